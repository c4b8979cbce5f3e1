"""Per-key partial aggregates of a block: what eager aggregation (``join_group_by``) moves
through a join instead of the rows -- per key of a fact side's block, the count-weighted
rows, the sums and the valid rows its aggregates need, read off the sums a part stores
or computes on its encoding where it can."""

from __future__ import annotations

import numpy as np

from arrangedb.ops.aggregate import (LIMB_SEP, decimal_limbs, int_limbs, numeric_values,
                                     times_counts, weigh_limbs)
from arrangedb.spine import Block, is_constant, run_index


SHORT_RUNS = 4   # fewer rows per key than this on average: per-key sums by bincount


class NotFiniteRetracted(Exception):
    """A linear read met a NaN or inf among rows counted below zero: their sums across
    batches do not cancel (NaN - NaN is NaN), so the caller reads the trace merged."""


def _any_below_zero(counts: np.ndarray, unit: int | None, odd: np.ndarray | None) -> bool:
    """Whether a row counts below zero (``unit``, ``odd``: the usual count and the rows
    counted otherwise, as found above; ``unit`` None: counts of no usual value)."""
    if unit is None:
        return bool(len(counts)) and int(counts.min()) < 0
    return unit < 0 or (odd is not None and len(odd) and int(counts[odd].min()) < 0)


class KeyPartials:
    """Per key of an A block, the sums each partial needs: ``n`` (count-weighted rows,
    or valid values), ``s`` (count-weighted values) and ``v`` (valid rows: a sum over no
    non-null value is null). ``v`` counts each row once, as the rows of a consolidated
    read are; ``linear``: weighted by the counts, as ``n`` is, so that every partial is
    linear in them -- for blocks of batches read side by side, whose counts may be zero
    or negative (a later batch's retraction) and add up across the batches. A decimal
    column's ``s`` comes as the limbs of its exact sums (``s#0``, ``s#1``...: see
    :mod:`arrangedb.ops.aggregate`)."""

    def __init__(self, aggs: dict, plan: dict, column_of: dict, decimal_sums=(),
                 linear: bool = False):
        self.aggs, self.plan, self.column_of = aggs, plan, column_of
        self.linear = linear
        self.decimal_sums = frozenset(decimal_sums)   # the partials of decimal sums
        cols = [(fn, column_of[c]) for fn, c in aggs.values() if c is not None]
        self.columns = frozenset(c for _, c in cols)   # the A columns read
        self.sums = frozenset(c for fn, c in cols if fn != "count")   # only summed

    def __call__(self, block: Block) -> dict[str, np.ndarray]:
        bounds = block.key_bounds.astype(np.int64, copy=False)
        starts, rows = bounds[:-1], np.diff(bounds)
        counts = block.counts
        # Counts are mostly one value (each stored row once): sum the values per key and
        # correct for the few rows counted otherwise, instead of weighing every row
        unit = int(counts[0]) if len(counts) and counts[0] != 0 else 1
        odd = None
        if not is_constant(counts):
            other = counts != unit
            if np.count_nonzero(other) > len(counts) // 8:
                unit = None   # not few (a delta's retractions): weigh every row
            else:
                odd = np.flatnonzero(other)
        odd_key = (None if odd is None or not len(odd)
                   else np.searchsorted(bounds, odd, side="right") - 1)

        # few rows per key (a delta's changes): reduceat pays per run; integers are
        # prefix-summed and differenced at the bounds (exact: int64 wraps alike on both
        # sides), floats summed by bincount over each row's key
        short = len(starts) * SHORT_RUNS > len(counts)
        # two rows every key (a view's change: each group's old row retracted, its new
        # one inserted): summed as the two halves of a strided view, in row order
        pairs = short and len(counts) == 2 * len(starts) and bool((rows == 2).all())
        key_of = None   # each row's key, made once if a sum needs it

        def per_key(x: np.ndarray) -> np.ndarray:
            nonlocal key_of
            if not len(starts):
                return x[:0]
            if pairs:
                return x[0::2] + x[1::2]
            if not short:
                return np.add.reduceat(x, starts)
            if x.dtype.kind in "iub":
                prefix = np.empty(len(x) + 1, np.int64)
                prefix[0] = 0
                np.cumsum(x.astype(np.int64, copy=False), out=prefix[1:])
                return prefix[bounds[1:]] - prefix[starts]
            if key_of is None:
                key_of = run_index(rows)
            return np.bincount(key_of, weights=x, minlength=len(starts))

        def weighted(x: np.ndarray) -> np.ndarray:
            if unit is not None:
                total = per_key(x)
                if unit == 1 and odd_key is None:
                    return total
                # the correction is exact for finite values only (inf - inf is NaN)
                if x.dtype.kind != "f" or np.isfinite(total).all():
                    if unit != 1:
                        total *= unit
                    if odd_key is not None:
                        np.add.at(total, odd_key, x[odd] * (counts[odd] - unit))
                    return total
            return per_key(times_counts(x, counts))

        if unit is None:
            n_rows = per_key(counts.astype(np.int64))
        elif unit == 1 and odd_key is None:
            n_rows = rows   # the same array: partials equal by identity are grouped once
        else:
            n_rows = rows * unit
            if odd_key is not None:
                np.add.at(n_rows, odd_key, counts[odd] - unit)
        valid_rows = n_rows if self.linear else rows   # (no nulls)
        summed = block.key_sums or {}
        weighted_sums = block.weighted_sums or {}
        out = {}
        for name, (fn, col) in self.aggs.items():
            if col is not None and self.column_of[col] in weighted_sums:
                # summed on its encoding, weighted by the counts: no nulls, no decimal
                s = weighted_sums[self.column_of[col]]
                for pname, kind in self.plan[name]:
                    out[pname] = n_rows if kind == "n" else valid_rows if kind == "v" else s
                continue
            if col is not None and self.column_of[col] in summed:
                # summed on its encoding: no nulls, every row counted ``unit`` times
                s = summed[self.column_of[col]]
                for pname, kind in self.plan[name]:
                    if pname in self.decimal_sums:   # the unscaled integers' sums, exact
                        limbs = int_limbs(s) if unit == 1 else weigh_limbs(int_limbs(s), unit)
                        out.update((f"{pname}{LIMB_SEP}{i}", x) for i, x in enumerate(limbs))
                        continue
                    out[pname] = (n_rows if kind == "n" else valid_rows if kind == "v"
                                  else s if unit == 1 else s * unit)
                continue
            arr = None
            if col is not None:
                arr = block.vals.column(self.column_of[col])
                arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
            valid = (None if arr is None or arr.null_count == 0
                     else arr.is_valid().to_numpy(zero_copy_only=False))
            for pname, kind in self.plan[name]:
                if kind == "n":
                    out[pname] = n_rows if valid is None else weighted(valid.astype(np.int64))
                elif kind == "v" and valid is None:
                    out[pname] = valid_rows
                elif kind == "v":
                    valid = valid.astype(np.int64)
                    out[pname] = weighted(valid) if self.linear else per_key(valid)
                elif pname in self.decimal_sums:   # exact: limbs of the unscaled integers
                    ones = unit == 1 and odd_key is None
                    out.update((f"{pname}{LIMB_SEP}{i}", per_key(x)) for i, x in
                               enumerate(decimal_limbs(arr, None if ones else counts)))
                else:   # "s": nulls were filled with 0
                    out[pname] = weighted(numeric_values(arr))
        if self.linear and _any_below_zero(counts, unit, odd):
            for x in out.values():
                if x.dtype.kind == "f" and not np.isfinite(x).all():
                    raise NotFiniteRetracted
        return out
