"""Cursors for operators: blocks of consecutive keys, with their vals and counts as arrays.

Design
------
A cursor walks a trace (or several traces at once, aligned on key ranges) in key order
and yields :class:`Block` s: many keys per step, never one key split across two steps.
In snapshot mode a block holds each (key, val)'s count accumulated at ``at``; in
changes mode it holds the consolidated ``(time, diff)`` updates with
``since <= time < upto``. Operators handle a whole block with array kernels.

``co_blocks`` reads several traces through one merged reader, so the i-th element of
every tuple it yields covers the same key range: a merge join is then a per-block
array operation, and neither side is ever held whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from arrangedb.spine.data.kernels import accumulate, consolidate, filter_times, key_starts
from arrangedb.spine.data.layout import PartLayout, leaf_totals, repeat_rows
from arrangedb.spine.data.codes import codes
from arrangedb.spine.data.argsort import fast_argsort
from arrangedb.spine.storage.dictionaries import dictionary_schema
from arrangedb.spine.read.reader import MergedReader, step_updates
from arrangedb.spine.data.updates import Updates, constant, extent, is_constant


@dataclass(frozen=True)
class Block:
    """Rows sorted by (key, val[, time]); ``key_bounds[i]:key_bounds[i+1]`` are key i's rows.

    ``keys`` has one row per distinct key; ``vals`` (None when key-only) and ``counts``
    one per row. In changes mode ``counts`` holds diffs and ``times`` their times.
    """

    keys: pa.Table
    key_bounds: np.ndarray
    vals: pa.Table | None
    counts: np.ndarray
    times: np.ndarray | None = None
    rows: pa.Table | None = None   # the key of every row, when the reader had it anyway
    # per key, the sum of a val column's values over its rows (unweighted), for columns
    # a reader asked summed (``part_blocks``) and the part could sum without decoding;
    # such a column is absent from ``vals``, and ``counts`` then is one constant
    key_sums: dict | None = None
    # as ``key_sums``, each value weighted by its row's count, from a part whose counts
    # vary (one time, a few rows counted otherwise); such a column is absent from ``vals``
    weighted_sums: dict | None = None

    @property
    def num_keys(self) -> int:
        return self.keys.num_rows

    def __len__(self) -> int:
        return len(self.counts)

    def row_keys(self) -> pa.Table:
        """The key of every row (keys repeated by their row counts)."""
        if self.rows is not None:
            return self.rows
        return repeat_rows(self.keys, np.diff(self.key_bounds))

    def record_batch(self, schema: pa.Schema, *extra: np.ndarray) -> pa.RecordBatch:
        """The rows as one record batch of ``schema``: each row's key, its vals, then
        the ``extra`` columns (counts; times and diffs)."""
        cols = list(self.row_keys().columns) + (list(self.vals.columns)
                                                if self.vals is not None else [])
        arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in cols]
        return pa.RecordBatch.from_arrays(arrays + [pa.array(e) for e in extra], schema=schema)


def _block(keys: pa.Table, vals, counts, times=None, starts: np.ndarray | None = None
           ) -> Block:
    """``starts``: where each key's rows start (plus the end), when the reader knows."""
    if starts is None:
        starts = key_starts(keys)
    if len(starts) - 1 == keys.num_rows:
        return Block(keys, starts, vals, counts, times)
    return Block(keys.take(starts[:-1]), starts, vals, counts, times, rows=keys)


def empty_block(key_schema: pa.Schema, val_schema: pa.Schema | None, changes=False) -> Block:
    vals = val_schema.empty_table() if val_schema is not None else None
    return Block(key_schema.empty_table(), np.zeros(1, np.int64), vals,
                 np.zeros(0, np.int64), np.zeros(0, np.uint64) if changes else None)


def _snapshot_block(upd: Updates, at: int | None, single_source: bool = False,
                    bag: bool = False, starts: np.ndarray | None = None) -> Block:
    t = upd.times
    if single_source and len(t) and t[0] == t[-1] and (at is None or t[0] <= at) \
            and bool(np.all(t == t[0])):
        # one batch's rows, all at one time: sorted and consolidated, so each (key, val)
        # is one row already and its diff is its count -- nothing to sort or sum
        return _block(upd.keys, upd.vals, upd.diffs, starts=starts)
    if bag and len(t) and (at is None or t.max() <= at) and upd.diffs.min() > 0:
        # a bag reader (a join that expands its output) needs each key's rows together,
        # not each (key, val) summed into one row: sorting the concatenated runs by key
        # alone (a linear merge for timsort) is enough when nothing is retracted
        kc = codes([upd.keys], upd.keys.column_names)[0]
        order = fast_argsort(kc)
        if len(order) and not (order[1:] > order[:-1]).all():
            upd = upd.take(order)
        return _block(upd.keys, upd.vals, upd.diffs)
    keys, vals, counts = accumulate(upd, at)
    return _block(keys, vals, counts)


