"""Aggregates of a join of two arranged datasets, kept up to date from the inputs'
changes: the Spark form of a maintained view (see docs/SPARK.md). This module holds
the view's spec and what its tasks run; :mod:`.views` the driver's side.

The view is itself an arranged dataset, under ``<left>/_views/<id>``: keyed by the
group columns (nulls made safe), its values the group's partial aggregates (row count,
per-aggregate counts and sums), partitioned by the group columns. A step from the view's
time ``v`` to ``upto``:

1. Each join partition reads both inputs at ``upto - 1`` and computes the join's changes
   in ``[v + 1, upto)`` (dA x B + A' x dB, from the inputs' changes and state), partially
   aggregated per (group, time): only these small partials leave the task.
2. Shuffled by group, each view partition looks up its changed groups' current state
   (one batched lookup), adds the per-time deltas in time order (vectorized cumulative
   sums within groups) and writes, per changed group and time, the retraction of the
   old state and the new state: a commit of the view dataset (:mod:`.dataset`).

The output's changes in ``[since, upto)`` are then the view's own changes, read from the
view's partitions and finished into aggregates; a step's changes, when few (as the
per-region changes of a day), are also kept in its manifest: reading them runs no job.

An ``insert`` (``upsert``, ``delete``) into an input of an up-to-date view steps the
view in the insert's own job: each writing task joins its partition's new updates with
the other input's partition, and the partials go on to the view's tasks -- one job, two
commits (the dataset's, then the view's; a view left behind by a crash between them is
stepped by its next read). Count, sum and mean are linear, so their state is exact; min,
max and count_distinct would need each group's multiset: refused here (``at=`` reads them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrangedb.spark_integration.dataset import Layout
from arrangedb.spark_integration.dataset_tasks import (REPORT, WriteSpec, load_partition,
                                                      save_attempt, written_trace)
from arrangedb.spark_integration.partition import NULLS, null_safe_keys, restore_null_keys
from arrangedb.spark_integration.task import Task, task_ids

INLINE_ROWS = 4096
"""A step whose output changes have at most this many rows keeps them in the manifest."""
ROWS = "__rows"
ROWS_PARTIAL = f"__{ROWS}__n"     # its partial column (ops.partials.partial_names)
TIME, DIFF = "time", "diff"


def state_aggs(aggs: dict, source: pa.Schema, where: str) -> dict:
    """The linear aggregates a group's state holds: a row count, and a count and sum per
    output (a mean is its sum over its count)."""
    state = {ROWS: ("count", None)}
    for name, (fn, col) in aggs.items():
        if fn not in ("count", "sum", "mean"):
            raise ValueError(f"{where}: since=/upto= keep count, sum and mean up to date "
                             f"from changes; {name!r} is {fn} (read it at two times with "
                             f"at= instead)")
        if col is not None and pa.types.is_decimal(source.field(col).type):
            raise ValueError(f"{where}: since=/upto= do not support {fn} of the decimal "
                             f"column {col!r} yet; cast it to double or read at= twice")
        if fn == "count":
            state[name] = (fn, col)
        else:
            state[f"{name}__sum"] = ("sum", col)
            if fn == "mean":
                state[f"{name}__count"] = ("count", col)
    return state


@dataclass
class ViewSpec:
    by: list[str]
    aggs: dict                 # the outputs: name -> (fn, col)
    state: dict                # the linear aggregates held per group
    source_schema: pa.Schema   # the join's output (what the aggregates read)
    out_schema: pa.Schema      # by, the outputs (Spark's types), time, diff
    key_schema: pa.Schema      # the view's key: by (nulls made safe), NULLS
    val_schema: pa.Schema      # the state's partial columns
    root: str                  # the view's directory
    cfg: object = None
    metrics: object = None
    left: Layout | None = None    # a step's inputs: what the view saw, and what is new
    right: Layout | None = None
    step_since: int = 0        # the step's updates are at times [step_since, step_upto)
    step_upto: int = 0
    view: Layout | None = None   # the view before a step, or at the time read
    version: int = 0           # the view's commit a step writes
    since: int = 0             # the changes read: [since, upto)
    upto: int = 0


def definition(left, right, on, by, aggs, source: pa.Schema, out: pa.Schema) -> dict:
    return {"left": left.path, "right": right.path, "on": list(on), "by": list(by),
            "aggs": {k: list(v) for k, v in aggs.items()},
            "source": source.serialize().to_pybytes().hex(),
            "out": out.serialize().to_pybytes().hex()}


def view_spec(defn: dict, root: str, cfg, metrics) -> ViewSpec:
    """The spec of the view ``defn`` describes (see :func:`definition`)."""
    from arrangedb.spark_integration.partition import ReduceSpec, partial_schema

    read = lambda h: pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(h)))  # noqa: E731
    by, aggs = defn["by"], {k: tuple(v) for k, v in defn["aggs"].items()}
    source, out_schema = read(defn["source"]), read(defn["out"])
    state = state_aggs(aggs, source, "snapshot_reduce")
    pschema = partial_schema(ReduceSpec(by=by, aggs=state, source_schema=source,
                                        out_schema=out_schema, cfg=cfg, metrics=metrics))
    key_schema = null_safe_keys(pschema.empty_table(), by).select(by + [NULLS]).schema
    key_schema = pa.schema([f.with_nullable(False) for f in key_schema])
    val_schema = pa.schema([f for f in pschema if f.name not in by])
    out = pa.schema(list(out_schema) + [pa.field(TIME, pa.int64()),
                                        pa.field(DIFF, pa.int64())])
    return ViewSpec(by=by, aggs=aggs, state=state, source_schema=source, out_schema=out,
                    key_schema=key_schema, val_schema=val_schema, root=root, cfg=cfg,
                    metrics=metrics)


def _partials(spec: ViewSpec):
    from arrangedb.ops.partials import Partials, partial_names

    return Partials(spec.by + [TIME], spec.state, partial_names(spec.state),
                    spec.source_schema.append(pa.field(TIME, pa.int64())), None)


ROUTE = "__arrangedb_view_partition"


def delta_schema(spec: ViewSpec) -> pa.Schema:
    """The partials a step's join tasks send to its view tasks: group columns, time, the
    state's partials, and the view partition of the group (Spark's hash of the group
    columns, :mod:`.hashing`: computed in the task, so one view task can take several
    view partitions)."""
    return pa.schema([spec.source_schema.field(b) for b in spec.by]
                     + [pa.field(TIME, pa.int64())] + list(spec.val_schema)
                     + [pa.field(ROUTE, pa.int32())])


def view_tasks(spec: ViewSpec, n: int) -> int:
    """How many tasks apply a step: one wave of the executors' slots (a step's partials
    are small), at most one per view partition."""
    return max(1, min(n, spec.cfg.slots if spec.cfg is not None else n))


VIEW_REPORT = REPORT.append(pa.field("changes", pa.binary()))
"""A view task's report: its directory, and its finished changes when few."""

