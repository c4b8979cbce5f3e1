"""Joins of two arrangements: a merge over their cursors, block by block, in key order.

Design
------
``co_blocks`` hands both traces' blocks aligned on one key range at a time. Within a
block pair, the distinct keys of the two sides are matched with one ``searchsorted``
over comparable codes; each matched key contributes the cross product of its left and
right rows, which is generated in bounded chunks by index arithmetic (``repeat``,
``//`` and ``%`` over the chunk's output positions) and materialised with ``take``.
No hash table, no per-record loop, and an output far larger than memory (a skewed
key, or ``expand=True``) still comes out in batches of ``batch_rows``.

Incremental form
----------------
The join is bilinear, so its output's changes in ``[since, upto)`` are exactly::

    dA x B_old  +  A_old x dB  +  dA x dB          (time = the later of the two)

where ``d`` are the inputs' changes in the interval and ``_old`` their accumulations
at ``since - 1``. The deltas are read through the cursor (batches whose time bounds
lie before ``since`` are skipped); the old state of only the keys a delta touches is
fetched with each trace's batched, sorted ``lookup``. Nothing outside the touched keys
is joined. Left, right, full, semi and anti joins are not bilinear (a match appearing
retracts an unmatched row): their changes come from the touched keys' output before and
after (:mod:`arrangedb.ops.per_key`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from arrangedb.ops.common import (DEFAULT_BATCH_ROWS, check_batch_rows, columns_of,
                                  output_chunks, ranges, rows_within_bytes)
from arrangedb.ops.match import match_keys
from arrangedb.ops.per_key import check_window, consolidated, lookup_block, per_key_changes
from arrangedb.spine import Block, co_blocks, dictionary_schema, roles

HOWS = ("inner", "left", "right", "full", "semi", "anti")
WITH_RIGHT_VALS = ("inner", "left", "right", "full")   # outputs holding the right vals


# -- validation and output schema -----------------------------------------------------------
def check_traces(left, right) -> None:
    lt = [f.type for f in left.key_schema]
    rt = [f.type for f in right.key_schema]
    if lt != rt:
        raise TypeError(
            "cannot join traces whose key types differ: left "
            f"{list(zip(left.key_names, map(str, lt)))} vs right "
            f"{list(zip(right.key_names, map(str, rt)))}; cast one side's key columns "
            "before arranging it")


def prefixed_names(keys: list[str], lvals: list[str], rvals: list[str]
                   ) -> tuple[list[str], list[str]]:
    """Left and right val names, prefixed ``left_``/``right_`` where they clash."""
    keys = set(keys)
    clash = (set(lvals) & set(rvals)) | (set(rvals) & keys) | (set(lvals) & keys)
    return ([f"left_{n}" if n in clash else n for n in lvals],
            [f"right_{n}" if n in clash else n for n in rvals])


def dictionary_readable(t: pa.DataType) -> bool:
    """A val column ``read_dictionary`` may ask for: string, binary or integer."""
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_integer(t))


def _dictionary_columns(left, right, how: str, read_dictionary) -> tuple[frozenset, frozenset]:
    """The left and right val columns (trace names) that ``read_dictionary`` (output
    names) asks for as dictionary arrays; an error naming any other name or type."""
    if read_dictionary is None:
        return frozenset(), frozenset()
    if isinstance(read_dictionary, str):
        read_dictionary = [read_dictionary]
    lnames, rnames = prefixed_names(left.key_names, left.val_names, right.val_names)
    sides = [(left, lnames)] + ([(right, rnames)] if how in WITH_RIGHT_VALS else [])
    where = {out: (i, f) for i, (t, names) in enumerate(sides) if t.val_schema is not None
             for out, f in zip(names, t.val_schema)}
    chosen = (set(), set())
    for name in read_dictionary:
        if name not in where:
            raise KeyError(f"read_dictionary: {name!r} is not a val column of the join's "
                           f"output (val columns: {sorted(where)})")
        side, field = where[name]
        t = field.type
        if not dictionary_readable(t):
            raise TypeError(f"read_dictionary: column {name!r} is {t}; dictionary arrays "
                            "are for string, binary and integer columns")
        chosen[side].add(field.name)
    return frozenset(chosen[0]), frozenset(chosen[1])


def output_schema(left, right, how: str, changes: bool,
            dictionary: tuple[frozenset, frozenset] = (frozenset(), frozenset())) -> pa.Schema:
    lnames, rnames = prefixed_names(left.key_names, left.val_names, right.val_names)
    fields = list(left.key_schema)
    if left.val_schema is not None:   # null in a right or full join's unmatched right rows
        fields += [f.with_name(n).with_nullable(f.nullable or how in ("right", "full"))
                   for f, n in zip(dictionary_schema(left.val_schema, dictionary[0]), lnames)]
    if how in WITH_RIGHT_VALS and right.val_schema is not None:
        fields += [f.with_name(n).with_nullable(True) for f, n in
                   zip(dictionary_schema(right.val_schema, dictionary[1]), rnames)]
    if changes:
        fields += [roles.time_field("time"), roles.weight_field("diff")]
    else:
        fields += [roles.weight_field("count")]
    return roles.with_engine(pa.schema(fields), left.ctx.engine_id)


# -- kernels ----------------------------------------------------------------------------------
def _one_row_per_key(b: Block) -> bool:
    """Row i is key i's only row. Equal counts alone do not say so: a looked-up block
    can hold no row for one key and two for another."""
    return len(b) == b.num_keys and bool((np.diff(b.key_bounds) == 1).all())


def product_chunks(lb: Block, rb: Block, li_key: np.ndarray, ri_key: np.ndarray,
                   batch_rows: int, want_keys: bool = True
                   ) -> Iterator[tuple[np.ndarray | None, np.ndarray | slice, np.ndarray]]:
    """For matched keys, the cross product of their rows in chunks: (left key, li, ri).
    ``li`` is a slice when the chunk's left rows are consecutive.

    ``want_keys=False``: the caller reads keys off the left rows; many-to-one chunks then
    carry None for the left key indices instead of a repeat of them."""
    if _one_row_per_key(lb) and _one_row_per_key(rb):   # key-level: keys index rows
        yield from _in_chunks(batch_rows, li_key, li_key, ri_key)
        return
    lstart, nl = lb.key_bounds[li_key], np.diff(lb.key_bounds)[li_key]
    rstart, nr = rb.key_bounds[ri_key], np.diff(rb.key_bounds)[ri_key]
    if (nr == 1).all():   # many-to-one (a foreign key): each left row meets one right row
        if (nl == 1).all():   # one-to-one: the matched keys' rows are the rows
            yield from _in_chunks(batch_rows, li_key, lstart, rstart)
            return
        kidx = np.repeat(li_key, nl) if want_keys else None
        # every left key matched: the left rows in order, as slices (no index array)
        every = len(li_key) == lb.num_keys
        li = None if every else ranges(lstart, nl)
        ri = np.repeat(rstart, nl)
        for lo in range(0, len(ri), batch_rows):
            hi = min(lo + batch_rows, len(ri))
            yield (kidx[lo:hi] if want_keys else None), \
                slice(lo, hi) if every else li[lo:hi], ri[lo:hi]
        return
    for g, pos in output_chunks(nl * nr, batch_rows):
        width = nr[g]
        yield li_key[g], lstart[g] + pos // width, rstart[g] + pos % width


def _in_chunks(batch_rows: int, *arrays: np.ndarray):
    """The arrays' consecutive slices of ``batch_rows`` rows, side by side."""
    for lo in range(0, len(arrays[0]), batch_rows):
        yield tuple(a[lo:lo + batch_rows] for a in arrays)


