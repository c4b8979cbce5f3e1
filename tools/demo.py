"""The main job: a snapshot join larger than its budget, on Spark, beside Spark's own.

Generates TPC-H-like orders and customers (``--scale``), then counts orders and sums
their amounts per customer region twice on the same local Spark: with arrangedb
(``snapshot_join`` + ``snapshot_reduce``, each task within its share of the budget) and
with Spark's own sort-merge join and aggregation. Prints the result, the times, the
bytes spilled and each task's peak RSS against its budget.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time

from arrangedb.pager import RSS_ALLOWANCE, format_size, parse_size
from arrangedb.tools.progress import Bar, SparkStages


def parse_args(argv):
    p = argparse.ArgumentParser(prog="arrangedb demo", description=__doc__.split("\n")[0])
    p.add_argument("--scale", type=float, default=0.25,
                   help="1.0 = 40M orders x 4M customers (default 0.25)")
    p.add_argument("--budget", default="256MiB",
                   help="arrangedb memory budget per executor (default 256MiB)")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--partitions", type=int, default=None,
                   help="shuffle partitions (default: enough for each task's input to be "
                        "about 4x its budget share)")
    p.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "arrangedb-demo"),
                   help="where the generated Parquet files go (reused across runs)")
    p.add_argument("--skip-spark-baseline", action="store_true",
                   help="do not run Spark's own join for comparison")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args(argv)


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

    budget = parse_size(args.budget)
    t = time.time()
    print(f"starting Spark ({args.master}) ...", file=out)
    from arrangedb.spark_integration import (JobMetrics, local_session, snapshot_join,
                                             snapshot_reduce)
    from arrangedb.spark_integration.config import resolve

    spark = local_session(args.master, memory_budget=budget,
                          extra={"spark.sql.autoBroadcastJoinThreshold": "-1"})
    print(f"Spark up in {time.time() - t:.1f} s", file=out)
    from pyspark.sql import functions as F

    orders = spark.read.parquet(files["orders"])
    customers = spark.read.parquet(files["customers"])
    cfg = resolve(spark)
    input_bytes = n_orders * 32 + n_customers * 48        # Arrow bytes of the joined columns
    partitions = args.partitions or max(2 * cfg.slots,
                                        math.ceil(input_bytes / (4 * cfg.budget_bytes)))
    print(f"join input ~{format_size(input_bytes)} vs budget {format_size(budget)} per "
          f"executor ({cfg.slots} task slots, {format_size(cfg.budget_bytes)} each); "
          f"{partitions} partitions", file=out)

    # First-job costs (the JVM's JIT, starting Python workers and their imports) would be
    # charged to whichever plan runs first: both plans run once on a small slice, untimed.
    t = time.time()
    few_o = orders.select("customer_id", "amount").limit(10_000)
    few_c = customers.select("customer_id", "region").limit(10_000)
    snapshot_reduce(snapshot_join(few_o, few_c, "customer_id", num_partitions=cfg.slots),
                    "region", {"orders": ("count", None)}, num_partitions=cfg.slots).collect()
    few_o.join(few_c, "customer_id").groupBy("region").count().collect()
    print(f"warmed up both plans on a small slice in {time.time() - t:.1f} s", file=out)

    metrics = JobMetrics(spark)
    t = time.time()
    with SparkStages(spark.sparkContext, "arrangedb", out):
        joined = snapshot_join(orders.select("customer_id", "amount"),
                               customers.select("customer_id", "region"), "customer_id",
                               num_partitions=partitions, metrics=metrics)
        result = snapshot_reduce(joined, "region", {"orders": ("count", None),
                                                    "amount": ("sum", "amount")},
                                 num_partitions=cfg.slots, metrics=metrics)
        rows = sorted(result.collect(), key=lambda r: r["region"])
    ours = time.time() - t
    m = metrics.value

    print("\nregion        orders        amount", file=out)
    for r in rows:
        print(f"{r['region']:<10} {r['orders']:>9,} {r['amount']:>17,.2f}", file=out)
    limit = cfg.budget_bytes + RSS_ALLOWANCE
    print(f"\narrangedb on Spark: {ours:.1f} s, {m['rows_in']:,} rows in, "
          f"{format_size(m['bytes_spilled'])} spilled", file=out)
    print(f"  peak RSS per task over its start: {format_size(m['max_task_peak_rss_bytes'])} "
          f"(budget {format_size(cfg.budget_bytes)} + allowance "
          f"{format_size(RSS_ALLOWANCE)} = {format_size(limit)}; "
          f"{m['over_budget_tasks']} of {m['tasks']} tasks over)", file=out)

    status = 0 if m["over_budget_tasks"] == 0 else 1
    if not args.skip_spark_baseline:
        t = time.time()
        with SparkStages(spark.sparkContext, "spark sort-merge join", out):
            spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
            theirs_rows = sorted(
                orders.join(customers, "customer_id").groupBy("region")
                .agg(F.count("*").alias("orders"), F.sum("amount").alias("amount")).collect(),
                key=lambda r: r["region"])
        theirs = time.time() - t
        same = len(rows) == len(theirs_rows) and all(
            a["region"] == b["region"] and a["orders"] == b["orders"]
            and math.isclose(a["amount"], b["amount"], rel_tol=1e-9)
            for a, b in zip(rows, theirs_rows))
        print(f"Spark's own sort-merge join: {theirs:.1f} s; arrangedb is "
              f"{theirs / ours:.2f}x its speed; results {'equal' if same else 'DIFFER'}",
              file=out)
        status = status or (0 if same else 1)
    spark.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