_FUSED_REPORT = [("__report_partition", pa.int64()), ("__report_dir", pa.string()),
                 ("__report_updates", pa.int64())]
_TARGET = pa.field("__report_target", pa.string())


def fused_schema(spec: ViewSpec) -> pa.Schema:
    """A fused writing task's output: the view's partials, then its own report (the
    other columns null)."""
    return pa.schema([f.with_nullable(True) for f in delta_schema(spec)]
                     + [pa.field(n, t) for n, t in _FUSED_REPORT])


def fused_report_schema() -> pa.Schema:
    return VIEW_REPORT.append(_TARGET)


# -- tasks ----------------------------------------------------------------------------

def _join_partials(engine, spec: ViewSpec, pid: int, task: Task):
    """The join's changes in the step for partition ``pid``, partially aggregated per
    (group, time)."""
    import arrangedb as adb

    left = load_partition(engine, spec.left, pid)
    right = load_partition(engine, spec.right, pid)
    changes = adb.join(left, right, since=spec.step_since, upto=spec.step_upto)
    names = spec.source_schema.names + [TIME, DIFF]
    renamed = pa.RecordBatchReader.from_batches(
        pa.schema([f.with_name(n) for f, n in zip(changes.schema, names)]),
        (pa.RecordBatch.from_arrays(b.columns, names=names) for b in changes))
    from arrangedb.spark_integration.hashing import partition_ids

    target = delta_schema(spec)
    n = len(spec.left.parts)
    # a sum's state counts its values present (null once the last is retracted); group_by's
    # v counts each changed value once (SQL's sum(x * diff)): v is a diff-weighted count
    sums = [(name, col) for name, (fn, col) in spec.state.items() if fn == "sum"]
    present = {f"{name}__present": ("count", col) for name, col in sums}
    source = {f"__{name}__v": f"__{name}__present__n" for name, _ in sums}
    for out in adb.group_by(renamed, spec.by + [TIME], dict(spec.state, **present),
                            weight=DIFF, engine=engine, phase="partial"):
        task.rows_out += out.num_rows
        yield pa.RecordBatch.from_arrays(
            [out.column(source.get(f.name, f.name)).cast(f.type) for f in list(target)[:-1]]
            + [pa.array(partition_ids(out, spec.by, n), pa.int32())], schema=target)


