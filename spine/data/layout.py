"""The seeds' batch layout: keys, key_bounds, vals, val_bounds, times, diffs.

Design
------
A sorted, consolidated run of updates is stored with each key once and each (key, val)
once::

    keys        distinct keys, sorted                       (Arrow table)
    key_bounds  where each key's vals start, into vals      (offsets, len nkeys + 1)
    vals        vals, sorted within each key                (Arrow table)
    val_bounds  where each val's updates start              (offsets, len nvals + 1)
    times       u64
    diffs       i64

Key-only arrangements have no ``vals``: ``key_bounds`` points straight into the updates
and ``val_bounds`` is absent.

Singleton compression (as in differential dataflow's ``ord_neu``): a val (or key, when
key-only) whose only update equals the previous one's only update stores nothing: its
bound repeats (``bounds[i + 1] == bounds[i]``), meaning "reuse the update before". A
snapshot of distinct rows therefore stores a single ``(0, +1)`` and a bounds list
``0, 1, 1, ..., 1``, which the offsets codec keeps in O(1) bytes.

Bounds are ``uint32`` while the count they index fits (every part's do), ``uint64``
beyond: never 8 bytes an entry where 4 do, in memory as in the page files.

Invariants
----------
- Offset lists are one longer than their parent, start at 0, and are non-decreasing.
- ``bounds[i + 1] == bounds[i]`` only when ``i > 0`` or the run reuses nothing: the first
  val of a part always stores its own update.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from arrangedb.spine.data.codes import sorted_row_starts
from arrangedb.spine.data.order import run_lengths
from arrangedb.spine.data.updates import Updates, all_equal, constant

RUN_INDEX_REPEAT_FROM = 16   # rows per run from which np.repeat writes run indices faster


@dataclass(frozen=True)
class PartLayout:
    keys: pa.Table
    key_bounds: np.ndarray
    vals: pa.Table | None
    val_bounds: np.ndarray | None
    times: np.ndarray
    diffs: np.ndarray

    @property
    def leaf_bounds(self) -> np.ndarray:
        """Where each leaf's updates start: a (key, val)'s, or a key's when key-only."""
        return self.val_bounds if self.vals is not None else self.key_bounds

    @property
    def num_updates(self) -> int:
        """Logical updates, singleton-compressed ones included."""
        if len(self.times) == 1:   # one stored (time, diff): each leaf one update of it
            return len(self.leaf_bounds) - 1
        return int(_expanded_counts(self.leaf_bounds).sum())


def bounds_dtype(top: int) -> np.dtype:
    """The dtype of a bounds list whose largest entry is ``top``: u32 while it fits."""
    return np.dtype(np.uint32 if top < 2**32 else np.uint64)


