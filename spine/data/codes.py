"""Comparable codes: turning rows of Arrow columns into numpy arrays that sort like them.

Every kernel of the spine (sort, merge, consolidate, search) works on numpy arrays.
Key and val columns are Arrow arrays of many types, so each operation first asks this
module for *codes*: one numpy array per input whose elements compare (``<``, ``==``,
``np.searchsorted``, ``np.lexsort``) exactly as the rows do.

Design
------
- Fast path: a single fixed-width column without nulls (integers, dates, timestamps,
  durations, booleans, floats, decimals of up to 18 digits) is its own code -- the
  values viewed as numpy, zero-copy for integers, decimals as their unscaled integers.
  Such codes are *absolute*: codes computed separately for two tables
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

from arrangedb.codecs.arrow_decimal import decimal_words, unscaled_int64
from arrangedb.spine.data.argsort import pack
from arrangedb.spine.data.order import row_starts

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
        or _int64_decimal(t)
    )


def _int64_decimal(t: pa.DataType) -> bool:
    """A decimal type whose unscaled values always fit in int64: their own codes."""
    return pa.types.is_decimal(t) and (t.byte_width <= 8 or t.precision <= 18)


def _column_values(col) -> np.ndarray:
    if pa.types.is_decimal(col.type):   # a scale per type: unscaled integers order alike
        ints = unscaled_int64(col)        # (chunk by chunk: no 16-byte concatenation)
        if ints is None:
            raise ValueError(f"a {col.type} column holds values beyond its precision")
        return ints
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
        if np.isnan(f).any():   # one canonical NaN (the check is ~10x cheaper than a copy)
            f = np.where(np.isnan(f), np.nan, f)
        bits = f.view(np.int64)
        # IEEE total order as signed integers: flip the magnitude bits of negatives
        # (in place in one new array: the column's size in bytes, not three times it).
        out = bits >> 63
        out &= ~_SIGN_BIT
        out ^= bits
        return out
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
    ranks = []
    for c in columns:
        chunks = []
        for t in tables:
            col = t.column(c)
            chunks.extend(col.chunks if isinstance(col, pa.ChunkedArray) else [col])
        arr = pa.chunked_array(chunks, type=tables[0].schema.field(c).type).combine_chunks()
        ranks.append(_column_rank(arr))
    combined = ranks[0] if len(ranks) == 1 else _combine_ranks(ranks)
    out, start = [], 0
    for n in sizes:
        out.append(combined[start:start + n])
        start += n
    return out


def _column_rank(arr: pa.Array) -> np.ndarray:
    """Dense rank of one column: null 0, values from 1 in ascending order.

    Strings and binaries are dictionary-encoded first (a hash pass), so only the distinct
    values are sorted: cheap for the repeated values arrangements are full of.
    """
    t = arr.type
    if pa.types.is_null(t):   # a column of nulls only (a val column may be one)
        return np.zeros(len(arr), np.int64)
    if pa.types.is_dictionary(t) and arr.dictionary.null_count == 0 and \
            not is_absolute([t.value_type]):   # numbers rank by their total-order codes
        return _ranks_by_dictionary(arr)   # strings: only the dictionary's values are sorted
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    if pa.types.is_decimal(t):
        return _decimal_rank(arr)
    if is_absolute([t]):
        valid = None if arr.null_count == 0 else arr.is_valid().to_numpy(zero_copy_only=False)
        filler = False if pa.types.is_boolean(t) else 0   # a bool takes no integer
        values = _column_values(arr.fill_null(filler) if valid is not None else arr)
        uniq, inv = np.unique(values, return_inverse=True)
        rank = inv.astype(np.int64) + 1
        if valid is not None:
            rank[~valid] = 0
        return rank
    return _ranks_by_dictionary(pc.dictionary_encode(arr))


def _decimal_rank(arr: pa.Array) -> np.ndarray:
    """Dense-ish rank of a decimal column (null 0): its unscaled integers sorted as int64
    where they fit, else as their 64-bit words, most significant (signed) first -- never
    through Arrow's hashing and sort of 16-byte values (4 s for 5M rows)."""
    valid = None if arr.null_count == 0 else arr.is_valid().to_numpy(zero_copy_only=False)
    ints = unscaled_int64(arr, valid)
    if ints is not None:
        rank = np.unique(ints, return_inverse=True)[1].astype(np.int64) + 1
    else:
        words = decimal_words(arr)
        k = words.shape[1]
        least_first = [words[:, i].view(np.uint64) for i in range(k - 1)] + [words[:, k - 1]]
        order = np.lexsort(least_first)
        differs = np.zeros(len(order), dtype=bool)
        for w in least_first:
            ws = w[order]
            differs[1:] |= ws[1:] != ws[:-1]
        rank = np.empty(len(order), np.int64)
        rank[order] = np.cumsum(differs) + 1
    if valid is not None:
        rank[~valid] = 0
    return rank


