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

from arrangedb.ops.aggregate import (LIMB_SEP, aggregate, as_comparable, check_aggs,
                                     decimal_limbs, decimal_mean, fold_limbs, limbs_to_decimal,
                                     numeric_values, output_field, sum_type)
from arrangedb.ops.common import DEFAULT_BATCH_ROWS, columns_of
from arrangedb.pager.budget import release_freed_memory
from arrangedb.spine.data import roles
from arrangedb.spine.engine import engine_for
from arrangedb.spine.data.ingest import open_batches

_COMBINE = {"n": "sum", "s": "sum", "v": "sum", "min": "min", "max": "max"}


def _partial_names(aggs: dict) -> dict[str, list[tuple[str, str]]]:
    """For each output, the partial columns it needs: (partial column, kind)."""
    plan = {}
    for name, (fn, _col) in aggs.items():
        kinds = {"count": ["n"], "sum": ["s", "v"], "mean": ["s", "n"], "min": ["min"],
                 "max": ["max"]}[fn]
        plan[name] = [(f"__{name}__{k}", k) for k in kinds]
    return plan


class _Partials:
    """Partial aggregates of chunks, combined, finished. A sum of a decimal column is a
    ``decimal(38, s)`` partial; within a chunk it is summed as integer limbs
    (``<partial>#0``, ``#1``... see :mod:`arrangedb.ops.aggregate`), by the same
    kernels as the other sums, and folded back into its decimal column at once."""

    def __init__(self, by: list[str], aggs: dict, plan: dict, schema: pa.Schema,
                 weight: str | None):
        self.by, self.aggs, self.plan, self.schema, self.weight = by, aggs, plan, schema, weight
        self.decimal_sums = {   # decimal sum partials -> their type
            pname: sum_type(schema.field(col).type)
            for name, (fn, col) in aggs.items() for pname, kind in plan[name]
            if kind == "s" and pa.types.is_decimal(schema.field(col).type)}

    def of_batch(self, chunk: pa.Table) -> pa.Table:
        chunk = _unified(chunk, self.by)
        n = chunk.num_rows
        w = (_decoded(chunk.column(self.weight)).to_numpy(zero_copy_only=False)
             .astype(np.int64, copy=False) if self.weight else None)
        if w is not None and n and w.min() == 1 == w.max():
            w = None   # every row once (a join's distinct rows): no weights to multiply
        cols = {}   # partial name -> per-row values (None: one per row)
        for name, (fn, col) in self.aggs.items():
            arr = _decoded(chunk.column(col)) if col is not None else None
            valid = (None if arr is None or arr.null_count == 0   # None: every row counts
                     else arr.is_valid().to_numpy(zero_copy_only=False))
            for pname, kind in self.plan[name]:
                if kind == "n" and valid is None:
                    cols[pname] = w
                elif kind == "n":
                    cols[pname] = valid.astype(np.int64) if w is None else w * valid
                elif kind == "v":
                    cols[pname] = None if valid is None else valid.astype(np.int64)
                elif kind == "s" and pname in self.decimal_sums:
                    for i, limb in enumerate(decimal_limbs(arr, w)):
                        cols[f"{pname}{LIMB_SEP}{i}"] = limb
                elif kind == "s":
                    x = numeric_values(arr)
                    cols[pname] = x if w is None else x * w   # nulls were filled with 0
                elif w is None:  # min / max
                    cols[pname] = arr
                else:  # min / max over rows present with a positive weight
                    cols[pname] = pc.if_else(pa.array(w > 0), arr, pa.nulls(n, arr.type))
        if all(c is None or isinstance(c, np.ndarray) for c in cols.values()):  # no min/max
            fast = _bincount_groups(chunk, self.by, cols)
            if fast is None:
                fast = _run_groups(chunk, self.by, cols)
            if fast is not None:
                return self.fold(fast)
        table = {b: chunk.column(b) for b in self.by}
        table.update((p, np.ones(n, np.int64) if c is None else c) for p, c in cols.items())
        return self.fold(self.combine(pa.table(table)))

    def fold(self, table: pa.Table) -> pa.Table:
        """Grouped partials with the limb columns of decimal sums folded into them."""
        return fold_limbs(table, self.decimal_sums) if self.decimal_sums else table

    def combine(self, table: pa.Table) -> pa.Table:
        specs = [(c, _COMBINE[c.rsplit("__", 1)[1].split(LIMB_SEP)[0]])
                 for c in table.column_names if c not in self.by]
        if all(fn == "sum" for _, fn in specs):   # partials of consecutive sorted chunks
            fast = _run_groups(table, self.by, {c: table.column(c) for c, _ in specs})
            if fast is not None:
                return fast
        grouped = table
        narrow = {}   # min/max of decimal32/64: grouped as their integers
        for c, fn in specs:
            col = table.column(c)
            if fn in ("min", "max") and as_comparable(col.type) != col.type:
                narrow[c] = col.type
                grouped = grouped.set_column(grouped.schema.get_field_index(c), c, _viewed(
                    col, as_comparable(col.type)))
        out = grouped.group_by(self.by, use_threads=False).aggregate(specs)
        out = pa.table({c: _decoded(out.column(c)) for c in out.column_names})
        out = out.rename_columns([c.rsplit("_", 1)[0] if c not in self.by else c
                                  for c in out.column_names]).select(table.column_names)
        for c, t in narrow.items():
            out = out.set_column(out.schema.get_field_index(c), c, _viewed(out.column(c), t))
        return out

    def partial_schema(self) -> pa.Schema:
        fields = [self.schema.field(b) for b in self.by]
        for name, (fn, col) in self.aggs.items():
            for pname, kind in self.plan[name]:
                if kind in ("n", "v"):
                    typ = pa.int64()
                elif kind == "s":
                    typ = (pa.float64() if pa.types.is_floating(self.schema.field(col).type)
                           else self.decimal_sums.get(pname, pa.int64()))
                else:
                    typ = self.schema.field(col).type
                fields.append(pa.field(pname, typ))
        return pa.schema(fields)

    def as_partials(self, table: pa.Table) -> pa.RecordBatch:
        """Emit combined partial rows as they are (the first phase of a two-phase plan)."""
        table = self.fold(table)
        return pa.RecordBatch.from_arrays([table.column(f.name).combine_chunks().cast(f.type)
                                           for f in self.partial_schema()],
                                          schema=self.partial_schema())

    def of_partials(self, chunk: pa.Table) -> pa.Table:
        """Partial rows coming from a first phase: combined, never recomputed."""
        return self.combine(chunk.select(self.partial_schema().names))

    def finish(self, part: pa.Table) -> pa.RecordBatch:
        arrays = [part.column(b).combine_chunks() for b in self.by]
        fields = [self.schema.field(b) for b in self.by]
        for name, (fn, col) in self.aggs.items():
            field = output_field(name, fn, col, self.schema)
            p = {k: part.column(c).combine_chunks() for c, k in self.plan[name]}
            if fn == "count":
                arr = p["n"].fill_null(0)
            elif fn == "sum" and pa.types.is_decimal(field.type):
                none = p["v"].fill_null(0).to_numpy(zero_copy_only=False) == 0
                arr = pc.if_else(pa.array(none), pa.scalar(None, field.type), p["s"])
            elif fn == "mean" and pa.types.is_decimal(p["s"].type):
                nn = p["n"].fill_null(0).to_numpy(zero_copy_only=False)
                arr = pa.array(decimal_mean(p["s"], nn, p["s"].type.scale), pa.float64(),
                               mask=nn == 0)
            elif fn == "sum":
                s = p["s"].to_numpy(zero_copy_only=False)
                arr = pa.array(s, field.type, mask=p["v"].fill_null(0).to_numpy(
                    zero_copy_only=False) == 0)
            elif fn == "mean":
                s = p["s"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.float64)
                nn = p["n"].fill_null(0).to_numpy(zero_copy_only=False)
                with np.errstate(divide="ignore", invalid="ignore"):
                    arr = pa.array(s / np.where(nn == 0, 1, nn), pa.float64(), mask=nn == 0)
            else:
                arr = p[fn]
            arrays.append(arr.cast(field.type))
            fields.append(field)
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def _bincount_groups(chunk: pa.Table, by: list[str], cols: dict) -> pa.Table | None:
    """Partials of a chunk grouped on one dictionary column, by ``np.bincount`` over its
    codes (~6x faster than hashing them): for counts and sums, whose integer totals stay
    exact in float64 (checked). None when that does not apply."""
    if len(by) != 1 or not pa.types.is_dictionary(chunk.schema.field(by[0]).type):
        return None
    n = chunk.num_rows
    distinct = {id(c): c for c in cols.values() if c is not None}   # one pass per array
    positive = None   # an integer partial >= 1 on every row: its totals show the groups
    for i, c in distinct.items():
        if c.dtype.kind in "iu" and len(c):
            least, most = int(c.min()), int(c.max())
            if max(abs(most), abs(least)) * n >= 2**53:
                return None
            if least >= 1 and positive is None:
                positive = i
    column = chunk.column(by[0])
    dictionary = column.chunk(0).dictionary   # unified: one dictionary for all chunks
    k = len(dictionary)
    # rows per group: counted only when a partial needs them, or no partial tells which
    # groups have rows (a bincount less per chunk)
    count_rows = positive is None or any(c is None for c in cols.values())
    rows = np.zeros(k + 1, np.int64)
    sums = {i: np.zeros(k + 1) for i in distinct}
    lo = 0
    for part in column.chunks:   # chunk by chunk: the codes are never concatenated
        codes = (part.indices.fill_null(0) if part.null_count else part.indices).to_numpy(
            zero_copy_only=False)
        # bincount takes only what casts safely to intp (not uint64); null keys go to
        # slot k, which a narrow index type cannot hold
        codes = codes.astype(np.intp, copy=bool(part.null_count))
        if part.null_count:
            codes[part.is_null().to_numpy(zero_copy_only=False)] = k
        hi = lo + len(codes)
        if count_rows:
            rows += np.bincount(codes, minlength=k + 1)
        for i, total in sums.items():
            total += np.bincount(codes, weights=distinct[i][lo:hi], minlength=k + 1)
        lo = hi
    present = np.flatnonzero(rows if count_rows else sums[positive])
    out = {by[0]: dictionary.take(pa.array(present, pa.int64(), mask=present == k))}
    for p, c in cols.items():
        if c is None:
            out[p] = pa.array(rows[present])
        else:
            total = sums[id(c)][present]
            out[p] = pa.array(total.astype(np.int64) if c.dtype.kind in "iu" else total)
    return pa.table(out)


