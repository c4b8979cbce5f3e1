"""join_group_by_changes: the changes of a grouped join, with the aggregation pushed below
the join.

Design
------
``group_by(join(A, B, since=, upto=), by, aggs)`` groups the join's changes: the rows of
``dA x B_old + A_old x dB + dA x dB`` (:mod:`arrangedb.ops.join`), each weighed by its
diff. For counts and sums of A's columns grouped on B's columns (or keys) -- the shape
:func:`~arrangedb.ops.join_group_by.join_group_by` aggregates eagerly -- a key range where
only A changed has only the first term, and each of B's rows of a changed key meets
every changed A row of that key. So A's changes are summed per key first (diff-weighted
counts and sums; valid rows counted once each, as the grouping counts the joined rows),
and each B row of the key meets one partial row: a 1% delta of line items (600k
changes over 300k orders) moves 300k partials through the join instead of 600k rows,
and no joined row is made.

A key range where B changed too runs the join's changes as written (the three terms,
consolidated) and groups them; both kinds of range feed one final grouping. The output
is ``group_by``'s over the written plan's changes: the same groups (a group appears when
a change row of the join falls in it, even if its changes net to zero), counts and
sums.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from arrangedb.ops.aggregate import check_aggs
from arrangedb.ops.common import DEFAULT_BATCH_ROWS, check_batch_rows
from arrangedb.ops.group_by import group_by
from arrangedb.ops.join import (block_changes, check_traces, join,
                                output_schema)
from arrangedb.ops.coded_groups import coded_groups
from arrangedb.ops.join_group_by import (grouped_pairs, key_pairs, output_sides,
                                         pushdown_side, read_as_codes)
from arrangedb.ops.key_partials import KeyPartials
from arrangedb.ops.match import match_keys
from arrangedb.ops.partials import Partials, partial_names, plain_schema
from arrangedb.ops.per_key import check_window, lookup_block, present_keys
from arrangedb.spine import co_blocks, is_absolute, roles

CHANGES_AGGS = ("count", "sum")   # linear in the diffs (mean of changes is not defined)


def changes_pushdown_side(left, right, by: list[str], aggs: dict, how: str) -> int | None:
    """The side summed per key below the join for this shape of grouped changes, or
    None when the changes are joined and grouped as written."""
    where = output_sides(left, right)
    if any(fn not in CHANGES_AGGS for fn, _ in aggs.values()) \
            or any(c not in where for c in [*by, *(c for _, c in aggs.values() if c)]):
        return None   # time and diff are the changes' own columns
    return pushdown_side(left, right, by, aggs, how)


LOOKUP_WINDOWS = 4   # windows of A's changed keys looked up in B at once


def join_group_by_changes(left, right, by, aggs: dict, since: int, upto: int | None = None,
                          engine=None, batch_rows: int = DEFAULT_BATCH_ROWS, check=None
                          ) -> pa.RecordBatchReader:
    """``group_by(join(left, right, since=since, upto=upto), by, aggs)`` -- the grouped
    changes of an inner join in ``[since, upto)`` -- with A's changes summed per key
    below the join where only A changed (module notes). Shapes other than counts and
    sums of one side's columns grouped on the other's run as written. ``check``: called
    with each block of A's changes before it is used (a caller's test of the changes it
    can take, raising to refuse them); with the aggregation pushed below the join
    only."""
    batch_rows = check_batch_rows(batch_rows)
    check_traces(left, right)
    check_window((left, right), None, since, upto)
    by = [by] if isinstance(by, str) else list(by)
    schema = plain_schema(output_schema(left, right, "inner", True))
    aggs = check_aggs(aggs, schema, "the join's changes")
    side = changes_pushdown_side(left, right, by, aggs, "inner")
    if side is None:
        return group_by(join(left, right, since=since, upto=upto, batch_rows=batch_rows),
                        by, aggs, engine=engine, batch_rows=batch_rows)
    where = output_sides(left, right)
    b_side = 1 - side
    by_b = [where[b][1] for b in by if where[b][0] == b_side]
    b_trace = (left, right)[b_side]
    b_dict = frozenset(c for c in by_b if read_as_codes(b_trace.val_schema.field(c).type))
    dictionary = [frozenset(), frozenset()]
    dictionary[b_side] = b_dict
    coded_schema = output_schema(left, right, "inner", True, tuple(dictionary))
    partials = Partials(by, aggs, partial_names(aggs), schema, "count")
    rows = Partials(by, aggs, partials.plan, schema, "diff")   # for joined change rows
    column_of = {out: name for out, (s, name) in where.items() if s == side}
    key_partials = KeyPartials(aggs, partials.plan, column_of, partials.decimal_sums)
    coded = (len(by) == 1 and where[by[0]][0] == b_side and where[by[0]][1] in b_dict
             and is_absolute([f.type for f in left.key_schema]))

    def grouped(pieces: list) -> Iterator[pa.RecordBatch]:
        """A's pieces (keys and per-key partials of steps where only A changed) met with
        B's rows of their keys, grouped: one lookup for them all."""
        if not pieces:
            return
        akeys = pa.concat_tables([k for k, _ in pieces]) if len(pieces) > 1 else pieces[0][0]
        sums = _concat_partials([p for _, p in pieces])
        bb = present_keys(lookup_block(b_trace, akeys.rename_columns(b_trace.key_names),
                                       since - 1, b_dict))
        if not bb.num_keys:
            return
        got = [(akeys, sums)]
        out = coded_groups(got, bb, where[by[0]][1], by[0]) if coded else None
        if out is None:
            li, ri = match_keys(akeys, bb.keys.rename_columns(akeys.column_names))
            groups, cols = key_pairs(akeys, bb, li, ri, by, where, b_side, sums)
            out = grouped_pairs(groups, cols, by, partials)
        if out.num_rows:
            yield partials.as_partials(out)

    # A's changes are read a window at a time; their keys are looked up in B a few
    # windows at once, as a lookup pays per part of B it visits (three lookups of 100k
    # order keys in 15 parts: 10 ms, one of 300k: 7.5 ms)
    most_keys = LOOKUP_WINDOWS * left.ctx.window_rows

    def batches() -> Iterator[pa.RecordBatch]:
        pending, held = [], 0
        for blocks in co_blocks([left, right], changes=(since, upto), dictionary=dictionary):
            da, db = blocks[side], blocks[b_side]
            if check is not None and len(da):
                check(da)
            if len(db):   # B changed here: the join's changes as written, grouped
                yield from grouped(pending)
                pending, held = [], 0
                for rb in block_changes(*blocks, left, right, since, batch_rows,
                                        coded_schema, dictionary):
                    yield partials.as_partials(rows.of_batch(pa.Table.from_batches([rb])))
                continue
            if not len(da) or since == 0:   # nothing changed, or no B before the changes
                continue
            pending.append((da.keys, key_partials(da)))
            held += da.num_keys
            if held >= most_keys:
                yield from grouped(pending)
                pending, held = [], 0
        yield from grouped(pending)

    stream = pa.RecordBatchReader.from_batches(
        roles.with_engine(partials.partial_schema(), left.ctx.engine_id), batches())
    return group_by(stream, by, aggs, engine=engine, batch_rows=batch_rows, phase="final",
                    source_schema=schema)


def _concat_partials(parts: list[dict]) -> dict:
    """The per-key partials of consecutive pieces, one array per name; names whose
    arrays are one array in every piece (a count that is the rows per key) stay one."""
    if len(parts) == 1:
        return parts[0]
    out = {}
    names = list(parts[0])
    for name in names:
        twin = next((o for o in names[:names.index(name)]
                     if all(p[o] is p[name] for p in parts)), None)
        if twin is not None:
            out[name] = out[twin]
            continue
        out[name] = np.concatenate([p[name] for p in parts])
    return out
