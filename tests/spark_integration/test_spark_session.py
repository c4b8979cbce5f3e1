"""A user's own SparkSession (not ``local_session``), started by a virtualenv's python
that was never activated: Spark's workers would run ``python3`` from the PATH, which has
no arrangedb. In local mode the workers run the driver's interpreter; a worker whose
interpreter lacks arrangedb fails with an error that names the setting to use.

Each case is a fresh driver process with a clean environment: no PYSPARK_PYTHON, and a
PATH whose ``python3`` cannot import arrangedb (nor pyspark).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from arrangedb.spark_integration.config import WORKER_RSS_ALLOWANCE

pytestmark = pytest.mark.spark

if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs Java 17 (see `make java`)", allow_module_level=True)

SCRIPT = textwrap.dedent("""
    import json, sys
    from pyspark.sql import SparkSession
    from arrangedb.spark_integration import snapshot_join, snapshot_reduce

    # one session per case, one after the other (each case: its configuration entries,
    # cases separated by "--"): a driver process and its JVM start once
    cases = [[]]
    for arg in sys.argv[2:]:
        if arg == "--":
            cases.append([])
        else:
            cases[-1].append(arg)
    for conf in cases:
        builder = SparkSession.builder.master(sys.argv[1]).appName("a user's own session")
        for kv in conf:
            k, v = kv.split("=", 1)
            builder = builder.config(k, v)
        spark = builder.config("spark.driver.host", "127.0.0.1") \\
            .config("spark.ui.enabled", "false").getOrCreate()
        spark.sparkContext.setLogLevel("OFF")
        a = spark.range(0, 20_000, 1, 4).selectExpr("id % 500 as k", "id as v")
        b = spark.range(0, 600, 1, 2).selectExpr("id as k", "id % 7 as r")
        try:
            r = snapshot_reduce(snapshot_join(a, b, "k", num_partitions=2), "r",
                                {"n": ("count", None)})
            print(json.dumps({"n": sum(row["n"] for row in r.collect())}))
        except Exception as e:
            print(json.dumps({"error": str(e)}))
        spark.stop()
""")


CLUSTER_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from collections import Counter
    from pyspark.sql import SparkSession
    from arrangedb.spark_integration import (arrange_df, snapshot_join, snapshot_reduce,
                                             JobMetrics)

    root = sys.argv[1]
    spark = (SparkSession.builder.master("local-cluster[2,1,1024]")
             .appName("a user's own session").config("spark.driver.host", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.local.dir", root)
             .config("spark.executor.memory", "512m")
             .config("spark.arrangedb.memoryBudget", "48MiB").getOrCreate())
    spark.sparkContext.setLogLevel("OFF")
    a = spark.range(0, 40_000, 1, 4).selectExpr("id % 1000 as k", "id as v")
    b = spark.range(0, 1200, 1, 2).selectExpr("id as k", "id % 7 as r")
    j = snapshot_join(a, b, "k", num_partitions=4)
    got = Counter(map(tuple, j.collect()))
    want = Counter(map(tuple, a.join(b, "k").collect()))
    groups = len(snapshot_reduce(j, "r", {"n": ("count", None), "s": ("sum", "v")}).collect())

    # a living dataset written by tasks in separate executor processes
    metrics = JobMetrics(spark)
    da = arrange_df(a, "k", path=os.path.join(root, "a"), num_partitions=4, metrics=metrics)
    db = arrange_df(b, "k", path=os.path.join(root, "b"), num_partitions=4, unique=True,
                    metrics=metrics)
    aggs = {"n": ("count", None), "s": ("sum", "v")}
    view = Counter()
    for row in snapshot_reduce(snapshot_join(da, db, "k"), "r", aggs, since=0).collect():
        view[(row["r"], row["n"], row["s"])] += row["diff"]
    more = spark.range(0, 300, 1, 2).selectExpr("id * 3 as k", "id + 1000000 as v")
    t = da.insert(more, metrics=metrics)
    for row in snapshot_reduce(snapshot_join(da, db, "k"), "r", aggs, since=t).collect():
        view[(row["r"], row["n"], row["s"])] += row["diff"]
    from pyspark.sql import functions as F
    truth = a.unionByName(more).join(b, "k").groupBy("r").agg(F.count("*"), F.sum("v"))
    print(json.dumps({"equal": got == want, "rows": sum(got.values()), "groups": groups,
                      "metrics": j.arrangedb_metrics.value, "living": metrics.value,
                      "view_equal": +view == Counter(map(tuple, truth.collect()))}))
    spark.stop()
""")