def _changes_block(upd: Updates, since: int, upto: int | None, frontier: int,
                   single_source: bool = False, starts: np.ndarray | None = None,
                   runs: int = 1) -> Block:
    """``runs``: how many sorted runs ``upd`` concatenates (one per source batch; their
    order survives advancing times to the frontier, which is monotone)."""
    # times not yet advanced by a merge are reported as a merge would: max(time, frontier)
    if not (single_source and (len(upd) == 0 or upd.times.min() >= frontier)):
        # one batch's are consolidated already
        upd, starts = consolidate(upd, frontier, presorted_runs=runs), None
    kept = filter_times(upd, since, upto)
    return _block(kept.keys, kept.vals, kept.diffs, kept.times,
                  starts if kept is upd else None)


def _may_matter(batch, at, changes, frontier) -> bool:
    """Whether a batch can contribute, judging by the times its description bounds."""
    d = batch.description
    if changes is None:
        return at is None or d.lower <= at or d.lower <= frontier
    since, upto = changes
    lower, upper = max(d.lower, frontier), max(d.upper, frontier + 1)
    return upper > since and (upto is None or lower < upto)


def co_blocks(traces: list, at: int | None = None,
              changes: tuple[int, int | None] | None = None,
              window_rows: int | None = None, bag: bool = False,
              dictionary: list | None = None) -> Iterator[tuple[Block, ...]]:
    """Aligned blocks of several traces: the i-th of each tuple covers one key range.

    Snapshot mode (``changes=None``): counts accumulated at ``at``. Changes mode
    (``changes=(since, upto)``): consolidated updates in that time interval. Steps where
    every trace is empty are skipped.

    ``bag=True`` (snapshot mode) lets a block hold one (key, val) in several rows whose
    counts add up, when that saves sorting by val: for readers of multisets, such as a
    join expanding its output, that are indifferent to how a count is split. The first
    trace's rows may then also come one run at a time: when every row of a step's runs
    is an insertion, each run's sorted slice is its own tuple, beside the same blocks of
    the other traces, instead of the runs being merged by a sort (a bag reader that is
    linear in its first input, as a join is, sums the same output).

    ``dictionary``: per trace, names of val columns its blocks hold as dictionary arrays
    (int32 codes; see :meth:`Part.read`).
    """
    batches, tags = [], []
    for i, t in enumerate(traces):
        if changes is None:
            t.check_read_time(at)
        bs = [b for b in t.batches() if _may_matter(b, at, changes, t.since)]
        batches += bs
        tags += [i] * len(bs)
    ctx = traces[0].ctx
    dictionary = [frozenset(d) for d in dictionary] if dictionary else [frozenset()] * len(traces)
    val_schemas = [dictionary_schema(t.val_schema, d) for t, d in zip(traces, dictionary)]
    reader = MergedReader(batches, ctx, tags, window_rows, dict(enumerate(dictionary)))
    with ctx.working():
        for step in reader:
            out = []
            runs = None
            for i, t in enumerate(traces):
                mine = [(u, s) for tag, u, s in step if tag == i]
                if not mine:
                    out.append(empty_block(t.key_schema, val_schemas[i], changes is not None))
                    continue
                if (i == 0 and bag and changes is None and len(mine) > 1
                        and all(_insertions(u, at) for u, _ in mine)):
                    runs = [_snapshot_block(u, at, True, bag, s) for u, s in mine]
                    out.append(None)
                    continue
                single = len(mine) == 1
                upd, starts = mine[0] if single else (step_updates(step, i), None)
                out.append(_snapshot_block(upd, at, single, bag, starts) if changes is None
                           else _changes_block(upd, *changes, t.since, single, starts, len(mine)))
            for first in runs or [out[0]]:
                block = (first, *out[1:])
                if any(len(b) for b in block):
                    yield block


def _insertions(upd: Updates, at: int | None) -> bool:
    """Every row an insertion visible at ``at``: its rows count as they are, so a bag
    reader may take them without summing them with other runs' rows."""
    if len(upd) == 0:
        return True
    return (at is None or extent(upd.times)[1] <= at) and extent(upd.diffs)[0] > 0


