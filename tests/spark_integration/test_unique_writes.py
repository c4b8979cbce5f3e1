"""Writes into datasets arranged with ``unique=True``: each key holds at most one row
after every write, or the write is refused (a ValueError) and nothing is committed."""

from __future__ import annotations

import os
from collections import Counter

import pytest

pytestmark = pytest.mark.spark

from arrangedb.spark_integration import arrange_df, snapshot_join, snapshot_reduce  # noqa: E402
from arrangedb.spark_integration.dataset import read_manifest  # noqa: E402

CUSTOMERS = "cid long, region string"


def rows(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def unnamed_directories(ds) -> list[str]:
    named = {d for c in read_manifest(ds.path)["commits"] for d in c["parts"].values()}
    return [f"{p}/{d}" for p in os.listdir(ds.path) if p.startswith("part-")
            for d in os.listdir(os.path.join(ds.path, p)) if f"{p}/{d}" not in named]


def test_an_insert_giving_a_unique_key_a_second_row_is_refused(spark, tmp_path):
    customers = [(k, f"r{k}") for k in range(5)]
    c = arrange_df(spark.createDataFrame(customers, CUSTOMERS), "cid",
                   path=tmp_path / "c", num_partitions=2, unique=True)
    o = arrange_df(spark.createDataFrame([(k, 1.0) for k in range(5)], "cid long, x double"),
                   "cid", path=tmp_path / "o", num_partitions=2)

    def refused(bad):
        with pytest.raises(ValueError, match=r"unique=True on key column\(s\) \['cid'\]"):
            c.insert(spark.createDataFrame(bad, CUSTOMERS))
        assert c.times() == [0] and unnamed_directories(c) == []

    refused([(1, "again"), (9, "new")])   # key 1 exists
    joined = snapshot_join(o, c, "cid")
    snapshot_reduce(joined, "region", {"n": ("count", None)}, since=0).collect()
    # a view over c: an insert into c now steps it in the insert's own job
    refused([(1, "again")])
    refused([(7, "x"), (7, "y")])   # key 7 twice in the insert
    with pytest.raises(ValueError, match="upsert: the input repeats keys"):
        c.upsert(spark.createDataFrame([(2, "x"), (2, "y")], CUSTOMERS))
    assert c.times() == [0] and unnamed_directories(c) == []
    # a key's row retracted and another added in one insert leaves it one row: accepted
    changes = [(1, "r1", -1), (1, "s1", 1), (8, "r8", 1)]
    assert c.insert(spark.createDataFrame(changes, CUSTOMERS + ", d long"), diff="d") == 1
    now = [r for r in customers if r[0] != 1] + [(1, "s1"), (8, "r8")]
    everyone = spark.createDataFrame([(k,) for k in range(10)], "cid long")
    assert rows(snapshot_join(everyone, c, "cid")) == Counter(now)
    # a retraction of a row the key does not hold, beside a new row for it: refused
    with pytest.raises(ValueError, match=r"retracts rows it does not hold: \[\{'cid': 2"):
        c.insert(spark.createDataFrame([(2, "zz", -1), (2, "new", 1)], CUSTOMERS + ", d long"),
                 diff="d")
    assert c.times() == [0, 1] and unnamed_directories(c) == []


@pytest.mark.slow
def test_an_upsert_streams_through_the_task_budget(spark, tmp_path):
    """~100 MiB of rows per partition upserted with 32 MiB per task: arranged and spilled
    as an insert's rows are, never held whole in the worker."""
    from pyspark.sql import functions as F

    from arrangedb.pager import RSS_ALLOWANCE
    from arrangedb.spark_integration import JobMetrics

    def rows_of(n, tag):
        return spark.range(n).select(F.col("id").alias("k"), F.concat(
            F.lit(tag * 300), F.col("id").cast("string")).alias("v"))

    ds = arrange_df(rows_of(1000, "a"), "k", path=tmp_path / "u", num_partitions=2,
                    unique=True)
    metrics = JobMetrics(spark)
    n = 700_000
    assert ds.upsert(rows_of(n, "b"), metrics=metrics) == 1
    m = metrics.value
    assert m["bytes_spilled"] > 0 and m["over_budget_tasks"] == 0
    assert m["max_task_peak_rss_bytes"] <= m["max_task_budget_bytes"] + RSS_ALLOWANCE
    probe = spark.createDataFrame([(0,), (999,), (1000,), (n - 1,), (n,)], "k long")
    got = {r["k"]: r["v"] for r in snapshot_join(probe, ds, "k").collect()}
    assert got == {k: "b" * 300 + str(k) for k in (0, 999, 1000, n - 1)}
    assert snapshot_reduce(ds, "k", {"n": ("count", None)}).count() == n


def test_a_write_of_another_kind_of_value_is_refused_and_nothing_committed(spark, tmp_path):
    """Spark would cast '3' to 3 and a diff of 0.5 to 0; a write refuses them as an insert
    into a trace does, naming the column."""
    from arrangedb import SchemaError

    c = arrange_df(spark.createDataFrame([(k, f"r{k}") for k in range(5)], CUSTOMERS), "cid",
                   path=tmp_path / "c", num_partitions=2)
    with pytest.raises(SchemaError, match="column 'cid' has type string, the dataset's is int64"):
        c.insert(spark.createDataFrame([("7", "r7")], "cid string, region string"))
    with pytest.raises(SchemaError, match="diff column 'd' must hold integers"):
        c.insert(spark.createDataFrame([(7, "r7", 0.5)], "cid long, region string, d double"),
                 diff="d")
    assert c.times() == [0] and unnamed_directories(c) == []
    c.insert(spark.createDataFrame([(7, "r7")], "cid int, region string"))   # a narrower int
    got = snapshot_reduce(c, "cid", {"n": ("count", None)}).collect()
    assert sorted((r["cid"], r["n"]) for r in got)[-1] == (7, 1) and c.times() == [0, 1]
