"""The cold path from Parquet files: tasks read row groups with pyarrow, never through
the JVM.

A DataFrame read from Parquet and arranged through ``mapInArrow`` crosses the JVM twice:
Spark decodes every row, shuffles it by key and converts it back to Arrow for the Python
worker. When the DataFrame is a plain scan of Parquet files (columns selected, nothing
computed), ``arrange_df`` instead reads the files itself, in two Spark jobs:

1. *route*: each task reads its share of the row groups (about 1/:data:`SPLIT_SHARE`
   of a task's budget, in bytes of the selected columns) with pyarrow, computes each
   row's partition with Spark's own hash (:func:`.hashing.partition_ids`), and writes
   the rows of each partition as one Arrow file into the dataset's directory: the
   exchange goes through the dataset's storage, as Spark's bucketed writes do;
2. *arrange*: each partition's task arranges its routed files (mapped, not copied)
   with one sort, as a task of the general path arranges its shuffled rows.

The driver commits the arranged directories as the dataset's first time; the routed
files, named with the same commit's prefix, are removed with the attempts that lost.
Spark still schedules, retries and places every task. Sorting runs per route task and
merging them per partition was measured slower: the merge of a partition's runs cost
as much as the sorts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

# Bytes of selected columns (uncompressed) a route task reads, as a share of its budget:
# the rows, their copy sorted by partition and the runs being written fit beside it.
SPLIT_SHARE = 8


@dataclass(frozen=True)
class Split:
    """The row groups one route task reads: ``(file, [row group, ...])`` pairs."""
    units: tuple
    rows: int
    nbytes: int


def plain_parquet_scan(df) -> list[str] | None:
    """The files ``df`` reads when it is a plain Parquet scan -- a file relation with no
    partition columns, under at most a selection of its columns -- else None."""
    try:
        plan = df._jdf.queryExecution().optimizedPlan()
        if plan.getClass().getSimpleName() == "Project":
            exprs = plan.projectList()
            if any(exprs.apply(i).getClass().getSimpleName() != "AttributeReference"
                   for i in range(exprs.size())):
                return None
            plan = plan.child()
        if plan.getClass().getSimpleName() != "LogicalRelation":
            return None
        relation = plan.relation()
        if relation.getClass().getSimpleName() != "HadoopFsRelation":
            return None
        if relation.fileFormat().getClass().getSimpleName() != "ParquetFileFormat":
            return None
        if relation.partitionSchema().size() != 0:
            return None
        files = list(df.inputFiles())
    except Exception:   # a plan of another shape (or another Spark): the general path
        return None
    local = [_local_path(f) for f in files]
    return local if local and all(p is not None for p in local) else None


def _local_path(uri: str) -> str | None:
    """A path pyarrow opens as a file, or None (remote schemes take the general path)."""
    if uri.startswith("file:"):
        from urllib.parse import unquote, urlparse

        return unquote(urlparse(uri).path)
    return uri if uri.startswith("/") else None


def parquet_files(paths) -> list[str]:
    """The Parquet files under ``paths`` (files, or directories walked; names starting
    with ``_`` or ``.`` skipped, as Spark skips them)."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not paths:
        raise ValueError("no Parquet paths given")
    files = []
    for p in paths:
        p = os.path.abspath(os.fspath(p))
        files += pads.dataset(p, format="parquet").files if os.path.isdir(p) else [p]
    if not files:
        raise FileNotFoundError(f"no Parquet files under {paths}")
    return sorted(files)


def file_schema(files: list[str]) -> pa.Schema:
    return pq.read_schema(files[0])


