"""Matching the keys of two blocks: the pairs of equal keys between two sorted tables of
distinct keys, by the cheapest kernel their codes allow -- an offset when one side is a
range of ids, a direct-address table over a narrow span, else one linear merge."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from arrangedb.spine import codes


def match_keys(lkeys: pa.Table, rkeys: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Indices (i, j) of equal keys between two sorted tables of distinct keys."""
    if lkeys.num_rows == 0 or rkeys.num_rows == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    names = lkeys.column_names
    lc, rc = codes([lkeys, rkeys.rename_columns(names)], names)
    if len(lc) == len(rc) and np.array_equal(lc, rc):
        same = np.arange(len(lc), dtype=np.int64)   # both sides hold the same keys
        return same, same
    return match_codes(lc, rc)


def match_codes(lc: np.ndarray, rc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`match_keys` over two sorted arrays of distinct, comparable key codes."""
    if len(lc) == 0 or len(rc) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if lc.dtype.kind in "iu":
        if is_range(rc):   # right keys are every id of a range
            return _match_range(lc, rc)
        if int(lc[-1]) - int(lc[0]) == len(lc) - 1:
            ri, li = _match_range(rc, lc)
            return li, ri
        dense = _match_dense(lc, rc)
        if dense is not None:
            return dense
    # Both sides are sorted and distinct: a stable sort of the two runs is one linear
    # merge (timsort), twice as fast as a binary search per key; an equal pair is a
    # match, its left key first.
    both = np.concatenate([lc, rc])
    order = np.argsort(both, kind="stable")
    merged = both[order]
    eq = np.flatnonzero(merged[1:] == merged[:-1])
    return order[eq].astype(np.int64), order[eq + 1].astype(np.int64) - len(lc)


def _match_range(lc: np.ndarray, rc: np.ndarray):
    """``rc`` consecutive integers (a dimension's dense ids): a code of ``lc`` inside
    their range is matched by its offset, found without a table or a search. (Called
    with the sides swapped when the left keys are the range.)"""
    (a, b), ri = range_matches(lc, rc)
    return np.arange(a, b, dtype=np.int64), ri


def is_range(rc: np.ndarray) -> bool:
    """``rc`` (sorted, distinct integer codes) is every integer from its first to its last."""
    return len(rc) > 0 and rc.dtype.kind in "iu" and int(rc[-1]) - int(rc[0]) == len(rc) - 1


def range_matches(lc: np.ndarray, rc: np.ndarray) -> tuple[tuple[int, int], np.ndarray]:
    """For ``rc`` a range (:func:`is_range`) and ``lc`` sorted integer codes: the left
    keys that match are one slice ``lc[a:b]``, returned as ``(a, b)`` for the caller to
    slice its arrays by (views, not gathers), with the right positions of those keys."""
    a = int(np.searchsorted(lc, rc[0], side="left"))
    b = int(np.searchsorted(lc, rc[-1], side="right"))
    return (a, b), _offsets(lc[a:b], int(rc[0]))


def _match_dense(lc: np.ndarray, rc: np.ndarray):
    """Integer codes over a span not much wider than the keys (ids, ranks): the right
    side's positions in a direct-address table, looked up by the left codes. About 4x
    faster than the merge at millions of keys, in about the merge's temporaries (4 bytes
    per slot, at most 4 slots per key, against its 24 bytes per key)."""
    lo = min(int(lc[0]), int(rc[0]))
    span = max(int(lc[-1]), int(rc[-1])) - lo + 1
    if span > 4 * (len(lc) + len(rc)) or len(rc) >= 2**31:
        return None
    pos = np.full(span, -1, np.int32)
    pos[_offsets(rc, lo)] = np.arange(len(rc), dtype=np.int32)
    j = pos[_offsets(lc, lo)]
    hit = j >= 0
    return np.flatnonzero(hit), j[hit].astype(np.int64)


def _offsets(c: np.ndarray, lo: int) -> np.ndarray:
    """c - lo without overflow: narrow ints widen first, uint64 subtracts as unsigned."""
    if c.dtype == np.uint64:
        return (c - np.uint64(lo)).astype(np.int64)
    return c.astype(np.int64, copy=False) - lo