def join_deltas(batches, spec: ViewSpec):
    """Step 1 in join partition i."""
    pid, _ = task_ids()
    task = Task(spec.cfg, spec.metrics)
    for _ in batches:
        pass
    with task.engine() as engine:
        yield from _join_partials(engine, spec, pid, task)
        task.report(engine)


def apply_deltas(batches, spec: ViewSpec):
    """Step 2: each view partition the task's partials belong to."""
    _, attempt = task_ids()
    task = Task(spec.cfg, spec.metrics)
    incoming = [rb for rb in batches if rb.num_rows]
    with task.engine() as engine:
        reports = [_apply(engine, spec, q, attempt, rows) for q, rows in _by_view_partition(
            incoming, spec)]
        task.report(engine)
    yield from reports


def _by_view_partition(batches, spec: ViewSpec):
    """(view partition, its partials without the routing column), for each partition
    the batches hold."""
    if not batches:
        return
    table = pa.Table.from_batches(batches)
    q = table.column(ROUTE).to_numpy(zero_copy_only=False)
    rows = table.drop_columns([ROUTE])
    for part in np.unique(q):
        yield int(part), rows.filter(pa.array(q == part)).to_batches()


def fused_write(batches, write: WriteSpec, spec: ViewSpec, side: str):
    """A dataset's writing task that also runs step 1 of a view over it: the partition's
    new directory is the new commit of input ``side``."""
    pid, attempt = task_ids()
    task = Task(spec.cfg, spec.metrics)
    schema = fused_schema(spec)
    with task.engine() as engine:
        report = save_attempt(written_trace(engine, batches, write, pid, task), write.root,
                              write.version, pid, attempt)
        fresh = [[] for _ in range(len(getattr(spec, side).parts))]
        if report.column("dir")[0].as_py():
            fresh[pid] = [report.column("dir")[0].as_py()]
        layout = replace(getattr(spec, side), fresh=((write.time, fresh),))
        step = replace(spec, **{side: layout})
        for rb in _join_partials(engine, step, pid, task):
            yield pa.RecordBatch.from_arrays(
                list(rb.columns) + [pa.nulls(rb.num_rows, t) for _, t in _FUSED_REPORT],
                schema=schema)
        yield pa.RecordBatch.from_arrays(
            [pa.nulls(1, f.type) for f in delta_schema(spec)] + report.columns, schema=schema)
        task.report(engine)