def _run_groups(chunk: pa.Table, by: list[str], cols: dict) -> pa.Table | None:
    """Partials of a chunk whose one integer group column is sorted (a stream in key
    order, such as a trace's changes grouped by its key): runs of equal keys summed by
    ``np.add.reduceat``, exact for integers, no hashing. None when that does not apply.

    ``cols``: per partial, its per-row values (numpy, or an Arrow column converted only
    once the keys are known to be sorted) or None for one per row."""
    if len(by) != 1:
        return None
    column = chunk.column(by[0])
    if not pa.types.is_integer(column.type) or column.null_count or len(column) == 0:
        return None
    keys = column.to_numpy()
    if (keys[1:] < keys[:-1]).any():
        return None
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    out = {by[0]: pa.array(keys[starts], column.type)}
    for p, c in cols.items():
        if c is None:
            out[p] = pa.array(np.diff(np.append(starts, len(keys))))
        elif not isinstance(c, np.ndarray) and pa.types.is_decimal(c.type):
            # decimal partials, exactly: their unscaled integers summed as limbs
            out[p] = limbs_to_decimal([np.add.reduceat(limb, starts)
                                       for limb in decimal_limbs(c)], c.type)
        else:
            values = c if isinstance(c, np.ndarray) else c.to_numpy()
            out[p] = pa.array(np.add.reduceat(values, starts))
    return pa.table(out)


