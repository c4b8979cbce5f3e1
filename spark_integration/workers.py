"""Spark's Python workers: which interpreter runs them, and what they say when it lacks
arrangedb.

Spark starts its Python workers with ``spark.pyspark.python`` (or ``PYSPARK_PYTHON``),
else ``python3`` from the PATH -- not the interpreter the driver runs in. A user who
starts a virtualenv's python without activating it gets workers of the system python,
and the first task dies deep in a worker's traceback with
``ModuleNotFoundError: No module named 'arrangedb'``. So:

- In local mode (``local[...]``, ``local-cluster[...]``: workers on this host) with
  nothing configured, the workers run the driver's own interpreter
  (:func:`use_driver_python_locally`), which has arrangedb by construction.
- Everywhere, the function each task runs (:func:`task`) is shipped without a reference
  to arrangedb's modules; it imports them on the worker and, when that fails, raises an
  error naming the worker's interpreter and the settings that fix it.
"""

from __future__ import annotations

import os
import sys

def use_driver_python_locally(spark) -> None:
    """Run local-mode workers with the driver's interpreter unless one is configured.

    ``spark.pyspark.python`` given to a session builder (not to spark-submit) is read
    by nobody in a driver already running; it is applied here, as the user meant."""
    from arrangedb.spark_integration.config import context_conf

    sc = spark.sparkContext
    conf = context_conf(sc)
    # sc.pythonExec is read when each job's Python function is wrapped
    if conf.get("spark.pyspark.python"):
        sc.pythonExec = conf.get("spark.pyspark.python")
        return
    if not str(sc.master).startswith("local"):
        return
    if os.environ.get("PYSPARK_PYTHON") or conf.get("spark.executorEnv.PYSPARK_PYTHON"):
        return
    sc.pythonExec = sys.executable


def task(module: str, function: str, *args):
    """A function of an iterator of Arrow batches for ``mapInArrow``: ``module.function``
    (batches, *args), imported on the worker -- with a clear error when it cannot be."""
    from pyspark import cloudpickle

    payload = cloudpickle.dumps(args)   # the specs import arrangedb when unpickled

    def run(batches):
        import importlib
        import pickle

        try:
            fn = getattr(importlib.import_module(module), function)
        except ImportError as e:
            import sys as worker_sys

            raise RuntimeError(
                f"arrangedb cannot be imported by Spark's Python worker "
                f"({worker_sys.executable}: {e}). Run the workers with an interpreter "
                f"that has it installed -- set spark.pyspark.python (or the PYSPARK_PYTHON "
                f"environment variable) -- or ship it to them with spark.archives (a "
                f"packed virtualenv or conda environment) or --py-files") from None
        return fn(batches, *pickle.loads(payload))

    return run