def fused_apply(batches, spec: ViewSpec):
    """Step 2 of a fused write; the writing tasks' reports pass through."""
    _, attempt = task_ids()
    task = Task(spec.cfg, spec.metrics)
    partials, reports = [], []
    names = delta_schema(spec).names
    for rb in batches:
        written = rb.column("__report_partition").is_valid()
        if pc.any(written).as_py():
            reports.append(rb.filter(written))
        rest = rb.filter(pc.invert(written))
        if rest.num_rows:
            partials.append(pa.RecordBatch.from_arrays(rest.columns[:len(names)],
                                                       schema=delta_schema(spec)))
    schema = fused_report_schema()
    for r in reports:
        yield pa.RecordBatch.from_arrays(
            [r.column(n) for n, _ in _FUSED_REPORT] + [pa.nulls(r.num_rows, pa.binary()),
                                                       pa.array(["dataset"] * r.num_rows)],
            schema=schema)
    with task.engine() as engine:
        outs = [_apply(engine, spec, q, attempt, rows)
                for q, rows in _by_view_partition(partials, spec)]
        task.report(engine)
    for out in outs:
        yield pa.RecordBatch.from_arrays(out.columns + [pa.array(["view"])], schema=schema)


def _apply(engine, spec: ViewSpec, pid: int, attempt: int, incoming) -> pa.RecordBatch:
    """The changed groups' states retracted and replaced, time by time, saved as the
    task attempt's directory of the view's next commit; reported with the finished
    changes when few."""
    if incoming:
        deltas = _partials(spec).of_partials(pa.Table.from_batches(incoming))
        updates = _state_updates(engine, spec, pid, deltas)
    else:
        updates = _updates_schema(spec).empty_table()
    trace = engine.arrange(updates, key=spec.key_schema.names, vals=spec.val_schema.names,
                           time=TIME, diff=DIFF)
    changes = None
    if trace.stats()["updates"] <= INLINE_ROWS:
        finished = list(_finished(trace.changes(0), spec))
        table = (pa.Table.from_batches(finished, schema=spec.out_schema) if finished
                 else spec.out_schema.empty_table())
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, spec.out_schema) as w:
            w.write_table(table)
        changes = sink.getvalue().to_pybytes()
    report = save_attempt(trace, spec.root, spec.version, pid, attempt)
    return pa.RecordBatch.from_arrays(report.columns + [pa.array([changes], pa.binary())],
                                      schema=VIEW_REPORT)


def _updates_schema(spec: ViewSpec) -> pa.Schema:
    return pa.schema(list(spec.key_schema) + list(spec.val_schema)
                     + [pa.field(TIME, pa.int64()), pa.field(DIFF, pa.int64())])


def _state_updates(engine, spec: ViewSpec, pid: int, deltas: pa.Table) -> pa.Table:
    keys = spec.key_schema.names
    vals = spec.val_schema.names
    deltas = null_safe_keys(deltas, spec.by)
    deltas = deltas.take(pc.sort_indices(deltas, [(k, "ascending") for k in keys + [TIME]]))
    n = deltas.num_rows
    starts = np.arange(n) == 0
    for k in keys:   # a group begins where any key column changes
        col = deltas.column(k).combine_chunks()
        starts[1:] |= pc.not_equal(col.slice(1), col.slice(0, n - 1)) \
            .to_numpy(zero_copy_only=False)
    gid = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    groups = deltas.select(keys).take(pa.array(first))
    old = {v: np.zeros(len(first), np.float64 if pa.types.is_floating(
        spec.val_schema.field(v).type) else np.int64) for v in vals}
    if spec.view is not None:
        current = load_partition(engine, spec.view, pid)
        found = current.lookup(groups, at=spec.view.at)
        qi = found.column("query_index").to_numpy(zero_copy_only=False)
        for v in vals:
            old[v][qi] = found.column(v).to_numpy(zero_copy_only=False)
    new, prev = {}, {}
    for v in vals:
        d = deltas.column(v).to_numpy(zero_copy_only=False).astype(old[v].dtype)
        new[v] = _running_sums(d, old[v], first, gid)
        p = np.empty_like(new[v])           # the state each row replaces: the row before
        p[1:] = new[v][:-1]                 # it in its group (exactly, not new - delta)
        p[first] = old[v]
        prev[v] = p
    time = deltas.column(TIME).to_numpy(zero_copy_only=False)
    key_cols = deltas.select(keys)
    pieces = []
    for state, diff in ((prev, -1), (new, 1)):
        rows = np.flatnonzero(state[ROWS_PARTIAL] != 0)   # a group with no rows holds no state
        if rows.size:
            idx = pa.array(rows)
            pieces.append(pa.table(
                list(key_cols.take(idx).columns) + [pa.array(state[v][rows]) for v in vals]
                + [pa.array(time[rows]), pa.array(np.full(rows.size, diff, np.int64))],
                schema=_updates_schema(spec)))
    return pa.concat_tables(pieces) if pieces else _updates_schema(spec).empty_table()