def _take(table: pa.Table | None, idx: np.ndarray | slice) -> list[pa.Array]:
    if table is None:
        return []
    if isinstance(idx, slice):
        return columns_of(table.slice(idx.start, idx.stop - idx.start))
    n = len(idx)
    if n and idx[-1] - idx[0] == n - 1 and (n == 1 or (np.diff(idx) == 1).all()):
        return columns_of(table.slice(int(idx[0]), n))   # a run of rows: no gather
    i = pa.array(idx, pa.int64())
    return [c.take(i) for c in columns_of(table)]


def _null_columns(schema: pa.Schema | None, n: int) -> list[pa.Array]:
    return [] if schema is None else [pa.nulls(n, f.type) for f in schema]


def _expand(arrays: list[pa.Array], counts: np.ndarray, batch_rows: int):
    """Repeat each row ``count`` times, in bounded batches (SQL bag semantics): the
    batches' columns and their ``count`` column (all ones). Counts must not be negative."""
    if len(counts) and counts.max() == 1 and counts.min() == 1:   # distinct rows: as they are
        for lo in range(0, len(counts), batch_rows):
            yield [a.slice(lo, batch_rows) for a in arrays], counts[lo:lo + batch_rows]
        return
    for g, _ in output_chunks(counts, batch_rows):
        idx = pa.array(g, pa.int64())
        yield [a.take(idx) for a in arrays], np.ones(len(g), np.int64)


