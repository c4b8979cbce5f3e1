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

from arrangedb.codecs import parallel
from arrangedb.codecs.arrow_decimal import decimal_words, unscaled_int64

PARALLEL_SORT_FROM = 1 << 17   # rows; below, handing half to a thread saves too little

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
        values = _column_values(arr.fill_null(0) if valid is not None else arr)
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
    packed = _pack(ranks)
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
        if pa.types.is_null(col.type):
            continue    # nulls only: every row alike
        col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        a, b = col.slice(1), col.slice(0, n - 1)
        ne = pc.not_equal(a, b).fill_null(False).to_numpy(zero_copy_only=False)
        if col.null_count:
            ne |= (a.is_null().to_numpy(zero_copy_only=False)
                   != b.is_null().to_numpy(zero_copy_only=False))
        differs[1:] |= ne
    return np.flatnonzero(differs)


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
        scalar = b[0]
        lt = pc.less(col, scalar).to_numpy(zero_copy_only=False)
        e = pc.equal(col, scalar).to_numpy(zero_copy_only=False)
        le |= eq & lt
        eq &= e
    return int(np.count_nonzero(le | eq))


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
    """Bits needed for ``x - min(x)`` and that offset array as uint64 (always a new
    array, never a view of ``x``: callers shift it in place)."""
    lo = x.min()
    span = int(x.max()) - int(lo)
    off = (x.astype(np.int64, copy=False) - np.int64(lo)).view(np.uint64) if x.dtype.kind == "i" \
        else (x - lo).astype(np.uint64, copy=False)
    return max(span.bit_length(), 1), off


