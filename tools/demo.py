"""The main job: orders and customers arranged once on Spark, then days of changes kept
in the per-region result, beside Spark recomputing it every day.

Generates TPC-H-like orders and customers (``--scale``) and arranges both once with
``arrange_df`` (each task within its share of the budget). The result -- orders and
amount per customer region -- is then a maintained view. Each "day" brings 1% of the
orders as changes (new orders, changed amounts): arrangedb inserts them and reads the
regions' changes (``snapshot_reduce(..., since=day)``), Spark recomputes the join and
aggregation over the updated data with its sort-merge join, and the two results are
checked equal. Prints each day's changes, the times, and each task's peak RSS against
its budget.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time

import pyarrow.parquet as pq

from arrangedb.pager import RSS_ALLOWANCE, format_size, parse_size
from arrangedb.tools.progress import Bar, SparkStages

AGGS = {"orders": ("count", None), "amount": ("sum", "amount")}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="arrangedb demo", description=__doc__.split("\n")[0])
    p.add_argument("--scale", type=float, default=0.25,
                   help="1.0 = 40M orders x 4M customers (default 0.25)")
    p.add_argument("--budget", default="256MiB",
                   help="arrangedb memory budget per executor (default 256MiB)")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--partitions", type=int, default=None,
                   help="partitions of the arranged datasets (default: enough for each "
                        "task's input to be about 4x its budget share)")
    p.add_argument("--days", type=int, default=3, help="days of 1%% changes (default 3)")
    p.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "arrangedb-demo"),
                   help="where the generated Parquet files go (reused across runs)")
    p.add_argument("--skip-spark-baseline", action="store_true",
                   help="do not run Spark's own recomputation for comparison")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args(argv)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k][0] == b[k][0] and math.isclose(a[k][1], b[k][1], rel_tol=1e-9) for k in a)


def _apply(result: dict, changes) -> None:
    """Fold a view's changes (old row -1, new row +1) into the result."""
    for r in sorted(changes, key=lambda r: r["diff"]):   # retractions first
        if r["diff"] < 0:
            result.pop(r["region"], None)
        else:
            result[r["region"]] = (r["orders"], r["amount"])


