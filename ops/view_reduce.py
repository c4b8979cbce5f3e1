"""A reduce view's change from its stored aggregates: per-key state, not whole groups.

For ``reduce(trace, aggs)``, the view's own row of a key is the state its next value is
computed from (the way a maintained aggregate keeps its running value): a key's change
at one time is summed into its counts and sums, and its new maximum is the larger of
the stored one and the values inserted -- as long as no value retracted reaches the
stored maximum, or a value inserted reaches it too (minimums alike). Means and counts
of distinct values come from the accumulators the view keeps beside its rows
(:mod:`arrangedb.ops.view_state`), which also count each key's rows. Only keys where
that does not hold -- the extreme retracted and not passed, a null among the changed
values or the stored aggregates of a sum, minimum or maximum, a group that may have
emptied without a count to tell -- are recomputed from their rows by the view's
per-key path.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrangedb.ops.view_delta import DIFF, as_retractions, delta_schema
from arrangedb.ops.view_state import distinct_countable

FAST = ("count", "sum", "min", "max", "mean", "count_distinct")
_ACCUMULATED = ("mean", "count_distinct")   # from the view's state, nulls and all


def eligible(aggs: dict, val_schema: pa.Schema | None) -> bool:
    """Whether every aggregate can be kept from the stored row, the state and the
    changes: counts; sums, means, minimums and maximums of signed integer or float
    columns; counts of distinct integers, strings, booleans and dates."""
    for fn, col in aggs.values():
        if fn not in FAST:
            return False
        if col is not None:
            t = val_schema.field(col).type
            # unsigned values past 2**63 would compare as negatives in int64, and a
            # retraction's weighted change does not fit their type
            numeric = pa.types.is_signed_integer(t) or pa.types.is_floating(t)
            if not (distinct_countable(t) if fn == "count_distinct" else numeric):
                return False
    return True


def _values(arr, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(values with nulls as 0, valid mask) of an Arrow column."""
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    valid = np.ones(len(arr), dtype=bool) if arr.null_count == 0 else \
        arr.is_valid().to_numpy(zero_copy_only=False)
    filled = arr.fill_null(pa.scalar(0, arr.type)) if arr.null_count else arr
    return filled.to_numpy(zero_copy_only=False).astype(dtype, copy=False), valid