def _compress_singletons(starts: np.ndarray, n: int, times: np.ndarray,
                         diffs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bounds for leaves starting at ``starts`` (into n updates), and which updates to keep."""
    dt = bounds_dtype(n)
    if len(starts) == n and n and all_equal(times) and all_equal(diffs):
        # a snapshot of distinct rows (the common merged batch): one stored (time, diff)
        bounds = np.ones(n + 1, dtype=dt)
        bounds[0] = 0
        keep = np.zeros(n, dtype=bool)
        keep[0] = True
        return bounds, keep
    counts = run_lengths(starts, n)
    single = counts == 1
    t_first, d_first = times[starts], diffs[starts]
    same_as_prev = np.zeros(len(starts), dtype=bool)
    if len(starts) > 1:
        same_as_prev[1:] = (single[1:] & single[:-1] & (t_first[1:] == t_first[:-1])
                            & (d_first[1:] == d_first[:-1]))
    if len(starts) == n and 2 * np.count_nonzero(same_as_prev) < n:
        # one update per leaf, and runs of equal (time, diff) short (a delta of
        # retractions and insertions): bounds 0, 1, 2, ... store as a stride, in no
        # bytes, where dropping the repeats would cost a bound per leaf (the offsets
        # codec stores long runs of a repeated bound in O(1), short ones at 4 bytes)
        return np.arange(n + 1, dtype=dt), np.ones(n, dtype=bool)
    keep = np.ones(n, dtype=bool)
    keep[starts[same_as_prev]] = False
    stored = np.where(same_as_prev, 0, counts)
    bounds = np.zeros(len(starts) + 1, dtype=dt)
    np.cumsum(stored, dtype=dt, out=bounds[1:])
    return bounds, keep


def _expanded_counts(bounds: np.ndarray) -> np.ndarray:
    counts = np.diff(bounds.astype(np.int64))
    return np.where(counts == 0, 1, counts)


def to_layout(upd: Updates, kstarts: np.ndarray | None = None) -> PartLayout:
    """Compact a sorted, consolidated run into the seeds' layout. ``kstarts``: where
    each key's rows begin, when the caller knows (a builder cutting parts at keys)."""
    n = len(upd)
    if kstarts is None:
        kstarts = sorted_row_starts(upd.keys)
    if upd.vals is None:
        bounds, keep = _compress_singletons(kstarts, n, upd.times, upd.diffs)
        keys = upd.keys.take(kstarts) if len(kstarts) != n else upd.keys
        return PartLayout(keys, bounds, None, None, upd.times[keep], upd.diffs[keep])
    if len(kstarts) == n or all_equal(upd.times):
        # every row its own (key, val): its own key, or all at one time (consolidated
        # rows differ in (key, val, time)) -- no val comparisons, no float codes
        vstarts = leaf_of = np.arange(n, dtype=np.int64)
    else:
        vstarts, leaf_of = _union_starts(kstarts, sorted_row_starts(upd.vals), n)
    bounds, keep = _compress_singletons(vstarts, n, upd.times, upd.diffs)
    key_bounds = np.append(leaf_of[kstarts], len(vstarts)).astype(bounds_dtype(len(vstarts)))
    keys = upd.keys.take(kstarts) if len(kstarts) != n else upd.keys
    vals = upd.vals.take(vstarts) if len(vstarts) != n else upd.vals
    return PartLayout(keys, key_bounds, vals, bounds, upd.times[keep], upd.diffs[keep])


def _union_starts(a: np.ndarray, b: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Row starts of (key, val) -- a new row begins wherever the key or the val changes --
    and, for every row, the index of the (key, val) row it belongs to."""
    mark = np.zeros(n, dtype=bool)
    mark[a] = True
    mark[b] = True
    leaf_of = np.cumsum(mark, dtype=np.int64)
    leaf_of -= 1
    return np.flatnonzero(mark), leaf_of


def leaf_update_index(bounds: np.ndarray, singleton: bool = False
                       ) -> tuple[np.ndarray | None, np.ndarray]:
    """For each logical update, the index of its stored (time, diff); and per-leaf counts.

    ``singleton``: the part stores one (time, diff) for all; no index is needed then.
    """
    b = bounds.astype(np.int64)
    stored = np.diff(b)
    counts = np.maximum(stored, 1)
    if singleton:
        return None, counts
    if not (stored > 1).any():
        if b[-1] - b[0] == len(stored):
            return None, counts   # identity: every leaf stores its one update
        # a leaf, one update: its own or the one before it, the last stored at its end
        return b[1:] - 1, counts
    starts = np.where(stored == 0, b[:-1] - 1, b[:-1])
    return ranges(starts, counts), counts


def leaf_totals(bounds: np.ndarray, times: np.ndarray, diffs: np.ndarray,
                at: int | None = None) -> np.ndarray:
    """Each leaf's count at ``at``: the sum of its stored diffs whose time is at most
    ``at`` (a repeated bound's leaf counts the update stored before it). The updates are
    never expanded to one per logical update: a leaf of at most one stored update counts
    the last one stored before its end (its own, or the one it repeats), and the few
    leaves of several are summed by differences of a running sum."""
    d = diffs.astype(np.int64, copy=False)
    if at is not None and len(times) and int(times.max()) > at:
        d = np.where(times <= np.uint64(at), d, 0)
    if len(bounds) < 2:
        return np.zeros(0, np.int64)
    ends = bounds[1:]
    totals = d[ends - ends.dtype.type(1)]   # every bound past the first is at least 1
    several = np.flatnonzero(np.diff(bounds) > 1)
    if len(several):
        running = np.zeros(len(d) + 1, np.int64)
        np.cumsum(d, out=running[1:])
        totals[several] = running[bounds[several + 1]] - running[bounds[several]]
    return totals


def from_layout(part: PartLayout) -> Updates:
    """Expand the layout back into one row per update (the inverse of ``to_layout``)."""
    leaves = part.leaf_bounds
    singleton = len(part.times) == 1
    idx, leaf_counts = leaf_update_index(leaves, singleton)
    if singleton:
        n = int(leaf_counts.sum())
        times = np.full(n, part.times[0], dtype=np.uint64)
        diffs = np.full(n, part.diffs[0], dtype=np.int64)
    elif idx is None:
        times, diffs = part.times, part.diffs
    else:
        times, diffs = part.times[idx], part.diffs[idx]
    if part.vals is None:
        return Updates(repeat_rows(part.keys, leaf_counts), None, times, diffs)
    vals = repeat_rows(part.vals, leaf_counts)
    # updates per key = sum of its vals' update counts
    kb = part.key_bounds.astype(np.int64)
    if len(kb) == len(leaf_counts) + 1 and vals is part.vals:
        return Updates(part.keys, vals, times, diffs)   # one val and one update per key
    leaf_end = np.zeros(len(leaf_counts) + 1, dtype=np.int64)
    np.cumsum(leaf_counts, out=leaf_end[1:])
    per_key = np.diff(leaf_end[kb])
    return Updates(repeat_rows(part.keys, per_key), vals, times, diffs)


def expand_singleton(keys: pa.Table, key_bounds: np.ndarray, vals: pa.Table | None,
                     time, diff) -> tuple[Updates, np.ndarray]:
    """A part storing one (time, diff) for all, expanded, and where each key's rows start.

    With a single stored update every leaf holds exactly one (a bound either stores it
    or repeats it), so the leaf bounds need not even be read: a (key, val) is a row, and
    a key's rows are its vals.
    """
    if vals is None:
        n = keys.num_rows
        starts = np.arange(n + 1, dtype=np.int64)
    else:
        n = vals.num_rows
        starts = key_bounds.astype(np.int64)
        if len(starts) != keys.num_rows + 1 or starts[0] != 0 or starts[-1] != n:
            raise ValueError(f"corrupt part: key bounds ({len(starts)}, ending at "
                             f"{starts[-1]}) do not span {keys.num_rows} keys and {n} vals")
        if n != keys.num_rows:
            keys = repeat_rows(keys, np.diff(starts))
    return Updates(keys, vals, constant(time, n, np.uint64), constant(diff, n, np.int64)), starts


def repeat_rows(table: pa.Table, counts: np.ndarray) -> pa.Table:
    """Each row ``counts[i]`` times; one numpy repeat per fixed-width column without
    nulls (a single pass, where an index take would be two)."""
    if np.all(counts == 1):
        return table
    arrays = []
    for col in table.columns:
        arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        t = arr.type
        if arr.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)):
            arrays.append(pa.array(np.repeat(arr.to_numpy(), counts), t))
        else:
            idx = pa.array(run_index(counts))
            arrays.append(arr.take(idx))
    return pa.Table.from_arrays(arrays, schema=table.schema)


def run_index(lengths: np.ndarray) -> np.ndarray:
    """The run each row belongs to, for runs of ``lengths`` (>= 0) laid end to end:
    ``np.repeat(np.arange(len(lengths)), lengths)``. Short runs (a delta's few rows per
    key) are marked where each begins and summed up, as ``np.repeat`` copies run by run:
    244k runs of ~3 rows took it 1.7 ms, the marks 0.5."""
    lengths = np.asarray(lengths, np.int64)
    total = int(lengths.sum())
    if total >= RUN_INDEX_REPEAT_FROM * len(lengths) or total == 0:
        return np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    marks = np.zeros(total, np.int64)
    begins = np.cumsum(lengths[:-1])   # where runs 1, 2, ... begin
    if int(lengths.min()) > 0:
        marks[begins] = 1
    else:   # empty runs begin where the next one does (or past the end)
        np.add.at(marks, begins[begins < total], 1)
    return np.cumsum(marks, out=marks)


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each (s, n), without a Python loop."""
    lengths = lengths.astype(np.int64, copy=False)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    out = np.take(starts.astype(np.int64) - offsets, run_index(lengths))
    out += np.arange(total, dtype=np.int64)
    return out


def both_ends(bounds, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``bounds[index]`` and ``bounds[index + 1]`` as int64, in one gather: indexed
    before widening (no copy of the whole part's), and a paged part's bounds are read
    at the rows."""
    return np.split(bounds[np.concatenate([index, index + 1])].astype(np.int64), 2)


def leaf_updates(bounds, leaves: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The stored updates of the given leaves, in order, and how many each has (a
    repeated bound's leaf has one: the update stored before it)."""
    first, end = both_ends(bounds, leaves)
    stored = end - first
    counts = np.where(stored == 0, 1, stored)
    return ranges(np.where(stored == 0, first - 1, first), counts), counts


def select_vals(part: PartLayout, key_index: np.ndarray
                ) -> tuple[pa.Table | None, np.ndarray, np.ndarray, np.ndarray]:
    """The updates of the keys at ``key_index`` (sorted positions into ``part.keys``)
    only, without their keys, which a lookup knows: (vals, times, diffs, owner), owner
    giving per update the position in ``key_index`` it belongs to.

    Expands just the selected keys' vals and updates, so a lookup touching a few keys of
    a large part pays for those keys, not for the part."""
    n_keys = len(part.key_bounds) - 1
    if part.vals is None:
        leaves, k_lens = key_index, None
    elif int(part.key_bounds[[n_keys]][0]) == n_keys:
        # every key one val (each key has one at least): a dimension's val i is key i's
        leaves, k_lens = key_index, None
    else:
        k_first, k_end = both_ends(part.key_bounds, key_index)
        k_lens = k_end - k_first
        if (k_lens == 1).all():       # one val per key (a dimension table)
            leaves, k_lens = k_first, None
        else:
            leaves = ranges(k_first, k_lens)         # val slots of the selected keys
    if len(part.times) == 1:
        # one stored (time, diff) for the whole part: every leaf is one update of it
        n = len(leaves)
        owner = np.arange(n) if k_lens is None else run_index(k_lens)
        vals = part.vals.take(leaves) if part.vals is not None else None
        return (vals, constant(part.times[0], n, np.uint64), constant(part.diffs[0], n, np.int64),
                owner)
    if k_lens is None:
        k_lens = np.ones(len(key_index), dtype=np.int64)
    upd_idx, counts = leaf_updates(part.leaf_bounds, leaves)
    leaf_owner = run_index(k_lens)
    owner = np.repeat(leaf_owner, counts)
    vals = part.vals.take(np.repeat(leaves, counts)) if part.vals is not None else None
    return vals, part.times[upd_idx], part.diffs[upd_idx], owner
