"""The demo query on Spark: arrangedb against Spark's own plans, same data, same run.

orders x customers on customer_id, then count and sum(amount) per region, on local[2]:

- arrangedb cold: snapshot_join + snapshot_reduce from Parquet (arranged in the tasks);
- arrangedb reused: both sides arranged once with arrange_df (not timed), then queried;
- Spark sort-merge join (spark.sql.autoBroadcastJoinThreshold=-1);
- Spark's default plan (whatever the optimizer picks with its default threshold);
- the transfer alone: the cold plan's shuffle into a mapInArrow that only counts rows.

Peak memory is the RSS of the whole process tree (this Python driver, the JVM it
launched and the Python workers), sampled every 50 ms. Ratios are Spark's time over
arrangedb's (above 1: arrangedb is faster). ARRANGEDB_BENCH_SCALE=full runs scale 0.5
(20M orders x 2M customers); the default is a smoke run at scale 0.005.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import time

import pytest

from arrangedb.tools import datagen

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _orders  # noqa: E402

pytestmark = pytest.mark.spark

FULL = os.environ.get("ARRANGEDB_BENCH_SCALE") == "full"
SCALE = 0.5 if FULL else 0.005
BUDGET = "512MiB"
RESULTS: dict[str, dict] = {}


@pytest.fixture(scope="module")
def env():
    from arrangedb.spark_integration import arrange_df, local_session

    files = datagen.generate(os.path.join(tempfile.gettempdir(), "arrangedb-bench",
                                          f"scale-{SCALE:g}"), SCALE)
    spark = local_session("local[2]", memory_budget=BUDGET,
                          extra={"spark.sql.autoBroadcastJoinThreshold": "-1"})
    orders = spark.read.parquet(files["orders"]).select("customer_id", "amount")
    customers = spark.read.parquet(files["customers"]).select("customer_id", "region")
    parts = max(4, math.ceil(SCALE * 1_400_000_000 / (4 * 256 << 20)))
    tmp = tempfile.mkdtemp(prefix="arrangedb-bench-arranged-")
    arranged = (arrange_df(orders, "customer_id", path=os.path.join(tmp, "orders"),
                           num_partitions=parts),
                arrange_df(customers, "customer_id", path=os.path.join(tmp, "customers"),
                           num_partitions=parts))
    expected = _expected(files)
    try:
        yield spark, orders, customers, arranged, parts, expected
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    _report()


def _expected(files: dict) -> list[tuple]:
    """The query's answer from DuckDB over the same Parquet files: every test checks its
    system against it, so none depends on another having run first."""
    import duckdb

    con = duckdb.connect()
    rows = con.execute(
        "SELECT c.region, count(*), sum(o.amount) FROM read_parquet(?) o "
        "JOIN read_parquet(?) c USING (customer_id) GROUP BY c.region",
        [files["orders"], files["customers"]]).fetchall()
    con.close()
    return sorted((r, int(n), float(a)) for r, n, a in rows)


def _ours(spark, left, right, parts):
    from arrangedb.spark_integration import ArrangedDataset, snapshot_join, snapshot_reduce

    arranged = isinstance(left, ArrangedDataset)
    j = snapshot_join(left, right, "customer_id", num_partitions=None if arranged else parts)
    r = snapshot_reduce(j, "region", {"orders": ("count", None), "amount": ("sum", "amount")},
                        num_partitions=2)
    return sorted((x["region"], x["orders"], x["amount"]) for x in r.collect()), j


def _spark(spark, orders, customers, threshold):
    from pyspark.sql import functions as F

    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", threshold)
    try:
        r = (orders.join(customers, "customer_id").groupBy("region")
             .agg(F.count("*").alias("orders"), F.sum("amount").alias("amount")).collect())
    finally:
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    return sorted((x["region"], x["orders"], x["amount"]) for x in r)


def _same(a, b) -> bool:
    return len(a) == len(b) and all(x[0] == y[0] and x[1] == y[1] and
                                    math.isclose(x[2], y[2], rel_tol=1e-9) for x, y in zip(a, b))


def _run(benchmark, name, fn):
    out = {}

    def once():
        with _orders.RssSampler(interval=0.05, tree=True) as rss:
            t = time.perf_counter()
            out["result"] = fn()
            out["seconds"] = time.perf_counter() - t
        out["peak_tree_rss"] = rss.peak

    benchmark.pedantic(once, rounds=1, iterations=1)
    RESULTS[name] = {"seconds": out["seconds"], "peak_tree_rss": out["peak_tree_rss"]}
    benchmark.extra_info.update(RESULTS[name])
    return out["result"]


def test_spark_sort_merge_join(benchmark, env):
    spark, orders, customers, _, parts, expected = env
    spark.conf.set("spark.sql.shuffle.partitions", str(parts))
    got = _run(benchmark, "spark sort-merge join",
               lambda: _spark(spark, orders, customers, "-1"))
    assert _same(got, expected)


def test_spark_default_plan(benchmark, env):
    spark, orders, customers, _, _, expected = env
    got = _run(benchmark, "spark default plan",
               lambda: _spark(spark, orders, customers, str(10 << 20)))
    assert _same(got, expected)


def test_arrangedb_cold(benchmark, env):
    spark, orders, customers, _, parts, expected = env
    got, j = _run(benchmark, "arrangedb cold", lambda: _ours(spark, orders, customers, parts))
    assert _same(got, expected)
    m = j.arrangedb_metrics.value
    RESULTS["arrangedb cold"]["max_task_peak_rss"] = m["max_task_peak_rss_bytes"]
    assert m["over_budget_tasks"] == 0


def test_arrangedb_reused_arrangements(benchmark, env):
    spark, _, _, (ao, ac), parts, expected = env
    got, _ = _run(benchmark, "arrangedb reused", lambda: _ours(spark, ao, ac, parts))
    assert _same(got, expected)


def test_transfer_floor(benchmark, env):
    """The same shuffle into the same mapInArrow, whose function only counts the rows it
    is handed: what the cold plan pays before arrangedb does any work (Spark converts
    every shuffled row to Arrow and sends it to a Python worker; its own join does not)."""
    import pyarrow as pa

    from arrangedb.spark_integration import snapshot_join

    spark, orders, customers, _, parts, _ = env
    shuffled = snapshot_join(orders, customers, "customer_id",
                             num_partitions=parts)._arrangedb_join[0]

    def count(batches):
        n = sum(b.num_rows for b in batches)
        yield pa.record_batch({"rows": pa.array([n], pa.int64())})

    rows = _run(benchmark, "mapInArrow transfer alone",
                lambda: sum(r["rows"] for r in shuffled.mapInArrow(count, "rows long").collect()))
    assert rows == orders.count() + customers.count()


def _report():
    base = RESULTS.get("spark sort-merge join")
    if not base:
        return
    lines = [f"\ndemo query at scale {SCALE:g} on local[2], arrangedb budget {BUDGET}/executor",
             f"{'system':<24}{'seconds':>9}{'peak tree RSS':>15}{'SMJ time / this':>17}"]
    for name, r in RESULTS.items():
        if name.startswith("_"):
            continue
        lines.append(f"{name:<24}{r['seconds']:>9.2f}{r['peak_tree_rss'] / 2**20:>11.0f} MiB"
                     f"{base['seconds'] / r['seconds']:>16.2f}x")
    print("\n".join(lines))
    folder = os.environ.get("ARRANGEDB_BENCH_PLOTS")
    if folder:
        import plots

        os.makedirs(folder, exist_ok=True)
        plots.spark_chart({k: v for k, v in RESULTS.items() if not k.startswith("_")},
                          "spark sort-merge join", os.path.join(folder, "spark.png"),
                          f"orders x customers per region, scale {SCALE:g}, local[2], "
                          f"{BUDGET} per executor")