def plan_splits(files: list[str], columns: list[str], target_bytes: int) -> list[Split]:
    """Row groups packed in file order into splits of about ``target_bytes`` of the
    selected columns each (a row group larger than that is a split of its own)."""
    splits, units, rows, nbytes = [], [], 0, 0

    def close():
        nonlocal units, rows, nbytes
        if units:
            splits.append(Split(tuple((f, tuple(g)) for f, g in units), rows, nbytes))
        units, rows, nbytes = [], 0, 0

    for f in files:
        meta = pq.ParquetFile(f).metadata
        names = [meta.schema.column(i).path.split(".")[0] for i in range(meta.num_columns)]
        wanted = [i for i, name in enumerate(names) if name in columns]
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            size = sum(rg.column(i).total_uncompressed_size for i in wanted)
            if units and nbytes + size > target_bytes:
                close()
            if units and units[-1][0] == f:
                units[-1][1].append(g)
            else:
                units.append((f, [g]))
            rows += rg.num_rows
            nbytes += size
    close()
    return splits


def read_split(split: Split, schema: pa.Schema) -> pa.Table:
    """The split's rows, the dataset's columns cast to its types."""
    tables = [pq.ParquetFile(f).read_row_groups(list(groups), columns=schema.names,
                                                use_threads=False)
              for f, groups in split.units]
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    return table.select(schema.names).cast(schema)


# Inputs of a write (insert, upsert, delete) up to this many bytes of their columns,
# uncompressed, are routed by the driver: a day's delta then needs no scan-and-shuffle
# stage before the writing tasks.
DRIVER_ROUTE_MAX_BYTES = 64 << 20


def route_on_driver(df, columns: list[str], schema: pa.Schema, keys: list[str], n: int,
                    root: str, prefix: str) -> dict | None:
    """For a small plain Parquet scan: its ``columns`` read here, cast to ``schema``,
    and each partition's rows written as ``part-NNNNN/<prefix>d.arrow`` under ``root``
    (removed with the commit's losing attempts); partition -> [file]. None when ``df``
    is not a plain scan or is larger than :data:`DRIVER_ROUTE_MAX_BYTES`."""
    from arrangedb.spark_integration.dataset import check_keys

    files = plain_parquet_scan(df)
    if files is None:
        return None
    splits = plan_splits(files, columns, DRIVER_ROUTE_MAX_BYTES)
    if len(splits) != 1 or splits[0].nbytes > DRIVER_ROUTE_MAX_BYTES:
        return None
    table = read_split(splits[0], schema)
    check_keys(table, keys)
    return {pid: [rel] for pid, rel, _ in route_rows(table, keys, n, root, f"{prefix}d")}


# Rows per batch of a routed file: its arrange reads them a batch at a time.
ROUTE_BATCH_ROWS = 1 << 20


def route_rows(table: pa.Table, keys: list[str], n: int, root: str,
               name: str) -> list[tuple[int, str, int]]:
    """Each of the ``n`` partitions' rows of ``table`` (by Spark's hash of ``keys``, which
    hold no nulls), in the order given, written as ``part-NNNNN/<name>.arrow`` under
    ``root``; ``(partition, file, rows)`` for each file written."""
    import numpy as np

    from arrangedb.spark_integration.dataset import part_dir
    from arrangedb.spark_integration.hashing import partition_ids

    pids = partition_ids(table, keys, n)
    if n <= 1 << 16:   # numpy sorts 16-bit integers by radix: linear in the rows
        pids = pids.astype(np.uint16)
    ends = np.cumsum(np.bincount(pids, minlength=n)).tolist()
    table = table.take(pa.array(np.argsort(pids, kind="stable")))
    written, start = [], 0
    for pid, end in enumerate(ends):
        if end > start:
            rel = f"{part_dir(pid)}/{name}.arrow"
            os.makedirs(os.path.join(root, part_dir(pid)), exist_ok=True)
            with pa.OSFile(os.path.join(root, rel), "wb") as sink, \
                    pa.ipc.new_file(sink, table.schema) as out:
                out.write_table(table.slice(start, end - start), max_chunksize=ROUTE_BATCH_ROWS)
            written.append((pid, rel, end - start))
        start = end
    return written
