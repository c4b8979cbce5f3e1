"""A local Spark session set up for arrangedb (tests, the demo, the benchmarks)."""

from __future__ import annotations

import os
import sys


def local_session(master: str = "local[2]", memory_budget="512MiB", app: str = "arrangedb",
                  driver_memory: str = "1g", extra: dict | None = None):
    """A SparkSession whose Python workers run this interpreter (and so this arrangedb).

    Binds to 127.0.0.1 (pip pyspark otherwise picks a non-loopback address, which
    ``local-cluster`` masters and sandboxes do not always reach).
    """
    import arrangedb

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    numpy_setting = arrangedb.numpy_sort_setting()
    if numpy_setting is not None:   # the workers, on this machine, load numpy afresh
        os.environ["NPY_DISABLE_CPU_FEATURES"] = numpy_setting
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master(master).appName(app)
         .config("spark.driver.memory", driver_memory)
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "8")
         # fewer, larger Arrow batches to and from the Python workers: per-batch costs
         # (IPC framing, Python calls) dominate at the default of 10k rows
         .config("spark.sql.execution.arrow.maxRecordsPerBatch", "65536")
         .config("spark.arrangedb.memoryBudget", str(memory_budget))
         .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable))
    if numpy_setting is not None:
        b = b.config("spark.executorEnv.NPY_DISABLE_CPU_FEATURES", numpy_setting)
    for k, v in (extra or {}).items():
        b = b.config(k, str(v))
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
