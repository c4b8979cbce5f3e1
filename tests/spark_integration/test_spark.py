"""arrangedb on a real local Spark (pip pyspark + Java 17): results equal Spark's own.

One ``local[2]`` session serves the module; the test with separate executor processes
runs ``local-cluster[2,1,1024]`` in a subprocess (one SparkContext per JVM).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

pytestmark = pytest.mark.spark

if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs Java 17 (see `make java`)", allow_module_level=True)

from arrangedb.pager import RSS_ALLOWANCE  # noqa: E402
from arrangedb.spark_integration import (  # noqa: E402
    ArrangedDataset, arrange_df, snapshot_join, snapshot_reduce)
from arrangedb.spark_integration.config import (  # noqa: E402
    WORKER_RSS_ALLOWANCE, check_address_space, task_slots)


def rows(df) -> Counter:
    def norm(v):
        return round(v, 6) if isinstance(v, float) else v
    return Counter(tuple(norm(v) for v in r) for r in df.collect())


def sides(spark, seed=0, n=3000, m=800):
    """Duplicates, nulls in keys and vals, one key holding 10% of the rows."""
    rng = np.random.default_rng(seed)
    k = rng.integers(0, 300, n)
    k[: n // 10] = 7
    left = pa.table({
        "k": pa.array(k, mask=rng.random(n) < 0.05),
        "s": pa.array([f"s{x % 4}" for x in k], pa.string()),
        "a": pa.array(rng.integers(0, 5, n), mask=rng.random(n) < 0.1),
        "x": rng.integers(0, 100, n).astype(np.float64) / 4,
    })
    rk = rng.integers(0, 350, m)
    rk[: m // 10] = 7
    right = pa.table({
        "k": pa.array(rk, mask=rng.random(m) < 0.05),
        "s": pa.array([f"s{x % 4}" for x in rk], pa.string()),
        "b": pa.array([f"é{v}" for v in rng.integers(0, 9, m)], mask=rng.random(m) < 0.1),
        "x": rng.integers(0, 100, m).astype(np.float64),
    })
    return spark.createDataFrame(left), spark.createDataFrame(right)


SPARK_HOW = {"inner": "inner", "left": "left", "semi": "left_semi", "anti": "left_anti"}


@pytest.mark.parametrize("how", list(SPARK_HOW))
@pytest.mark.parametrize("on", [["k"], ["k", "s"]])
def test_join_equals_sparks_join(spark, how, on):
    left, right = sides(spark)
    got = snapshot_join(left, right, on, how=how, num_partitions=3)
    want = left.join(right, on, SPARK_HOW[how])
    assert len(got.columns) == len(want.columns)
    assert rows(got) == rows(want)
    m = got.arrangedb_metrics.value
    assert m["tasks"] >= 3 and m["over_budget_tasks"] == 0


def test_reduce_equals_sparks_group_by(spark):
    from pyspark.sql import functions as F

    left, _ = sides(spark, seed=1)
    aggs = {"n": ("count", None), "na": ("count", "a"), "sa": ("sum", "a"),
            "sx": ("sum", "x"), "lo": ("min", "s"), "hi": ("max", "x"), "m": ("mean", "a")}
    want = left.groupBy("k").agg(F.count("*"), F.count("a"), F.sum("a"), F.sum("x"),
                                 F.min("s"), F.max("x"), F.avg("a"))
    assert rows(snapshot_reduce(left, "k", aggs, num_partitions=3)) == rows(want)
    # count_distinct takes the arranged path (null group keys made safe)
    got = snapshot_reduce(left, ["k"], {"n": ("count", None), "d": ("count_distinct", "a")})
    assert rows(got) == rows(left.groupBy("k").agg(F.count("*"), F.countDistinct("a")))


def test_reduce_of_a_join_runs_in_the_join_tasks(spark):
    from pyspark.sql import functions as F

    left, right = sides(spark, seed=2)
    joined = snapshot_join(left, right, "k", how="left", num_partitions=3)
    got = snapshot_reduce(joined, "b", {"n": ("count", None), "s": ("sum", "a"),
                                        "m": ("max", "left_x")})
    want = (left.join(right, "k", "left").groupBy("b")
            .agg(F.count("*"), F.sum("a"), F.max(left.x)))
    assert rows(got) == rows(want)


def test_arranged_datasets_are_reused(spark, tmp_path):
    from pyspark.sql import functions as F

    left, right = sides(spark, seed=3)
    left, right = left.where("k is not null"), right.where("k is not null")
    dl = arrange_df(left, "k", path=tmp_path / "left", num_partitions=4)
    dr = arrange_df(right, "k", vals=["b"], path=tmp_path / "right", num_partitions=4)
    assert ArrangedDataset.open(tmp_path / "left") == dl
    want = rows(left.join(right.select("k", "b"), "k"))
    assert rows(snapshot_join(dl, dr, "k")) == want          # both arranged: no shuffle
    assert rows(snapshot_join(left, dr, "k")) == want        # one side arranged
    # both sides arranged: the aggregation runs below the join, per key
    for how in ("inner", "left"):
        got = snapshot_reduce(snapshot_join(dl, dr, "k", how=how), "b",
                              {"n": ("count", None), "na": ("count", "a"), "sa": ("sum", "a"),
                               "mx": ("mean", "x")})
        want = left.join(right.select("k", "b"), "k", how).groupBy("b").agg(
            F.count("*"), F.count("a"), F.sum("a"), F.avg("x"))
        assert rows(got) == rows(want), how
    got = snapshot_reduce(dl, "k", {"n": ("count", None), "d": ("count_distinct", "s")})
    assert rows(got) == rows(left.groupBy("k").agg(F.count("*"), F.countDistinct("s")))
    with pytest.raises(FileExistsError):
        arrange_df(left, "k", path=tmp_path / "left")


def test_bad_input_is_refused_on_the_driver(spark):
    left, right = sides(spark)
    with pytest.raises(KeyError, match="nope"):
        snapshot_join(left, right, "nope")
    with pytest.raises(TypeError, match="key types differ"):
        snapshot_join(left, right.withColumn("k", right.k.cast("string")), "k")
    with pytest.raises(ValueError, match="unknown how"):
        snapshot_join(left, right, "k", how="full")
    with pytest.raises(TypeError, match="numeric"):
        snapshot_reduce(left, "k", {"x": ("sum", "s")})


@pytest.mark.slow
def test_a_partition_several_times_its_budget_stays_within_it():
    """local[2] with 32 MiB per executor: 16 MiB per task; each task gets ~5x that."""
    script = textwrap.dedent("""
        import json
        from arrangedb.spark_integration import local_session, snapshot_join
        spark = local_session("local[2]", memory_budget="32MiB")
        big = spark.range(0, 5_000_000, 1, 4).selectExpr("(id * 7919) % 1000003 as k",
                                                         "id as v")
        small = spark.range(0, 1_000_003, 1, 2).selectExpr("id as k", "id % 20 as r")
        j = snapshot_join(big, small, "k", num_partitions=2)
        n = j.count()
        print(json.dumps({"rows": n, "metrics": j.arrangedb_metrics.value}))
        spark.stop()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    m = r["metrics"]
    assert r["rows"] == 5_000_000
    budget = m["max_task_budget_bytes"]
    assert budget == 16 << 20
    assert m["bytes_spilled"] > 4 * budget
    print(f"peak RSS per task over its start {m['max_task_peak_rss_bytes'] / 2**20:.0f} MiB, "
          f"budget {budget / 2**20:.0f} MiB + {RSS_ALLOWANCE / 2**20:.0f} MiB")
    assert m["over_budget_tasks"] == 0
    assert m["max_task_peak_rss_bytes"] <= budget + RSS_ALLOWANCE
    assert budget < m["max_worker_peak_rss_bytes"] <= budget + WORKER_RSS_ALLOWANCE


