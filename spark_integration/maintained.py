"""Aggregates of a join of two arranged datasets, kept up to date from the inputs'
changes: the Spark form of a maintained view (see docs/SPARK.md).

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

The output's changes in ``[since, upto)`` are then the view's own changes, read from
the view's partitions and finished into aggregates. Count, sum and mean are linear, so
their state is exact; min, max and count_distinct would need each group's multiset and
are refused here (``at=`` snapshots compute them).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrangedb.spark_integration import dataset
from arrangedb.spark_integration.dataset import Layout
from arrangedb.spark_integration.dataset_tasks import REPORT, WriteSpec, _save, _task_ids, \
    load_partition
from arrangedb.spark_integration.partition import (NULLS, _Task, null_safe_keys,
                                                   restore_null_keys)

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
    cfg: object
    metrics: object
    join: object = None        # the JoinSpec of the inputs read at upto - 1
    view: Layout | None = None   # the view at its time before the step
    root: str = ""
    version: int = 0           # the view's commit this step writes
    since: int = 0             # the changes read: [since, upto)
    upto: int = 0


def _partials(spec: ViewSpec):
    from arrangedb.ops.partials import Partials, partial_names

    return Partials(spec.by + [TIME], spec.state, partial_names(spec.state),
                    spec.source_schema.append(pa.field(TIME, pa.int64())), None)


# -- tasks ----------------------------------------------------------------------------

def join_deltas(batches, spec: ViewSpec):
    """Step 1 in join partition i: the join's changes in the step, partially
    aggregated per (group, time)."""
    import arrangedb as adb

    pid, _ = _task_ids()
    task = _Task(spec.cfg, spec.metrics)
    for _ in batches:
        pass
    with task.engine() as engine:
        left = load_partition(engine, spec.join.left, pid)
        right = load_partition(engine, spec.join.right, pid)
        changes = adb.join(left, right, since=spec.join.since, upto=spec.join.upto)
        names = spec.join.out_schema.names + [TIME, DIFF]
        renamed = pa.RecordBatchReader.from_batches(
            pa.schema([f.with_name(n) for f, n in zip(changes.schema, names)]),
            (pa.RecordBatch.from_arrays(b.columns, names=names) for b in changes))
        target = delta_schema(spec)
        for out in adb.group_by(renamed, spec.by + [TIME], spec.state, weight=DIFF,
                                engine=engine, phase="partial"):
            task.rows_out += out.num_rows
            yield pa.RecordBatch.from_arrays(
                [out.column(f.name).cast(f.type) for f in target], schema=target)
        task.report(engine)


def apply_deltas(batches, spec: ViewSpec):
    """Step 2 in view partition q: the changed groups' states retracted and replaced,
    time by time, saved as the task attempt's directory of the view's next commit."""
    pid, attempt = _task_ids()
    task = _Task(spec.cfg, spec.metrics)
    partials = _partials(spec)
    incoming = [rb for rb in batches if rb.num_rows]
    with task.engine() as engine:
        if incoming:
            deltas = partials.of_partials(pa.Table.from_batches(incoming))
            updates = _state_updates(engine, spec, pid, deltas)
        else:
            updates = pa.schema(list(spec.key_schema) + list(spec.val_schema)
                                + [pa.field(TIME, pa.int64()),
                                   pa.field(DIFF, pa.int64())]).empty_table()
        trace = engine.arrange(updates, key=spec.key_schema.names, vals=spec.val_schema.names,
                               time=TIME, diff=DIFF)
        out = _save(trace, WriteSpec(spec.root, [], [], pa.schema([]), spec.version, None,
                                     None, spec.cfg, spec.metrics), pid, attempt)
        task.report(engine)
    yield out


def _state_updates(engine, spec: ViewSpec, pid: int, deltas: pa.Table) -> pa.Table:
    keys = spec.key_schema.names
    vals = spec.val_schema.names
    deltas = null_safe_keys(deltas, spec.by)
    deltas = deltas.take(pc.sort_indices(deltas, [(k, "ascending") for k in keys + [TIME]]))
    n = deltas.num_rows
    starts = np.zeros(n, bool)
    starts[0] = True
    for k in keys:   # a group begins where any key column changes
        col = deltas.column(k).combine_chunks()
        starts[1:] |= pc.not_equal(col.slice(1), col.slice(0, n - 1)) \
            .to_numpy(zero_copy_only=False)
    gid = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    groups = deltas.select(keys).take(pa.array(first))
    old = {v: np.zeros(len(first), _dtype(spec.val_schema.field(v).type)) for v in vals}
    if spec.view is not None:
        current = load_partition(engine, spec.view, pid)
        found = current.lookup(groups, at=spec.view.at)
        qi = found.column("query_index").to_numpy(zero_copy_only=False)
        for v in vals:
            old[v][qi] = found.column(v).to_numpy(zero_copy_only=False)
    new, prev = {}, {}
    for v in vals:
        d = deltas.column(v).to_numpy(zero_copy_only=False).astype(old[v].dtype)
        c = np.cumsum(d)
        base = c[first] - d[first]          # the running sum before each group's first row
        new[v] = old[v][gid] + (c - base[gid])
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
                schema=pa.schema(list(spec.key_schema) + list(spec.val_schema)
                                 + [pa.field(TIME, pa.int64()), pa.field(DIFF, pa.int64())])))
    if not pieces:
        return pa.schema(list(spec.key_schema) + list(spec.val_schema)
                         + [pa.field(TIME, pa.int64()), pa.field(DIFF, pa.int64())]).empty_table()
    return pa.concat_tables(pieces)


def _dtype(t: pa.DataType):
    return np.float64 if pa.types.is_floating(t) else np.int64


def view_changes(batches, spec: ViewSpec):
    """The output's changes in [since, upto) from view partition q: its updates there,
    finished into aggregates."""
    from arrangedb.ops.partials import Partials, partial_names

    pid, _ = _task_ids()
    task = _Task(spec.cfg, spec.metrics)
    for _ in batches:
        pass
    finisher = Partials(spec.by, spec.state, partial_names(spec.state), spec.source_schema,
                        None)
    with task.engine() as engine:
        view = load_partition(engine, spec.view, pid)
        for rb in view.changes(spec.since, spec.upto):
            if rb.num_rows == 0:
                continue
            rb = restore_null_keys(pa.RecordBatch.from_arrays(
                rb.columns, names=spec.key_schema.names + spec.val_schema.names
                + [TIME, DIFF]), spec.by)
            done = finisher.finish(pa.Table.from_batches([rb]))
            out = _outputs(done, spec, rb)
            task.rows_out += out.num_rows
            yield out
        task.report(engine)


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


# -- the driver -----------------------------------------------------------------------

def view_path(left, right, jspec, by, aggs) -> str:
    ident = json.dumps({"left": left.path, "right": right.path, "on": jspec.keys,
                        "by": by, "aggs": {k: list(v) for k, v in sorted(aggs.items())}},
                       sort_keys=True)
    return os.path.join(left.path, "_views", hashlib.sha1(ident.encode()).hexdigest()[:16])


def reduce_changes(spark, left, right, jspec, by, aggs, out_schema, since, upto, cfg,
                   metrics):
    """The aggregate's changes in [since, upto) as a DataFrame (by, aggregates, time,
    diff); brings the view up to date with its inputs first (one job, committed).

    A step folds the inputs' commits the view has not seen, counted by version: the
    state seen before is read as of the view's time ``v``, the new commits' updates at
    their times, or at ``v + 1`` if earlier (a commit to one input at a time the view
    has passed lands at the view's next time; its history is not rewritten)."""
    from arrangedb.spark_integration.frames import on_workers, spark_schema
    from arrangedb.spark_integration.partition import partial_schema, ReduceSpec

    if upto is not None and upto <= since:
        raise ValueError(f"upto={upto} must be greater than since={since}")
    source = jspec.out_schema
    state = state_aggs(aggs, source, "snapshot_reduce")
    pschema = partial_schema(ReduceSpec(by=by, aggs=state, source_schema=source,
                                        out_schema=out_schema, cfg=cfg, metrics=metrics))
    key_schema = null_safe_keys(pschema.empty_table(), by).select(by + [NULLS]).schema
    key_schema = pa.schema([f.with_nullable(False) for f in key_schema])
    val_schema = pa.schema([f for f in pschema if f.name not in by])
    out = pa.schema(list(out_schema) + [pa.field(TIME, pa.int64()),
                                        pa.field(DIFF, pa.int64())])
    path = view_path(left, right, jspec, by, aggs)
    n = left.num_partitions
    if not os.path.exists(os.path.join(path, dataset.MANIFEST)):
        os.makedirs(path, exist_ok=True)
        dataset.write_manifest(path, dataset.new_manifest(
            key_schema.names, val_schema.names, n,
            pa.schema(list(key_schema) + list(val_schema)), True,
            inputs={"left": 0, "right": 0},
            definition={"left": left.path, "right": right.path, "on": jspec.keys,
                        "by": by, "aggs": {k: list(v) for k, v in aggs.items()}}))
    spec = ViewSpec(by=by, aggs=aggs, state=state, source_schema=source, out_schema=out,
                    key_schema=key_schema, val_schema=val_schema, cfg=cfg, metrics=metrics,
                    root=path)
    with dataset.writer(path) as m:
        m = _step(spark, spec, m, left, right, jspec, n)
        v = dataset.latest_time(m)
        upto = v + 1 if upto is None else upto
        if since > v:
            raise ValueError(f"since={since} is after the view's latest time {v}")
        spec.since, spec.upto = since, upto
        spec.view = _view_layout(path, m, min(upto - 1, v), spec)
    return spark.range(0, n, 1, n).mapInArrow(on_workers("maintained", "view_changes", spec),
                                              spark_schema(out))


def _step(spark, spec: ViewSpec, m: dict, left, right, jspec, n: int) -> dict:
    """Fold the inputs' unseen commits into the view; returns its new manifest."""
    from arrangedb.spark_integration.frames import on_workers, spark_schema

    v = dataset.latest_time(m)
    ml, mr = dataset.read_manifest(left.path), dataset.read_manifest(right.path)
    seen = m["inputs"]
    lold, lnew = dataset.split_seen(ml, seen["left"])
    rold, rnew = dataset.split_seen(mr, seen["right"])
    if v is not None and not lnew and not rnew:
        return m
    floor = 0 if v is None else v + 1
    upto = max([floor] + [t for t, _ in lnew + rnew]) + 1
    sides = [Layout(ds.path, ds.key, ds.vals, ds.schema, old, upto - 1, tuple(new), floor)
             for ds, old, new in ((left, lold, lnew), (right, rold, rnew))]
    spec.version = m["version"] + 1
    spec.join = _replace(jspec, left=sides[0], right=sides[1], since=floor, upto=upto)
    spec.view = None if v is None else _view_layout(spec.root, m, v, spec)
    reports = (spark.range(0, n, 1, n)
               .mapInArrow(on_workers("maintained", "join_deltas", spec),
                           spark_schema(delta_schema(spec)))
               .repartition(n, *spec.by)
               .mapInArrow(on_workers("maintained", "apply_deltas", spec),
                           spark_schema(REPORT))
               .collect())
    return dataset.commit(spec.root, m, [r.asDict() for r in reports],
                          sorted({floor, upto - 1}),
                          inputs={"left": dataset.through(ml), "right": dataset.through(mr)})


def delta_schema(spec: ViewSpec) -> pa.Schema:
    """The partials step 1 sends to step 2: group columns, time, the state's partials."""
    return pa.schema([spec.source_schema.field(b) for b in spec.by]
                     + [pa.field(TIME, pa.int64())] + list(spec.val_schema))


def _view_layout(path: str, m: dict, at: int, spec: ViewSpec) -> Layout:
    return Layout(path, spec.key_schema.names, spec.val_schema.names,
                  pa.schema(list(spec.key_schema) + list(spec.val_schema)),
                  dataset.parts_at(m, at), at)


def _replace(jspec, **changes):
    from dataclasses import replace

    return replace(jspec, **changes)
