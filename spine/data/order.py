"""Sorting rows by their codes (:mod:`arrangedb.spine.data.codes`): the order of
(key, val, time) and where distinct rows begin. Several code columns are sorted by one
packed prefix of their leading bits (:mod:`arrangedb.spine.data.argsort`), and only the
rows whose prefixes tie are ordered by their full columns.
"""

from __future__ import annotations

import numpy as np

from arrangedb.spine.data.argsort import (from_offsets, lsd_order, offsets_from,
                                          packed_argsort, span_bits)


def row_starts(*code_arrays: np.ndarray) -> np.ndarray:
    """Indices where a new distinct row begins in sorted code arrays (always includes 0).

    Every column compared whole and or-ed in: a comparison masked to the rows still
    tied (``where=``) runs numpy's masked loop, ~9x slower (487k rows of three columns,
    every key twice: 4.1 ms against 0.47)."""
    n = len(code_arrays[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    change = np.empty(n, dtype=bool)
    change[0] = True
    first = code_arrays[0]
    np.not_equal(first[1:], first[:-1], out=change[1:])
    for c in code_arrays[1:]:
        change[1:] |= c[1:] != c[:-1]
    if change.all():   # distinct rows (a consolidated run): positions without a search
        return np.arange(n, dtype=np.int64)
    return np.flatnonzero(change)


def run_lengths(starts: np.ndarray, n: int) -> np.ndarray:
    """The lengths of the runs beginning at ``starts`` (rising, from 0) in ``n`` rows, in
    one new array (``np.diff(np.append(starts, n))`` makes two, each faulted in afresh
    when a run is large)."""
    out = np.empty(len(starts), np.int64)
    np.subtract(starts[1:], starts[:-1], out=out[:-1])
    out[-1] = n - starts[-1]
    return out


def is_identity(idx: np.ndarray, n: int) -> bool:
    """Whether ``idx`` is ``0, 1, ..., n - 1``: a gather by it would copy its source."""
    return len(idx) == n and (n == 0 or (idx[0] == 0 and idx[-1] == n - 1
                                         and bool((idx[1:] > idx[:-1]).all())))


def sort_rows(kc: np.ndarray, vc, times: np.ndarray | None,
              presorted_runs: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """An order sorting rows by (key code, val codes, time), and the positions along it
    where a distinct row begins (full ties, which are duplicates, in any order).
    :func:`sorted_rows` also gives the sorted key codes."""
    order, starts, _ = sorted_rows(kc, vc, times, presorted_runs, keys=False)
    return order, starts


def sorted_rows(kc: np.ndarray, vc, times: np.ndarray | None, presorted_runs: bool = False,
                keys: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """:func:`sort_rows`, and ``kc[order]`` when the sort holds it (the key codes whole
    in the packed values, or the rows in order already; None otherwise): unpacking it
    reads the sorted values in order, where the gather reads ``kc`` at random.
    ``keys=False``: never unpacked (None), as :func:`sort_rows` asks.

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
        return np.arange(n, dtype=np.int64), np.zeros(min(n, 1), np.int64), kc
    if _in_order(columns):   # a delta computed in key order: checked in a pass or two
        return np.arange(n, dtype=np.int64), row_starts(*columns), kc
    if any(c.dtype.kind not in "iub" for c in columns):
        order = lsd_order(columns)
        return order, row_starts(*[c[order] for c in columns]), None
    if len(columns) == 1:
        presorted_runs = presorted_runs or few_runs(kc)
        packed = packed_argsort(kc, stable_merge=presorted_runs, ties=True)
        if packed is None:
            order = np.argsort(kc, kind="stable")
            return order, row_starts(kc[order]), None
        return packed[0], starts_of(packed[1]), None
    return _prefix_order(columns, presorted_runs, keys)


def _in_order(columns: list[np.ndarray]) -> bool:
    """Whether the rows are sorted already (most significant column first). Unsorted
    input is told by its first column almost always, in one pass. Each later column is
    compared whole where rows are still tied: gathering the tied rows costs more once
    they are many (every key twice: 2.7 ms against 0.5 for 487k rows of three
    columns), and no less when they are few."""
    first = columns[0]
    if (first[1:] < first[:-1]).any():
        return False
    tied = first[1:] == first[:-1]
    for c in columns[1:]:
        if not tied.any():
            return True
        later, earlier = c[1:], c[:-1]
        if (tied & (later < earlier)).any():
            return False
        tied &= later == earlier
    return True


def never_falls(codes: np.ndarray, strict: bool = False) -> bool:
    """Whether ``codes`` never fall (``strict``: always rise). Codes in no order are
    mostly told by their first 64, without a pass over the rest."""
    for part in (codes[:64], codes):
        later, earlier = part[1:], part[:-1]
        if not bool((later > earlier).all() if strict else (later >= earlier).all()):
            return False
    return True


def few_runs(values: np.ndarray) -> bool:
    """Whether ``values`` are a few sorted runs end to end -- they fall at most once per
    1024 values -- as the rows of an update read in key order are (their retractions,
    then their new versions, a few rows of one key out of order): timsort merges such
    runs in about one linear pass. Judged on all the sort's bits: keys in two runs whose
    rows are out of order within each key make many short runs, which timsort sorts
    slower than the vectorized sort (800k rows, 100 per key: 20 ms against 11). Input
    in no order is told by its first 64k values, without a pass over the rest."""
    limit = 1 + len(values) // 1024
    for part in (values[:1 << 16], values):   # the head's falls are some of the whole's
        if int(np.count_nonzero(part[1:] < part[:-1])) > limit:
            return False
    return True


def starts_of(ties: np.ndarray) -> np.ndarray:
    """Distinct-row starts from ``ties`` (row i+1 equals row i along the order)."""
    distinct = np.empty(len(ties) + 1, dtype=bool)
    distinct[0] = True
    np.logical_not(ties, out=distinct[1:])
    return np.flatnonzero(distinct)


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


def _prefix_order(columns: list[np.ndarray], presorted_runs: bool = False,
                  unpack: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Order by integer code columns too wide to pack together (most significant first),
    where distinct rows begin along it, and (``unpack``) the first column in that order
    when all of its bits are in the prefix (a refinement of prefix ties keeps it: tied rows
    share it).

    One packed value sort of the columns' leading bits -- as many as fit beside the row
    index -- orders almost everything; only rows whose prefixes tie are then sorted by
    the full columns. A key (~22 bits) beside the row index (~22 bits) leaves a float's
    64-bit code its ~20 leading bits: ties are the rare rows whose values share a key and
    agree to a part in a million, where an LSD sort makes two full passes over every row.
    """
    n = len(columns[0])
    room = 64 - max(int(n - 1).bit_length(), 1)
    prefix = None
    used, complete, first, cut = 0, True, None, None
    for i, c in enumerate(columns):
        bits, off, lo = span_bits(c)
        take = min(bits, room - used)
        if take < bits and complete:   # the first column cut short: ties differ from here
            complete, cut = False, (i, lo, max(take, 0), bits)
        if take <= 0:
            break
        if take < bits:
            off >>= np.uint64(bits - take)   # span_bits' array is our own: shifted in place
        if prefix is None:               # the key's offsets become the prefix
            first, prefix = (take == bits, bits, lo), off
        else:
            prefix <<= np.uint64(take)
            prefix |= off
        del off
        used += take
    whole, lead_bits, lo = first
    whole = whole and unpack
    presorted_runs = presorted_runs or few_runs(prefix)
    # the prefix is its own offset (its columns' are): below 2**used, no offsetting pass
    packed = packed_argsort(prefix, stable_merge=presorted_runs, ties=True, bits=used,
                            values=whole)
    order, ties, lead = packed[0], packed[1], None
    if whole:
        lead = packed[2]
        lead >>= np.uint64(used - lead_bits)
        lead = from_offsets(lead, lo, columns[0].dtype)
    tied = None if complete else _tie_groups(ties)   # complete: equal prefixes, equal rows
    if tied is None:
        return order, starts_of(ties), lead
    rest = columns[cut[0]:]   # the columns prefix ties can differ in
    _order_ties(order, *tied, rest, cut[1:])
    # a prefix tie is a duplicate only if every full column agrees (refined: adjacent)
    cand = np.flatnonzero(ties) + 1
    a, b = order[cand - 1], order[cand]
    same = np.ones(len(cand), dtype=bool)
    for c in rest:
        same &= c[a] == c[b]
    distinct = np.ones(n, dtype=bool)
    distinct[cand[same]] = False
    return order, np.flatnonzero(distinct), lead


def _order_ties(order: np.ndarray, sub: np.ndarray, group: np.ndarray,
                columns: list[np.ndarray], cut: tuple[int, int, int]) -> None:
    """Order each group of prefix ties (``order[sub]``, labelled by ``group``) by the
    ``columns`` they can differ in, in place; the first of them had the leading bits
    of its offsets (``cut``: its minimum, the bits taken, its bits) in the prefix.

    Most groups are pairs: a row and its next version or retraction, equal but for a
    time or a value's low bits -- a merge of two deltas ties on almost every row. One
    vectorized comparison orders every pair (swapping those out of order). Larger groups
    are ordered by another prefix sort: the group, then the bits the first sort left out
    (1.2M rows of two merged deltas: 0.5 s by an LSD sort of the columns, 0.05 s so).
    """
    n = len(sub)
    starts = row_starts(group)
    sizes = run_lengths(starts, n)
    pairs = starts[sizes == 2]
    if len(pairs):
        at = sub[pairs]
        a, b = order[at], order[at + 1]
        swap = _less(columns, b, a)
        order[at[swap]], order[at[swap] + 1] = b[swap], a[swap]
    if 2 * len(pairs) < n:
        many = np.repeat(sizes > 2, sizes)
        s = sub[many]
        rows = order[s]
        lo, taken, bits = cut
        low = offsets_from(columns[0][rows], lo)
        if taken:   # the bits below those the prefix held
            low &= np.uint64((1 << (bits - taken)) - 1)
        ties = [group[many], low] + [c[rows] for c in columns[1:]]
        mixed = _mixed_groups(ties)
        if mixed is not None:   # groups of duplicates are in order as they are
            s, rows, ties = s[mixed], rows[mixed], [t[mixed] for t in ties]
        if len(s):
            order[s] = rows[_prefix_order(ties, unpack=False)[0]]


def _mixed_groups(ties: list[np.ndarray]) -> np.ndarray | None:
    """Which rows of ``ties`` (a group label, then the columns its rows can differ
    in; each group's rows adjacent) are in a group whose rows are not all equal; None
    when that is every row. A lookup across a view's batches meets each stored row
    with its copies -- its retraction and its reinsertion in later batches: 1.2M such
    rows (a view's state and two changes, 244k keys) sorted in 31 ms instead of 46 once
    their groups of copies are left alone."""
    group = ties[0]
    starts = row_starts(*ties)[1:]   # rows unlike the one before: a new group, or not
    marked = np.zeros(int(group[-1]) + 1, dtype=bool)
    marked[group[starts[group[starts] == group[starts - 1]]]] = True
    keep = marked[group]
    return None if keep.all() else keep


def _less(columns: list[np.ndarray], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether row ``a[i]`` sorts before row ``b[i]`` by ``columns`` (most significant
    first)."""
    less = np.zeros(len(a), dtype=bool)
    equal = np.ones(len(a), dtype=bool)
    for c in columns:
        ca, cb = c[a], c[b]
        less |= equal & (ca < cb)
        equal &= ca == cb
    return less