def stored_delta(view, aggs: dict, changes: pa.Table, state=None, time: int = 0
                 ) -> tuple[pa.Table | None, pa.Table, int, pa.Table]:
    """(the view's change for the keys it can keep from their stored rows, the keys it
    must recompute, how many it kept, the stored rows of the keys to recompute -- a
    lookup's columns, ``query_index`` the key's position among them: what their
    recompute retracts, not looked up twice). ``changes``: the input's changes at one
    time; ``state``: the view's :class:`~arrangedb.ops.view_state.ReduceState`, which
    this advances (None: the aggregates need none, or it is to be built again -- then
    every key that needs it is recomputed) to ``time``, the changes' time.

    A float value retracted that is not finite (NaN, inf) cannot be taken back out of a
    stored sum (NaN - NaN, inf - inf are NaN): such keys are recomputed. Minimums and
    maximums skip NaN, as ``reduce``'s do."""
    keys = view.key_names
    cols = sorted({c for fn, c in aggs.values() if c is not None and fn != "count_distinct"})
    extremes = {fn for fn, _ in aggs.values() if fn in ("min", "max")}
    summed = {c for fn, c in aggs.values() if fn in ("sum", "mean")}
    per_key = _sorted_runs(changes, keys, cols, extremes, summed)
    if per_key is None:
        per_key = _hashed(changes, keys, cols)
    n = per_key.num_rows
    key_table = per_key.select(keys)
    old = view.stored_rows(key_table)
    qi = old.column("query_index").to_numpy()
    had = np.zeros(n, dtype=bool)
    had[qi] = True
    retracts = per_key.column("__down_sum").to_numpy() > 0
    dn = per_key.column("__d_sum").to_numpy()

    fast = np.ones(n, dtype=bool)
    alive = np.ones(n, dtype=bool)
    known = ~retracts          # whether the group is known to keep a row (or be gone)
    acc = state.advance(key_table, per_key, changes, time) if state is not None else None
    if acc is not None:   # the state counts every key's rows
        known[:] = True
        alive = acc.rows > 0
    elif any(fn in _ACCUMULATED for fn, _ in aggs.values()):
        fast[:] = False
    # a key whose row comes out as stored (a change below its maximum, say): neither
    # retracted nor inserted -- most keys of a small change to a max or min
    same = had.copy()
    same[qi] &= old.column("count").to_numpy() == 1
    new_cols, new_valid = {}, {}
    for name, (fn, c) in aggs.items():
        t = view.val_schema.field(name).type
        dtype = np.float64 if pa.types.is_floating(t) else np.int64
        prev = np.zeros(n, dtype)
        prev_valid = np.ones(n, dtype=bool)
        stored, stored_valid = _values(old.column(name), dtype)
        prev[qi], prev_valid[qi] = stored, stored_valid
        valid = np.ones(n, dtype=bool)
        if fn in _ACCUMULATED:
            if acc is None:
                continue
            if fn == "mean":   # null over no non-null value
                count, total = acc.means[c]
                valid = count > 0
                with np.errstate(divide="ignore", invalid="ignore"):
                    value = total / np.where(valid, count, 1)
            else:
                value = prev + acc.distinct[c]
            new_cols[name], new_valid[name] = value, valid
            same &= np.where(valid & prev_valid, _bits_equal(value, prev),
                             valid == prev_valid)
            continue
        fast[qi[~stored_valid]] = False   # a stored null: a group of nulls alone
        if c is not None:
            fast &= per_key.column(f"{c}__nulls_sum").to_numpy() == 0
            if f"{c}__outbad_sum" in per_key.column_names:   # a NaN or inf taken out
                fast &= per_key.column(f"{c}__outbad_sum").to_numpy() == 0
        if fn == "count":
            new_cols[name] = prev + dn   # no nulls among the changes: rows are values
            if c is None:
                known[:] = True
                alive &= new_cols[name] > 0
        elif fn == "sum":
            delta, _ = _values(per_key.column(f"{c}__w_sum"), dtype)
            with np.errstate(invalid="ignore"):   # inf - inf: NaN, as a sum of them is
                new_cols[name] = prev + delta
        else:
            ins, has_in = _values(per_key.column(f"{c}__in_{fn}"), dtype)
            out, has_out = _values(per_key.column(f"{c}__out_{fn}"), dtype)
            # the stored extreme holds unless a value retracted reaches it; an inserted
            # value beyond it is the new extreme whatever was retracted
            if fn == "max":   # (fmax, fmin: NaN skipped, unless there is nothing else)
                stays = ~has_out | (out < prev) | (has_in & (ins >= prev))
                value = np.where(has_in, np.fmax(prev, ins), prev)
            else:
                stays = ~has_out | (out > prev) | (has_in & (ins <= prev))
                value = np.where(has_in, np.fmin(prev, ins), prev)
            # a new group: its extreme is what was inserted, if nothing was retracted
            value = np.where(had, value, ins)
            stays = np.where(had, stays, ~has_out & has_in)
            fast &= stays
            known |= stays
            new_cols[name] = value
        new_valid[name] = valid
        same &= _bits_equal(new_cols[name], prev)
    fast &= known   # without a count, a group whose extreme left may have emptied
    slow = key_table.filter(pa.array(~fast))
    slow_stored = _rows_of(old, qi, ~fast)
    kept = int(fast.sum())
    same &= alive
    fast &= ~same
    if not fast.any():
        return None, slow, kept, slow_stored
    rows = np.flatnonzero(fast)
    keep = pa.array(rows[alive[rows]])
    inserted = {k: key_table.column(k).take(keep) for k in keys}
    for name in view.val_names:
        inserted[name] = pa.array(new_cols[name], mask=~new_valid[name]).take(keep).cast(
            view.val_schema.field(name).type)
    inserted[DIFF] = pa.array(np.ones(len(keep), np.int64))
    # the stored rows of the keys kept here, retracted
    retracted = as_retractions(old.filter(pa.array(fast[qi])), keys + view.val_names)
    return (pa.concat_tables([retracted, pa.table(inserted).cast(delta_schema(view))]),
            slow, kept, slow_stored)


def _rows_of(looked_up: pa.Table, qi: np.ndarray, chosen: np.ndarray) -> pa.Table:
    """The rows of a lookup whose query is ``chosen``, their ``query_index`` renumbered
    to the position among the chosen queries."""
    rows = chosen[qi]
    position = np.cumsum(chosen) - 1
    return looked_up.filter(pa.array(rows)).set_column(
        0, "query_index", pa.array(position[qi[rows]]))