def _clean_env(tmp_path, **extra) -> dict:
    """No PYSPARK_PYTHON; ``python3`` on the PATH is a stand-in that has no arrangedb."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python3"
    fake.write_text("#!/bin/sh\necho 'this python has no arrangedb' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_", "VIRTUAL_ENV", "PYTHON"))}
    java = shutil.which("java")
    path = [str(bin_dir)] + ([os.path.dirname(java)] if java else []) + ["/usr/bin", "/bin"]
    env.update(PATH=os.pathsep.join(path), SPARK_LOCAL_IP="127.0.0.1", **extra)
    return env


def _run(tmp_path, master: str, *cases: list[str]) -> list[dict]:
    """One driver process running one session per case (its configuration entries);
    each case's result."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    args = []
    for i, conf in enumerate(cases):
        args += (["--"] if i else []) + list(conf)
    out = subprocess.run([sys.executable, str(script), master, *args], capture_output=True,
                         text=True, timeout=600, env=_clean_env(tmp_path))
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == len(cases), f"exit {out.returncode}: {out.stderr[-3000:]}"
    return [json.loads(ln) for ln in lines]


@pytest.fixture(scope="module")
def local_cases(tmp_path_factory):
    """A user's own local session, unconfigured and then with a worker python that lacks
    arrangedb configured: both in one driver process."""
    tmp = tmp_path_factory.mktemp("sessions")
    return _run(tmp, "local[2]", [], [f"spark.pyspark.python={_blocked_python(tmp)}"])


def _blocked_python(tmp_path) -> str:
    """An interpreter with pyspark but without arrangedb: this one, with a stand-in
    package first on its path whose import fails as a missing module does."""
    blocker = tmp_path / "blocker" / "arrangedb"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'arrangedb'\", name='arrangedb')\n")
    wrapper = tmp_path / "python-without-arrangedb"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={blocker.parent} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def test_a_users_own_local_session_runs_workers_with_the_drivers_python(local_cases):
    assert local_cases[0] == {"n": 20_000}


def test_separate_executor_processes(tmp_path):
    """local-cluster, a user's own session: executors are their own JVMs and Python
    workers (running the driver's interpreter), with their own local dirs and budget;
    they arrange, insert into and step a living dataset's view."""
    script = tmp_path / "cluster.py"
    script.write_text(CLUSTER_SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                         text=True, timeout=600, env=_clean_env(tmp_path))
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"exit {out.returncode}: {out.stderr[-3000:]}"
    r = json.loads(lines[-1])
    assert r["equal"] and r["rows"] == 40_000 and r["groups"] == 7 and r["view_equal"]
    for m in (r["metrics"], r["living"]):
        assert m["max_task_budget_bytes"] == 48 << 20     # one core per executor: one slot
        # the sizing rule of docs/SPARK.md, on the whole worker process
        assert 48 << 20 < m["max_worker_peak_rss_bytes"] <= (48 << 20) + WORKER_RSS_ALLOWANCE
        assert m["over_budget_tasks"] == 0


def test_a_configured_worker_python_is_left_alone(local_cases):
    """Configured, it is used -- and one without arrangedb gets a clear error."""
    r = local_cases[1]
    assert "error" in r
    assert "arrangedb cannot be imported by Spark's Python worker" in r["error"]
    assert "spark.pyspark.python" in r["error"] and "spark.archives" in r["error"]
