"""A writing task whose Python worker dies after writing its directory, and Spark's retry
of it: the insert lands once (the retried attempt's directory is committed, the dead
attempt's removed), or -- when every attempt dies -- the dataset stays at its old time
with nothing of the insert left behind.

The worker is killed by a ``sitecustomize`` on the workers' ``PYTHONPATH`` that wraps
``save_attempt`` (the test's code only, nothing in arrangedb): after the directory is
written and fsync'd, attempt 0 of partition 0 (or every attempt, in the second case)
exits with ``os._exit``, as a worker killed by the OOM killer or a lost executor would.
The driver is a subprocess of its own: ``local[2,3]`` (three attempts per task) needs a
SparkContext of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.spark

if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs Java 17 (see `make java`)", allow_module_level=True)

HOOK = textwrap.dedent("""
    import os

    if os.environ.get("ARRANGEDB_TEST_KILL_MARKER"):
        from arrangedb.spark_integration import dataset_tasks

        marker = os.environ["ARRANGEDB_TEST_KILL_MARKER"]
        real = dataset_tasks.save_attempt

        def save_attempt(trace, root, version, pid, attempt):
            from pyspark import TaskContext

            out = real(trace, root, version, pid, attempt)
            if os.path.exists(marker) and pid == 0:
                with open(marker) as f:
                    mode = f.read()
                if mode == "always" or TaskContext.get().attemptNumber() == 0:
                    os._exit(17)   # after the directory is written, before any report
            return out

        dataset_tasks.save_attempt = save_attempt
""")

DRIVER = textwrap.dedent("""
    import json, os, sys
    from collections import Counter
    from arrangedb.spark_integration import arrange_df, local_session, snapshot_reduce
    from arrangedb.spark_integration import ArrangedDataset

    root, marker = sys.argv[1], os.environ["ARRANGEDB_TEST_KILL_MARKER"]
    spark = local_session("local[2,3]", memory_budget="64MiB")
    spark.sparkContext.setLogLevel("OFF")
    base = spark.range(0, 2000, 1, 2).selectExpr("id % 50 as k", "id as v")
    ds = arrange_df(base, "k", path=os.path.join(root, "ds"), num_partitions=2)

    def state():
        counts = snapshot_reduce(ds, "k", {"n": ("count", None)}).collect()
        left = sorted(d for p in sorted(os.listdir(ds.path)) if p.startswith("part-")
                      for d in os.listdir(os.path.join(ds.path, p)))
        return {"times": ArrangedDataset.open(ds.path).times(),
                "rows": sum(r["n"] for r in counts), "dirs": left}

    out = {}
    with open(marker, "w") as f:
        f.write("first")                # attempt 0 of partition 0 dies; the retry lands
    t = ds.insert(spark.range(0, 300, 1, 2).selectExpr("id % 50 as k", "id + 5000 as v"))
    out["retried"] = {"t": t, **state()}
    with open(marker, "w") as f:
        f.write("always")               # every attempt dies: the job fails
    try:
        ds.insert(spark.range(0, 300, 1, 2).selectExpr("id % 50 as k", "id as v"))
        out["failed"] = {"error": None}
    except Exception as e:
        out["failed"] = {"error": type(e).__name__, **state()}
    os.remove(marker)
    out["after"] = {"t": ds.insert(base.limit(10)), **state()}
    print(json.dumps(out))
    spark.stop()
""")


def test_a_killed_writer_is_retried_and_lands_once(tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    env = dict(os.environ, ARRANGEDB_TEST_KILL_MARKER=str(tmp_path / "kill"),
               PYTHONPATH=os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH"))
                                          if p))
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    retried, failed, after = out["retried"], out["failed"], out["after"]
    # the retry's directory is the one committed; the dead attempt's is gone
    assert retried["t"] == 1 and retried["times"] == [0, 1]
    assert retried["rows"] == 2300
    assert len(retried["dirs"]) == 4   # two partitions x two commits
    # every attempt died: the insert raised and left the dataset as it was
    assert failed["error"] is not None
    assert failed["times"] == [0, 1] and failed["rows"] == 2300
    assert failed["dirs"] == retried["dirs"]
    # and the next insert commits at the next time
    assert after["t"] == 2 and after["times"] == [0, 1, 2] and after["rows"] == 2310