def _ranks_by_dictionary(enc: pa.DictionaryArray) -> np.ndarray:
    """Dense ranks of a dictionary array whose dictionary holds no null: the dictionary's
    ranks (equal values, even repeated in the dictionary, rank equal) taken by the codes."""
    if len(enc.dictionary) == 0:
        return np.zeros(len(enc), dtype=np.int64)  # every row null
    dict_rank = pc.rank(enc.dictionary, sort_keys=[("", "ascending", "at_start")],
                        tiebreaker="dense").to_numpy().astype(np.int64)
    idx = enc.indices
    if idx.null_count:
        filled = idx.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        rank = dict_rank[filled]
        rank[~idx.is_valid().to_numpy(zero_copy_only=False)] = 0
        return rank
    return dict_rank[idx.to_numpy(zero_copy_only=False).astype(np.int64)]


def _combine_ranks(ranks: list[np.ndarray]) -> np.ndarray:
    """One comparable code from per-column ranks: packed in a word if they fit, else dense."""
    packed = pack(ranks)
    if packed is not None:
        return packed.view(np.int64) if packed.max(initial=0) < (1 << 63) else packed
    order = np.lexsort(tuple(reversed(ranks)))
    n = len(order)
    differs = np.zeros(n, dtype=bool)
    for r in ranks:
        rs = r[order]
        differs[1:] |= rs[1:] != rs[:-1]
    dense = np.cumsum(differs)
    out = np.empty(n, dtype=np.int64)
    out[order] = dense
    return out


def _types(table) -> list[pa.DataType]:
    return [f.type for f in table.schema]


def _no_nulls(table) -> bool:
    return all(c.null_count == 0 for c in table.columns)


def sorted_row_starts(table: pa.Table) -> np.ndarray:
    """Where a new distinct row begins in a *sorted* table (always includes 0).

    Sorted input needs no ranking: adjacent rows are compared column by column, which
    is linear, where ranks of strings would cost a sort.
    """
    n = table.num_rows
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if is_absolute(_types(table)) and _no_nulls(table):
        return row_starts(absolute_codes(table, table.column_names))
    differs = np.zeros(n, dtype=bool)
    differs[0] = True
    for col in table.columns:
        differs[1:] |= differs_from_previous(col)
    return np.flatnonzero(differs)


def differs_from_previous(col) -> np.ndarray:
    """Per row after the first, whether it differs from the row before, as the sorts
    tell values apart: floats by their codes (-0.0 before 0.0, every NaN one value), a
    null apart from any value and equal to a null."""
    n = len(col)
    if pa.types.is_null(col.type) or n < 2:
        return np.zeros(max(n - 1, 0), dtype=bool)    # nulls only: every row alike
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    a, b = col.slice(1), col.slice(0, n - 1)
    if pa.types.is_floating(col.type):
        c = _column_values(col)
        ne = c[1:] != c[:-1]
    else:
        ne = pc.not_equal(a, b).fill_null(False).to_numpy(zero_copy_only=False)
    if col.null_count:
        ne |= (a.is_null().to_numpy(zero_copy_only=False)
               != b.is_null().to_numpy(zero_copy_only=False))
    return ne


def count_le(sorted_keys: pa.Table, bound: pa.Table) -> int:
    """How many leading rows of key-sorted ``sorted_keys`` are <= the one row of ``bound``.

    Keys never hold nulls, so a lexicographic comparison over the columns is exact; it is
    linear and needs no ranks.
    """
    n = sorted_keys.num_rows
    if n == 0:
        return 0
    names = sorted_keys.column_names
    if is_absolute(_types(sorted_keys)):
        kc = absolute_codes(sorted_keys, names)
        bc = absolute_codes(bound.rename_columns(names), names)
        return int(np.searchsorted(kc, bc[0], side="right"))
    le = np.zeros(n, dtype=bool)      # strictly less on an earlier column
    eq = np.ones(n, dtype=bool)       # equal on every column so far
    for name, b in zip(names, bound.columns):
        col = sorted_keys.column(name)
        if pa.types.is_floating(col.type):   # in the sort's total order, not IEEE equality
            c, bc = _column_values(col), _column_values(b)[0]
            lt, e = c < bc, c == bc
        else:
            scalar = b[0]
            lt = pc.less(col, scalar).to_numpy(zero_copy_only=False)
            e = pc.equal(col, scalar).to_numpy(zero_copy_only=False)
        le |= eq & lt
        eq &= e
    # the rows <= bound are a prefix of sorted keys: its length is the first row past it
    past = np.flatnonzero(~(le | eq))
    return int(past[0]) if len(past) else n
