"""What runs inside a Spark task: one engine per partition, arranged from Arrow batches.

Each function here is the body of a ``mapInArrow``: it receives the partition's Arrow
batches, mounts an :class:`~arrangedb.Engine` on the executor's local directory with
the task's share of the budget, arranges what comes in (spilling as needed), runs the
operator, streams the output in bounded batches and closes the engine when the
partition ends. Python workers are reused between tasks, so memory is measured from the
task's own start (the engine's budget takes its baseline then).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from arrangedb.spine import dictionary_schema
from arrangedb.spark_integration.task import Task, partition_id


SIDE = "__arrangedb_side"
NULLS = "__arrangedb_nulls"


@dataclass
class JoinSpec:
    keys: list[str]
    left_cols: list[str]        # column names in the shuffled rows
    left_vals: list[str]        # ... as the arrangement names them
    right_cols: list[str]
    right_vals: list[str]
    how: str
    out_schema: pa.Schema
    left_schema: pa.Schema      # keys + left vals, as arranged
    right_schema: pa.Schema
    cfg: object
    metrics: object
    left: object = None         # an arranged dataset's Layout (its partitions at a time)
    right: object = None
    since: int | None = None    # the join's changes in [since, upto) instead of its rows
    upto: int | None = None
    batch_rows: int = 1 << 16


class SideBuilder:
    """Buffers one side's rows and sorts them into runs in chunks of about a sixteenth of
    the budget; the runs enter the trace together when the side is complete."""

    def __init__(self, engine, keys: list[str], vals: list[str], schema: pa.Schema):
        self.engine, self.keys, self.vals, self.schema = engine, keys, vals, schema
        self.chunk = max(engine.budget.limit // 16, 1 << 20)
        self.buffered: list[pa.RecordBatch] = []
        self.size = 0
        self.trace = None
        self.appender = None

    def add(self, rb: pa.RecordBatch, held: int | None = None) -> None:
        """Buffer ``rb``; ``held``: the bytes it keeps alive, when more than its own."""
        if rb.num_rows == 0:
            return
        if self.schema is not None and not rb.schema.equals(self.schema):
            rb = pa.RecordBatch.from_arrays(rb.columns, schema=self.schema)  # nullability
        nbytes = max(rb.nbytes, held or 0)
        self.engine.budget.reserve(nbytes, "spark input buffer")
        self.buffered.append(rb)
        self.size += nbytes
        if self.size >= self.chunk:
            self.flush()

    def flush(self) -> None:
        table = pa.Table.from_batches(self.buffered, schema=self.schema)
        try:
            if self.trace is None:
                self.trace = self.engine.arrange(table.slice(0, 0), key=self.keys,
                                                 vals=self.vals)
                self.appender = self.trace.appender()
            self.appender.add(table)
        except BaseException:
            if self.appender is not None:
                self.appender.abort()   # the task fails: its runs' files go now
            raise
        finally:
            self.engine.budget.release(self.size, "spark input buffer")
            self.buffered, self.size = [], 0

    def done(self):
        if self.buffered or self.trace is None:
            self.flush()
        self.appender.finish()
        return self.trace


def _rename(rb: pa.RecordBatch, cols: list[str], names: list[str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([rb.column(c) for c in cols], names=names)


def join_partition(batches, spec: JoinSpec, then: "ReduceSpec | None" = None):
    """Arrange both sides of one partition (or load them) and stream their join.

    With ``then`` (a partial reduction), the join's rows are aggregated in the same task
    and only the partial aggregates leave it.
    """
    import arrangedb as adb

    task = Task(spec.cfg, spec.metrics)
    pid, batches = partition_id(batches)
    with task.engine() as engine:
        if then is None:
            for out in _joined(batches, spec, task, engine, pid):
                task.rows_out += out.num_rows
                yield out
        elif spec.left is not None and spec.right is not None and _pushable(then):
            # both sides arranged: aggregate below the join (per key), never
            # materialising the joined rows, and emit the result as partials
            from arrangedb.spark_integration.dataset_tasks import load_partition

            for _ in batches:
                pass
            left = load_partition(engine, spec.left, pid)
            right = load_partition(engine, spec.right, pid)
            for out in _as_partials(adb.join_group_by(
                    left, right, then.by, _partial_aggs(then), at=_read_time(spec.left,
                                                                             spec.right),
                    how=spec.how, engine=engine), then):
                task.rows_out += out.num_rows
                yield out
        else:
            # string group columns travel from the join to group_by as dictionary codes
            # (grouped by bincount); the partials leave the task as plain strings
            coded = [b for b in then.by
                     if b not in spec.keys and _is_string(spec.out_schema.field(b).type)]
            schema = dictionary_schema(spec.out_schema, frozenset(coded))
            stream = pa.RecordBatchReader.from_batches(
                schema, _joined(batches, spec, task, engine, pid, coded, schema))
            for out in adb.group_by(stream, then.by, then.aggs, weight=False, engine=engine,
                                    phase="partial"):
                task.rows_out += out.num_rows
                yield out
        task.report(engine)


def _pushable(then: "ReduceSpec") -> bool:
    """Whether the partials are sums and counts of non-decimal columns (those a join's
    grouped aggregation gives as they are)."""
    return all(fn in ("count", "sum", "mean") and
               (col is None or not pa.types.is_decimal(then.source_schema.field(col).type))
               for fn, col in then.aggs.values())


def _partial_aggs(then: "ReduceSpec") -> dict:
    """Each partial column as an aggregate of its own: n a count, s a sum, v the count
    of values a sum saw."""
    from arrangedb.ops.partials import partial_names

    out = {}
    for name, parts in partial_names(then.aggs).items():
        fn, col = then.aggs[name]
        for pname, kind in parts:
            out[pname] = ("sum", col) if kind == "s" else ("count", col)
    return out


def _as_partials(stream, then: "ReduceSpec"):
    schema = partial_schema(then)
    for rb in stream:
        yield pa.RecordBatch.from_arrays([rb.column(f.name).cast(f.type) for f in schema],
                                         schema=schema)


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _joined(batches, spec: JoinSpec, task: Task, engine, pid: int,
            read_dictionary: list[str] | None = None, schema: pa.Schema | None = None):
    import arrangedb as adb

    from arrangedb.spark_integration.dataset_tasks import load_partition

    left = load_partition(engine, spec.left, pid) if spec.left is not None else None
    right = load_partition(engine, spec.right, pid) if spec.right is not None else None
    lb = None if left is not None else SideBuilder(engine, spec.keys, spec.left_vals,
                                                   spec.left_schema)
    rb = None if right is not None else SideBuilder(engine, spec.keys, spec.right_vals,
                                                    spec.right_schema)
    lsel, rsel = spec.keys + spec.left_cols, spec.keys + spec.right_cols
    for batch in batches:
        task.rows_in += batch.num_rows
        if lb is not None and rb is not None:
            left_rows = batch.column(SIDE).to_numpy(zero_copy_only=False) == 0
            for builder, rows, sel, names in ((lb, left_rows, lsel, spec.left_schema.names),
                                              (rb, ~left_rows, rsel, spec.right_schema.names)):
                if rows.all():     # a shuffle block holds one side's rows: no filtered copy
                    # (its columns are slices of the whole message: reserve all of it)
                    builder.add(_rename(batch, sel, names), held=batch.nbytes)
                elif rows.any():
                    builder.add(_rename(batch.filter(pa.array(rows)), sel, names))
        elif lb is not None:
            lb.add(_rename(batch, lsel, spec.left_schema.names))
        elif rb is not None:
            rb.add(_rename(batch, rsel, spec.right_schema.names))
    left = left if lb is None else lb.done()
    right = right if rb is None else rb.done()
    if spec.since is not None:   # changes: key, vals, time, diff
        for out in adb.join(left, right, since=spec.since, upto=spec.upto,
                            batch_rows=spec.batch_rows):
            yield pa.RecordBatch.from_arrays(out.columns, schema=schema or spec.out_schema)
        return
    at = _read_time(spec.left, spec.right)
    for out in adb.join(left, right, at=at, how=spec.how, expand=True,
                        batch_rows=spec.batch_rows, read_dictionary=read_dictionary or None):
        yield pa.RecordBatch.from_arrays(out.columns[:-1], schema=schema or spec.out_schema)


def _read_time(*layouts) -> int | None:
    """The time a join reads: the later of its arranged sides' (each side holds nothing
    after its own time)."""
    times = [lay.at for lay in layouts if lay is not None]
    return max(times) if times else None


@dataclass
class ReduceSpec:
    by: list[str]
    aggs: dict
    source_schema: pa.Schema     # of the rows the aggregates read
    out_schema: pa.Schema
    cfg: object
    metrics: object
    phase: str = "complete"      # complete (arranged), partial, final
    layout: object = None        # an arranged dataset (at a time) to reduce instead
    means: dict = field(default_factory=dict)   # decimal means -> their (sum, count) aggs
    weight: str | None = None    # a column of multiplicities (a change DataFrame's diff)
    since: int | None = None     # the aggregate's changes in [since, upto) (arranged input)
    upto: int | None = None


def spark_result(rb: pa.RecordBatch, spec: ReduceSpec) -> pa.RecordBatch:
    """Aggregates as Spark types them (``spec.out_schema``): decimal sums cast to Spark's
    precision (an error if one does not fit, as Spark's ANSI mode), decimal means divided
    exactly from their sums and counts, rounded half up."""
    from arrangedb.ops.aggregate import decimal_quotient

    arrays = []
    for f in spec.out_schema:
        if f.name in spec.means:
            s, n = spec.means[f.name]
            counts = rb.column(n).fill_null(0).to_numpy(zero_copy_only=False)
            arrays.append(decimal_quotient(rb.column(s), counts, f.type))
        else:
            arrays.append(rb.column(f.name).cast(f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=spec.out_schema)


def null_safe_keys(table: pa.Table, by: list[str]) -> pa.Table:
    """Keys cannot be null in an arrangement; SQL groups nulls together. Fill each null
    key with its type's zero and record which were null in a bitmask key column."""
    mask = np.zeros(table.num_rows, np.int64)
    cols = {}
    for i, b in enumerate(by):
        col = table.column(b)
        if col.null_count:
            mask |= col.is_null().to_numpy(zero_copy_only=False).astype(np.int64) << i
            col = col.fill_null(pa.scalar(_zero(col.type), col.type))
        cols[b] = col
    out = table
    for b, col in cols.items():
        out = out.set_column(out.schema.get_field_index(b), b, col)
    return out.append_column(NULLS, pa.array(mask))


def restore_null_keys(rb: pa.RecordBatch, by: list[str]) -> pa.RecordBatch:
    mask = rb.column(NULLS).to_numpy(zero_copy_only=False)
    arrays = []
    for name, col in zip(rb.schema.names, rb.columns):
        if name in by:
            isnull = ((mask >> by.index(name)) & 1).astype(bool)
            if isnull.any():
                col = pa.compute.if_else(pa.array(isnull), pa.nulls(len(col), col.type), col)
        if name != NULLS:
            arrays.append(col)
    return pa.RecordBatch.from_arrays(arrays, names=[n for n in rb.schema.names if n != NULLS])


def _zero(typ: pa.DataType):
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return ""
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return b""
    if pa.types.is_boolean(typ):
        return False
    if pa.types.is_floating(typ):
        return 0.0
    if pa.types.is_decimal(typ):
        import decimal
        return decimal.Decimal(0)
    if pa.types.is_date(typ) or pa.types.is_timestamp(typ):
        return pa.scalar(0, pa.int64()).cast(pa.int32() if pa.types.is_date32(typ)
                                              else pa.int64()).cast(typ).as_py()
    return 0


def reduce_partition(batches, spec: ReduceSpec):
    """One partition of snapshot_reduce: a phase of group_by, or arrange + reduce."""
    import arrangedb as adb

    task = Task(spec.cfg, spec.metrics)
    pid, batches = partition_id(batches)

    def counted(it):
        for b in it:
            task.rows_in += b.num_rows
            yield b

    with task.engine() as engine:
        if spec.phase in ("partial", "final"):
            stream = pa.RecordBatchReader.from_batches(
                spec.source_schema if spec.phase == "partial" else partial_schema(spec),
                counted(batches))
            out = adb.group_by(stream, spec.by, spec.aggs, weight=spec.weight or False,
                               engine=engine, phase=spec.phase,
                               source_schema=spec.source_schema)
            for b in out:
                task.rows_out += b.num_rows
                yield b if spec.phase == "partial" else spark_result(b, spec)
        else:
            if spec.layout is not None:
                from arrangedb.spark_integration.dataset_tasks import load_partition

                for _ in counted(batches):
                    pass
                trace = load_partition(engine, spec.layout, pid)
                at = spec.layout.at
                restore = False
            else:
                vals = sorted({c for _, c in spec.aggs.values() if c is not None} - set(spec.by))
                cols = spec.by + [NULLS] + vals
                schema = null_safe_keys(spec.source_schema.empty_table(), spec.by) \
                    .select(cols).schema
                b = SideBuilder(engine, spec.by + [NULLS], vals, schema)
                for batch in counted(batches):
                    for rb in null_safe_keys(pa.Table.from_batches([batch]), spec.by) \
                            .select(cols).to_batches():
                        b.add(rb)
                trace = b.done()
                at, restore = None, True
            timed = dict(since=spec.since, upto=spec.upto) if spec.since is not None \
                else dict(at=at)
            for out in adb.reduce(trace, spec.aggs, **timed):
                if restore:
                    out = restore_null_keys(out, spec.by)
                task.rows_out += out.num_rows
                yield spark_result(out, spec)
        task.report(engine)


def partial_schema(spec: ReduceSpec) -> pa.Schema:
    from arrangedb.ops.aggregate import check_aggs
    from arrangedb.ops.partials import Partials, partial_names

    aggs = check_aggs(spec.aggs, spec.source_schema, "the input")
    return Partials(spec.by, aggs, partial_names(aggs), spec.source_schema,
                     None).partial_schema()
