"""Grouping on one integer column whose values span a small range, without hashing.

Each value less the smallest is its group's slot, and ``np.bincount`` sums the partials
into one array per partial, as DuckDB's perfect hash aggregation does: customer ids,
dates as days, small enumerations. 7.5M rows of 750k customer ids with a count and a
float sum group in 0.16 s this way, against 0.47 s through Arrow's hash grouping (in
1M-row chunks, as ``group_by`` hands them over: 0.11 s). The slot arrays stay near the
input's size (at most four slots per row, and 1M slots), as a hash table would.

Arithmetic: float partials are summed in row order; integer partials exactly -- by
``bincount`` while every total stays below 2**53, else signed ones by ``np.add.at``
(uint64 ones beyond that are left to the hash grouping).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

SLOTS_PER_ROW = 4     # a range up to four times the rows (plus SLOTS_FLOOR) goes by slot,
SLOTS_FLOOR = 1 << 12
MAX_SLOTS = 1 << 20   # and never past 8 MiB per partial's totals


def dense_groups(chunk: pa.Table, by: list[str], cols: dict) -> pa.Table | None:
    """Partials of ``chunk`` grouped on its one integer group column by slot, groups in
    ascending order; None when the column is not of that form (nulls, a wide range) or
    a partial is not a numpy-readable number column without nulls.

    ``cols``: per partial, its per-row values (numpy, an Arrow column, or None for one
    per row); partials given as one array under several names are summed once."""
    if len(by) != 1:
        return None
    column = chunk.column(by[0])
    n = len(column)
    if not pa.types.is_integer(column.type) or column.null_count or n == 0:
        return None
    keys = column.to_numpy()
    lo, hi = int(keys.min()), int(keys.max())
    span = hi - lo + 1
    if span > min(SLOTS_PER_ROW * n + SLOTS_FLOOR, MAX_SLOTS):
        return None
    values = {}
    for p, c in cols.items():
        if c is None or id(c) in values:
            continue
        if not isinstance(c, np.ndarray):
            if c.null_count or not (pa.types.is_integer(c.type) or pa.types.is_floating(c.type)):
                return None
            c = c.to_numpy()
        values[id(cols[p])] = c
    wide = np.uint64 if keys.dtype.kind == "u" else np.int64   # narrow keys' offsets wrap
    slot = (keys.astype(wide, copy=False) - wide(lo)).astype(np.intp, copy=False)
    rows = np.bincount(slot, minlength=span)
    totals = {}
    for i, c in values.items():
        totals[i] = _summed(slot, c, span)
        if totals[i] is None:
            return None
    present = np.flatnonzero(rows)
    out = {by[0]: pa.array((present.astype(wide) + wide(lo)).astype(keys.dtype), column.type)}
    for p, c in cols.items():
        out[p] = pa.array((rows if c is None else totals[id(c)])[present])
    return pa.table(out)


def _summed(slot: np.ndarray, c: np.ndarray, span: int) -> np.ndarray | None:
    """``c`` summed per slot: float64 for floats, int64 for integers (exactly)."""
    if c.dtype.kind == "f":
        return np.bincount(slot, weights=c, minlength=span)
    if c.dtype.kind not in "iub":
        return None
    largest = max(abs(int(c.max())), abs(int(c.min())))
    if largest * len(c) < 2 ** 53:   # every total, and every sum on the way, is exact
        return np.bincount(slot, weights=c, minlength=span).astype(np.int64)
    if c.dtype.kind == "u":
        return None
    total = np.zeros(span, np.int64)
    np.add.at(total, slot, c.astype(np.int64, copy=False))
    return total
