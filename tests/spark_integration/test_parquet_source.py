"""The cold path from Parquet: tasks read the files' row groups with pyarrow, route the
rows to partitions by Spark's hash and arrange each partition's rows -- checked against the
general path (every row through Spark's shuffle and mapInArrow), partition by partition."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.spark

from arrangedb import Engine  # noqa: E402
from arrangedb.spark_integration import (  # noqa: E402
    ArrangedDataset, arrange_df, arrange_parquet, snapshot_join)
from arrangedb.spark_integration.dataset_tasks import load_partition  # noqa: E402
from arrangedb.spark_integration.parquet_source import (  # noqa: E402
    plain_parquet_scan, plan_splits)


def write_files(root, n_files=3, rows=3000, seed=0, null_key=False):
    """Orders-like files: several files, several row groups each, repeated keys, a
    string key column, nulls and repeats among the vals."""
    rng = np.random.default_rng(seed)
    os.makedirs(root, exist_ok=True)
    for i in range(n_files):
        cid = rng.integers(0, 400, rows)
        t = pa.table({
            "cid": pa.array(cid, pa.int64()),
            "tag": pa.array(rng.choice(["a", "bb", "ccc", "é"], rows)),
            "amount": pa.array(np.round(rng.random(rows) * 100, 2),
                               mask=rng.random(rows) < 0.05),
            "qty": pa.array(rng.integers(0, 3, rows), pa.int32()),
            "extra": pa.array(rng.random(rows)),
        })
        if null_key and i == n_files - 1:
            t = t.set_column(0, "cid", pa.array(cid, pa.int64(), mask=cid < 20))
        pq.write_table(t, os.path.join(root, f"part-{i}.parquet"), row_group_size=700)
    return root


def partitions(ds: ArrangedDataset, tmp) -> list[pa.Table]:
    """Each partition's consolidated updates, in a canonical order."""
    layout = ds.layout()
    out = []
    with Engine(spill_dir=str(tmp), memory_budget="64MiB") as engine:
        for pid in range(ds.num_partitions):
            t = load_partition(engine, layout, pid).snapshot().read_all()
            out.append(t.sort_by([(c, "ascending") for c in t.column_names]))
    return out


def test_a_plain_parquet_scan_is_recognised(spark, tmp_path):
    from pyspark.sql import functions as F

    root = write_files(str(tmp_path / "files"), n_files=2, rows=50)
    df = spark.read.parquet(root)
    files = plain_parquet_scan(df)
    assert sorted(os.path.basename(f) for f in files) == ["part-0.parquet", "part-1.parquet"]
    assert plain_parquet_scan(df.select("cid", "amount")) == files
    for computed in (df.filter(F.col("qty") > 0), df.withColumn("x", F.col("qty") + 1),
                     df.select((F.col("qty") + 1).alias("qty")), df.repartition(2),
                     spark.createDataFrame([(1, 2.0)], "cid long, amount double")):
        assert plain_parquet_scan(computed) is None
    parted = str(tmp_path / "parted")
    df.write.partitionBy("qty").parquet(parted)
    assert plain_parquet_scan(spark.read.parquet(parted)) is None   # values in dir names


def test_splits_cover_every_row_group_once_in_order(tmp_path):
    root = write_files(str(tmp_path / "files"), n_files=3, rows=3000)   # 5 groups a file
    files = sorted(os.path.join(root, f) for f in os.listdir(root))
    groups = [(f, g) for f in files for g in range(5)]
    for target in (1, 30_000, 60_000, 10**12):
        splits = plan_splits(files, ["cid", "amount"], target)
        assert [(f, g) for s in splits for f, gs in s.units for g in gs] == groups
        assert sum(s.rows for s in splits) == 9000
        assert all(s.nbytes <= target or sum(len(gs) for _, gs in s.units) == 1
                   for s in splits)
    assert len(plan_splits(files, ["cid", "amount"], 1)) == 15
    assert len(plan_splits(files, ["cid", "amount"], 10**12)) == 1


def test_the_cold_path_arranges_what_the_general_path_does(spark, tmp_path):
    root = write_files(str(tmp_path / "files"))
    scan = spark.read.parquet(root).select("cid", "tag", "amount", "qty")
    cold = arrange_df(scan, key=["cid", "tag"], path=str(tmp_path / "cold"), num_partitions=3)
    general = arrange_df(scan.repartition(2), key=["cid", "tag"],
                         path=str(tmp_path / "general"), num_partitions=3)
    assert cold.schema == general.schema
    got, want = partitions(cold, tmp_path), partitions(general, tmp_path)
    assert [t.num_rows for t in got] == [t.num_rows for t in want]
    assert all(g.equals(w) for g, w in zip(got, want))
    # the routed files are gone: one committed directory per partition
    for pid in range(3):
        assert len(os.listdir(tmp_path / "cold" / f"part-{pid:05d}")) == 1
    # and a query reads it as it reads any arranged dataset
    customers = spark.createDataFrame([(i, tag, f"r{i % 3}") for i in range(0, 400, 2)
                                       for tag in ("a", "é")], "cid long, tag string, region string")
    def rows(df):
        return sorted((tuple(sorted(r.asDict().items())) for r in df.collect()), key=repr)
    on = ["cid", "tag"]
    assert rows(snapshot_join(cold, customers, on=on)) == rows(scan.join(customers, on))