def test_task_slots_divide_the_executor_budget():
    assert task_slots({}, "local[2]") == 2
    assert task_slots({"spark.task.cpus": "2"}, "local[4]") == 2
    assert task_slots({}, "local-cluster[2,3,1024]") == 3
    assert task_slots({"spark.executor.cores": "8", "spark.task.cpus": "2"}, "yarn") == 4


def test_address_space_limit_is_detected_with_a_clear_message():
    script = textwrap.dedent("""
        import resource, sys
        from arrangedb.spark_integration.config import check_address_space
        import psutil
        vms = psutil.Process().memory_info().vms
        resource.setrlimit(resource.RLIMIT_AS, (vms + (200 << 20), resource.RLIM_INFINITY))
        try:
            check_address_space(256 << 20)
        except MemoryError as e:
            print(e); sys.exit(0)
        sys.exit(1)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "spark.executor.pyspark.memory" in out.stdout and "RLIMIT_AS" in out.stdout
    check_address_space(1 << 20)   # no limit in the test process: nothing to say


def test_the_demo_runs_end_to_end_as_the_readme_says(tmp_path):
    """``make demo`` at a tiny size, through the installed console script: the datasets
    are arranged, each day's changes agree with Spark recomputing, every task stays
    within its budget, and the summary is printed."""
    exe = os.path.join(os.path.dirname(sys.executable), "arrangedb")
    proc = subprocess.run([exe, "demo", "--scale", "0.002", "--budget", "64MiB", "--days", "2",
                           "--data-dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout + proc.stderr     # the summary goes to stderr beside the progress
    assert "warmed up both plans" in out and out.count("results equal") == 2
    assert "DIFFER" not in out and "day 2:" in out and "a day's update" in out
    assert "arrangedb on Spark:" in out and "0 of" in out and "tasks over" in out
    assert sum(1 for line in out.splitlines() if line[:1].isupper() and
               len(line.split()) == 3 and line.split()[1].replace(",", "").isdigit()) == 20


def test_reduce_weighs_a_change_dataframes_diff(spark):
    """A change DataFrame carries its multiplicity in ``diff`` (Spark keeps no Arrow
    metadata): count and sum are the net change per group."""
    rng = np.random.default_rng(5)
    n = 2000
    t = pa.table({"g": rng.integers(0, 13, n), "x": rng.integers(-5, 50, n),
                  "diff": rng.choice([-1, 1, 2], n)})
    df = spark.createDataFrame(t.to_pandas())
    got = snapshot_reduce(df, "g", {"n": ("count", None), "s": ("sum", "x")})
    df.createOrReplaceTempView("changes")
    want = spark.sql("select g, sum(diff) n, sum(x * diff) s from changes group by g")
    assert rows(got) == rows(want)
    plain = snapshot_reduce(df, "g", {"n": ("count", None)}, weight=False)
    assert rows(plain) == rows(df.groupBy("g").count())
    with pytest.raises(Exception, match="not linear"):
        snapshot_reduce(df, "g", {"hi": ("max", "x")}).collect()


def test_snapshot_reduce_types_decimals_as_spark_does(spark):
    """Sums and means of decimals equal Spark's own groupBy, values and types."""
    from pyspark.sql import functions as F

    from test_decimals import _money

    rng = np.random.default_rng(7)
    n = 2000
    v = _money(rng, n, pa.decimal128(15, 2), distinct=500)
    w = _money(rng, n, pa.decimal128(30, 5), distinct=500)
    data = [{"k": int(k), "v": a, "w": b}
            for k, a, b in zip(rng.integers(0, 30, n), v.to_pylist(), w.to_pylist())]
    df = spark.createDataFrame(data, schema="k long, v decimal(15,2), w decimal(30,5)")
    got = snapshot_reduce(df, "k", {"s": ("sum", "v"), "m": ("mean", "v"),
                                    "sw": ("sum", "w"), "mw": ("mean", "w")},
                          num_partitions=3)
    want = df.groupBy("k").agg(F.sum("v").alias("s"), F.avg("v").alias("m"),
                               F.sum("w").alias("sw"), F.avg("w").alias("mw"))
    assert [f.dataType for f in got.schema.fields] == [f.dataType for f in want.schema.fields]
    assert sorted(map(tuple, got.collect())) == sorted(map(tuple, want.collect()))


def test_timestamp_columns_are_joined_grouped_and_arranged_as_spark_does(spark, tmp_path):
    """Spark's timestamp (the type of current_timestamp(), to_timestamp(), Parquet
    written by Spark) in a DataFrame whether the query uses it or not, as a group and a
    join key, in a session time zone that is not UTC."""
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "Europe/Berlin")   # DST starts at 2:00
    try:
        _timestamps_as_spark(spark, tmp_path)
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)


def _timestamps_as_spark(spark, tmp_path):
    import datetime

    from pyspark.sql import functions as F

    day = datetime.datetime(2024, 3, 31, 1, 30)
    ev = spark.createDataFrame([(k % 4, day + datetime.timedelta(hours=k), k / 2)
                                for k in range(12)], "k long, ts timestamp, x double")
    dim = spark.createDataFrame([(k, f"n{k}") for k in range(3)], "k long, name string")
    assert rows(snapshot_join(ev, dim, "k")) == rows(ev.join(dim, "k"))
    assert rows(snapshot_reduce(ev, "k", {"s": ("sum", "x")})) == \
        rows(ev.groupBy("k").agg(F.sum("x")))
    assert rows(snapshot_reduce(ev, "ts", {"n": ("count", None), "hi": ("max", "ts")})) == \
        rows(ev.groupBy("ts").agg(F.count("*"), F.max("ts")))
    by_time = arrange_df(ev, "ts", path=tmp_path / "ev", num_partitions=2)
    assert rows(snapshot_join(by_time, ev.select("ts", "k"), "ts")) == \
        rows(ev.join(ev.select("ts", F.col("k").alias("right_k")), "ts")
             .select("ts", F.col("k").alias("left_k"), "x", "right_k"))
