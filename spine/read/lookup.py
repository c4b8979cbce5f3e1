"""Batched lookups: a batch of keys sorted once and walked in order through every batch
of a trace, touching only the parts (and, in a paged part, only the rows and zstd
blocks) that hold them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from arrangedb.spine.data import roles
from arrangedb.spine.data.ingest import SchemaError, cast_column
from arrangedb.spine.data.kernels import accumulate, adjacent_sums, filter_times
from arrangedb.spine.data.layout import both_ends, leaf_updates, ranges, run_index, select_vals
from arrangedb.spine.data.codes import absolute_codes, codes, is_absolute
from arrangedb.spine.data.argsort import sort_order
from arrangedb.spine.data.order import is_identity, row_starts, run_lengths
from arrangedb.spine.data.updates import Updates, concat_column, is_constant
from arrangedb.spine.read.reader import part_edges
from arrangedb.spine.storage.batch import Batch
from arrangedb.spine.storage.dictionaries import dictionary_schema


def lookup(trace, keys, at: int | None = None, read_dictionary=None,
           consolidate: bool = True) -> pa.Table:
    """Rows for a batch of keys: query_index, key, vals, count (sorted once, walked in
    order). ``read_dictionary``: val columns to return as dictionary arrays (int32
    codes), taken as codes from the parts that store them dictionary-coded.
    ``consolidate=False``, for keys given distinct and sorted: each batch's rows of the
    keys at times through ``at`` as stored, not summed across batches (a row may repeat,
    its counts summing to its count; a caller that groups the rows itself skips a sort).
    """
    with trace.ctx.working():   # idle merging waits
        return _lookup(trace, keys, at, read_dictionary, consolidate)


def _lookup(trace, keys, at, read_dictionary, consolidate=True) -> pa.Table:
    trace.check_read_time(at)
    queries = _key_table(keys, trace.key_schema)
    dictionary = frozenset(read_dictionary or ())
    unknown = sorted(dictionary - set(trace.val_names))
    if unknown:
        raise KeyError(f"read_dictionary: {unknown} are not val columns of this trace "
                       f"(vals: {trace.val_names})")
    schema = dictionary_schema(trace.output_schema(roles.weight_field("count")),
                               dictionary)
    schema = pa.schema([pa.field("query_index", pa.int64())] + list(schema))
    n = queries.num_rows
    if n == 0:
        return schema.empty_table()
    qc = codes([queries], trace.key_names)[0]
    distinct_sorted = bool((qc[1:] > qc[:-1]).all())   # a join's keys: nothing to sort
    if distinct_sorted:
        uq = queries
    else:
        order = sort_order(qc)
        sq = qc[order]
        first = np.ones(n, dtype=bool)
        first[1:] = sq[1:] != sq[:-1]
        uniq_pos = np.flatnonzero(first)        # positions (in sorted order) of distinct keys
        uq = queries.take(order[uniq_pos])      # distinct, sorted
    found: list[tuple] = []       # (vals, times, diffs) of the keys' rows, per part
    found_u: list[np.ndarray] = []
    sources = 0
    for batch in trace.batches():
        if at is None or batch.description.lower <= max(at, trace.since):
            before = len(found)
            _lookup_batch(trace.key_names, batch, uq, found, found_u, dictionary)
            sources += len(found) > before
    if not found:
        return schema.empty_table()
    vals = pa.concat_tables([f[0] for f in found]) if found[0][0] is not None else None
    diffs = concat_column([f[2] for f in found], np.int64)
    u = np.concatenate(found_u)
    if not consolidate and distinct_sorted:   # as stored: in query order per batch
        # times are read only to drop those after ``at``: a part's one stored time (a
        # stride-0 view) is judged once, not per row
        if at is not None and any(_any_after(f[1], at) for f in found):
            t = concat_column([f[1] for f in found], np.uint64)
            rows = np.flatnonzero(t <= np.uint64(at))
            u, diffs = u[rows], diffs[rows]
            vals = vals.take(pa.array(rows)) if vals is not None else None
        return _record_table(schema, u, _keys_at(uq, u), vals, diffs)
    t = concat_column([f[1] for f in found], np.uint64)
    if sources == 1 and len(t) and t[0] == t[-1] and (at is None or t[0] <= at) \
            and bool(np.all(t == t[0])):
        # one batch at one time: consolidated, in query order, a count per (key, val)
        u_rows, counts = u, diffs
    else:
        u_rows, vals, counts = _accumulated(u, vals, t, diffs, at, sources)
    if distinct_sorted:     # each query is its own distinct key: rows are in query order
        return _record_table(schema, u_rows, _keys_at(uq, u_rows), vals, counts)
    # expand to every query row (duplicates included), ordered by query_index
    group_of_sorted = np.cumsum(first) - 1       # distinct index of each sorted query
    lo = np.searchsorted(u_rows, np.arange(len(uniq_pos)), side="left")
    hi = np.searchsorted(u_rows, np.arange(len(uniq_pos)), side="right")
    q_index = order                              # sorted position -> original row
    per_query = (hi - lo)[group_of_sorted]
    by_query = np.empty(n, dtype=np.int64)       # original row order: the inverse
    by_query[q_index] = np.arange(n)              # permutation, no sort needed
    reps = per_query[by_query]
    starts = lo[group_of_sorted][by_query]
    rows = ranges(starts, reps)
    qi = run_index(reps)                         # q_index is a permutation of 0..n-1
    key_rows = uq.take(u_rows[rows])
    out_vals = vals.take(rows) if vals is not None else None
    return _record_table(schema, qi, key_rows, out_vals, counts[rows])


def _accumulated(u: np.ndarray, vals: pa.Table | None, t: np.ndarray, diffs: np.ndarray,
                 at: int | None, sources: int):
    """Counts per (distinct query ``u``, val) at ``at`` of the rows found in ``sources``
    batches: ``(u, vals, counts)``, sorted, zero counts dropped. A key's rows from one
    batch come in stored order (val, then time), so equal rows are adjacent and sum
    without a sort: one batch's rows need nothing more -- a view's state beside its
    last refresh's changes, three rows for each of 244k changed keys, consolidated in
    9-12 ms instead of the sort's 27-32 -- and several batches' are merged by a sort of
    what is left."""
    # the distinct query index acts as the key
    upd = Updates(pa.table({"__u": u}), vals, t, diffs)
    if at is not None:
        upd = filter_times(upd, 0, at + 1)
    summed = adjacent_sums(upd.keys.column(0).to_numpy(), upd.vals, upd.diffs)
    if summed is not None:
        pos, sums = summed
        if pos is not None:
            upd = upd.take(pos)
        upd = Updates(upd.keys, upd.vals, upd.times, sums)
        if sources == 1:
            return upd.keys.column(0).to_numpy(), upd.vals, upd.diffs
    k_u, vals, counts = accumulate(upd, None)
    return k_u.column(0).to_numpy(), vals, counts


def _found_keys(key_names: list[str], batch: Batch, uq: pa.Table,
                dictionary: frozenset = frozenset()):
    """For each part of ``batch`` holding some of the distinct, sorted keys ``uq``:
    ``(lo, part, layout, pos, hit)`` -- the part's slice of ``uq`` starting at ``lo``,
    which of that slice's keys it holds (``hit``) and where (``pos``). The part is
    released once the caller goes on."""
    edges = part_edges(batch, uq)
    for p in np.flatnonzero(np.diff(edges)):
        lo, hi = int(edges[p]), int(edges[p + 1])
        part = batch.parts[p]
        first = part.dense_first_key()
        qk = uq.slice(lo, hi - lo)
        # key i is first + i, or the part's rank index places the keys: none to decode
        # or search
        found = (_dense_positions(first, part.num_keys, qk.column(0)) if first is not None
                 else _ranked(part, qk.column(0)))
        layout = part.lookup_layout(dictionary, dense=found is not None)
        try:
            if found is not None:
                pos, hit = found
            else:
                pkeys = layout.keys
                pc_, qc_ = codes([pkeys, qk.rename_columns(pkeys.column_names)],
                                 key_names)
                pos, hit = _positions(pc_, qc_)
            if hit.any():
                yield lo, part, layout, pos, hit
        finally:
            part.release()


def _ranked(part, queries):
    """:meth:`Part.rank_positions`, the part released should it fail."""
    try:
        return part.rank_positions(queries)
    except BaseException:
        part.release()
        raise


def _lookup_batch(key_names: list[str], batch: Batch, uq: pa.Table, found: list, found_u: list,
                  dictionary: frozenset = frozenset()) -> None:
    for lo, _, layout, pos, hit in _found_keys(key_names, batch, uq, dictionary):
        vals, times, diffs, owner = select_vals(layout, pos)
        found.append((vals, times, diffs))
        u = (np.arange(lo, lo + len(hit)) if len(pos) == len(hit)
             else lo + np.flatnonzero(hit))
        # as many updates as keys: one each, in order (a dimension's), no gather
        found_u.append(u if len(owner) == len(u) else u[owner])


def row_counts(trace, keys: pa.Table, vals: pa.Table | None, at: int | None = None
               ) -> np.ndarray:
    """The count at ``at`` of each given row -- ``keys`` and ``vals`` side by side,
    sorted by key -- summed over the trace's batches (a row given twice is counted
    each time).

    Where :func:`lookup` gathers every val of each key, this searches each key's vals
    for the one asked (a binary search per row, all rows at once), so checking a
    delta's retractions costs in proportion to them, not to their keys' other vals.
    ``vals`` None: a key-only trace, whose rows are its keys."""
    with trace.ctx.working():   # idle merging waits
        trace.check_read_time(at)
        queries = _key_table(keys, trace.key_schema)
        totals = np.zeros(queries.num_rows, np.int64)
        if queries.num_rows == 0:
            return totals
        starts = row_starts(codes([queries], trace.key_names)[0])   # each key's first row
        rows_of = run_lengths(starts, len(totals))
        uq = queries.take(starts)
        for batch in trace.batches():
            if at is None or batch.description.lower <= max(at, trace.since):
                for lo, part, layout, pos, hit in _found_keys(trace.key_names, batch, uq):
                    # every row of each key found, and that key's position in the part
                    n_rows = rows_of[lo:lo + len(hit)][hit]
                    row = ranges(starts[lo:lo + len(hit)][hit], n_rows)
                    first, end = _row_leaves(part, layout, np.repeat(pos, n_rows), vals,
                                             row)
                    counts = _leaf_counts(layout, ranges(first, end - first), at)
                    np.add.at(totals, np.repeat(row, end - first), counts)
        return totals


def _row_leaves(part, layout, key_pos: np.ndarray, vals: pa.Table | None, row: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """The leaves ``[lo, hi)`` in ``layout`` of the asked rows ``row`` (of ``vals``),
    whose keys are at ``key_pos``: empty where the part lacks the row's val."""
    if vals is None:   # key-only: the key is the leaf
        return key_pos, key_pos + 1
    k_first, k_end = both_ends(layout.key_bounds, key_pos)
    search = _ValSearch(layout.vals, vals.take(row))
    leaf_lo = search.bound(k_first, k_end, upper=False)
    if part.distinct_leaves:   # the val once, or not at all
        return leaf_lo, leaf_lo + search.equal_at(leaf_lo, k_end)
    return leaf_lo, search.bound(leaf_lo, k_end, upper=True)   # a resident part repeats