def sort_rows(kc: np.ndarray, vc, times: np.ndarray | None,
              presorted_runs: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """An order sorting rows by (key code, val codes, time), and the positions along it
    where a distinct row begins (full ties, which are duplicates, in any order).

    ``vc``: None, one code array, or a list of them (one per val column).

    One packed value sort of the key and the leading bits of val and time orders almost
    every row (see :func:`_prefix_order`); concatenated sorted runs go through the stable
    timsort, which merges them in linear time. Rows whose packed prefixes differ are
    distinct: only prefix ties are compared column by column, so finding the distinct
    rows costs no gather of the columns by the order.
    """
    vcs = vc if isinstance(vc, list) else [vc]
    columns = [c for c in [kc, *vcs, times] if c is not None]
    n = len(kc)
    if n < 2:
        return np.arange(n, dtype=np.int64), np.zeros(min(n, 1), np.int64)
    if any(c.dtype.kind not in "iub" for c in columns):
        order = _lsd_order(columns)
        return order, row_starts(*[c[order] for c in columns])
    if len(columns) == 1:
        packed = _packed_argsort(kc, stable_merge=presorted_runs, ties=True)
        if packed is None:
            order = np.argsort(kc, kind="stable")
            return order, row_starts(kc[order])
        return packed[0], _starts_of(packed[1])
    return _prefix_order(columns, presorted_runs)


def _starts_of(ties: np.ndarray) -> np.ndarray:
    """Distinct-row starts from ``ties`` (row i+1 equals row i along the order)."""
    starts = np.flatnonzero(~ties)
    starts += 1
    return np.concatenate([np.zeros(1, np.int64), starts])


def _tie_groups(ties: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Positions of rows equal to a neighbour along an order (``ties[i]``: row i+1
    equals row i), and their group ids.

    Ties are few where this is used (prefixes of distinct rows): only the tied rows are
    labelled, never a group id for every row.
    """
    if not ties.any():
        return None
    # rows tied with the next or the previous one: a mask, not np.union1d (numpy 2.4's
    # hashing unique took 0.87 s for 1.6M tied rows where this takes 1 ms)
    tied = np.zeros(len(ties) + 1, dtype=bool)
    tied[:-1] = ties
    tied[1:] |= ties
    sub = np.flatnonzero(tied)
    continues = np.zeros(len(sub), dtype=bool)
    inner = sub > 0
    continues[inner] = ties[sub[inner] - 1]
    return sub, np.cumsum(~continues)


def _prefix_order(columns: list[np.ndarray], presorted_runs: bool = False
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Order by integer code columns too wide to pack together (most significant first),
    and where distinct rows begin along it.

    One packed value sort of the columns' leading bits -- as many as fit beside the row
    index -- orders almost everything; only rows whose prefixes tie are then sorted by
    the full columns. A key (~22 bits) beside the row index (~22 bits) leaves a float's
    64-bit code its ~20 leading bits: ties are the rare rows whose values share a key and
    agree to a part in a million, where an LSD sort makes two full passes over every row.
    """
    n = len(columns[0])
    room = 64 - max(int(n - 1).bit_length(), 1)
    prefix = np.zeros(n, dtype=np.uint64)
    used, complete = 0, True
    for c in columns:
        bits, off = _bits(c)
        take = min(bits, room - used)
        if take < bits:
            complete = False
        if take <= 0:
            break
        prefix <<= np.uint64(take)
        off >>= np.uint64(bits - take)   # _bits' array is our own: shifted in place
        prefix |= off
        del off
        used += take
    order, ties = _packed_argsort(prefix, stable_merge=presorted_runs, ties=True)  # fits
    tied = None if complete else _tie_groups(ties)   # complete: equal prefixes, equal rows
    if tied is None:
        return order, _starts_of(ties)
    sub, group = tied
    rows = order[sub]
    order[sub] = rows[_lsd_order([group] + [c[rows] for c in columns])]
    # a prefix tie is a duplicate only if every full column agrees (refined: adjacent)
    cand = np.flatnonzero(ties) + 1
    a, b = order[cand - 1], order[cand]
    same = np.ones(len(cand), dtype=bool)
    for c in columns:
        same &= c[a] == c[b]
    distinct = np.ones(n, dtype=bool)
    distinct[cand[same]] = False
    return order, np.flatnonzero(distinct)


def _packed_argsort(x: np.ndarray, stable_merge: bool = False, ties: bool = False):
    """argsort by sorting values: (x - min) with the row index in the low bits.

    numpy sorts plain integers several times faster than it argsorts them (vectorized
    sorting networks), and the index in the low bits makes the result stable. None when
    the span and the index do not fit in 64 bits together. ``stable_merge``: ``x`` is
    concatenated sorted runs, which timsort merges in linear time. ``ties``: also return
    which neighbours along the order hold equal values (``[i]``: rows i and i+1).
    """
    n = len(x)
    if x.dtype.kind not in "iub":
        return None
    index_bits = max(int(n - 1).bit_length(), 1)
    bits, off = _bits(x)
    if bits + index_bits > 64:
        return None
    p = off                              # _bits' array is our own: packed in place
    p <<= np.uint64(index_bits)
    p |= np.arange(n, dtype=np.uint64)
    _sort_values(p, stable_merge)
    equal = None
    if ties:   # equal values differ only in the index bits
        equal = np.bitwise_xor(p[1:], p[:-1]) < np.uint64(1 << index_bits)
    p &= np.uint64((1 << index_bits) - 1)
    order = p.view(np.int64)
    return (order, equal) if ties else order


def _sort_values(p: np.ndarray, stable_merge) -> None:
    """Sort ``p`` in place (its values are distinct: any sort gives one order).

    Two concatenated runs (``stable_merge`` True, 1 or 2): timsort merges them in one
    linear pass. More runs (``stable_merge`` their number): timsort's merges cost more
    than the vectorized sort of unsorted input (2.4M values: 8 runs 0.024 s against
    0.015 s, 16 runs 0.032 against 0.015), so they are sorted like random input. Large
    random input: its halves sorted on two threads (numpy drops the GIL), then merged
    by timsort -- 1.75x faster than one sort of 100k to 4M values here."""
    stable_merge = stable_merge is True or 0 < int(stable_merge) <= 2
    if stable_merge or len(p) < PARALLEL_SORT_FROM or parallel.threads() < 2:
        p.sort(kind="stable" if stable_merge else None)
        return
    half = len(p) // 2
    parallel.both(p[:half].sort, p[half:].sort)
    p.sort(kind="stable")


def fast_argsort(x: np.ndarray) -> np.ndarray:
    """A stable argsort of integer codes, by packed value sort when it fits."""
    if len(x) < 2:
        return np.arange(len(x), dtype=np.int64)
    order = _packed_argsort(x)
    return order if order is not None else np.argsort(x, kind="stable")


def _stable_by(x: np.ndarray) -> np.ndarray:
    """A stable argsort of one pass of an LSD sort; wide codes go through dense ranks."""
    order = _packed_argsort(x) if len(x) > 1 else np.arange(len(x), dtype=np.int64)
    if order is not None:
        return order
    s = np.argsort(x)                               # ranks need no stability
    rank = np.empty(len(x), np.int64)
    xs = x[s]
    rank[s] = np.concatenate([[0], np.cumsum(xs[1:] != xs[:-1])])
    return _packed_argsort(rank)


def _lsd_order(columns: list[np.ndarray]) -> np.ndarray:
    """Order by several code columns (most significant first): stable passes, least
    significant first -- cheaper than lexsort when each pass is a packed value sort."""
    order = None
    for c in reversed(columns):
        if order is None:     # the first pass needs no stability: any fast argsort
            order = _packed_argsort(c) if len(c) > 1 else None
            if order is None:
                order = np.argsort(c)
        else:
            order = order[_stable_by(c[order])]
    return order


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
        return fast_argsort(present[0])
    return np.lexsort(tuple(reversed(present)))