def _viewed(col, t: pa.DataType):
    """A column's chunks viewed as another type of the same layout."""
    if isinstance(col, pa.ChunkedArray):
        return pa.chunked_array([c.view(t) for c in col.chunks], t)
    return col.view(t)


def _decoded(col):
    """A dictionary column as its values (partials and results hold plain columns)."""
    return col.cast(col.type.value_type) if pa.types.is_dictionary(col.type) else col


def _unified(chunk: pa.Table, by: list[str]) -> pa.Table:
    """Dictionary group columns made to share one dictionary across the chunk's batches
    (Arrow groups on their codes then, but only on one dictionary). A dictionary that
    holds a null value (Arrow cannot unify those) is decoded instead."""
    for b in by:
        col = chunk.column(b)
        if pa.types.is_dictionary(col.type) and any(c.dictionary.null_count for c in col.chunks):
            chunk = chunk.set_column(chunk.schema.get_field_index(b), b, _decoded(col))
    if any(pa.types.is_dictionary(chunk.schema.field(b).type) and chunk.column(b).num_chunks > 1
           for b in by):
        return chunk.unify_dictionaries()
    return chunk


def _plain_schema(schema: pa.Schema) -> pa.Schema:
    """Dictionary columns typed as their values: what partials and results hold."""
    return pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f
                      for f in schema])


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
    Runs in ``engine``, else the engine that made the stream, else the one engine open
    (:func:`arrangedb.spine.engine.engine_for`), spilling partial aggregates through it
    when the groups do not fit its budget.

    ``phase`` splits the work for a distributed plan: ``"partial"`` emits partial
    aggregates (columns of :meth:`_Partials.partial_schema`) instead of results, and
    ``"final"`` takes such partials (from many producers) and finishes them; it needs
    ``source_schema``, the schema of the rows the partials were computed from.
    """
    if phase not in ("complete", "partial", "final"):
        raise ValueError(f"phase must be complete, partial or final, not {phase!r}")
    by = [by] if isinstance(by, str) else list(by)
    stream_schema, batches = open_batches(stream)
    schema = _plain_schema(stream_schema)
    if phase == "final":
        if source_schema is None:
            raise ValueError("group_by(phase='final') needs source_schema=, the schema of "
                             "the rows the partials were computed from")
        schema, weight = _plain_schema(source_schema), None
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
    partials = _Partials(by, aggs, _partial_names(aggs), schema, weight)
    if phase == "final":
        missing = [n for n in partials.partial_schema().names if n not in stream_schema.names]
        if missing:
            raise KeyError(f"group_by(phase='final'): the stream lacks partial columns "
                           f"{missing}; feed it the output of phase='partial'")
    first = partials.of_partials if phase == "final" else partials.of_batch
    last = partials.as_partials if phase == "partial" else partials.finish
    out_schema = partials.partial_schema() if phase == "partial" else _output_schema(partials)
    return pa.RecordBatchReader.from_batches(
        out_schema, _run(partials, batches, engine, batch_rows, first, last))


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


def _output_schema(partials: _Partials) -> pa.Schema:
    fields = [partials.schema.field(b) for b in partials.by]
    fields += [output_field(n, f, c, partials.schema) for n, (f, c) in partials.aggs.items()]
    return pa.schema(fields)


def _run(partials: _Partials, batches, engine, batch_rows, first, last):
    trace = None
    held: list[pa.Table] = []
    held_bytes = 0
    reserved = 0

    def account(nbytes: int) -> None:
        """Hold exactly ``nbytes`` of the budget for the partials kept in memory."""
        nonlocal reserved
        if nbytes > reserved:
            engine.budget.reserve(nbytes - reserved, "group_by partials")
        else:
            engine.budget.release(reserved - nbytes, "group_by partials")
        reserved = nbytes

    try:
        # combining the held partials takes two to three times their size again (the
        # concatenation, Arrow's hash table and its output): an eighth of the budget
        # held keeps that within the budget's share left beside the readers
        limit = max(engine.budget.limit // 8, 1 << 20)
        churn = 0
        budget = engine.budget
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
                budget.trim_if_high(share=1.0)
            part = first(chunk)
            held.append(part)
            held_bytes += part.nbytes
            account(held_bytes)
            if held_bytes < limit:
                continue
            combined = partials.combine(pa.concat_tables(held))
            held, held_bytes = [combined], combined.nbytes
            account(held_bytes)
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
            account(held_bytes)
            release_freed_memory()
        rest = partials.combine(pa.concat_tables(held)) if held else None
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
        engine.budget.trim_if_high()


def _coalesced(batches, max_bytes: int, max_rows: int = 1 << 20) -> Iterator[pa.Table]:
    """The stream's non-empty batches gathered into tables of up to ``max_rows`` rows (or
    ``max_bytes``), as chunks: one grouping call per table costs less per row than one
    per 64k-row batch, and chunks need no copy (strings included) to be grouped."""
    pending, rows, nbytes = [], 0, 0
    for rb in batches:
        if rb.num_rows == 0:
            continue
        pending.append(rb)
        rows += rb.num_rows
        nbytes += rb.nbytes
        if rows >= max_rows or nbytes >= max_bytes:
            yield pa.Table.from_batches(pending)
            pending, rows, nbytes = [], 0, 0
    if pending:
        yield pa.Table.from_batches(pending)


def _finish_spilled(partials: _Partials, trace, last) -> Iterator[pa.RecordBatch]:
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