class _ValSearch:
    """Each asked row's val among a part's vals (sorted within each key's range)."""

    def __init__(self, part_vals, asked: pa.Table):
        self.part_vals, self.asked = part_vals, asked
        self.names = part_vals.schema.names
        # integer and float vals compare by their own codes: the asked ones coded once
        self.wanted = (absolute_codes(asked, self.names)
                       if is_absolute(list(asked.schema.types))
                       and asked.column(0).null_count == 0 else None)

    def _codes(self, rows: np.ndarray, asking: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Comparable codes of the part's vals at ``rows`` and of the asked rows
        ``asking``."""
        got = self.part_vals.take(rows)
        if self.wanted is not None and got.column(0).null_count == 0:
            return absolute_codes(got, self.names), self.wanted[asking]
        return tuple(codes([got, self.asked.take(asking)], self.names))

    def bound(self, lo: np.ndarray, hi: np.ndarray, upper: bool) -> np.ndarray:
        """Per asked row, the first position in ``[lo, hi)`` whose val is at least
        (``upper``: greater than) the row's: bisections of all rows at once, each step
        over the rows still open (most keys hold few vals: their rows close early)."""
        out = lo.copy()
        rows = np.flatnonzero(lo < hi)
        lo, hi = lo[rows], hi[rows]
        while len(rows):
            mid = (lo + hi) >> 1
            at_mid, want = self._codes(mid, rows)
            right = at_mid <= want if upper else at_mid < want
            lo = np.where(right, mid + 1, lo)
            hi = np.where(right, hi, mid)
            done = lo >= hi
            if done.any():
                out[rows[done]] = lo[done]
                open_ = ~done
                rows, lo, hi = rows[open_], lo[open_], hi[open_]
        return out

    def equal_at(self, pos: np.ndarray, end: np.ndarray) -> np.ndarray:
        """1 where the part's val at ``pos`` (before ``end``) is the row's, else 0."""
        out = np.zeros(len(pos), np.int64)
        inside = np.flatnonzero(pos < end)
        if len(inside):
            got, want = self._codes(pos[inside], inside)
            out[inside] = got == want
        return out


def _leaf_counts(layout, leaves: np.ndarray, at: int | None) -> np.ndarray:
    """Each leaf's count at ``at`` (None: every time) from its stored updates."""
    if len(layout.times) == 1:   # one stored (time, diff) for the part
        d = int(layout.diffs[0]) if at is None or int(layout.times[0]) <= at else 0
        return np.full(len(leaves), d, np.int64)
    upd, counts = leaf_updates(layout.leaf_bounds, leaves)
    d = layout.diffs[upd].astype(np.int64)
    if at is not None:
        d[layout.times[upd] > np.uint64(at)] = 0
    if not len(d):
        return np.zeros(0, np.int64)
    return np.add.reduceat(d, np.cumsum(counts) - counts)


def _any_after(times: np.ndarray, at: int) -> bool:
    """Whether any of ``times`` is after ``at``."""
    if not len(times):
        return False
    top = times[0] if is_constant(times) else times.max()
    return bool(top > np.uint64(at))


def _key_table(keys, key_schema: pa.Schema) -> pa.Table:
    if isinstance(keys, pa.RecordBatch):
        keys = pa.Table.from_batches([keys])
    if not isinstance(keys, pa.Table):
        raise SchemaError(f"lookup keys must be a pyarrow Table or RecordBatch, "
                          f"not {type(keys).__name__}")
    cols = []
    for f in key_schema:
        if f.name not in keys.column_names:
            raise SchemaError(f"lookup keys lack key column {f.name!r} "
                              f"(columns: {', '.join(keys.column_names)})")
        col = keys.column(f.name)
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        if col.null_count:
            raise SchemaError(f"lookup key column {f.name!r} holds nulls")
        cols.append(cast_column(col, f, "lookup key column", "the trace's"))
    return pa.Table.from_arrays(cols, schema=key_schema)


def _positions(sorted_codes: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where the queries' codes are among a part's distinct, sorted key codes: the
    positions of those found, and which were found.

    Consecutive integer codes (dense ids, the common surrogate key) need no search: a
    key's position is its distance from the first (5x faster than a binary search of
    380k queries in 4M keys)."""
    n = len(sorted_codes)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(len(queries), dtype=bool)
    if sorted_codes.ndim == 1 and sorted_codes.dtype.kind in "iu":
        lo, hi = sorted_codes[0], sorted_codes[-1]
        if int(hi) - int(lo) == n - 1:
            hit = (queries >= lo) & (queries <= hi)
            return (queries[hit] - lo).astype(np.int64), hit
    pos = np.searchsorted(sorted_codes, queries)
    hit = (pos < n) & (sorted_codes[np.minimum(pos, n - 1)] == queries)
    return pos[hit], hit


def _dense_positions(first: int, n: int, queries) -> tuple[np.ndarray, np.ndarray]:
    """Positions of integer queries among the keys first, first + 1, ..., first + n - 1,
    and which were found."""
    if isinstance(queries, pa.ChunkedArray):   # a slice of the queries: one chunk, viewed
        queries = queries.chunk(0) if queries.num_chunks == 1 else queries.combine_chunks()
    q = queries.to_numpy()
    if len(q) and first <= int(q[0]) and int(q[-1]) <= first + n - 1:
        # the queries are sorted (a lookup's are) and all inside the range: every one
        # found, no mask to build or apply
        return q.astype(np.int64, copy=False) - np.int64(first), np.ones(len(q), dtype=bool)
    # uint64 queries beyond int64 wrap to negatives: below an unsigned first key, missed
    q = q.astype(np.int64, copy=False)
    hit = (q >= first) & (q <= first + n - 1)
    return q[hit] - np.int64(first), hit


def _keys_at(uq: pa.Table, rows: np.ndarray) -> pa.Table:
    """The distinct queries at ``rows``: ``uq`` itself when ``rows`` is each query once,
    in order (a dimension's keys, all found), else a gather."""
    return uq if is_identity(rows, uq.num_rows) else uq.take(rows)


def _record_table(schema, qi, keys, vals, counts) -> pa.Table:
    arrays = [pa.array(qi)] + list(keys.columns)
    if vals is not None:
        arrays += list(vals.columns)
    arrays.append(pa.array(counts))
    return pa.Table.from_arrays(arrays, schema=schema)
