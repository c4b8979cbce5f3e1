"""Argsort kernels over integer codes.

numpy sorts plain integers several times faster than it argsorts them (vectorized
sorting networks), so an argsort here sorts values: each code's offset from the minimum
with the row index packed into the low bits (which also makes it stable).
Concatenated sorted runs go through timsort, which merges them in linear time; large
random input is split at its median and its halves sorted on two threads; columns too
wide to pack together are sorted least-significant digit first.
"""

from __future__ import annotations

import numpy as np

from arrangedb.codecs import parallel

PARALLEL_SORT_FROM = 1 << 17   # rows; below, handing half to a thread saves too little


def span_bits(x: np.ndarray) -> tuple[int, np.ndarray, int]:
    """Bits needed for ``x - min(x)``, that offset array as uint64 (always a new array,
    never a view of ``x``: callers shift it in place), and ``min(x)``."""
    lo = x.min()
    span = int(x.max()) - int(lo)
    return max(span.bit_length(), 1), offsets_from(x, lo), int(lo)


def offsets_from(x: np.ndarray, lo) -> np.ndarray:
    """``x - lo`` as uint64, in a new array (``lo`` at most every value of ``x``)."""
    if x.dtype.kind == "i":
        return (x.astype(np.int64, copy=False) - np.int64(lo)).view(np.uint64)
    return (x - x.dtype.type(lo)).astype(np.uint64, copy=False)


def from_offsets(off: np.ndarray, lo: int, dtype: np.dtype) -> np.ndarray:
    """The inverse of :func:`span_bits`' offsets: ``off + lo`` in ``dtype`` (in place when
    ``off`` is already of that width; additions wrap, as the subtraction did)."""
    out = off.view(dtype) if dtype.itemsize == 8 else off.astype(dtype)
    out += dtype.type(lo)
    return out


def packed_argsort(x: np.ndarray, stable_merge: bool = False, ties: bool = False,
                   bits: int | None = None, values: bool = False):
    """argsort by sorting values: (x - min) with the row index in the low bits.

    numpy sorts plain integers several times faster than it argsorts them (vectorized
    sorting networks), and the index in the low bits makes the result stable. None when
    the span and the index do not fit in 64 bits together. ``stable_merge``: ``x`` is
    concatenated sorted runs, which timsort merges in linear time. ``ties``: also return
    which neighbours along the order hold equal values (``[i]``: rows i and i+1).
    ``bits``: ``x`` is a uint64 array of the caller's, below ``2**bits``, packed in
    place as it is (no offsetting pass). ``values`` (with ``ties``): also return the
    sorted values, as offsets from the minimum (``x``'s values when ``bits`` is given).
    """
    n = len(x)
    if x.dtype.kind not in "iub":
        return None
    index_bits = max(int(n - 1).bit_length(), 1)
    if bits is None:
        bits, p, _ = span_bits(x)              # span_bits' array is our own: packed in place
    else:
        p = x
    if bits + index_bits > 64:
        return None
    p <<= np.uint64(index_bits)
    p |= np.arange(n, dtype=np.uint64)
    sort_values(p, stable_merge)
    equal = sorted_values = None
    if ties:   # equal values differ only in the index bits
        equal = np.bitwise_xor(p[1:], p[:-1]) < np.uint64(1 << index_bits)
    if values:
        sorted_values = p >> np.uint64(index_bits)
    p &= np.uint64((1 << index_bits) - 1)
    order = p.view(np.int64)
    if not ties:
        return order
    return (order, equal, sorted_values) if values else (order, equal)


def sort_values(p: np.ndarray, stable_merge) -> None:
    """Sort ``p`` in place (plain values: any sort gives the same array, and stability
    is moot -- an argsort packs the row index in).

    Two concatenated runs (``stable_merge`` True, 1 or 2): timsort merges them in one
    linear pass. More runs (``stable_merge`` their number): timsort's merges cost more
    than the vectorized sort of unsorted input (2.4M values: 8 runs 0.024 s against
    0.015 s, 16 runs 0.032 against 0.015), so they are sorted like random input. Large
    random input: split at its median by a selection (``partition``, about a fifth of a
    sort), then its halves sorted on two threads (numpy drops the GIL), with nothing to
    merge after: 625k values in 6.3-7.3 ms against 9.1-9.4 ms for one sort, where sorting
    the halves and merging them by timsort took 7.4-9.0 ms (2.5M values: 23-25 ms,
    against 30-38 ms and 30-32 ms)."""
    stable_merge = stable_merge is True or 0 < int(stable_merge) <= 2
    if stable_merge or len(p) < PARALLEL_SORT_FROM or parallel.threads() < 2:
        p.sort(kind="stable" if stable_merge else None)
        return
    half = len(p) // 2
    p.partition(half)   # every value of the lower half below the upper half's
    parallel.both(p[:half].sort, p[half:].sort)


def fast_argsort(x: np.ndarray) -> np.ndarray:
    """A stable argsort of integer codes, by packed value sort when it fits."""
    if len(x) < 2:
        return np.arange(len(x), dtype=np.int64)
    order = packed_argsort(x)
    return order if order is not None else np.argsort(x, kind="stable")


def _stable_by(x: np.ndarray) -> np.ndarray:
    """A stable argsort of one pass of an LSD sort; wide codes go through dense ranks."""
    order = packed_argsort(x) if len(x) > 1 else np.arange(len(x), dtype=np.int64)
    if order is not None:
        return order
    s = np.argsort(x)                               # ranks need no stability
    rank = np.empty(len(x), np.int64)
    xs = x[s]
    rank[s] = np.concatenate([[0], np.cumsum(xs[1:] != xs[:-1])])
    return packed_argsort(rank)


def lsd_order(columns: list[np.ndarray]) -> np.ndarray:
    """Order by several code columns (most significant first): stable passes, least
    significant first -- cheaper than lexsort when each pass is a packed value sort."""
    order = None
    for c in reversed(columns):
        if order is None:     # the first pass needs no stability: any fast argsort
            order = packed_argsort(c) if len(c) > 1 else None
            if order is None:
                order = np.argsort(c)
        else:
            order = order[_stable_by(c[order])]
    return order


def pack(columns: list[np.ndarray]) -> np.ndarray | None:
    """Pack integer columns (most significant first) into one uint64, if they fit."""
    if any(c.dtype.kind not in "iub" for c in columns):
        return None
    spans = [span_bits(c) for c in columns]
    if sum(b for b, _, _ in spans) > 64:
        return None
    out = np.zeros(len(columns[0]), dtype=np.uint64)
    for b, off, _ in spans:
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