def _running_sums(d: np.ndarray, old: np.ndarray, first: np.ndarray,
                  gid: np.ndarray) -> np.ndarray:
    """Each row's group state after it: old state plus the group's deltas through the
    row. Integers by one prefix sum (exact: int64 wraps alike); floats within each group,
    so that one group's magnitude, NaN or inf never reaches another's sum."""
    if d.dtype.kind != "f":
        c = np.cumsum(d)
        base = c[first] - d[first]          # the running sum before each group's first row
        return old[gid] + (c - base[gid])
    new = d.copy()
    new[first] += old
    rank = np.arange(len(d)) - first[gid]   # a row's place in its group
    order, ends = np.argsort(rank, kind="stable"), np.cumsum(np.bincount(rank))
    for lo, hi in zip(ends[:-1], ends[1:]):   # one pass per time of the step, not per row
        rows = order[lo:hi]
        new[rows] += new[rows - 1]
    return new


def view_changes(batches, spec: ViewSpec):
    """The output's changes in [since, upto) from view partition q: its updates there,
    finished into aggregates."""
    pid, _ = task_ids()
    task = Task(spec.cfg, spec.metrics)
    for _ in batches:
        pass
    with task.engine() as engine:
        view = load_partition(engine, spec.view, pid)
        for out in _finished(view.changes(spec.since, spec.upto), spec):
            task.rows_out += out.num_rows
            yield out
        task.report(engine)


def _finished(changes: pa.RecordBatchReader, spec: ViewSpec):
    """A view's updates (state rows with time and diff) as output rows."""
    from arrangedb.ops.partials import Partials, partial_names

    finisher = Partials(spec.by, spec.state, partial_names(spec.state), spec.source_schema,
                        None)
    for rb in changes:
        if rb.num_rows == 0:
            continue
        rb = restore_null_keys(pa.RecordBatch.from_arrays(
            rb.columns, names=spec.key_schema.names + spec.val_schema.names
            + [TIME, DIFF]), spec.by)
        yield _outputs(finisher.finish(pa.Table.from_batches([rb])), spec, rb)


def _outputs(done: pa.RecordBatch, spec: ViewSpec, rb: pa.RecordBatch) -> pa.RecordBatch:
    arrays = [done.column(b) for b in spec.by]
    for name, (fn, _col) in spec.aggs.items():
        if fn == "count":
            arrays.append(done.column(name))
        elif fn == "sum":
            arrays.append(done.column(f"{name}__sum"))
        else:
            s = done.column(f"{name}__sum").cast(pa.float64())
            n = done.column(f"{name}__count")
            arrays.append(pc.if_else(pc.equal(n, 0), pa.scalar(None, pa.float64()),
                                     pc.divide(s, n.cast(pa.float64()))))
    arrays += [rb.column(TIME), rb.column(DIFF)]
    return pa.RecordBatch.from_arrays(
        [a.cast(f.type) for a, f in zip(arrays, spec.out_schema)], schema=spec.out_schema)