def test_arrange_parquet_reads_files_and_directories(spark, tmp_path):
    root = write_files(str(tmp_path / "files"), n_files=2, rows=500)
    ds = arrange_parquet(spark, [root], key="cid", vals=["amount"], path=str(tmp_path / "a"),
                         num_partitions=2, time=5)
    assert (ds.key, ds.vals, ds.times()) == (["cid"], ["amount"], [5])
    assert ds.schema == pa.schema([("cid", pa.int64()), ("amount", pa.float64())])
    whole = pa.concat_tables(partitions(ds, tmp_path))
    src = pq.read_table(root, columns=["cid", "amount"])
    assert whole.num_rows == src.group_by(["cid", "amount"]).aggregate([]).num_rows
    assert whole.column("count").to_numpy().sum() == src.num_rows
    with pytest.raises(KeyError, match="nope"):
        arrange_parquet(spark, root, key="nope", path=str(tmp_path / "b"))
    with pytest.raises(Exception, match="unique=True, but keys"):   # raised in a task
        arrange_parquet(spark, root, key="cid", path=str(tmp_path / "c"), unique=True)
    assert not os.path.exists(tmp_path / "c" / "_arrangedb_dataset.json")


def test_a_null_key_fails_the_arrange_and_leaves_nothing(spark, tmp_path):
    root = write_files(str(tmp_path / "files"), n_files=2, rows=300, null_key=True)
    with pytest.raises(Exception, match="holds nulls"):
        arrange_df(spark.read.parquet(root), key="cid", path=str(tmp_path / "d"),
                   num_partitions=2)
    left = [d for p in os.listdir(tmp_path / "d") if p.startswith("part-")
            for d in os.listdir(tmp_path / "d" / p)]
    assert left == [] and not os.path.exists(tmp_path / "d" / "_arrangedb_dataset.json")


def test_small_parquet_inserts_are_routed_by_the_driver(spark, tmp_path):
    """An insert or upsert whose DataFrame is a small Parquet scan is routed to the
    partitions by the driver (no scan-and-shuffle stage): the same dataset as the
    general path's, with a view stepped in the same job, and no routed file left."""
    from arrangedb.spark_integration import parquet_source, snapshot_reduce

    root = write_files(str(tmp_path / "base"), n_files=1, rows=2000)
    base = spark.read.parquet(root).select("cid", "tag", "amount", "qty")
    rng = np.random.default_rng(3)
    delta = pq.read_table(root).slice(0, 300).append_column(
        "diff", pa.array(rng.choice([-1, 1], 300), pa.int64()))
    os.makedirs(tmp_path / "delta")
    pq.write_table(delta, str(tmp_path / "delta" / "d.parquet"))
    customers = arrange_df(spark.createDataFrame([(i, f"r{i % 3}") for i in range(400)],
                                                 "cid long, region string"),
                           "cid", path=str(tmp_path / "customers"), num_partitions=3)
    datasets = {}
    for route in (True, False):
        ds = arrange_df(base.repartition(2), key="cid", path=str(tmp_path / f"o{route}"),
                        num_partitions=3)
        aggs = {"n": ("count", None), "amount": ("sum", "amount")}
        joined = snapshot_join(ds, customers, "cid")
        snapshot_reduce(joined, "region", aggs, since=0).collect()   # starts the view
        dpath = str(tmp_path / "delta")
        frame = spark.read.parquet(dpath)
        frame = frame if route else frame.repartition(2)   # not a plain scan
        assert (parquet_source.plain_parquet_scan(frame) is not None) == route
        t = ds.insert(frame, diff="diff")
        changes = snapshot_reduce(joined, "region", aggs, since=t).collect()
        datasets[route] = (ds, sorted(map(tuple, changes), key=repr))
        left = [f for p in os.listdir(ds.path) if p.startswith("part-")
                for f in os.listdir(os.path.join(ds.path, p)) if f.endswith(".arrow")]
        assert left == []
    (routed, routed_changes), (general, general_changes) = datasets[True], datasets[False]
    assert routed_changes == general_changes and routed_changes
    assert all(a.equals(b) for a, b in zip(partitions(routed, tmp_path),
                                           partitions(general, tmp_path)))