def main(argv=None) -> int:
    args = parse_args(argv)
    out = sys.stderr
    from arrangedb.tools import datagen

    n_orders, n_customers = datagen.sizes(args.scale)
    data_dir = os.path.join(args.data_dir, f"scale-{args.scale:g}-seed-{args.seed}")
    bar = Bar("generating data", out)
    files = datagen.generate(data_dir, args.scale, args.seed,
                             progress=lambda d, t: bar.update(d, t, f"{d:,}/{t:,} rows"))
    bar.finish(f"{n_orders:,} orders, {n_customers:,} customers in {data_dir}")
    deltas = datagen.daily_deltas(files, args.scale, args.days, data_dir)

    budget = parse_size(args.budget)
    t = time.time()
    print(f"starting Spark ({args.master}) ...", file=out)
    from arrangedb.spark_integration import (JobMetrics, arrange_df, local_session,
                                             snapshot_join, snapshot_reduce)
    from arrangedb.spark_integration.config import resolve

    spark = local_session(args.master, memory_budget=budget,
                          extra={"spark.sql.autoBroadcastJoinThreshold": "-1"})
    print(f"Spark up in {time.time() - t:.1f} s", file=out)
    from pyspark.sql import functions as F

    orders = spark.read.parquet(files["orders"]).select("customer_id", "amount")
    customers = spark.read.parquet(files["customers"]).select("customer_id", "region")
    cfg = resolve(spark)
    input_bytes = n_orders * 32 + n_customers * 48        # Arrow bytes of the joined columns
    partitions = args.partitions or max(2 * cfg.slots,
                                        math.ceil(input_bytes / (4 * cfg.budget_bytes)))
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    print(f"input ~{format_size(input_bytes)} vs budget {format_size(budget)} per executor "
          f"({cfg.slots} task slots, {format_size(cfg.budget_bytes)} each); "
          f"{partitions} partitions", file=out)

    # First-job costs (the JVM's JIT, starting Python workers and their imports) would be
    # charged to whichever plan runs first: both plans run once on a small slice, untimed.
    t = time.time()
    few_o, few_c = orders.limit(10_000), customers.limit(10_000)
    snapshot_reduce(snapshot_join(few_o, few_c, "customer_id", num_partitions=cfg.slots),
                    "region", {"orders": ("count", None)}, num_partitions=cfg.slots).collect()
    few_o.join(few_c, "customer_id").groupBy("region").count().collect()
    print(f"warmed up both plans on a small slice in {time.time() - t:.1f} s", file=out)

    root = tempfile.mkdtemp(prefix="arrangedb-demo-datasets-")
    metrics = JobMetrics(spark)
    status = 0
    try:
        t = time.time()
        with SparkStages(spark.sparkContext, "arranging once", out):
            o = arrange_df(orders, "customer_id", path=os.path.join(root, "orders"),
                           num_partitions=partitions, metrics=metrics)
            c = arrange_df(customers, "customer_id", path=os.path.join(root, "customers"),
                           num_partitions=partitions, unique=True, metrics=metrics)
            joined = snapshot_join(o, c, "customer_id")
            result: dict = {}
            _apply(result, snapshot_reduce(joined, "region", AGGS, since=0,
                                           metrics=metrics).collect())
        print(f"\narranged {n_orders:,} orders and {n_customers:,} customers once, and "
              f"started the per-region view, in {time.time() - t:.1f} s", file=out)
        print("\nregion        orders        amount", file=out)
        for region, (n, amount) in sorted(result.items()):
            print(f"{region:<10} {n:>9,} {amount:>17,.2f}", file=out)

        updated = orders.withColumn("diff", F.lit(1).cast("long"))
        ours_s, theirs_s = [], []
        for day, path in enumerate(deltas, 1):
            delta = spark.read.parquet(path)
            t = time.time()
            when = o.insert(delta, diff="diff", metrics=metrics)
            changes = snapshot_reduce(joined, "region", AGGS, since=when, upto=when + 1,
                                      metrics=metrics).collect()
            ours_s.append(time.time() - t)
            before = dict(result)
            _apply(result, changes)
            moved = sorted(k for k in result if result[k] != before.get(k))
            rows = pq.ParquetFile(path).metadata.num_rows
            line = (f"\nday {day}: {rows:,} rows of changes; arrangedb "
                    f"{ours_s[-1]:.2f} s (insert + the {len(moved)} regions' changes)")
            if not args.skip_spark_baseline:
                updated = updated.unionByName(delta)
                t = time.time()
                with SparkStages(spark.sparkContext, "spark recompute", out):
                    theirs = {r["region"]: (r["orders"], r["amount"]) for r in (
                        updated.join(customers, "customer_id").groupBy("region")
                        .agg(F.sum("diff").alias("orders"),
                             F.sum(F.col("amount") * F.col("diff")).alias("amount"))
                        .collect())}
                theirs_s.append(time.time() - t)
                same = _same(result, theirs)
                status = status or (0 if same else 1)
                line += (f"; Spark recomputing {theirs_s[-1]:.2f} s; results "
                         f"{'equal' if same else 'DIFFER'}")
            print(line, file=out)
            for region in moved[:3]:
                (n0, a0), (n1, a1) = before.get(region, (0, 0.0)), result[region]
                print(f"  {region:<10} orders {n0:,} -> {n1:,}   amount {a0:,.2f} -> "
                      f"{a1:,.2f}", file=out)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    m = metrics.value
    limit = cfg.budget_bytes + RSS_ALLOWANCE
    print(f"\narrangedb on Spark: {m['rows_in']:,} rows in, "
          f"{format_size(m['bytes_spilled'])} spilled", file=out)
    print(f"  peak RSS per task over its start: {format_size(m['max_task_peak_rss_bytes'])} "
          f"(budget {format_size(cfg.budget_bytes)} + allowance "
          f"{format_size(RSS_ALLOWANCE)} = {format_size(limit)}; "
          f"{m['over_budget_tasks']} of {m['tasks']} tasks over)", file=out)
    if theirs_s:
        med_ours = sorted(ours_s)[len(ours_s) // 2]
        med_theirs = sorted(theirs_s)[len(theirs_s) // 2]
        print(f"a day's update: arrangedb {med_ours:.2f} s, Spark recomputing "
              f"{med_theirs:.2f} s (median of {len(ours_s)} days): arrangedb is "
              f"{med_theirs / med_ours:.1f}x its speed", file=out)
    status = status or (0 if m["over_budget_tasks"] == 0 else 1)
    spark.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
