"""Per-key reductions of one arrangement: reduce, distinct, top_k, threshold.

Each walks the trace's cursor block by block (a block never splits a key), so a key's
rows are complete in one block and every function is an array operation over the
block's groups. Output streams in the cursor's bounded blocks.

Incremental ``reduce(since=, upto=)``: the keys a change in ``[since, upto)`` touches
are read from the changes cursor; their old (``since - 1``) and new (``upto - 1``)
accumulations come from the trace's batched ``lookup``; each key whose aggregates
differ yields a retraction of the old row and an insertion of the new one, at the time
of the key's last change in the interval. Applying them to the result at ``since - 1``
gives the result at ``upto - 1``; a reduction's values at times in between are not
materialised.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from arrangedb.ops.aggregate import aggregate, check_aggs, grouped_sum, output_field
from arrangedb.ops.common import columns_of, row_owner
from arrangedb.ops.per_key import check_window, lookup_block, per_key_changes
from arrangedb.spine import Block, blocks, codes, roles


def _agg_schema(trace, aggs: dict, changes: bool) -> pa.Schema:
    fields = list(trace.key_schema) + [output_field(n, f, c, trace.val_schema)
                                       for n, (f, c) in aggs.items()]
    if changes:
        fields += [roles.time_field("time"), roles.weight_field("diff")]
    return roles.with_engine(pa.schema(fields), trace.ctx.engine_id)


def _reduce_block(b: Block, aggs, val_schema) -> tuple[pa.Table, list[pa.Array], np.ndarray]:
    """Distinct keys whose rows net a non-zero count, and their aggregates."""
    arrays = aggregate(b.key_bounds, b.vals, b.counts, aggs, val_schema)
    net = grouped_sum(b.counts.astype(np.int64, copy=False), b.key_bounds)
    return b.keys, arrays, net != 0


def _snapshot(trace, aggs, at, schema):
    for b in blocks(trace, at=at):
        if not len(b):
            continue
        keys, arrays, keep = _reduce_block(b, aggs, trace.val_schema)
        if not keep.all():
            idx = pa.array(np.flatnonzero(keep), pa.int64())
            keys, arrays = keys.take(idx), [a.take(idx) for a in arrays]
        if keys.num_rows:
            yield pa.RecordBatch.from_arrays(columns_of(keys) + arrays, schema=schema)


def reduce_of_keys(trace, keys: pa.Table, aggs: dict, at: int) -> pa.Table:
    """``reduce(trace, aggs, at=at)``'s rows of ``keys`` (distinct, sorted) alone, from
    one batched lookup: a view's recomputed keys."""
    aggs = check_aggs(aggs, trace.val_schema, f"trace {trace.name or ''} vals".strip())
    b = lookup_block(trace, keys, at)
    keys, arrays, keep = _reduce_block(b, aggs, trace.val_schema)
    out = pa.Table.from_arrays(columns_of(keys) + arrays,
                               schema=_agg_schema(trace, aggs, changes=False))
    return out if keep.all() else out.filter(pa.array(keep))


def _rows_equal(a: list[pa.Array], b: list[pa.Array], n: int) -> np.ndarray:
    same = np.ones(n, dtype=bool)
    for x, y in zip(a, b):
        eq = pa.compute.equal(x, y).fill_null(False).to_numpy(zero_copy_only=False)
        both_null = (x.is_null().to_numpy(zero_copy_only=False)
                     & y.is_null().to_numpy(zero_copy_only=False))
        same &= eq | both_null
    return same


def _incremental(trace, aggs, since, upto, schema):
    for d in blocks(trace, changes=(since, upto)):
        if d.num_keys == 0:
            continue
        last_time = np.maximum.reduceat(d.times, d.key_bounds[:-1])
        new = lookup_block(trace, d.keys, upto - 1 if upto is not None else None)
        if since > 0:
            old = lookup_block(trace, d.keys, since - 1)
        else:
            old = Block(d.keys, np.zeros(d.num_keys + 1, np.int64),
                        trace.val_schema.empty_table() if trace.val_schema is not None else None,
                        np.zeros(0, np.int64))
        _, new_a, new_has = _reduce_block(new, aggs, trace.val_schema)
        _, old_a, old_has = _reduce_block(old, aggs, trace.val_schema)
        same = new_has & old_has & _rows_equal(new_a, old_a, d.num_keys)
        retract = np.flatnonzero(old_has & ~same)
        insert = np.flatnonzero(new_has & ~same)
        sel = np.concatenate([retract, insert])
        if not len(sel):
            continue
        order = np.argsort(sel, kind="stable")       # key order, retraction first
        sel = sel[order]
        side = np.concatenate([np.zeros(len(retract), bool), np.ones(len(insert), bool)])[order]
        idx = pa.array(sel, pa.int64())
        arrays = [pa.compute.if_else(pa.array(side), n.take(idx), o.take(idx))
                  for n, o in zip(new_a, old_a)]
        arrays = [a.cast(f.type) for a, f in zip(arrays, list(schema)[len(trace.key_names):])]
        yield pa.RecordBatch.from_arrays(
            columns_of(d.keys.take(idx)) + arrays
            + [pa.array(last_time[sel], pa.uint64()),
               pa.array(np.where(side, 1, -1).astype(np.int64))], schema=schema)


