"""Key rank index: where integer keys sit among a part's sorted keys, without reading them.

Design
------
A part whose integer keys fill their range densely enough (at least one key per
``RANK_SPAN`` integers from the first key to the last) also stores them as a bitmap over
that range -- bit ``k - first`` set where ``k`` is a key -- and, per 64-bit word of it,
the number of keys before the word: the rank directory of succinct data structures. A
key's position is then ``ranks[w] + popcount(word & (bit - 1))``, two gathers per query.

Without it a lookup decodes the part's whole key column (delta-coded keys are a
cumulative sum over all of them) and binary-searches it: a batch of 290k keys into
7.5M order keys spent 30 ms there against 3 ms through the index. Sparse surrogate keys
(TPC-H's order keys use 8 of every 32 integers) are the common case; dense ids need no
index at all (``Part.dense_first_key``).

Cost: at most ``12 * RANK_SPAN / 64`` bytes per key on disk (1.5 at the limit, 0.75 for
TPC-H order keys), written with the part; reads map only the words the queries touch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

RANK_SPAN = 8          # at most this many integers of the key range per key
RANK_MIN_KEYS = 4096   # below this a part's keys are decoded and searched as fast
_INT64 = (-2**63, 2**63 - 1)


def rank_index(keys: pa.Table) -> tuple[np.ndarray, np.ndarray] | None:
    """``(words, ranks)`` of a part's sorted, distinct keys, or None when the index does
    not apply (several key columns, not integers, few keys, sparse keys, or keys at one
    step from each other, dense ids among them)."""
    n = keys.num_rows
    if keys.num_columns != 1 or n < RANK_MIN_KEYS or n >= 2**32 \
            or not pa.types.is_integer(keys.schema.field(0).type):
        return None
    col = keys.column(0)
    values = (col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col).to_numpy()
    first, last = int(values[0]), int(values[-1])
    span = last - first + 1
    if span == n or span > RANK_SPAN * n or first < _INT64[0] or last > _INT64[1]:
        return None
    step = (last - first) // (n - 1)
    if step * (n - 1) == last - first and bool((np.diff(values) == step).all()):
        return None   # first + step * i: stored as a stride, decoded by arange
    present = np.zeros(-(-span // 64) * 64, dtype=bool)
    present[values.astype(np.int64, copy=False) - np.int64(first)] = True
    words = np.packbits(present, bitorder="little").view("<u8")
    counts = np.bitwise_count(words)
    ranks = np.empty(len(words), np.uint32)
    ranks[0] = 0
    np.cumsum(counts[:-1], dtype=np.uint32, out=ranks[1:])
    return words, ranks


def rank_positions(first: int, last: int, words_at: Callable, ranks_at: Callable,
                   queries: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Positions of integer ``queries`` among the keys of a part with a rank index (keys
    from ``first`` to ``last``; ``words_at``/``ranks_at`` gather the index at word
    numbers), and which were found."""
    q = (queries.combine_chunks() if isinstance(queries, pa.ChunkedArray)
         else queries).to_numpy()
    # uint64 queries beyond int64 wrap to negatives: below first, missed (first >= -2**63)
    q = q.astype(np.int64, copy=False)
    n = len(q)
    # a lookup hands a part the queries between its first key and the next part's: all
    # inside its range, but at the ends of the trace's key range
    inside = None if n and q.min() >= first and q.max() <= last \
        else np.flatnonzero((q >= first) & (q <= last))
    offset = (q if inside is None else q[inside]) - np.int64(first)
    offset = offset.view(np.uint64)
    w = (offset >> np.uint64(6)).view(np.int64)   # below 2**58: the same bits either way
    bit = offset   # the offsets are done with: their low bits, in place
    bit &= np.uint64(63)
    word = np.asarray(words_at(w), np.uint64)
    found = ((word >> bit) & np.uint64(1)).astype(bool)
    every = bool(found.all())
    if not every:   # ranks read for the keys found only
        w, bit, word = w[found], bit[found], word[found]
    below = word & ((np.uint64(1) << bit) - np.uint64(1))
    pos = np.asarray(ranks_at(w), np.int64) + np.bitwise_count(below)
    if inside is None:   # every query was looked at: found is the hit mask
        return pos, found
    hit = np.zeros(n, dtype=bool)
    hit[inside[found]] = True
    return pos, hit
