"""A view of ``group_by(join(A, B), by, aggs)`` with a count and sums, kept from the
join's changes.

The incremental join gives the joined rows' changes at each time (dA x B + A' x dB);
grouped and weighed by their diffs they are each group's change of count and sums, which
is added to the group's stored row. A group whose count reaches zero is retracted. A sum
over a group holding only nulls is null, which changes cannot tell from a sum of zero,
and a NaN or inf retracted cannot be taken back out of a sum: a view whose summed
columns hold a null, or whose changes retract a NaN or inf, is recomputed whole instead
(the caller's part, when :func:`apply_linear` returns False).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrangedb.ops.aggregate import decimal_limbs, limbs_to_decimal
from arrangedb.ops.common import names
from arrangedb.ops.group_by import group_by
from arrangedb.ops.join import join
from arrangedb.ops.join_group_by import output_sides
from arrangedb.ops.join_group_by_changes import changes_pushdown_side, join_group_by_changes
from arrangedb.ops.planner import coded_group_columns, params
from arrangedb.ops.view_delta import DIFF, as_retractions, change_times, delta_schema
from arrangedb.spine import Trace, holds_nulls, may_change


def apply_linear(view, lower: int, upper: int) -> bool:
    """Insert the view's changes at each time in ``[lower, upper)``; False (nothing
    inserted) when a summed column's changes hold a null, or retract a NaN or inf (a
    stored sum cannot give it back: NaN - NaN is NaN)."""
    g = params(view.plan._node)
    j = params(g["stream"]._node)
    times = change_times(view.inputs, lower, upper)
    try:
        grouped = _grouped(g, j, lower, upper, len(times) > 1)
    except _NotFromChanges:
        return False
    at = grouped.column("time").to_numpy() if len(times) > 1 else None
    for t in times:
        delta = grouped if at is None else grouped.filter(pa.array(at == t)).drop_columns(
            ["time"])
        delta = delta.cast(pa.schema([view.key_schema.field(f.name)
                                      if f.name in view.key_names else f
                                      for f in delta.schema]))
        view.insert_delta(added(view, delta, g["aggs"]), t)
    return True


def _grouped(g: dict, j: dict, lower: int, upper: int, timed: bool) -> pa.Table:
    """The join's changes in ``[lower, upper)`` grouped (``timed``: by time too: each
    time's change per group, all in one pass). At one time (a refresh after each insert),
    when only the summed side changed, its changes are summed per key below the join
    (the planner's eager aggregation of changes) and grouped by the groups alone, which
    an integer group column adds up by slot; else the joined rows are made and grouped.
    Raises _NotFromChanges when a summed value of the changes is null or a NaN or inf
    retracted."""
    left, right, by, aggs = j["left"], j["right"], names(g["by"]), g["aggs"]
    columns = summed(aggs)
    side = None if timed else changes_pushdown_side(left, right, by, aggs, "inner")
    if side is not None and not may_change((right, left)[side], lower, upper):
        # the joined rows' summed values are those of the summed side's changes,
        # checked block by block as the grouping reads them
        where = output_sides(left, right)
        stored = [where[c][1] for c in columns if where[c][0] != "key"]
        return join_group_by_changes(left, right, by, aggs, lower, upper,
                                     engine=g["engine"],
                                     check=lambda block: _check_block(block, stored)
                                     ).read_all()
    # string group columns as codes, as the planner reads them for the plan itself
    changes = join(left, right, since=lower, upto=upper,
                   read_dictionary=coded_group_columns(g, j) or None)

    def checked():   # the joined changes streamed into the grouping, never held whole
        for b in changes:
            _check_changes(b, columns)
            yield b
    return group_by(pa.RecordBatchReader.from_batches(changes.schema, checked()),
                    by + (["time"] if timed else []), aggs, weight="diff",
                    engine=g["engine"]).read_all()


class _NotFromChanges(Exception):
    """A summed column's change holds a null or retracts a NaN or inf."""


def _check_changes(changes: pa.RecordBatch, columns: list[str]) -> None:
    """Raise _NotFromChanges when a change of ``columns`` is null or retracts a NaN or
    inf."""
    diffs = changes.column("diff").to_numpy()
    if any(_refused(changes.column(c), diffs) for c in columns):
        raise _NotFromChanges


def _check_block(block, columns: list[str]) -> None:
    """:func:`_check_changes` of a block of changes (its vals and diffs)."""
    if any(_refused(block.vals.column(c), block.counts) for c in columns):
        raise _NotFromChanges


def added(view, delta: pa.Table, aggs: dict) -> pa.Table | None:
    """The view's rows of ``delta``'s groups retracted, and their sums with ``delta``
    inserted (a group whose count reaches zero: retracted only)."""
    if delta.num_rows == 0:
        return None
    keys = delta.select(view.key_names)
    old = Trace.lookup(view, keys)
    qi = old.column("query_index").to_numpy()
    new_cols = []
    for name in view.val_names:   # a group the view lacks starts from zero
        d = delta.column(name).combine_chunks()
        before = _scatter(old.column(name).combine_chunks(), qi, delta.num_rows, d.type)
        new_cols.append(_plus(before, d.fill_null(pa.scalar(0, d.type))))
    count = next(n for n, (fn, col) in aggs.items() if fn == "count" and col is None)
    alive = pc.greater(new_cols[view.val_names.index(count)], 0).to_numpy(
        zero_copy_only=False)
    new = pa.table(dict(zip(view.key_names, keys.columns)) |
                   dict(zip(view.val_names, new_cols)))
    if not alive.all():   # (usually every touched group keeps rows)
        new = new.filter(pa.array(alive))
    new = new.append_column(DIFF, pa.array(np.ones(new.num_rows, np.int64)))
    gone = as_retractions(old, view.key_names + view.val_names)
    return pa.concat_tables([gone, new.cast(delta_schema(view))])


def _plus(a: pa.Array, b: pa.Array) -> pa.Array:
    """``a + b`` in their type. Decimals are added as the limbs of their unscaled
    integers (Arrow's decimal addition widens the precision by a digit, past the 38 of
    a decimal128 sum); OverflowError when a total has more digits than the type holds."""
    if not pa.types.is_decimal(a.type):
        return pc.add(a, b)
    # two limbs when an array's values fit int64, more otherwise; a value is the sum of
    # its limb i times 2**(32 i), so the shorter list is padded with zeros
    la, lb = decimal_limbs(a), decimal_limbs(b)
    zero = np.zeros(len(a), np.int64)
    la += [zero] * (len(lb) - len(la))
    lb += [zero] * (len(la) - len(lb))
    return limbs_to_decimal([x + y for x, y in zip(la, lb)], a.type)


def _refused(values, diffs: np.ndarray) -> bool:
    """Whether ``values`` (a column of changes) hold a null, or a NaN or inf that
    ``diffs`` retracts."""
    if values.null_count:
        return True
    if not pa.types.is_floating(values.type) or not len(values):
        return False
    finite = np.isfinite(values.to_numpy())   # (no nulls)
    if finite.all():   # the usual case: one pass
        return False
    return bool((~finite & (diffs < 0)).any())


def summed(aggs: dict) -> list[str]:
    """The columns the aggregates sum."""
    return [col for fn, col in aggs.values() if fn == "sum"]


def summed_nulls(node) -> bool:
    """Whether a column a linear view sums holds a null in its input (named in the
    join's output, ``left_``/``right_`` where names clash; keys hold none)."""
    g = params(node)
    j = params(g["stream"]._node)
    left, right = j["left"], j["right"]
    where = output_sides(left, right)
    return any(holds_nulls((left, right)[side], name)
               for side, name in (where[c] for c in summed(g["aggs"])) if side != "key")


def _scatter(values: pa.Array, positions: np.ndarray, n: int, t: pa.DataType) -> pa.Array:
    """``n`` zeros of type ``t`` with ``values`` placed at ``positions``."""
    if values.type == t and not values.null_count and (pa.types.is_integer(t)
                                                       or pa.types.is_floating(t)):
        placed = np.zeros(n, t.to_pandas_dtype())   # plain numbers: placed by numpy
        placed[positions] = values.to_numpy()
        return pa.array(placed, t)
    out = pa.array(np.zeros(n, np.int64)).cast(t)
    if not len(positions):
        return out
    idx = np.zeros(n, np.int64)
    idx[positions] = np.arange(len(positions))
    present = np.zeros(n, dtype=bool)
    present[positions] = True
    taken = values.cast(t).fill_null(pa.scalar(0, t)).take(pa.array(idx))
    return pc.if_else(pa.array(present), taken, out)