def reduce(trace, aggs: dict, at: int | None = None, since: int | None = None,
           upto: int | None = None) -> pa.RecordBatchReader:
    """One row per key: the key columns and one column per aggregate.

    ``aggs`` maps an output name to ``(function, column)``, function in count, sum, min,
    max, count_distinct, mean (``count`` with column None counts rows). Counts weigh
    every row. With ``since`` (and ``upto``), the result's changes instead: the same
    columns plus ``time`` and ``diff``.
    """
    aggs = check_aggs(aggs, trace.val_schema, f"trace {trace.name or ''} vals".strip())
    check_window([trace], at, since, upto)
    if since is None:
        trace.check_read_time(at)
        schema = _agg_schema(trace, aggs, changes=False)
        return pa.RecordBatchReader.from_batches(schema, _snapshot(trace, aggs, at, schema))
    schema = _agg_schema(trace, aggs, changes=True)
    return pa.RecordBatchReader.from_batches(schema, _incremental(trace, aggs, since, upto,
                                                                  schema))


def _filtered(trace, at, since, upto, counts_of):
    """Snapshot rows of ``trace`` with the counts ``counts_of(block)`` gives them; rows
    given a zero count are dropped (a snapshot block holds no zero counts of its own).
    With ``since``: that output's changes (:mod:`arrangedb.ops.per_key`)."""
    check_window([trace], at, since, upto)
    if since is not None:
        schema = trace.output_schema(roles.time_field("time"), roles.weight_field("diff"))
        return pa.RecordBatchReader.from_batches(schema, per_key_changes(
            [trace], since, upto, schema, lambda b: _kept_rows(b, counts_of)))
    trace.check_read_time(at)
    schema = trace.output_schema(roles.weight_field("count"))

    def gen():
        for b in blocks(trace, at=at):
            for arrays, counts in _kept_rows(b, counts_of):
                yield pa.RecordBatch.from_arrays(arrays + [pa.array(counts, pa.int64())],
                                                 schema=schema)
    return pa.RecordBatchReader.from_batches(schema, gen())


def _kept_rows(b, counts_of):
    """(columns, counts) of the block's rows ``counts_of`` gives a nonzero count."""
    if not len(b):
        return
    counts = counts_of(b)
    rows = np.flatnonzero(counts)
    if not len(rows):
        return
    idx = pa.array(rows, pa.int64())
    yield (columns_of(b.row_keys().take(idx)) + columns_of(
        b.vals.take(idx) if b.vals is not None else None), counts[rows])


def distinct(trace, at: int | None = None, since: int | None = None,
             upto: int | None = None) -> pa.RecordBatchReader:
    """Each (key, vals) present with a positive count, once (``count`` = 1). With
    ``since`` (and ``upto``), the result's changes instead: ``time`` and ``diff``."""
    return _filtered(trace, at, since, upto, lambda b: (b.counts > 0).astype(np.int64))


def threshold(trace, predicate, at: int | None = None, since: int | None = None,
              upto: int | None = None) -> pa.RecordBatchReader:
    """Rows whose count passes ``predicate`` (called on a numpy array of counts). With
    ``since`` (and ``upto``), the result's changes instead."""
    if not callable(predicate):
        raise TypeError(f"predicate must be callable on an array of counts, got {predicate!r}")

    def passing(b):
        mask = np.asarray(predicate(b.counts))
        if mask.dtype != bool or mask.shape != b.counts.shape:
            raise TypeError("predicate must return a boolean array shaped like the counts "
                            "(it is called on a whole block: use numpy comparisons)")
        return np.where(mask, b.counts, 0)
    return _filtered(trace, at, since, upto, passing)


def top_k(trace, k: int, by, descending: bool = True, at: int | None = None,
          since: int | None = None, upto: int | None = None) -> pa.RecordBatchReader:
    """Per key, the ``k`` rows first by ``by`` (counts weigh: a row of count 3 is 3 rows).
    With ``since`` (and ``upto``), the result's changes instead."""
    if not isinstance(k, (int, np.integer)) or k <= 0:
        raise ValueError(f"k must be a positive int, got {k!r}")
    by = [by] if isinstance(by, str) else list(by)
    for col in by:
        if col not in trace.val_names:
            raise KeyError(f"top_k: no val column {col!r} (vals: {trace.val_names})")

    def first_k(b):
        present = b.counts > 0
        group = row_owner(b.key_bounds)
        rank = codes([b.vals.select(by)], by)[0].astype(np.int64)
        rank = -rank if descending else rank
        order = np.lexsort((rank, ~present, group))   # within a key: present rows by rank
        c = np.where(present, b.counts, 0)[order]
        csum = np.cumsum(c)
        group_start_sum = np.concatenate([[0], csum])[b.key_bounds[:-1]]
        before = csum - c - group_start_sum[group[order]]
        allowed = np.clip(k - before, 0, None)
        out = np.minimum(c, allowed)
        counts = np.zeros(len(b.counts), dtype=np.int64)
        counts[order] = out
        return counts
    return _filtered(trace, at, since, upto, first_k)
