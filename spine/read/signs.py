"""Signs: whether a trace's rows all count at least zero at a time.

A reader that sums a trace's batches side by side, never merging them (an aggregation
pushed below a join), takes each row's counts in every batch as adding up to its
multiplicity; whether a row is present -- and so whether a group exists, or a sum is
null -- is then whether that sum is above zero. That holds when no row accumulates to
a negative count: a collection, as inserts and the retractions of what they inserted
leave it, and not a trace of differences that retract more than they inserted.

A batch answers for itself (:meth:`Batch.nonnegative_at`). A batch whose own rows go
below zero -- the retractions of a delta, before a merge meets them with what they
retract -- is checked against the whole trace: each of its negative rows is searched
in every batch (its key, then its val among the key's vals) and its counts summed
(:func:`row_counts`), at a cost in proportion to those rows, not to the trace nor to
their keys' other vals. Only they can be below zero: every other row sums counts
that are each at least zero. The answer is kept for the spine's committed version it
was found for.

A yes also outlives later versions. Merges keep every row's count, and an insert with
no retraction only adds to counts, so it stands while the spine has numbered no new
retracting insert (``Spine.retracting_inserts``). When some came in and each is still
a batch of its own, only their negative rows are checked: any other row's count
has only grown since. A retracting insert already merged into another batch hides
which rows it lowered, and everything doubtful is checked again.
"""

from __future__ import annotations

import weakref

import numpy as np
import pyarrow as pa

from arrangedb.spine.data.layout import leaf_totals
from arrangedb.spine.read.lookup import row_counts

CHUNK_ROWS = 1 << 17
"""Rows searched at once, at most: a delta of 400k retractions of a 40M-row trace is
checked a slice at a time, each holding its rows' positions and vals in every batch."""
BUDGET_PER_ROW = 1024
"""Bytes of budget per row searched at once (128 MiB: 128k rows), a quarter of them
reserved while a slice is searched: under RSS pressure the reservation hands back what
the allocators keep of the slices before."""

DOUBTFUL_SHARE = 16
ALWAYS_CHECKED = 1 << 16
"""Batches of negative rows are checked while they hold at most 1/16 of the trace's
updates (a delta), or few updates: the searches cost in proportion to their rows, and
reading a trace merged costs in proportion to all of it. Beyond, the answer is no."""

# trace -> (version, at, sign, retracting inserts numbered when it was found)
_found: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def nonnegative_at(trace, at: int | None = None) -> bool:
    """Whether no row of ``trace`` accumulates to a negative count at ``at``; False
    also when finding out would cost more than a merged read (``DOUBTFUL_SHARE``)."""
    trace.check_read_time(at)
    # before the batches: a commit in between makes the answer stale, never wrong
    version, numbered = trace.spine.version, trace.spine.retracting_inserts
    batches = trace.batches()
    doubtful = [b for b in batches if len(b) and not b.nonnegative_at(at)]
    if not doubtful:
        return True
    kept = _found.get(trace)
    if kept is not None and kept[:2] == (version, at):
        return kept[2]
    if kept is not None and kept[1] == at and kept[2]:   # a yes, and what came since
        since = kept[3]
        fresh = [b for b in batches if (b.retraction_seq or 0) > since]
        if len(fresh) == numbered - since:   # none merged away: they alone are new
            doubtful = [b for b in doubtful if b in fresh]
    sign = _checked(trace, doubtful, batches, at)
    _found[trace] = (version, at, sign, numbered)
    return sign


def _checked(trace, doubtful: list, batches: list, at: int | None) -> bool:
    """Whether the rows of the doubtful batches' negative rows' keys count at least
    zero in ``trace`` (no, without looking, for more than a small delta)."""
    if not doubtful:
        return True
    n = sum(len(b) for b in doubtful)
    if n > ALWAYS_CHECKED and n * DOUBTFUL_SHARE > sum(len(b) for b in batches):
        return False   # not a small delta: a merged read is cheaper than looking it up
    budget = trace.ctx.budget
    chunk = CHUNK_ROWS if budget is None else max(256, min(CHUNK_ROWS,
                                                           budget.limit // BUDGET_PER_ROW))
    # batch by batch, whose negative rows come in order: a slice of them reads few
    # parts of every batch (rows two batches share are searched twice)
    return all(_counted_nonnegative(trace, _negative_rows(b, at), at, chunk)
               for b in doubtful)


def _counted_nonnegative(trace, rows: tuple[pa.Table, pa.Table | None], at: int | None,
                         chunk: int) -> bool:
    """Whether every one of ``rows`` (keys, vals) counts at least zero in ``trace`` at
    ``at``."""
    keys, vals = rows
    for start in range(0, keys.num_rows, chunk):
        trace.ctx.reserve(chunk * BUDGET_PER_ROW // 4, "sign check")
        try:
            counts = row_counts(trace, keys.slice(start, chunk),
                                vals.slice(start, chunk) if vals is not None else None, at)
        finally:
            trace.ctx.release(chunk * BUDGET_PER_ROW // 4)
        if len(counts) and int(counts.min()) < 0:
            return False
    return True


def _negative_rows(batch, at: int | None) -> tuple[pa.Table, pa.Table | None]:
    """The batch's rows (keys, vals) that count below zero at ``at``, in order."""
    keys, vals = [], []
    for part in batch.parts:
        if part.num_updates == 0:
            continue
        layout = part.layout()
        if len(layout.diffs) == 1:   # one stored (time, diff): every row alike
            if layout.diffs[0] >= 0 or (at is not None and int(layout.times[0]) > at):
                continue
            negative = np.arange(len(layout.leaf_bounds) - 1)
        else:
            totals = leaf_totals(layout.leaf_bounds, layout.times, layout.diffs, at)
            negative = np.flatnonzero(totals < 0)
        if not len(negative):
            continue
        if layout.vals is None:   # key-only: the leaves are the keys
            keys.append(layout.keys.take(pa.array(negative)))
            continue
        owner = np.searchsorted(np.asarray(layout.key_bounds, np.int64), negative,
                                side="right") - 1
        keys.append(layout.keys.take(pa.array(owner)))
        vals.append(layout.vals.take(pa.array(negative)))
    if not keys:
        layout = batch.parts[0].layout()
        return layout.keys.slice(0, 0), (layout.vals.slice(0, 0)
                                         if layout.vals is not None else None)
    return pa.concat_tables(keys), (pa.concat_tables(vals) if vals else None)
