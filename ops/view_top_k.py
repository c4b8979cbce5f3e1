"""A ``top_k`` view's change from its stored rows: most touched keys are not re-read.

A key's stored rows are its first k rows (by ``by``, ties by the vals' order, counts
weighing, as :func:`arrangedb.ops.reduce.top_k` orders them). The first k of a union
are the first k of the first k of each part, so:

- when a key's changes retract only rows ordered strictly after its last stored row,
  none of them was among the first k, and the new first k are the first k of the stored
  rows and the changes;
- when the stored rows count fewer than k, they are the whole group, and the new first
  k are again the first k of the stored rows and the changes.

Only the other keys -- a retraction reaching into a full first k -- are recomputed from
their rows by the view's per-key path. As differential dataflow's ``reduce`` does, this
reads the input's counts as never negative.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from arrangedb.ops.view_delta import DIFF, delta_schema
from arrangedb.spine import codes, sort_rows


def stored_top_k(view, k: int, by: list[str], descending: bool, changes: pa.Table,
                 key_of: np.ndarray, key_table: pa.Table
                 ) -> tuple[pa.Table | None, pa.Table, int]:
    """(the view's change for the keys it can keep from their stored rows, the keys it
    must recompute, how many it kept). ``changes``: the input's changes at one time,
    sorted by key (``key_of``: each row's key index, from 0, into the distinct
    ``key_table``)."""
    cols = view.key_names + view.val_names
    n = key_table.num_rows
    old = view.stored_rows(key_table)
    qi = old.column("query_index").to_numpy()
    count = old.column("count").to_numpy()
    both = pa.concat_tables([old.select(cols),
                             changes.select(cols).cast(old.select(cols).schema)])
    rank = _rank(codes([both], by)[0], descending)
    rank_old, rank_new = rank[:len(qi)], rank[len(qi):]
    diff = changes.column("diff").to_numpy()

    held = np.bincount(qi, weights=count, minlength=n) if len(qi) else np.zeros(n)
    last = np.full(n, np.iinfo(np.int64).min)     # the last stored row's rank, per key
    if len(qi):   # a lookup's rows come in query order
        runs = np.flatnonzero(np.concatenate([[True], qi[1:] != qi[:-1]]))
        last[qi[runs]] = np.maximum.reduceat(rank_old, runs)
    down = diff < 0
    reaches = np.zeros(n, dtype=bool)
    reaches[key_of[down & (rank_new <= last[key_of])]] = True
    fast = (held < k) | ~reaches
    slow = key_table.filter(pa.array(~fast))
    if not fast.any():
        return None, slow, 0
    # the kept keys' stored rows weigh their counts, and their changes their diffs
    keep = np.concatenate([fast[qi], fast[key_of]])
    stored = np.concatenate([count, np.zeros(len(diff), np.int64)])[keep]
    weight = np.concatenate([count, diff]).astype(np.int64)[keep]
    delta = _change(view, k, by, both.filter(pa.array(keep)),
                    np.concatenate([qi, key_of])[keep], rank[keep], weight, stored)
    return delta, slow, int(fast.sum())


def recomputed_top_k(view, k: int, by: list[str], descending: bool, trace, keys: pa.Table,
                     time: int) -> pa.Table:
    """The view's change at ``time`` for ``keys`` from their rows in the input ``trace``
    (looked up) against their stored rows."""
    cols = view.key_names + view.val_names
    # the rows as stored: their counts are summed with the rest below
    rows = trace.lookup(keys.rename_columns(trace.key_names), at=time, consolidate=False)
    old = view.stored_rows(keys)
    both = pa.concat_tables([
        rows.drop_columns(["query_index", "count"]).rename_columns(cols).cast(
            old.select(cols).schema), old.select(cols)])
    count = rows.column("count").to_numpy()
    stored = old.column("count").to_numpy()
    return _change(view, k, by, both,
                   np.concatenate([rows.column("query_index").to_numpy(),
                                   old.column("query_index").to_numpy()]),
                   _rank(codes([both], by)[0], descending),
                   np.concatenate([count, np.zeros(len(stored), np.int64)]),
                   np.concatenate([np.zeros(len(count), np.int64), stored]))


def _change(view, k, by, rows: pa.Table, key: np.ndarray, rank: np.ndarray,
            weight: np.ndarray, stored: np.ndarray) -> pa.Table:
    """The change of the first k per key: ``rows`` (keys' indexes ``key``, top_k's
    ``rank``) weigh ``weight`` in the new group and ``stored`` in the view. Each distinct
    row's stored count against its count in the new first k: most rows of most keys do
    not change and are not handed over."""
    if list(by) == view.val_names:   # the rank orders the vals too
        order, starts = sort_rows(key, [rank], None)
    else:
        order, starts = sort_rows(key, [rank, codes([rows], view.val_names)[0]], None)
    first = order[starts]
    present = np.maximum(np.add.reduceat(weight[order], starts), 0)   # count > 0 weighs
    was = np.add.reduceat(stored[order], starts)
    group = key[first]
    before = np.cumsum(present) - present          # weight ahead of each row, all keys
    group_first = np.flatnonzero(np.concatenate([[True], group[1:] != group[:-1]]))
    before -= np.repeat(before[group_first], np.diff(np.append(group_first, len(group))))
    change = np.minimum(present, np.clip(k - before, 0, None)) - was
    moved = np.flatnonzero(change)
    return rows.take(pa.array(first[moved])).append_column(
        DIFF, pa.array(change[moved], pa.int64())).cast(delta_schema(view))


def _rank(code: np.ndarray, descending: bool) -> np.ndarray:
    """Smaller first, as ``top_k`` orders: its codes as int64, negated when descending."""
    rank = code.astype(np.int64)
    return -rank if descending else rank
