"""group_by: aggregate a stream of Arrow batches on columns other than an arrangement key.

Design
------
Each incoming batch is reduced to *partial aggregates* per group with Arrow's grouped
kernels (weighted sums and counts, mins, maxes); partials are combined while they fit
in a quarter of the budget. When they no longer fit, they are arranged -- keyed by the
group columns, partial values as vals -- into a trace of an engine, which sorts and
spills them like any arrangement. At the end the trace's cursor yields every group's
partials together (a block never splits a key), and they are combined per block with
the same count-weighted kernels the reductions use; identical partial rows that the
arrangement consolidated into one row with count c are weighed by c, so nothing is
lost. Groups with a null in a group column never enter the arrangement (keys cannot be
null); they are few and stay in memory.

``weight`` names a column of per-row multiplicities (a join's ``count``, a change
stream's ``diff``): a row with weight 3 counts three times and adds three times its
value, one with weight -1 takes itself back. By default it is the column the stream's
schema marks as its weight (:mod:`arrangedb.spine.data.roles`). Over a change stream,
counts and sums are the net change per group; min, max and mean are not linear in the
changes, so a stream with negative weights is refused for them.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrangedb.ops.aggregate import aggregate, check_aggs, output_field
from arrangedb.ops.common import DEFAULT_BATCH_ROWS, columns_of
from arrangedb.ops.dense_groups import SlotTotals
from arrangedb.ops.partials import Partials, partial_names, plain_schema
from arrangedb.pager import GROUP_BY_SHARE, release_freed_memory
from arrangedb.spine import engine_for, open_batches, roles

def _has_null_key(table: pa.Table, by: list[str]) -> np.ndarray:
    mask = np.zeros(table.num_rows, dtype=bool)
    for b in by:
        col = table.column(b)
        if col.null_count:
            mask |= col.is_null().to_numpy(zero_copy_only=False)
    return mask


def group_by(stream, by, aggs: dict, weight: str | bool | None = None, engine=None,
             batch_rows: int = DEFAULT_BATCH_ROWS, phase: str = "complete",
             source_schema: pa.Schema | None = None) -> pa.RecordBatchReader:
    """Group a stream of Arrow batches by ``by`` columns and aggregate, within a budget.

    ``aggs`` as in :func:`arrangedb.reduce`: output name -> (function, column), function
    in count, sum, min, max, mean. ``weight``: the column of per-row multiplicities;
    None (default): the column the stream's schema marks as its weight (a join's
    ``count``, a change stream's ``diff``), else every row once; False: every row once.
    Over a stream with negative weights (changes), count and sum give the net change
    per group; min, max and mean are refused (use ``reduce(trace, aggs, since=, upto=)``).
    ``by=[]`` groups the whole stream into one row, and an empty stream into none (a
    grouping reports the groups it saw; SQL's global aggregate answers a count of 0).
    Runs in ``engine``, else the engine that made the stream, else the one engine open
    (:func:`arrangedb.spine.engine.engine_for`), spilling partial aggregates through it
    when the groups do not fit its budget.

    ``phase`` splits the work for a distributed plan: ``"partial"`` emits partial
    aggregates (columns of :meth:`Partials.partial_schema`) instead of results, and
    ``"final"`` takes such partials (from many producers) and finishes them; it needs
    ``source_schema``, the schema of the rows the partials were computed from.
    """
    if phase not in ("complete", "partial", "final"):
        raise ValueError(f"phase must be complete, partial or final, not {phase!r}")
    by = [by] if isinstance(by, str) else list(by)
    stream_schema, batches = open_batches(stream)
    schema = plain_schema(stream_schema)
    if phase == "final":
        if source_schema is None:
            raise ValueError("group_by(phase='final') needs source_schema=, the schema of "
                             "the rows the partials were computed from")
        schema, weight = plain_schema(source_schema), None
    for b in by:
        if b not in schema.names:
            raise KeyError(f"group_by: no column {b!r} in the stream (columns: {schema.names})")
    aggs = check_aggs(aggs, schema, "the stream")
    for name, (fn, _c) in aggs.items():
        if fn == "count_distinct":
            raise ValueError(f"aggs[{name!r}]: group_by supports count, sum, min, max and "
                             "mean; count_distinct over a stream needs the distinct pairs "
                             "arranged first: arrange (by + column) key-only, then reduce")
    weight = None if phase == "final" else roles.resolve_role(stream_schema, weight,
                                                               roles.WEIGHT)
    if weight is not None and weight not in schema.names:
        raise KeyError(f"group_by: no weight column {weight!r} (columns: {schema.names})")
    if weight is not None and not pa.types.is_integer(schema.field(weight).type):
        raise TypeError(f"group_by: weight column {weight!r} must be integer, "
                        f"is {schema.field(weight).type}")
    engine = engine_for(stream_schema, engine, "group_by")
    nonlinear = sorted(n for n, (fn, _c) in aggs.items() if fn not in ("count", "sum"))
    if weight is not None and nonlinear:
        batches = _no_retractions(batches, weight, nonlinear)
    partials = Partials(by, aggs, partial_names(aggs), schema, weight)
    if phase == "final":
        missing = [n for n in partials.partial_schema().names if n not in stream_schema.names]
        if missing:
            raise KeyError(f"group_by(phase='final'): the stream lacks partial columns "
                           f"{missing}; feed it the output of phase='partial'")
    final = phase == "final"
    first = partials.of_partials if final else partials.of_batch
    # each row's partials alone, ungrouped, for totals that add rows up as they come
    rows = partials.partial_rows if final else partials.row_partials
    last = partials.as_partials if phase == "partial" else partials.finish
    out_schema = partials.partial_schema() if phase == "partial" else _output_schema(partials)
    return pa.RecordBatchReader.from_batches(
        out_schema,
        _working(engine, _run(partials, batches, engine, batch_rows, first, rows, last)))


def _working(engine, gen):
    """``gen`` as work of ``engine``: its idle merger waits while the grouping goes on."""
    with engine.ctx.working():
        yield from gen


def _no_retractions(batches, weight: str, nonlinear: list[str]):
    """The batches, refusing any row of negative weight: the aggregates ``nonlinear``
    cannot be taken from changes alone."""
    for rb in batches:
        w = rb.column(weight)
        if len(w) and pc.min(w).as_py() < 0:
            raise ValueError(
                f"group_by: aggs {nonlinear} (min, max, mean) are not linear in changes, but "
                f"the stream's weight column {weight!r} holds negative values (retractions): "
                f"aggregate the changes with count and sum only, or take the changed groups "
                f"from reduce(trace, aggs, since=, upto=), which reads per-key state")
        yield rb


def _output_schema(partials: Partials) -> pa.Schema:
    fields = [partials.schema.field(b) for b in partials.by]
    fields += [output_field(n, f, c, partials.schema) for n, (f, c) in partials.aggs.items()]
    return pa.schema(fields)


def _run(partials: Partials, batches, engine, batch_rows, first, rows, last):
    start_rss = engine.budget.rss(fast=True)
    start_free = engine.budget.heap_free()
    trace = None
    held: list[pa.Table] = []
    held_bytes = 0
    reserved = 0
    slots: SlotTotals | None = None

    def account() -> None:
        """Hold exactly what the partials kept in memory take of the budget."""
        nonlocal reserved
        nbytes = held_bytes + (slots.nbytes if slots is not None else 0)
        if nbytes > reserved:
            engine.budget.reserve(nbytes - reserved, "group_by partials")
        else:
            engine.budget.release(reserved - nbytes, "group_by partials")
        reserved = nbytes

    try:
        # combining the held partials takes two to three times their size again (the
        # concatenation, Arrow's hash table and its output): an eighth of the budget
        # held keeps that within the budget's share left beside the readers
        limit = max(engine.budget.limit // GROUP_BY_SHARE, 1 << 20)
        churn = 0
        budget = engine.budget
        # one integer group column: partials added up per slot of its range, while the
        # range's arrays fit the share; else (and for the rows it cannot take) as below
        partial_schema = partials.partial_schema()
        slots = SlotTotals.for_partials(partial_schema, partials.by,
                                        limit // (9 * max(len(partial_schema), 1)),
                                        partials.added())
        for chunk in _coalesced(batches, min(limit // 8, 64 << 20)):
            churn += chunk.nbytes
            if churn >= limit // 2:
                churn = 0
                # Arrow's pool (mimalloc) and malloc keep what grouping and the upstream
                # operator freed; handed back only once RSS passes the budget, because
                # the next chunks fault those pages in again: trimming every 64 MiB of
                # input cost a third of a 40M-row join, and trimming past half the
                # budget, a join over 16 runs (a decoded part of each held) spent
                # ~0.2 of its 1.3 s in faults at 512 MiB, ~0.3 of 1.6 at 128 MiB
                if budget.trim_if_high(share=1.0):   # what was freed before went too
                    start_free = min(start_free, budget.heap_free())
            part = None
            if slots is not None:
                # each row's partials add up by slot as they come: grouping the chunk
                # first would group it twice (a chunk over a wide range of ids barely
                # shrinks by it, and hashing is what the slots spare)
                each = rows(chunk)
                left = slots.add(each, distinct=False) if each is not None else None
                if left is not None:
                    if not left.num_rows:
                        account()
                        continue
                    part = partials.combine(partials.partial_rows(left))   # null group
            if part is None:
                part = first(chunk)
                if slots is not None:
                    left = slots.add(part)
                    if left is None:   # the range grew past the share: the general path
                        part = _joined([slots.table(), part])
                        slots = None
                    else:
                        part = left
            held.append(part)
            held_bytes += part.nbytes
            account()
            if held_bytes < limit:
                continue
            combined = partials.combine(pa.concat_tables(held))
            held, held_bytes = [combined], combined.nbytes
            account()
            if held_bytes < limit // 2:
                continue
            nulls = _has_null_key(combined, partials.by)
            spill = combined.filter(pa.array(~nulls))
            vals = [c for c in combined.column_names if c not in partials.by]
            if trace is None:
                trace = engine.arrange(spill, key=partials.by, vals=vals)
            else:
                trace.insert(spill)
            held = [combined.filter(pa.array(nulls))]
            held_bytes = held[0].nbytes
            account()
            release_freed_memory()
            start_free = min(start_free, engine.budget.heap_free())
        rest = partials.combine(pa.concat_tables(held)) if held else None
        if slots is not None:   # its groups and those held (null groups) are apart
            rest = slots.table() if rest is None else _joined([slots.table(), rest])
        if trace is None:
            if rest is not None and rest.num_rows:
                for rb in rest.to_batches(max_chunksize=batch_rows):
                    yield last(pa.Table.from_batches([rb]))
            return
        if rest is not None and rest.num_rows:
            nulls = _has_null_key(rest, partials.by)
            trace.insert(rest.filter(pa.array(~nulls)))
            rest = rest.filter(pa.array(nulls))
            if rest.num_rows:
                yield last(rest)
        yield from _finish_spilled(partials, trace, last)
    finally:
        if reserved:
            engine.budget.release(reserved, "group_by partials")
        if trace is not None:
            trace.close()   # the spilled partials: their files go now
        # a trim costs ~10 ms, a large share of a small query's time, and the next step
        # faults the pages in again: worth it only when this grouping (and what fed it)
        # raised RSS and freed much, not for what was resident or freed before, and RSS
        # nears the budget (past half of it, a 30M-row join's trim made the 600k-row
        # insert after it fault 40 MB in afresh: 28-32 ms instead of 13; trimming what
        # the idle merger left freed made a 40M-row join's first warm query 110 ms
        # instead of 60)
        if engine.budget.rss(fast=True) - start_rss > engine.budget.limit // 16:
            engine.budget.trim_if_high(share=0.75, free_before=start_free)


def _joined(tables: list[pa.Table]) -> pa.Table:
    """Tables of the same partial columns (in any order and nullability) end to end."""
    first = tables[0].schema
    return pa.concat_tables([t.select(first.names).cast(first) for t in tables])


def _coalesced(batches, max_bytes: int, max_rows: int = 1 << 20) -> Iterator[pa.Table]:
    """The stream's non-empty batches gathered into tables of up to ``max_rows`` rows (or
    ``max_bytes``), as chunks: one grouping call per table costs less per row than one
    per 64k-row batch, and chunks need no copy (strings included) to be grouped. A
    larger batch (a table read whole) is cut: grouping it at once would hold partials
    for all its groups."""
    pending, rows, nbytes = [], 0, 0
    for rb in _cut(batches, max_bytes, max_rows):
        pending.append(rb)
        rows += rb.num_rows
        nbytes += rb.nbytes
        if rows >= max_rows or nbytes >= max_bytes:
            yield pa.Table.from_batches(pending)
            pending, rows, nbytes = [], 0, 0
    if pending:
        yield pa.Table.from_batches(pending)


def _cut(batches, max_bytes: int, max_rows: int) -> Iterator[pa.RecordBatch]:
    """The non-empty batches, those over ``max_rows`` rows or ``max_bytes`` sliced."""
    for rb in batches:
        n = rb.num_rows
        if n == 0:
            continue
        step = min(max_rows, max(1, n * max_bytes // max(rb.nbytes, 1)))
        if step >= n:
            yield rb
            continue
        for lo in range(0, n, step):
            yield rb.slice(lo, step)


def _finish_spilled(partials: Partials, trace, last) -> Iterator[pa.RecordBatch]:
    """Combine each group's spilled partials, weighing consolidated rows by their count."""
    specs = {}
    for c in trace.val_names:
        kind = c.rsplit("__", 1)[1]
        specs[c] = ({"n": "sum", "s": "sum", "v": "sum"}.get(kind, kind), c)
    for b in trace.cursor():
        if not len(b):
            continue
        arrays = aggregate(b.key_bounds, b.vals, b.counts, specs, trace.val_schema)
        table = pa.Table.from_arrays(columns_of(b.keys) + arrays,
                                     names=partials.by + list(specs))
        yield last(table)
