"""Signs: whether a trace's rows all count at least zero at a time.

A reader that sums a trace's batches side by side, never merging them (an aggregation
pushed below a join), takes each row's counts in every batch as adding up to its
multiplicity; whether a row is present -- and so whether a group exists, or a sum is
null -- is then whether that sum is above zero. That holds when no row accumulates to
a negative count: a collection, as inserts and the retractions of what they inserted
leave it, and not a trace of differences that retract more than they inserted.

A batch answers for itself (:meth:`Batch.nonnegative_at`). A batch whose own rows go
below zero -- the retractions of a delta, before a merge meets them with what they
retract -- is checked against the whole trace: the keys of its negative rows are
looked up, consolidated across the batches, at a cost in proportion to those keys,
not to the trace. The answer is kept for the spine's committed version it was found
for.
"""

from __future__ import annotations

import weakref

import numpy as np
import pyarrow as pa

from arrangedb.spine.data.layout import leaf_totals
from arrangedb.spine.read.lookup import lookup

_found: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # trace -> (version, at, sign)


def nonnegative_at(trace, at: int | None = None) -> bool:
    """Whether no row of ``trace`` accumulates to a negative count at ``at``."""
    trace.check_read_time(at)
    version = trace.spine.version   # before the batches: a commit between makes it stale
    doubtful = [b for b in trace.batches() if len(b) and not b.nonnegative_at(at)]
    if not doubtful:
        return True
    kept = _found.get(trace)
    if kept is not None and kept[:2] == (version, at):
        return kept[2]
    keys = [k for k in (_negative_keys(b, at) for b in doubtful) if k.num_rows]
    sign = True
    if keys:
        got = lookup(trace, pa.concat_tables(keys), at)
        sign = got.num_rows == 0 or int(np.min(got.column("count").to_numpy())) >= 0
    _found[trace] = (version, at, sign)
    return sign


def _negative_keys(batch, at: int | None) -> pa.Table:
    """The keys of the batch's rows that count below zero at ``at``."""
    tables = []
    for part in batch.parts:
        if part.num_updates == 0:
            continue
        layout = part.layout()
        keyed = layout.vals is not None
        if len(layout.diffs) == 1:   # one stored (time, diff): every row alike
            if layout.diffs[0] < 0 and (at is None or int(layout.times[0]) <= at):
                tables.append(layout.keys)
            continue
        totals = leaf_totals(layout.val_bounds if keyed else layout.key_bounds,
                             layout.times, layout.diffs, at)
        negative = np.flatnonzero(totals < 0)
        if keyed and len(negative):   # each row's key, once (the rows are in key order)
            owner = np.searchsorted(np.asarray(layout.key_bounds, np.int64), negative,
                                    side="right") - 1
            negative = owner[np.concatenate([[True], owner[1:] != owner[:-1]])]
        if len(negative):
            tables.append(layout.keys.take(pa.array(negative)))
    return pa.concat_tables(tables) if tables else batch.parts[0].layout().keys.slice(0, 0)