def blocks(trace, at: int | None = None, changes: tuple[int, int | None] | None = None,
           window_rows: int | None = None) -> Iterator[Block]:
    """Blocks of one trace, in key order (see :func:`co_blocks`)."""
    for (b,) in co_blocks([trace], at, changes, window_rows):
        yield b


def part_blocks(trace, at: int | None = None, dictionary: frozenset = frozenset(),
                sums: frozenset = frozenset(), columns: frozenset | None = None
                ) -> Iterator[Block]:
    """Blocks at ``at`` read straight off the stored layout, one per part, in key order:
    keys stay distinct (never expanded to one per row and found again), each val with
    its count summed over its updates visible at ``at``. For readers that work per key
    (an aggregation pushed below a join), this skips most of what a cursor's read costs.

    Exact -- each (key, val) once, with its nonzero accumulated count -- when one batch
    holds the updates visible at ``at``: a batch is consolidated, so its parts hold
    each (key, val) once. When several batches do, a (key, val) may sit in more than
    one, and the blocks come from :func:`co_blocks`, which accumulates across them.

    ``dictionary``: val columns to hold as dictionary arrays (see :meth:`Part.read`).
    ``sums``: numeric val columns the reader only sums per key: where a part can sum
    them on their encoding (:meth:`Part.summed_layout`), its block carries them as
    ``key_sums`` instead of in ``vals``. ``columns``: the other val columns the reader
    needs (None: all); blocks may hold more.
    """
    trace.check_read_time(at)
    batches = _visible(trace, at)
    if len(batches) != 1:
        for (b,) in co_blocks([trace], at, dictionary=[dictionary]):
            yield b
        return
    yield from _batch_blocks(trace.ctx, batches[0], at, dictionary, sums, columns,
                             keep=_keeps(trace, batches)[0],
                             scan=_is_scan(trace, batches, sums, columns))


def batch_part_blocks(trace, at: int | None = None, dictionary: frozenset = frozenset(),
                      sums: frozenset = frozenset(), columns: frozenset | None = None
                      ) -> list[Iterator[Block]]:
    """One stream of blocks per batch visible at ``at``, each as :func:`part_blocks`
    reads one batch: per part, in key order, straight off the stored layout, and never
    consolidated across batches -- a key may appear in several streams, and a count
    may be negative (a later batch's retraction) or zero (a val whose updates cancel
    at ``at``, kept: dropping it would copy the part's keys and vals). For readers that
    are linear in the counts (sums per key): they add the streams up instead of paying a
    k-way merge."""
    trace.check_read_time(at)
    batches = _visible(trace, at)
    scan = _is_scan(trace, batches, sums, columns)
    return [_batch_blocks(trace.ctx, b, at, dictionary, sums, columns, linear=True,
                          keep=keep, scan=scan)
            for b, keep in zip(batches, _keeps(trace, batches))]


def may_change(trace, since: int, upto: int) -> bool:
    """Whether the trace may hold changes in ``[since, upto)``: a batch with updates
    whose description reaches into it (as :func:`co_blocks` judges what to read)."""
    return any(len(b) and _may_matter(b, None, (since, upto), trace.since)
               for b in trace.batches())


def holds_nulls(trace, column: str) -> bool:
    """Whether val ``column`` holds a null in the trace's snapshot: told by the counts
    the parts recorded when written, without a read, when none holds one; else (a null
    stored, maybe retracted since, or a part that does not say) by reading the column.
    A key column holds none; another name is a KeyError."""
    if column in trace.key_names:
        return False
    if column not in trace.val_names:
        raise KeyError(f"no val column {column!r} in the trace (vals: {trace.val_names}, "
                       f"keys: {trace.key_names})")
    counts = [p.val_nulls(column) for b in trace.batches() for p in b.parts]
    if all(c == 0 for c in counts):
        return False
    return any(b.column(column).null_count for b in trace.snapshot())


def _visible(trace, at) -> list:
    return [b for b in trace.batches() if len(b) and _may_matter(b, at, None, trace.since)]


def _keeps(trace, batches: list) -> list[bool]:
    """Whether a read keeps the columns it decodes of each of ``batches``: not of one a
    merge in progress is to replace (an arrange's runs, read right after it: dim_dim's
    cold query copied the key columns of eight runs, 20 ms, that the merged batch's
    would replace)."""
    merging = trace.spine.merging_batches()
    return [id(b) not in merging for b in batches]


