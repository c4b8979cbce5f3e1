"""What runs inside the tasks that read and write an arranged dataset's partitions.

Each writing task saves the trace of its partition's new updates into a directory of its
own (``part-NNNNN/cVVVVVV-aTTTT``, T: Spark's task attempt id) and reports one row
(partition, dir, updates); the driver commits (see :mod:`.dataset`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrangedb.pager import disk
from arrangedb.spark_integration.dataset import (Layout, attempt_prefix, check_keys, part_dir,
                                                parts_at, read_manifest, resolve_at)
from arrangedb.spark_integration.task import Refused, Task, task_ids

TIME = "__arrangedb_time"
DIFF = "__arrangedb_diff"
REPORT = pa.schema([("partition", pa.int64()), ("dir", pa.string()), ("updates", pa.int64())])


def load_partition(engine, layout: Layout, pid: int):
    """Partition ``pid`` of a dataset at ``layout.at``: its directories mapped in place
    as one trace; then the updates of ``layout.fresh`` (a view's step), at
    ``layout.floor`` or later."""
    dirs = [os.path.join(layout.root, d) for d in layout.parts[pid]]
    if not layout.fresh and not all(os.path.isdir(d) for d in dirs):
        # a compaction since the query was planned replaced them: the same time, read
        # from the commits that hold it now
        m = read_manifest(layout.root)
        dirs = [os.path.join(layout.root, d)
                for d in parts_at(m, resolve_at(m, layout.at, layout.root))[pid]]
    fresh = [_at_least(engine.load(os.path.join(layout.root, d)).changes(0), layout.floor)
             for _time, parts in layout.fresh for d in parts[pid]]
    if not dirs:
        trace = engine.arrange(layout.schema.empty_table(), key=layout.key, vals=layout.vals)
        for f in fresh:
            trace.insert(f)
        return trace
    return engine.load_all(dirs, then=fresh)


def _at_least(reader: pa.RecordBatchReader, floor: int) -> pa.RecordBatchReader:
    """The updates with each time moved up to ``floor`` if it is earlier."""
    i = reader.schema.get_field_index("time")

    def gen():
        for rb in reader:
            t = pc.max_element_wise(rb.column(i), pa.scalar(floor, rb.column(i).type))
            yield pa.RecordBatch.from_arrays(
                [t if j == i else c for j, c in enumerate(rb.columns)], schema=reader.schema)
    return pa.RecordBatchReader.from_batches(reader.schema, gen())


@dataclass
class WriteSpec:
    root: str
    key: list[str]
    vals: list[str]
    schema: pa.Schema           # key columns then vals, as stored
    version: int                # the commit the written directories belong to
    time: int | None            # the time of every update (None: the rows' TIME column)
    diff: str | None            # the column of multiplicities (None: +1 each)
    cfg: object
    metrics: object
    unique: bool = False
    current: Layout | None = None   # the dataset before the write (upserts, deletes)
    mode: str = "insert"        # insert, upsert, delete, compact, arrange
    compact_before: int | None = None
    num_partitions: int = 0     # the dataset's (the cold path routes rows to them)
    routed: dict | None = None  # partition -> its rows' Arrow files (routed by the driver)


def save_attempt(trace, root: str, version: int, pid: int, attempt: int):
    """Save partition ``pid``'s trace as task attempt ``attempt``'s directory of commit
    ``version`` under the dataset ``root``; the report row (no directory when empty)."""
    n = trace.stats()["updates"]
    if n == 0:
        return pa.record_batch({"partition": [pid], "dir": [""], "updates": [0]},
                               schema=REPORT)
    rel = f"{part_dir(pid)}/{attempt_prefix(version)}a{attempt}"
    os.makedirs(os.path.join(root, part_dir(pid)), exist_ok=True)
    trace.save(os.path.join(root, rel))   # page files, manifest, directory: fsync'd
    # the new directory's entry, and its partition's, before a manifest names them
    disk().fsync_dir(os.path.join(root, part_dir(pid)))
    disk().fsync_dir(root)
    return pa.record_batch({"partition": [pid], "dir": [rel], "updates": [n]}, schema=REPORT)


def _with_time(rb: pa.RecordBatch, spec: WriteSpec) -> pa.RecordBatch:
    arrays = [rb.column(c) for c in spec.schema.names]
    arrays.append(pa.array(np.full(rb.num_rows, spec.time, np.int64)))
    if spec.diff is not None:
        d = rb.column(spec.diff)
        if d.null_count:
            raise ValueError(f"the diff column {spec.diff!r} holds nulls")
        arrays.append(d.cast(pa.int64()))
    return pa.RecordBatch.from_arrays(arrays, schema=_updates_schema(spec))


def _updates_schema(spec: WriteSpec) -> pa.Schema:
    fields = list(spec.schema) + [pa.field(TIME, pa.int64())]
    if spec.diff is not None:
        fields.append(pa.field(DIFF, pa.int64()))
    return pa.schema(fields)


def write_partition(batches, spec: WriteSpec):
    """One partition's new updates (insert, upsert, delete), or all of its updates
    (arrange, compact), saved as a trace in the task attempt's own directory."""
    pid, attempt = task_ids()
    task = Task(spec.cfg, spec.metrics)
    with task.engine() as engine:
        out = save_attempt(written_trace(engine, batches, spec, pid, task), spec.root,
                           spec.version, pid, attempt)
        task.report(engine)
    yield out


def written_trace(engine, batches, spec: WriteSpec, pid: int, task: Task):
    """The trace a writing task saves for partition ``pid``."""
    if spec.routed is not None:   # the rows come from files, the input only starts the task
        for _ in batches:
            pass
        batches = mapped_batches([os.path.join(spec.root, f)
                                  for f in spec.routed.get(pid, [])])
    if spec.mode == "compact":
        for _ in batches:
            pass
        trace = load_partition(engine, spec.current, pid)
        handle = trace.handle()
        handle.set_logical_compaction(spec.compact_before)
        trace.merge_all()
        return trace
    if spec.mode in ("upsert", "delete"):
        return _retract_and_replace(engine, batches, spec, pid, task)

    def rows():
        for rb in batches:
            task.rows_in += rb.num_rows
            check_keys(rb, spec.key)
            yield _with_time(rb, spec)
    trace = engine.arrange(pa.RecordBatchReader.from_batches(_updates_schema(spec), rows()),
                           key=spec.key, vals=spec.vals, time=TIME,
                           diff=DIFF if spec.diff is not None else None)
    if spec.mode == "arrange":
        trace.merge_all()   # pay for the merge once: later reads walk one batch
        if spec.unique:
            _check_unique(trace, spec.key)
    elif spec.unique:
        _check_unique_insert(engine, trace, spec, pid)
    return trace


def _check_unique(trace, keys) -> None:
    st = trace.stats()
    if st["keys"] != st["updates"]:
        raise Refused(f"unique=True, but keys {keys} repeat: {st['updates']} rows hold "
                      f"{st['keys']} distinct keys")


def _check_unique_insert(engine, trace, spec: WriteSpec, pid: int) -> None:
    """An insert into a unique dataset leaves each key at most one row, and retracts
    only rows it holds: the touched keys' rows before it plus the insert's net count of
    each row, per block of the keys it touches (one batched lookup each)."""
    current = load_partition(engine, spec.current, pid)
    cols = spec.key + spec.vals
    for b in trace.snapshot():   # the insert's net rows, in key order
        new = pa.table({c: b.column(c) for c in cols + ["count"]})
        keys = new.select(spec.key).group_by(spec.key).aggregate([])
        old = current.lookup(keys, at=spec.current.at)
        old = pa.table({c: old.column(c).cast(new.schema.field(c).type)
                        for c in cols + ["count"]})
        net = pa.concat_tables([new, old]).group_by(cols, use_threads=False).aggregate(
            [("count", "sum")])
        counts = net.column("count_sum").to_numpy(zero_copy_only=False)
        if (counts < 0).any():
            some = net.filter(pa.array(counts < 0)).select(cols).slice(0, 3).to_pylist()
            raise Refused(f"insert: the dataset is unique=True on key column(s) {spec.key}, "
                          f"and the insert retracts rows it does not hold: {some}")
        held = net.filter(pa.array(counts > 0)).group_by(spec.key).aggregate(
            [("count_sum", "sum")])
        repeated = held.filter(pc.greater(held.column("count_sum_sum"), 1))
        if repeated.num_rows:
            some = repeated.select(spec.key).slice(0, 3).to_pylist()
            raise Refused(f"insert: the dataset is unique=True on key column(s) {spec.key}, "
                          f"and the insert would give keys {some} a second row; use "
                          f"upsert to replace a key's row")


def _retract_and_replace(engine, batches, spec: WriteSpec, pid: int, task: Task):
    """Upsert: the new rows at the time, and the retraction of each key's current row;
    delete: the retractions alone. The input is arranged first, within the budget as an
    insert's rows are; its keys, walked in order, are checked once each and looked up
    in the current rows a block at a time (one batched lookup each)."""
    import arrangedb as adb

    cols = spec.key if spec.mode == "delete" else spec.schema.names
    fields = [spec.schema.field(c) for c in cols] + [pa.field(TIME, pa.int64())]

    def rows():
        for rb in batches:
            task.rows_in += rb.num_rows
            check_keys(rb, spec.key)
            yield pa.RecordBatch.from_arrays(
                [rb.column(f.name).cast(f.type) for f in fields[:-1]]
                + [pa.array(np.full(rb.num_rows, spec.time, np.int64))], schema=pa.schema(fields))
    incoming = engine.arrange(pa.RecordBatchReader.from_batches(pa.schema(fields), rows()),
                              key=spec.key, vals=cols[len(spec.key):], time=TIME)
    current = load_partition(engine, spec.current, pid)
    retracted = pa.schema(list(spec.schema) + [pa.field(TIME, pa.int64()),
                                               pa.field(DIFF, pa.int64())])

    def retractions():
        for out in adb.reduce(incoming, {"__n": ("count", None)}):
            keys = pa.table([out.column(k) for k in spec.key], names=spec.key)
            repeated = np.flatnonzero(out.column("__n").to_numpy(zero_copy_only=False) != 1)
            if repeated.size:
                raise Refused(f"{spec.mode}: the input repeats keys (e.g. "
                              f"{keys.take(pa.array(repeated[:3])).to_pylist()}); each key "
                              f"may appear once")
            old = current.lookup(keys, at=spec.current.at)
            if old.num_rows:
                counts = old.column("count").to_numpy(zero_copy_only=False).astype(np.int64)
                yield from pa.table(
                    [old.column(c) for c in spec.schema.names]
                    + [pa.array(np.full(old.num_rows, spec.time, np.int64)), pa.array(-counts)],
                    schema=retracted).to_batches()
    gone = engine.arrange(pa.RecordBatchReader.from_batches(retracted, retractions()),
                          key=spec.key, vals=spec.vals, time=TIME, diff=DIFF)
    if spec.mode == "delete":
        return gone
    # both at the write's time, which neither trace accepts once arranged: merged anew
    new, old = incoming.changes(0), gone.changes(0)
    both = (pa.RecordBatch.from_arrays(rb.columns, schema=new.schema)
            for reader in (new, old) for rb in reader)
    return engine.arrange(pa.RecordBatchReader.from_batches(new.schema, both), key=spec.key,
                          vals=spec.vals)


def route_split(batches, spec: WriteSpec, splits: list):
    """Stage 1 of the cold path from Parquet (:mod:`.parquet_source`): read this task's
    row groups and write the rows of each partition they hash to as one Arrow file, in
    the order read (stage 2 sorts each partition once); one report row per file."""
    from arrangedb.spark_integration.parquet_source import read_split, route_rows

    for _ in batches:   # the task's one input row names its split
        pass
    index, attempt = task_ids()
    task = Task(spec.cfg, spec.metrics)
    table = read_split(splits[index], spec.schema)
    task.rows_in += table.num_rows
    check_keys(table, spec.key)
    written = route_rows(table, spec.key, spec.num_partitions, spec.root,
                         f"{attempt_prefix(spec.version)}r{index:05d}a{attempt}")
    yield pa.record_batch({"partition": [w[0] for w in written], "dir": [w[1] for w in written],
                           "updates": [w[2] for w in written]}, schema=REPORT)


def arrange_routed(batches, spec: WriteSpec, routed: dict):
    """Stage 2 of the cold path from Parquet: arrange this partition's routed rows (one
    sort, as the general path's tasks do) into the directory the driver commits."""
    for _ in batches:
        pass
    pid, attempt = task_ids()
    task = Task(spec.cfg, spec.metrics)
    files = [os.path.join(spec.root, f) for f in routed.get(pid, [])]

    def rows():
        for rb in mapped_batches(files):
            task.rows_in += rb.num_rows
            yield _with_time(rb, spec)
    with task.engine() as engine:
        trace = engine.arrange(pa.RecordBatchReader.from_batches(_updates_schema(spec), rows()),
                               key=spec.key, vals=spec.vals, time=TIME)
        trace.merge_all()
        if spec.unique:
            _check_unique(trace, spec.key)
        out = save_attempt(trace, spec.root, spec.version, pid, attempt)
        task.report(engine)
    yield out


def mapped_batches(files):
    """The record batches of routed Arrow files, memory-mapped: no copy before a sort."""
    for f in files:
        with pa.memory_map(f) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)
