"""Vectorized kernels over :class:`Updates`: one named function per operation.

Every function here runs in numpy/pyarrow kernels over whole arrays; none loops over
records in Python.

Mathematics
-----------
The accumulation of ``(k, v)`` at time ``t`` is ``sum(diff for (k, v, s, diff) if s <= t)``.
Advancing a time ``s`` to a frontier ``f`` (logical compaction) replaces it by
``max(s, f)``; this preserves every accumulation at times ``t >= f``, which is why a
trace compacted to ``f`` can still answer any read at ``t >= f`` exactly.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from arrangedb.codecs.base import binary_offset_dtype
from arrangedb.spine.data.codes import (absolute_codes, codes, count_le, differs_from_previous,
                                        is_absolute, sorted_row_starts)
from arrangedb.spine.data.order import (is_identity, never_falls, run_lengths, sort_rows,
                                        sorted_rows)
from arrangedb.spine.data.packed_rows import distinct_sorted
from arrangedb.spine.data.updates import Updates, all_equal, constant, is_constant


def _key_val_codes(upd: Updates, kc: np.ndarray | None = None
                   ) -> tuple[np.ndarray, list[np.ndarray]]:
    """The key's code (``kc`` when the caller has it) and the vals' codes: one per val
    column when each is a fixed-width column without nulls (the sorts take several
    columns; ranking them jointly would cost a sort of its own), else one joint code."""
    if kc is None:
        kc = codes([upd.keys], upd.keys.column_names)[0]
    if upd.vals is None or upd.vals.num_columns == 0:
        return kc, []
    names = upd.vals.column_names
    if len(names) > 1 and all(is_absolute([upd.vals.schema.field(c).type])
                              and upd.vals.column(c).null_count == 0 for c in names):
        return kc, [absolute_codes(upd.vals, [c]) for c in names]
    return kc, [codes([upd.vals], names)[0]]


def _indices(idx: np.ndarray, n: int) -> np.ndarray | None:
    """None when ``idx`` is the identity permutation of ``range(n)`` (skip the take)."""
    return None if is_identity(idx, n) else idx


def _nonzero_sums(sorted_diffs: np.ndarray, starts: np.ndarray
                  ) -> tuple[np.ndarray | None, np.ndarray]:
    """(where each group of equal rows begins along the order, its summed diff), groups
    summing to zero dropped. Every row its own group (a delta of distinct rows) and none
    zero: None (every position) and the diffs as they are, no gathers."""
    if len(starts) == len(sorted_diffs):
        nonzero = sorted_diffs != 0
        if nonzero.all():
            return None, sorted_diffs
        keep = np.flatnonzero(nonzero)
        return keep, sorted_diffs[keep]
    sums = np.add.reduceat(sorted_diffs, starts)
    keep = np.flatnonzero(sums != 0)
    return starts[keep], sums[keep]


def _sorted_keys(keys: pa.Table, sorted_codes: np.ndarray | None,
                 positions: np.ndarray | None) -> pa.Table | None:
    """The keys at ``positions`` along the order, from their sorted codes when the codes
    are the keys (one integer column without nulls: its own values), else None."""
    if sorted_codes is None or keys.num_columns != 1:
        return None
    col = keys.column(0)
    if not pa.types.is_integer(col.type) or col.null_count:
        return None
    values = sorted_codes if positions is None else sorted_codes[positions]
    return pa.Table.from_arrays([pa.array(values, type=col.type)], schema=keys.schema)


def consolidate(upd: Updates, since: int | None = None, presorted_runs: bool | int = False
                ) -> Updates:
    """Sort by (key, val, time), sum diffs of equal rows, drop zero sums.

    With ``since``, times are first advanced to ``max(time, since)`` (logical compaction).
    Input in any order; ``presorted_runs``: the input is concatenated sorted runs (True,
    or how many), which the sort may exploit (see ``argsort.sort_values``).
    """
    n = len(upd)
    if n == 0:
        return upd
    times = upd.times
    if since:
        times = np.maximum(times, np.uint64(since))
    kc = codes([upd.keys], upd.keys.column_names)[0]
    if never_falls(kc, strict=True):   # distinct keys in order (a dimension by its id):
        return _nonzero_rows(upd, times)   # every row its own, whatever its vals
    kc, vcs = _key_val_codes(upd, kc)
    constant_time = all_equal(times)
    diffs = upd.diffs
    if constant_time:
        packed = _packed_rows(upd, kc, vcs, times[0], presorted_runs)
        if packed is not None:
            return packed
    order, starts, sorted_kc = sorted_rows(kc, vcs, None if constant_time else times,
                                           presorted_runs)
    if all_equal(diffs):   # (an input's rows at diff 1): each row's sum is its count
        if diffs[0] == 0:
            return upd.take(np.zeros(0, dtype=np.int64))
        if len(starts) == n:
            pos, sums = None, constant(diffs[0], n, np.int64)
        else:
            pos, sums = starts, run_lengths(starts, n)   # each row's count, weighed
            if diffs[0] != 1:
                sums *= diffs[0]
    else:   # (rows in order already: their diffs need no gather)
        in_order = _indices(order, n) is None
        pos, sums = _nonzero_sums(diffs if in_order else diffs[order], starts)
    rows = order if pos is None else order[pos]
    taken = _indices(rows, n)
    if taken is None:
        keys, vals = upd.keys, upd.vals
    else:
        keys = _sorted_keys(upd.keys, sorted_kc, pos)
        if keys is None:
            keys, vals = upd.take_payload(taken)
        else:   # the sort unpacked the keys: only the vals are gathered
            vals = upd.vals.take(pa.array(taken)) if upd.vals is not None else None
    out_times = constant(times[0], len(rows), np.uint64) if constant_time else times[rows]
    return Updates(keys, vals, out_times, sums)


def _packed_rows(upd: Updates, kc: np.ndarray, vcs: list[np.ndarray], time,
                 presorted_runs) -> Updates | None:
    """:func:`consolidate` of rows at one time whose key and vals are integer columns
    without nulls (their codes are their values) packing into 64 bits with their diffs
    (none, when every diff is one value): sorted as values and unpacked
    (:mod:`~arrangedb.spine.data.packed_rows`), never gathered. None for other rows."""
    tables = [upd.keys] if upd.vals is None else [upd.keys, upd.vals]
    fields = [f for t in tables for f in t.schema]
    if upd.keys.num_columns != 1 or len(vcs) != len(fields) - 1 \
            or not all(pa.types.is_integer(f.type) for f in fields) \
            or any(c.null_count for t in tables for c in t.columns):
        return None
    diffs = upd.diffs
    one_diff = all_equal(diffs)
    if one_diff and diffs[0] == 0:
        return None
    got = distinct_sorted([kc, *vcs], presorted_runs, None if one_diff else diffs)
    if got is None:
        return None
    columns, counts = got
    m = len(columns[0])
    if not one_diff:
        sums = counts
    else:
        sums = constant(diffs[0], m, np.int64) if counts is None else counts * diffs[0]
    if columns[0] is kc:   # in order already: the input's own tables, as the caller
        keys, vals = upd.keys, upd.vals   # tells them (a run kept copies such input)
    else:
        arrays = [pa.array(c, type=f.type) for c, f in zip(columns, fields)]
        keys = pa.Table.from_arrays(arrays[:1], schema=upd.keys.schema)
        vals = (None if upd.vals is None
                else pa.Table.from_arrays(arrays[1:], schema=upd.vals.schema))
    return Updates(keys, vals, constant(time, m, np.uint64), sums)


def keys_in_order(keys: pa.Table) -> bool:
    """Whether ``keys`` (rows in input order) are already sorted: one fixed-width
    column without nulls whose values never fall (others: False, unchecked)."""
    if len(keys.column_names) != 1 or not is_absolute([keys.schema.field(0).type]) \
            or keys.column(0).null_count:
        return False
    return never_falls(absolute_codes(keys, keys.column_names))


def _nonzero_rows(upd: Updates, times: np.ndarray) -> Updates:
    """``upd``, whose rows are sorted and distinct, at ``times``, less zero diffs."""
    diffs = upd.diffs
    if all_equal(diffs) and diffs[0] != 0:
        return Updates(upd.keys, upd.vals, times, diffs)
    keep = np.flatnonzero(diffs != 0)
    if len(keep) == len(diffs):
        return Updates(upd.keys, upd.vals, times, diffs)
    return Updates(upd.keys, upd.vals, times, diffs).take(keep)


def accumulate(upd: Updates, at: int | None) -> tuple[pa.Table, pa.Table | None, np.ndarray]:
    """Consolidated counts per (key, val) at time ``at`` (None: every time), sorted.

    Returns ``(keys, vals, counts)`` with one row per (key, val) whose count is nonzero.
    """
    if at is not None and len(upd):
        mask = upd.times <= np.uint64(at)
        if not mask.all():
            upd = upd.take(np.flatnonzero(mask))
    n = len(upd)
    if n == 0:
        return upd.keys, upd.vals, upd.diffs
    kc, vcs = _key_val_codes(upd)
    order, starts = sort_rows(kc, vcs, None, presorted_runs=True)
    pos, sums = _nonzero_sums(upd.diffs[order], starts)
    rows = order if pos is None else order[pos]
    taken = _indices(rows, n)
    keys, vals = (upd.keys, upd.vals) if taken is None else upd.take_payload(taken)
    return keys, vals, sums


def adjacent_sums(kc: np.ndarray, vals: pa.Table | None, diffs: np.ndarray
                  ) -> tuple[np.ndarray | None, np.ndarray] | None:
    """Each run of equal adjacent rows (key codes ``kc``, then ``vals``) summed into its
    first row: ``(positions kept, their sums)``, zero sums dropped (positions None:
    every row kept, its diff as it is). Rows read back in stored (key, val, time) order
    -- the rows of a key in one batch -- consolidate this way without a sort. None when
    a val column does not compare so (a dictionary or nested column: the sort ranks it)."""
    n = len(kc)
    if n == 0:
        return None, diffs
    starts = np.empty(n, bool)
    starts[0] = True
    np.not_equal(kc[1:], kc[:-1], out=starts[1:])
    for col in vals.columns if vals is not None else ():
        if not _compares_adjacent(col.type):
            return None
        starts[1:] |= differs_from_previous(col)
    return _nonzero_sums(diffs, np.flatnonzero(starts))


def _compares_adjacent(t: pa.DataType) -> bool:
    return is_absolute([t]) or pa.types.is_null(t) or binary_offset_dtype(t) is not None


def filter_times(upd: Updates, since: int, upto: int | None) -> Updates:
    """Rows with ``since <= time < upto`` (upto None: unbounded)."""
    if len(upd) and is_constant(upd.times):   # one stored time (a delta's): judged once
        t = int(upd.times[0])
        inside = since <= t and (upto is None or t < upto)
        return upd if inside else upd.take(np.zeros(0, np.int64))
    mask = upd.times >= np.uint64(since)
    if upto is not None:
        mask &= upd.times < np.uint64(upto)
    if mask.all():
        return upd
    return upd.take(np.flatnonzero(mask))


def count_through(sorted_keys: pa.Table, bound: pa.Table) -> int:
    """How many leading rows of ``sorted_keys`` have a key <= the single row of ``bound``."""
    if sorted_keys.num_rows == 0:
        return 0
    return count_le(sorted_keys, bound)


def smallest_last_key(tables: list[pa.Table]) -> int:
    """Index (into ``tables``) of the table whose *last* row holds the smallest key.

    Used to pick the bound of a window: the smallest of the windows' last keys, so that
    every source can be cut through it without leaving a key half read.
    """
    names = tables[0].column_names
    lasts = [t.slice(t.num_rows - 1, 1).rename_columns(names) for t in tables]
    cs = codes(lasts, names)
    return int(np.argmin([c[0] for c in cs]))


def key_starts(keys: pa.Table) -> np.ndarray:
    """Indices where a new key starts in key-sorted rows, plus the end (len n+1)."""
    return np.append(sorted_row_starts(keys), keys.num_rows).astype(np.int64)