def _is_scan(trace, batches: list, sums: frozenset, columns: frozenset | None) -> bool:
    """Whether a read of ``batches`` decodes more than the block cache holds (keys and
    key bounds, and the val columns read, at eight bytes a value): the columns such a
    read keeps give way to those of a read that fits (see ``blockcache``)."""
    cache = trace.ctx.block_cache
    if cache is None:
        return False
    n_vals = len(trace.val_names) if columns is None else len(columns | sums)
    decoded = sum(p.num_keys * 16 + p.num_updates * 8 * n_vals
                  for b in batches for p in b.parts)
    return decoded > cache.capacity


def _batch_blocks(ctx, batch, at, dictionary, sums, columns, linear: bool = False,
                  keep: bool = True, scan: bool = False) -> Iterator[Block]:
    with ctx.working():
        for part in batch.parts:
            if part.num_updates == 0:
                continue
            layout, key_sums, counts = part.summed_layout(dictionary, sums, columns, at,
                                                          linear, keep=keep, scan=scan)
            if layout is None:   # a resident part: its updates, reserved already
                upd, starts = part.read(dictionary)
                try:
                    block = _snapshot_block(upd, at, True, starts=starts)
                finally:
                    part.release()
                nbytes = upd.vals.nbytes if dictionary and upd.vals is not None else 0
            else:
                block = _layout_block(layout, at, key_sums, counts, linear)
                nbytes = (_layout_bytes(layout) + sum(x.nbytes for x in key_sums.values())
                          + (0 if counts is None else counts.nbytes))
            ctx.reserve(nbytes, "decoded part")
            try:
                if len(block):
                    yield block
            finally:
                ctx.release(nbytes)


def _layout_bytes(layout: PartLayout) -> int:
    arrays = [layout.key_bounds, layout.val_bounds, layout.times, layout.diffs]
    # whole buffers (a paged part decodes whole arrays; a slice would count high)
    return (layout.keys.get_total_buffer_size()
            + (layout.vals.get_total_buffer_size() if layout.vals is not None else 0)
            + sum(a.nbytes for a in arrays if a is not None and not is_constant(a)))


def _empty_block(keys: pa.Table, vals: pa.Table | None) -> Block:
    return Block(keys.slice(0, 0), np.zeros(1, np.int64),
                 None if vals is None else vals.slice(0, 0), np.zeros(0, np.int64))


def _layout_block(layout: PartLayout, at: int | None, key_sums: dict | None = None,
                  counts: np.ndarray | None = None, linear: bool = False) -> Block:
    """A part's layout as a Block at ``at``: each leaf's updates summed, zeros dropped
    (kept when ``linear``: its reader only sums counts). ``key_sums`` and ``counts``: as
    :meth:`Part.summed_layout` gives them (with ``counts``, each leaf's count at ``at``
    is given and the sums weigh each value by it; without, they come only under one
    stored (time, diff))."""
    keys, vals = layout.keys, layout.vals
    if vals is None:
        bounds = np.arange(keys.num_rows + 1, dtype=np.int64)
    else:
        bounds = layout.key_bounds.astype(np.int64)
    n_leaves = int(bounds[-1])   # vals may hold no column (all summed, see part_blocks)
    if counts is not None:   # each leaf's count given (visible at ``at``, see summed_layout)
        if at is not None and int(layout.times.min()) > at:
            return _empty_block(keys, vals)
        return Block(keys, bounds, vals, counts, weighted_sums=key_sums or None)
    if len(layout.times) == 1:
        # one stored (time, diff): every leaf is one update of it
        visible = at is None or int(layout.times[0]) <= at
        counts = constant(int(layout.diffs[0]) if visible else 0, n_leaves, np.int64)
        if not visible or counts[0] == 0:
            return _empty_block(keys, vals)
        return Block(keys, bounds, vals, counts, key_sums=key_sums or None)
    leaves = layout.leaf_bounds
    counts = leaf_totals(leaves, layout.times, layout.diffs, at)
    keep = counts != 0
    if linear or keep.all():
        return Block(keys, bounds, vals, counts)
    # some (key, val) accumulate to zero at ``at``: drop them, and keys left with none
    kept_before = np.zeros(n_leaves + 1, np.int64)
    np.cumsum(keep, out=kept_before[1:])
    new_bounds = kept_before[bounds]
    has = np.diff(new_bounds) > 0
    keys = keys.filter(pa.array(has))
    bounds = np.concatenate([[0], new_bounds[1:][has]]).astype(np.int64)
    rows = np.flatnonzero(keep)
    vals = vals.take(pa.array(rows, pa.int64())) if vals is not None else None
    return Block(keys, bounds, vals, counts[rows])
