"""join_group_by: a join followed by a grouping, with the aggregation pushed below the join.

Design
------
``SELECT by, aggs FROM left JOIN right USING (key) GROUP BY by`` -- what
``group_by(join(left, right, at=at), by, aggs)`` computes -- without materialising the
join, when every aggregate reads one side (A) and every group column is a key column or
a val of the other side (B). count, sum and mean are linear in the rows' counts, so A's
rows are summed per key first (eager aggregation, as in Yan and Larson's "group-by
before join") and each of B's rows then meets one partial row per key instead of every
A row of its key: a 40M-row fact side joined with a 4M-row dimension moves 4M partials
through the join, not 40M rows.

Both sides are read per part straight off their stored layout (``part_blocks``: keys
never expanded to rows) and merged in key order. Each A part's per-key partials (sums
by ``np.add.reduceat`` over the key bounds) are matched against the B blocks that cover
its keys and grouped on B's columns at once (``bincount`` over dictionary codes when the
group is one such column), so what reaches ``group_by`` is one small table of partial
aggregates per part, which it combines within the budget (its ``final`` phase) and
finishes exactly as it finishes a plain grouping.

Any other plan -- an aggregate over both sides, a group column of A, min, max,
count_distinct, a ``how`` other than inner -- runs as ``group_by(join(...))``: the same
result, with the join materialised.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrangedb.ops.aggregate import LIMB_SEP, carried, check_aggs, weigh_limbs
from arrangedb.ops.common import (DEFAULT_BATCH_ROWS, check_batch_rows, check_time,
                                  operator_buffer_bytes)
from arrangedb.ops.group_by import group_by
from arrangedb.ops.partials import (Partials, bincount_groups, partial_names, plain_schema,
                                    unified)
from arrangedb.ops.join import (HOWS, check_traces, dictionary_readable, join,
                                output_schema, prefixed_names)
from arrangedb.ops.code_totals import per_array
from arrangedb.ops.coded_groups import RunningTotals
from arrangedb.ops.key_partials import KeyPartials, NotFiniteRetracted
from arrangedb.ops.match import match_keys
from arrangedb.spine import (Block, batch_part_blocks, count_through, is_absolute,
                              is_constant, nonnegative_at, part_blocks, ranges, roles)

LINEAR = ("count", "sum", "mean")


def output_sides(left, right) -> dict[str, tuple[str, str]]:
    """Output column name -> (side, the trace's column); side in key, 0, 1. A key column
    is given by position: the side read may be the right trace, whose keys are named
    otherwise."""
    lnames, rnames = prefixed_names(left.key_names, left.val_names, right.val_names)
    where = {k: ("key", i) for i, k in enumerate(left.key_names)}
    where.update((out, (0, name)) for out, name in zip(lnames, left.val_names))
    where.update((out, (1, name)) for out, name in zip(rnames, right.val_names))
    return where


def _pushdown_side(left, right, by: list[str], aggs: dict, how: str) -> int | None:
    """The side whose rows can be summed per key before the join (0 left, 1 right), or
    None when the plan does not have that shape."""
    if how != "inner" or any(fn not in LINEAR for fn, _ in aggs.values()):
        return None
    where = output_sides(left, right)
    agg_sides = {where[col][0] for _, col in aggs.values() if col is not None}
    if "key" in agg_sides or len(agg_sides) > 1:
        return None
    by_sides = {where[b][0] for b in by} - {"key"}
    if len(by_sides) > 1:
        return None
    if agg_sides:
        side = agg_sides.pop()
    elif by_sides:
        side = 1 - next(iter(by_sides))
    else:   # only counts, grouped on keys: sum the larger side per key
        side = 0 if _updates(left) >= _updates(right) else 1
    return side if side not in by_sides else None


def pushdown_side(left, right, by: list[str], aggs: dict, how: str) -> int | None:
    """The side :func:`join_group_by` sums per key below the join for this shape (0
    left, 1 right), or None when it runs the join instead (the module's notes)."""
    if "count" in by or any(c == "count" for _, c in aggs.values()):
        return None   # the join's own count column is grouped or aggregated
    if not by:
        return None   # one global group: the join's rows grouped as they come
    return _pushdown_side(left, right, by, aggs, how)


def read_as_codes(t: pa.DataType) -> bool:
    """Whether a group column of B's of type ``t`` is read as dictionary codes: strings
    and binaries. Integers are read as they are: a wide-ranging one (a customer id) would
    be hashed into a dictionary per block, and a narrow one groups by slot
    (dense_groups) as fast as codes do."""
    return dictionary_readable(t) and not pa.types.is_integer(t)


def _updates(trace) -> int:
    return sum(len(b) for b in trace.batches())


GATHER_KEYS = 1 << 18   # A keys matched against a B block at once (~8 MiB of partials)


def _fused(a_trace, b_trace, at, by: list[str], where: dict, partials: Partials,
           key_partials: KeyPartials, b_side: int) -> Iterator[pa.RecordBatch]:
    """Walk B's blocks in key order; against each, the per-key partials of A's keys up
    to its last key, gathered across A's parts (a B block of a dimension spans many of a
    fact side's parts: one match and one grouping per block, not per A part).

    With ``key_partials.linear`` (no row of A counts below zero), A's batches are read
    side by side, each straight off its stored layout, and never merged: the partials
    are linear in the counts, so a key found in several batches adds up in the grouping,
    and reading the unmerged trace costs what reading a merged one does. Otherwise A is
    read merged: a row's multiplicity may be negative, and whether it is present --
    which decides whether a group exists and whether a sum is null -- needs its
    consolidated count."""
    by_b = [where[b][1] for b in by if where[b][0] == b_side]
    # strings read as codes: a block's codes group by bincount
    dictionary = frozenset(c for c in by_b
                           if read_as_codes(b_trace.val_schema.field(c).type))
    if key_partials.linear:
        a_gens = batch_part_blocks(a_trace, at, sums=key_partials.sums,
                                   columns=key_partials.columns)
    else:
        a_gens = [part_blocks(a_trace, at, sums=key_partials.sums,
                              columns=key_partials.columns)]
    a_streams = [((ab.keys, key_partials(ab)) for ab in gen if ab.num_keys)
                 for gen in a_gens]
    b_blocks = part_blocks(b_trace, at, dictionary, columns=frozenset(by_b))

    # one group column, B's and read as codes, over keys with comparable codes: counted
    # piece by piece, into totals that run across the read (coded_groups.RunningTotals)
    coded = (len(by) == 1 and where[by[0]][0] == b_side and where[by[0]][1] in dictionary
             and is_absolute([f.type for f in a_trace.key_schema]))

    running = (RunningTotals(where[by[0]][1], by[0], operator_buffer_bytes(a_trace))
               if coded else None)

    def emit(got: list[list], bb: Block) -> Iterator[pa.RecordBatch]:
        """The groups of A's pieces ``got`` (a list per A batch) against B's block:
        counted by code into the running totals when they can be, else matched batch
        by batch."""
        tables = running.add([p for ps in got for p in ps], bb) if coded else None
        if tables is not None:
            for t in tables:
                if t.num_rows:
                    yield partials.as_partials(t)
            return
        pairs = []
        for pieces in got:   # one batch's keys: sorted and distinct, as a match needs
            if not pieces:   # this batch has no keys through the block
                continue
            keys = (pieces[0][0] if len(pieces) == 1
                    else pa.concat_tables([k for k, _ in pieces]).combine_chunks())
            sums = (pieces[0][1] if len(pieces) == 1
                    else _concatenated([s for _, s in pieces]))
            li, ri = match_keys(keys, bb.keys)
            if len(li):
                pairs.append(key_pairs(keys, bb, li, ri, by, where, b_side, sums))
        if pairs:   # every batch's pairs grouped at once: one grouping per block
            groups = {b: pa.chunked_array([c for g, _ in pairs for c in _chunks(g[b])])
                      for b in by}
            cols = pairs[0][1] if len(pairs) == 1 else _concatenated([c for _, c in pairs])
            yield partials.as_partials(grouped_pairs(groups, cols, by, partials))

    # per A batch: the rest of a part reaching past a B block, and whether it is done
    carry, done = [None] * len(a_streams), [False] * len(a_streams)
    try:
        for bb in b_blocks:
            if bb.num_keys == 0:
                continue
            b_last = bb.keys.slice(bb.num_keys - 1, 1)
            # each batch's pieces through the block's last key, all grouped at once:
            # a trace of many runs costs one grouping per block, as a merged one does
            got, gathered = [], 0
            for i, a_parts in enumerate(a_streams):
                got.append([])
                while not done[i]:
                    if carry[i] is None:
                        carry[i] = next(a_parts, None)
                        if carry[i] is None:
                            done[i] = True
                            break
                    keys, sums = carry[i]
                    n = count_through(keys, b_last)
                    if n:
                        got[-1].append(carry[i] if n == keys.num_rows
                                       else _cut(carry[i], 0, n))
                        gathered += n
                    carry[i] = None if n == keys.num_rows else _cut(carry[i], n,
                                                                    keys.num_rows)
                    if gathered >= GATHER_KEYS:
                        yield from emit(got, bb)
                        got, gathered = [[]], 0
                    if carry[i] is not None:
                        break   # this batch's next keys lie beyond the block
            if gathered:
                yield from emit(got, bb)
            if all(done):
                break   # an inner join: B's remaining keys meet nothing
        for t in running.tables() if coded else []:
            if t.num_rows:
                yield partials.as_partials(t)
    finally:
        b_blocks.close()
        for gen in a_gens:
            gen.close()


def _chunks(column) -> list[pa.Array]:
    return column.chunks if isinstance(column, pa.ChunkedArray) else [column]


def _cut(item: tuple, lo: int, hi: int) -> tuple:
    keys, sums = item
    return keys.slice(lo, hi - lo), per_array(sums, lambda x: x[lo:hi])


def _concatenated(items: list[dict]) -> dict:
    """The partials of several A parts end to end; partials that share one array in
    every part share the concatenation (in only some parts -- rows counted once in one
    part, twice in the next -- they do not)."""
    joined, out = {}, {}
    for p in dict.fromkeys(p for s in items for p in s):
        # a decimal sum may have more limbs in one part than another: the others' are 0
        arrays = [s[p] if p in s else np.zeros(len(next(iter(s.values()))), np.int64)
                  for s in items]
        same = tuple(map(id, arrays))
        if same not in joined:
            joined[same] = np.concatenate(arrays)
        out[p] = joined[same]
    return out


def key_pairs(akeys: pa.Table, bb: Block, li: np.ndarray, ri: np.ndarray, by: list[str],
              where: dict, b_side: int, sums: dict) -> tuple[dict, dict]:
    """Group columns and partials of each (A key, B row) pair of matched keys."""
    if len(bb) == bb.num_keys:   # a dimension: one row per key, key i's row is row i
        rows, akey = ri, li
    else:
        first = bb.key_bounds[ri].astype(np.int64)
        b_rows = bb.key_bounds[ri + 1].astype(np.int64) - first
        if len(b_rows) and b_rows.max() == 1:   # each matched key one row
            rows, akey = first, li
        else:
            rows, akey = ranges(first, b_rows), np.repeat(li, b_rows)
    if akey is li and len(li) and li[-1] - li[0] == len(li) - 1:
        akey = slice(int(li[0]), int(li[-1]) + 1)   # distinct and consecutive: no gather
    # B's counts weigh every partial but v, which counts rows present
    weight = int(bb.counts[0]) if is_constant(bb.counts) else bb.counts[rows]
    unit = isinstance(weight, int) and weight == 1
    if unit:
        cols = per_array(sums, lambda x: x[akey])
    else:
        cols = {p: x[akey] if p.endswith("__v") else x[akey] * weight
                for p, x in sums.items() if LIMB_SEP not in p}
        cols.update(_weighed_limbs(sums, akey, weight))
    if isinstance(akey, slice):
        akey = np.arange(akey.start, akey.stop, dtype=np.int64)
    groups = {}
    for b in by:
        side, name = where[b]
        groups[b] = (_take(akeys.column(name), akey) if side == "key"
                     else _take(bb.vals.column(name), rows))
    return groups, cols


def _weighed_limbs(sums: dict, akey, weight) -> dict:
    """The limb columns of decimal sums at ``akey``, times ``weight``, exactly: carried
    first (one limb more on top), so that each limb times a weight fits 64 bits."""
    limbs: dict[str, dict] = {}
    for p, x in sums.items():
        base, sep, i = p.rpartition(LIMB_SEP)
        if sep:
            limbs.setdefault(base, {})[int(i)] = x[akey]
    out = {}
    for base, xs in limbs.items():
        weighed = weigh_limbs(carried([xs[i] for i in sorted(xs)], spare=1), weight)
        out.update((f"{base}{LIMB_SEP}{i}", x) for i, x in enumerate(weighed))
    return out


def _take(column, rows: np.ndarray):
    """Rows of a column; a run of consecutive rows as a slice. (First and last alone do
    not say so: rows [0, 2, 2] span three but are not 0, 1, 2.)"""
    n = len(rows)
    if n and rows[-1] - rows[0] == n - 1 and (n < 2 or bool((np.diff(rows) == 1).all())):
        return column.slice(int(rows[0]), n)
    return column.take(pa.array(rows, pa.int64()))


def grouped_pairs(groups: dict, cols: dict, by: list[str], partials: Partials) -> pa.Table:
    """Pairs grouped on ``by``: one partial row per group. (Per B block: a block's
    dictionary columns share one dictionary, so its codes are bincounted as they are.)"""
    chunk = pa.table(groups)
    fast = bincount_groups(chunk, by, cols)
    if fast is not None:
        return fast
    for p, c in cols.items():
        chunk = chunk.append_column(p, pa.array(c))
    if _sparse_ints(chunk, by):
        # ids spread wider than a block's pairs (the customers of a block of orders):
        # grouping the block would barely shrink it; the grouping downstream adds the
        # pairs up by slot, or combines many blocks' at once
        return chunk
    return partials.combine(unified(chunk, by))


def _sparse_ints(chunk: pa.Table, by: list[str]) -> bool:
    """Whether ``chunk`` is grouped on one integer column whose values span at least as
    many slots as it has rows."""
    if len(by) != 1 or not pa.types.is_integer(chunk.schema.field(by[0]).type):
        return False
    column = chunk.column(by[0])
    if column.null_count or not len(column):
        return False
    lo, hi = pc.min_max(column).values()
    return hi.as_py() - lo.as_py() + 1 >= len(column)


def join_group_by(left, right, by, aggs: dict, at: int | None = None, how: str = "inner",
                  engine=None, batch_rows: int = DEFAULT_BATCH_ROWS) -> pa.RecordBatchReader:
    """Join two traces on their keys and group the joined rows: the result of
    ``group_by(join(left, right, at=at, how=how), by, aggs)``, rows weighed by the
    join's counts (SQL bag semantics).

    ``by`` and the aggregated columns are named as in :func:`join`'s output (val names
    prefixed ``left_``/``right_`` where they clash). ``aggs`` as in :func:`group_by`.
    When every aggregate is a count, sum or mean of one side's vals (or a count) and
    every group column is a key column or the other side's val, the aggregation runs
    below the join, per key, and the joined rows are never materialised; otherwise the
    join is (see the module's notes). The groups are combined within the budget of
    ``engine``, by default the traces' own.
    """
    if how not in HOWS:
        raise ValueError(f"unknown how={how!r}; use one of {', '.join(HOWS)}")
    batch_rows = check_batch_rows(batch_rows)
    check_time("at", at)
    check_traces(left, right)
    for t in (left, right):
        t.check_read_time(at)
    by = [by] if isinstance(by, str) else list(by)
    join_schema = output_schema(left, right, how, False)
    schema = plain_schema(join_schema)
    for b in by:
        if b not in schema.names:
            raise KeyError(f"join_group_by: no column {b!r} in the join's output "
                           f"(columns: {schema.names})")
    aggs = check_aggs(aggs, schema, "the join's output")
    side = pushdown_side(left, right, by, aggs, how)
    if side is None:
        return group_by(join(left, right, at=at, how=how, batch_rows=batch_rows), by, aggs,
                        weight="count", engine=engine, batch_rows=batch_rows)
    a_trace, b_trace = (left, right) if side == 0 else (right, left)
    # read linearly, a group whose rows were all retracted sums to zero rows: counted,
    # and dropped -- which holds only while no joined row counts below zero (B's either)
    if not (nonnegative_at(a_trace, at) and nonnegative_at(b_trace, at)):
        return _eager(left, right, by, aggs, at, side, False, schema, engine, batch_rows)
    linear = _eager(left, right, by, aggs, at, side, True, schema, engine, batch_rows)

    # a NaN or inf among rows counted below zero does not cancel across batches: then
    # the trace is read merged (the grouping reads all its input before a group is out)
    def batches():
        it = iter(linear)
        try:
            first = next(it, None)
        except NotFiniteRetracted:
            yield from _eager(left, right, by, aggs, at, side, False, schema, engine,
                              batch_rows)
            return
        if first is not None:
            yield first
            yield from it
    return pa.RecordBatchReader.from_batches(linear.schema, batches())


def _eager(left, right, by, aggs, at, side, linear, schema, engine, batch_rows):
    """The aggregation below the join, side ``side`` summed per key; ``linear``: its
    batches read side by side (:func:`_fused`)."""
    where = output_sides(left, right)
    a_trace, b_trace = (left, right) if side == 0 else (right, left)
    rows = next((n for n, (fn, c) in aggs.items() if fn == "count" and c is None), None)
    counted = aggs if rows is not None or not linear else {**aggs, ROWS: ("count", None)}
    partials = Partials(by, counted, partial_names(counted), schema, "count")
    column_of = {out: name for out, (s, name) in where.items() if s == side}
    key_partials = KeyPartials(counted, partials.plan, column_of, partials.decimal_sums, linear)
    stream = pa.RecordBatchReader.from_batches(
        roles.with_engine(partials.partial_schema(), left.ctx.engine_id),
        _fused(a_trace, b_trace, at, by, where, partials, key_partials, 1 - side))
    grouped = group_by(stream, by, counted, engine=engine, batch_rows=batch_rows,
                       phase="final", source_schema=schema)
    return _present(grouped, rows or ROWS, [*by, *aggs]) if linear else grouped


ROWS = "__rows"   # the count of rows per group, when no aggregate counts them


def _present(grouped: pa.RecordBatchReader, rows: str, names: list[str]
             ) -> pa.RecordBatchReader:
    """The groups with rows, in the columns ``names``: A's batches are summed as they
    are, so a group whose rows were all retracted comes out of them with zero rows."""
    schema = pa.schema([grouped.schema.field(n) for n in names],
                       metadata=grouped.schema.metadata)

    def batches():
        for batch in grouped:
            kept = batch.filter(pc.not_equal(batch.column(rows), 0))
            if kept.num_rows:
                yield pa.RecordBatch.from_arrays([kept.column(n) for n in names],
                                                 schema=schema)
    return pa.RecordBatchReader.from_batches(schema, batches())