def _bits_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise equality of the stored bits (0.0 and -0.0 differ, as in the view)."""
    if a.dtype.kind == "f":
        return a.view(np.int64) == b.view(np.int64)
    return a == b


def _hashed(changes: pa.Table, keys: list[str], cols: list[str]) -> pa.Table:
    """Per key of ``changes``: the net diff, retractions, and per column its nulls,
    weighted sum and the extremes inserted (``__in``) and retracted (``__out``)."""
    diff = changes.column("diff")
    up, down = pc.greater(diff, 0), pc.less(diff, 0)
    work = {k: changes.column(k) for k in keys}
    work["__d"] = diff
    work["__down"] = pc.cast(down, pa.int64())
    specs = [("__d", "sum"), ("__down", "sum")]
    for c in cols:
        col = changes.column(c)
        work[f"{c}__in"] = pc.if_else(up, col, pa.nulls(len(col), col.type))
        work[f"{c}__out"] = pc.if_else(down, col, pa.nulls(len(col), col.type))
        work[f"{c}__nulls"] = pc.cast(pc.is_null(col), pa.int64())
        work[f"{c}__w"] = pc.multiply(col, pc.cast(diff, col.type))
        work[f"{c}__nv"] = pc.if_else(pc.is_valid(col), diff, 0)
        specs += [(f"{c}__in", "max"), (f"{c}__in", "min"), (f"{c}__out", "max"),
                  (f"{c}__out", "min"), (f"{c}__nulls", "sum"), (f"{c}__w", "sum"),
                  (f"{c}__nv", "sum")]
        if pa.types.is_floating(col.type):
            bad = pc.and_(down, pc.invert(pc.is_finite(col)))
            work[f"{c}__outbad"] = pc.cast(pc.fill_null(bad, False), pa.int64())
            specs.append((f"{c}__outbad", "sum"))
    per_key = pa.table(work).group_by(keys).aggregate(specs)
    return per_key.sort_by([(k, "ascending") for k in keys])


def _sorted_runs(changes: pa.Table, keys: list[str], cols: list[str], extremes: set,
                 summed: set) -> pa.Table | None:
    """:func:`_hashed`'s table by ``reduceat`` over runs of equal keys, when the changes
    come sorted by one integer key (a trace's changes at one time do): no hashing, and
    only what the aggregates read (the ``extremes``, "min" and "max"; weighted sums of
    the ``summed`` columns)."""
    if len(keys) != 1 or changes.num_rows == 0:
        return None
    kcol = changes.column(keys[0])
    if not pa.types.is_integer(kcol.type) or kcol.null_count:
        return None
    k = kcol.to_numpy()
    if (k[1:] < k[:-1]).any():
        return None
    starts = np.flatnonzero(np.concatenate([[True], k[1:] != k[:-1]]))
    d = changes.column("diff").to_numpy()
    up, down = d > 0, d < 0
    out = {keys[0]: pa.array(k[starts], kcol.type),
           "__d_sum": np.add.reduceat(d, starts),
           "__down_sum": np.add.reduceat(down.astype(np.int64), starts)}
    for c in cols:
        col = changes.column(c)
        t = col.type
        dtype = np.float64 if pa.types.is_floating(t) else np.int64
        v, valid = _values(col, dtype)
        out[f"{c}__nulls_sum"] = np.add.reduceat((~valid).astype(np.int64), starts) \
            if col.null_count else np.zeros(len(starts), np.int64)
        if c in summed:
            out[f"{c}__w_sum"] = pa.array(np.add.reduceat(np.where(valid, v * d, 0), starts)
                                          ).cast(t)
            out[f"{c}__nv_sum"] = np.add.reduceat(np.where(valid, d, 0), starts)
        lo, hi = (-np.inf, np.inf) if dtype is np.float64 else \
            (np.iinfo(np.int64).min, np.iinfo(np.int64).max)
        if dtype is np.float64:
            out[f"{c}__outbad_sum"] = np.add.reduceat(
                (down & valid & ~np.isfinite(v)).astype(np.int64), starts)
        for side, mask in (("in", up & valid), ("out", down & valid)):
            has = np.add.reduceat(mask.astype(np.int64), starts) == 0
            for fn, red, fill in (("max", np.fmax, lo), ("min", np.fmin, hi)):
                if fn not in extremes:
                    continue
                r = red.reduceat(np.where(mask, v, fill), starts)
                out[f"{c}__{side}_{fn}"] = pa.array(r, mask=has).cast(t)
    return pa.table(out)