# -- snapshot join ----------------------------------------------------------------------------
def _sides(left, right, how, dictionary) -> tuple[pa.Schema | None, pa.Schema | None]:
    """The left and right vals' schemas as blocks hold them (dictionary columns too): so
    are the nulls of unmatched rows typed. None for right vals the output lacks."""
    rvals_schema = dictionary_schema(right.val_schema, dictionary[1]) \
        if how in WITH_RIGHT_VALS else None
    return dictionary_schema(left.val_schema, dictionary[0]), rvals_schema


def _snapshot(left, right, at, how, expand, batch_rows, schema, dictionary):
    lvals_schema, rvals_schema = _sides(left, right, how, dictionary)

    def emit(arrays, counts):
        if expand:
            if len(counts) and counts.min() < 0:
                raise ValueError("expand=True needs non-negative counts, but the join produced "
                                 f"a row with count {int(counts.min())} (a retraction without "
                                 "its insertion); use expand=False to see signed counts")
            for cols, ones in _expand(arrays, counts, batch_rows):
                yield pa.RecordBatch.from_arrays(cols + [pa.array(ones, pa.int64())],
                                                 schema=schema)
        else:
            yield pa.RecordBatch.from_arrays(arrays + [pa.array(counts, pa.int64())],
                                             schema=schema)

    # a bag reader may split the left side's runs beside one right block: the right
    # side's unmatched rows need all of them at once
    bag = expand and how not in ("right", "full")
    for lb, rb in co_blocks([left, right], at=at, bag=bag, dictionary=dictionary):
        for arrays, counts in joined_rows(lb, rb, how, batch_rows, lvals_schema,
                                          rvals_schema):
            yield from emit(arrays, counts)


def joined_rows(lb: Block, rb: Block, how: str, batch_rows: int,
                lvals_schema: pa.Schema | None, rvals_schema: pa.Schema | None):
    """The join of two blocks over one key range: (output columns, counts) chunks."""
    li_key, ri_key = match_keys(lb.keys, rb.keys)
    if how in ("right", "full"):   # right keys the left lacks: null left vals
        unmatched = np.ones(rb.num_keys, dtype=bool)
        unmatched[ri_key] = False
        for keys, rows in _key_rows(rb, unmatched, batch_rows):
            yield (keys + _null_columns(lvals_schema, len(rows)) + _take(rb.vals, rows),
                   rb.counts[rows])
    if len(lb) == 0:
        return
    if how in WITH_RIGHT_VALS:
        row_keys = lb.rows   # the left rows' keys, when the reader had them: no gather
        unit = bool((rb.counts == 1).all())   # a right side of distinct rows (a dimension)
        for kidx, li, ri in product_chunks(lb, rb, li_key, ri_key, batch_rows,
                                           want_keys=row_keys is None):
            arrays = _take(lb.keys, kidx) if row_keys is None else _take(row_keys, li)
            arrays += (_take(lb.vals, li)
                       + (_take(rb.vals, ri) if rvals_schema is not None else []))
            yield arrays, (lb.counts[li] if unit else lb.counts[li] * rb.counts[ri])
    if how in ("inner", "right"):
        return
    matched = np.zeros(lb.num_keys, dtype=bool)
    matched[li_key] = True
    for keys, rows in _key_rows(lb, matched if how == "semi" else ~matched, batch_rows):
        arrays = keys + _take(lb.vals, rows)
        if how in ("left", "full"):   # left keys the right lacks: null right vals
            arrays += _null_columns(rvals_schema, len(rows))
        yield arrays, lb.counts[rows]


def _key_rows(b: Block, keep: np.ndarray, batch_rows: int):
    """(key columns, row indices) of the rows of the block's keys where ``keep``, in
    bounded chunks."""
    if not keep.any():
        return
    nrows = np.diff(b.key_bounds)
    for g, pos in output_chunks(np.where(keep, nrows, 0), batch_rows):
        rows = b.key_bounds[g] + pos
        yield _take(b.keys, g), rows


