"""A ``distinct`` view's change from the changed rows alone.

A row is in ``distinct``'s output while its count is positive, so the output changes
only at rows whose count crosses zero -- and only rows the input's changes name can.
Each such row's count after the change is read from the input (its key's rows looked
up as stored and summed, no accumulation first); its count before is that less the
change. The view's own rows are not read, and a touched key's unchanged rows are never
handed over.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from arrangedb.ops.view_delta import DIFF, delta_schema
from arrangedb.ops.common import row_owner
from arrangedb.spine import codes, sort_rows


def distinct_change(view, trace, changes: pa.Table, key_of: np.ndarray,
                    key_table: pa.Table, time: int) -> pa.Table:
    """The view's change at ``time`` from ``changes``, the input ``trace``'s changes at
    that time, sorted by key (``key_of``: each row's key index, from 0, into the
    distinct ``key_table``)."""
    cols = view.key_names + view.val_names
    rows = trace.lookup(key_table.rename_columns(trace.key_names), at=time, consolidate=False)
    named = changes.select(cols)
    changed = named.select(view.val_names)
    stored = rows.select(trace.val_names).rename_columns(view.val_names).cast(changed.schema)
    if view.val_names:   # comparable codes, no concatenation
        val, row_val = codes([changed, stored], view.val_names)
    else:   # key-only: a row is its key, every looked-up row the changed row of its key
        val = np.zeros(changes.num_rows, np.int64)
        row_val = np.zeros(rows.num_rows, np.int64)
    after = _counts_at(key_of, val, rows.column("query_index").to_numpy(), row_val,
                       rows.column("count").to_numpy())
    d = changes.column("diff").to_numpy()
    change = (after > 0).astype(np.int64) - (after - d > 0)
    moved = np.flatnonzero(change)
    return named.take(pa.array(moved)).append_column(
        DIFF, pa.array(change[moved], pa.int64())).cast(delta_schema(view))


MAX_SLOTS = 16   # a key's changed rows matched one slot at a time up to this; else a sort


def _counts_at(key: np.ndarray, val: np.ndarray, row_key: np.ndarray, row_val: np.ndarray,
               row_count: np.ndarray) -> np.ndarray:
    """Per changed row (``key``, ``val`` codes; sorted and distinct, as a trace's changes
    at one time are), the summed count of the looked-up rows equal to it. A key's
    changed rows are few: each looked-up row is compared with its key's first, second,
    ... changed row, one vectorized pass each."""
    n = len(key)
    first = np.searchsorted(key, np.arange(key[-1] + 2 if n else 1))
    width = np.diff(first)
    slots = int(width.max()) if n else 0
    if slots > MAX_SLOTS:
        return _counts_by_sort(key, val, row_key, row_val, row_count)
    start, have = first[row_key], width[row_key]
    found, weights = [], []
    for j in range(slots):
        if j:   # the rows whose key has a j-th changed row, against it
            live = np.flatnonzero(have > j)
            if len(live) < len(have):
                start, have = start[live], have[live]
                row_val, row_count = row_val[live], row_count[live]
            start += 1
        hit = np.flatnonzero(row_val == val[start])
        found.append(start[hit])
        weights.append(row_count[hit])
    if not found:
        return np.zeros(n, np.int64)
    summed = np.bincount(np.concatenate(found), np.concatenate(weights), minlength=n)
    return np.rint(summed).astype(np.int64)


def _counts_by_sort(key, val, row_key, row_val, row_count) -> np.ndarray:
    """:func:`_counts_at` by one sort of the changed and looked-up rows together."""
    n = len(key)
    order, starts = sort_rows(np.concatenate([key, row_key]), [np.concatenate([val, row_val])],
                              None)
    group = np.empty(len(order), np.int64)
    group[order] = row_owner(np.append(starts, len(order)))
    counts = np.concatenate([np.zeros(n, np.int64), row_count])
    summed = np.bincount(group, weights=counts, minlength=len(starts))
    return np.rint(summed[group[:n]]).astype(np.int64)
