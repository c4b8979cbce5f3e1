"""Comparable codes: turning rows of Arrow columns into numpy arrays that sort like them.

Every kernel of the spine (sort, merge, consolidate, search) works on numpy arrays.
Key and val columns are Arrow arrays of many types, so each operation first asks this
module for *codes*: one numpy array per input whose elements compare (``<``, ``==``,
``np.searchsorted``, ``np.lexsort``) exactly as the rows do.

Design
------
- Fast path: a single fixed-width column without nulls (integers, dates, timestamps,
  durations, booleans, floats) is its own code -- the values viewed as numpy, zero-copy
  for integers. Such codes are *absolute*: codes computed separately for two tables
  compare correctly with each other.
- General path (strings, binaries, several columns, nulls): dense ranks computed jointly
  over all the inputs of one operation, with Arrow's sort (byte-wise order for strings,
  nulls first). Such codes are *relative*: they compare only with codes computed in the
  same call, which is why every function here takes the list of tables it relates.

Invariants
----------
- ``codes(ts)[i][a] < codes(ts)[j][b]`` iff row ``a`` of ``ts[i]`` sorts before row
  ``b`` of ``ts[j]``, and equal codes mean equal rows (NaN equals NaN, null equals null).
- Floats order as IEEE total order with every NaN made one canonical value.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_SIGN_BIT = np.int64(-0x8000000000000000)


def is_absolute(types: list[pa.DataType]) -> bool:
    """True when rows of these column types get codes that compare across calls."""
    if len(types) != 1:
        return False
    t = types[0]
    return (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or pa.types.is_temporal(t)
    )


def _column_values(col) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    t = col.type
    if pa.types.is_boolean(t):
        return col.to_numpy(zero_copy_only=False).astype(np.uint8)
    if pa.types.is_temporal(t):
        width = t.bit_width
        return col.view(pa.int64() if width == 64 else pa.int32()).to_numpy()
    if pa.types.is_floating(t):
        f = col.cast(pa.float64()).to_numpy(zero_copy_only=False)
        f = np.where(np.isnan(f), np.nan, f)  # one canonical NaN
        bits = f.view(np.int64)
        # IEEE total order as signed integers: flip the magnitude bits of negatives.
        return bits ^ ((bits >> 63) & ~_SIGN_BIT)
    return col.to_numpy(zero_copy_only=False)


def absolute_codes(table: pa.Table | pa.RecordBatch, columns: list[str]) -> np.ndarray:
    """Codes of a single fixed-width non-null column: comparable across calls."""
    (name,) = columns
    col = table.column(name)
    if col.null_count:
        raise ValueError(f"column {name!r} holds nulls where none are allowed")
    return _column_values(col)


def codes(tables: list[pa.Table], columns: list[str]) -> list[np.ndarray]:
    """One code array per table, comparable across all of them (see module docstring)."""
    if not columns:
        return [np.zeros(t.num_rows, dtype=np.int8) for t in tables]
    first = tables[0]
    types = [first.schema.field(c).type for c in columns]
    if is_absolute(types) and all(t.column(columns[0]).null_count == 0 for t in tables):
        return [absolute_codes(t, columns) for t in tables]
    return _joint_ranks(tables, columns)


def _joint_ranks(tables: list[pa.Table], columns: list[str]) -> list[np.ndarray]:
    sizes = [t.num_rows for t in tables]
    total = sum(sizes)
    if total == 0:
        return [np.zeros(0, dtype=np.int64) for _ in tables]
    cols = []
    for c in columns:
        parts = [t.column(c) for t in tables]
        chunks = []
        for p in parts:
            chunks.extend(p.chunks if isinstance(p, pa.ChunkedArray) else [p])
        arr = pa.chunked_array(chunks, type=parts[0].type).combine_chunks()
        if pa.types.is_floating(arr.type):
            # Arrow's sort keeps NaNs apart from each other's ties; canonicalize via codes.
            mask = arr.is_null()
            arr = pa.array(_column_values(arr.fill_null(0)), mask=mask.to_numpy(zero_copy_only=False))
        cols.append(arr)
    if len(cols) == 1:
        ranks = pc.rank(cols[0], sort_keys=[("", "ascending", "at_start")],
                        tiebreaker="dense").to_numpy().astype(np.int64)
    else:
        ranks = _dense_rank_rows(cols)
    out, start = [], 0
    for n in sizes:
        out.append(ranks[start:start + n])
        start += n
    return out


def _dense_rank_rows(cols: list[pa.Array]) -> np.ndarray:
    """Dense rank of multi-column rows: Arrow sort, then mark where adjacent rows differ."""
    n = len(cols[0])
    names = [f"c{i}" for i in range(len(cols))]
    table = pa.table(dict(zip(names, cols)))
    order = pc.sort_indices(table, sort_keys=[(nm, "ascending", "at_start") for nm in names])
    sorted_t = table.take(order)
    differs = np.zeros(max(n - 1, 0), dtype=bool)
    for nm in names:
        col = sorted_t.column(nm).combine_chunks()
        a, b = col.slice(0, n - 1), col.slice(1)
        ne = pc.not_equal(a, b).fill_null(False).to_numpy(zero_copy_only=False)
        null_a = a.is_null().to_numpy(zero_copy_only=False)
        null_b = b.is_null().to_numpy(zero_copy_only=False)
        differs |= ne | (null_a != null_b)
    rank_sorted = np.empty(n, dtype=np.int64)
    rank_sorted[0] = 0
    np.cumsum(differs, out=rank_sorted[1:])
    ranks = np.empty(n, dtype=np.int64)
    ranks[order.to_numpy()] = rank_sorted
    return ranks


def row_starts(*code_arrays: np.ndarray) -> np.ndarray:
    """Indices where a new distinct row begins in sorted code arrays (always includes 0)."""
    n = len(code_arrays[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for c in code_arrays:
        np.not_equal(c[1:], c[:-1], out=change[1:], where=~change[1:])
    return np.flatnonzero(change)


def _bits(x: np.ndarray) -> tuple[int, np.ndarray]:
    """Bits needed for ``x - min(x)`` and that offset array as uint64."""
    lo = x.min()
    span = int(x.max()) - int(lo)
    off = (x.astype(np.int64, copy=False) - np.int64(lo)).view(np.uint64) if x.dtype.kind == "i" \
        else (x - lo).astype(np.uint64, copy=False)
    return max(span.bit_length(), 1), off


def sort_rows(kc: np.ndarray, vc: np.ndarray | None, times: np.ndarray | None,
              presorted_runs: bool = False) -> tuple[np.ndarray, bool]:
    """An order sorting rows by (key code, val code, time); ties in all three in any order.

    The key is sorted first (numpy's quicksort on random input; the stable timsort on
    concatenated sorted runs, where it merges in linear time). Only rows whose key is
    shared with a neighbour are then sorted by (key group, val, time) -- packed into one
    uint64 when they fit -- so unique keys cost a single sort. Returns the order and
    whether any key repeats.
    """
    order = np.argsort(kc, kind="stable" if presorted_runs else "quicksort")
    kc_s = kc[order]
    ties = kc_s[1:] == kc_s[:-1]
    if not ties.any():
        return order, False
    if vc is None and times is None:
        return order, True
    in_dup = np.zeros(len(kc), dtype=bool)
    in_dup[1:] = ties
    in_dup[:-1] |= ties
    sub = np.flatnonzero(in_dup)
    group = np.empty(len(kc), dtype=np.int64)
    group[0] = 0
    np.cumsum(~ties, out=group[1:])
    rows = order[sub]
    g = group[sub]
    secondary = [c[rows] for c in (vc, times) if c is not None]
    packed = _pack([g] + secondary)
    if packed is not None:
        sub_order = np.argsort(packed, kind="stable" if presorted_runs else "quicksort")
    else:
        sub_order = np.lexsort(tuple(reversed([g] + secondary)))
    order[sub] = rows[sub_order]
    return order, True


def _pack(columns: list[np.ndarray]) -> np.ndarray | None:
    """Pack integer columns (most significant first) into one uint64, if they fit."""
    if any(c.dtype.kind not in "iub" for c in columns):
        return None
    spans = [_bits(c) for c in columns]
    if sum(b for b, _ in spans) > 64:
        return None
    out = np.zeros(len(columns[0]), dtype=np.uint64)
    for b, off in spans:
        out <<= np.uint64(b)
        out |= off
    return out


def sort_order(*code_arrays: np.ndarray) -> np.ndarray:
    """Stable order sorting rows by the code arrays, most significant first.

    One array uses numpy's stable sort (timsort: linear on concatenated sorted runs);
    several use lexsort.
    """
    present = [c for c in code_arrays if c is not None]
    if len(present) == 1:
        return np.argsort(present[0], kind="stable")
    return np.lexsort(tuple(reversed(present)))