# -- incremental join -------------------------------------------------------------------------
def _delta_terms(dl: Block, dr: Block, left, right, since, batch_rows, dictionary):
    """(key index table, li-side, ri-side, times, diffs) chunks of the three delta terms."""
    old_r = (lookup_block(right, dl.keys, since - 1, dictionary[1])
             if since > 0 and dl.num_keys else None)
    old_l = (lookup_block(left, dr.keys, since - 1, dictionary[0])
             if since > 0 and dr.num_keys else None)
    terms = []
    if old_r is not None:      # dA x B_old, at dA's times
        terms.append((dl, old_r, lambda li, ri, a=dl: a.times[li]))
    if old_l is not None:      # A_old x dB, at dB's times
        terms.append((old_l, dr, lambda li, ri, b=dr: b.times[ri]))
    terms.append((dl, dr, lambda li, ri: np.maximum(dl.times[li], dr.times[ri])))
    for a, b, time_of in terms:
        li_key, ri_key = match_keys(a.keys, b.keys)
        for kidx, li, ri in product_chunks(a, b, li_key, ri_key, batch_rows):
            yield a, b, kidx, li, ri, time_of(li, ri), a.counts[li] * b.counts[ri]


def block_changes(dl: Block, dr: Block, left, right, since, batch_rows, schema, dictionary):
    """The join's changes over one key range (the two sides' change blocks ``dl``,
    ``dr``), as batches of ``schema``."""
    nk = len(left.key_names)
    # One term alone (only one side changed here) multiplies consolidated inputs: its
    # rows are distinct and nonzero already. Two terms may cancel: consolidate them.
    alone = (len(dl) == 0) != (len(dr) == 0)
    pieces = []
    for a, b, kidx, li, ri, times, diffs in _delta_terms(dl, dr, left, right, since,
                                                         batch_rows, dictionary):
        arrays = _take(a.keys, kidx) + _take(a.vals, li) + _take(b.vals, ri)
        pieces.append((arrays, times, diffs))
        if sum(len(p[1]) for p in pieces) >= batch_rows:
            yield from consolidated(pieces, nk, schema, alone)
            pieces = []
    if pieces:
        yield from consolidated(pieces, nk, schema, alone)


def _incremental(left, right, since, upto, batch_rows, schema, dictionary):
    for dl, dr in co_blocks([left, right], changes=(since, upto), dictionary=dictionary):
        yield from block_changes(dl, dr, left, right, since, batch_rows, schema, dictionary)


# -- public -----------------------------------------------------------------------------------
def join(left, right, at: int | None = None, how: str = "inner", since: int | None = None,
         upto: int | None = None, expand: bool = False,
         batch_rows: int = DEFAULT_BATCH_ROWS, read_dictionary=None) -> pa.RecordBatchReader:
    """Join two traces on their keys.

    Snapshot (``since=None``): the key, the left vals, the right vals and ``count`` (the
    product of the two sides' counts at ``at``). ``how``: inner, left (unmatched left rows
    with null right vals), right (and unmatched right rows with null left vals), full
    (both), semi, anti (left rows only). ``expand=True`` repeats each row
    ``count`` times (SQL bag semantics; then ``count`` is 1).

    Incremental (``since`` given): the output's changes with ``since <= time < upto``,
    as key, vals, ``time``, ``diff``. Applying them to the result at ``since - 1`` gives
    the result at ``upto - 1``. An inner join's changes are exact at every time; the
    other joins' come at the last time their key changed in the interval
    (:mod:`arrangedb.ops.per_key`).

    ``read_dictionary``: output val columns (string, binary or integer) to return as
    Arrow dictionary arrays (int32 codes), as ``pyarrow.parquet.read_table`` does: a
    column stored dictionary-coded is handed over as its codes and stored dictionary,
    never gathered per row, so taking rows and grouping on it (``group_by``) move 4
    bytes per row. The values are the same.
    """
    if how not in HOWS:
        raise ValueError(f"unknown how={how!r}; use one of {', '.join(HOWS)}")
    batch_rows = check_batch_rows(batch_rows)
    check_traces(left, right)
    check_window((left, right), at, since, upto)
    batch_rows = rows_within_bytes(batch_rows, (left, right))
    dictionary = _dictionary_columns(left, right, how, read_dictionary)
    if since is None:
        for t in (left, right):
            t.check_read_time(at)
        schema = output_schema(left, right, how, False, dictionary)
        return pa.RecordBatchReader.from_batches(
            schema, _snapshot(left, right, at, how, expand, batch_rows, schema, dictionary))
    if expand:
        raise ValueError("expand=True applies to snapshots; changes carry signed diffs")
    schema = output_schema(left, right, how, True, dictionary)
    if how != "inner":
        sides = _sides(left, right, how, dictionary)
        return pa.RecordBatchReader.from_batches(schema, per_key_changes(
            [left, right], since, upto, schema,
            lambda lb, rb: joined_rows(lb, rb, how, batch_rows, *sides), dictionary))
    return pa.RecordBatchReader.from_batches(
        schema, _incremental(left, right, since, upto, batch_rows, schema, dictionary))
