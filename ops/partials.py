"""Partial aggregates: what a group's rows reduce to before they meet the group's other
rows -- weighted counts and sums (exact limbs for decimals), mins, maxes -- and how
partials combine and finish into the aggregates. Shared by ``group_by`` (partials per
incoming batch, combined or spilled through an arrangement), ``join_group_by`` (partials
per key below a join) and the Spark integration (partials per task, combined after a
shuffle).

Groups are found by Arrow's grouped kernels, or without hashing where the data allows:
:func:`bincount_groups` counts dictionary codes with ``np.bincount``, :func:`run_groups`
sums the runs of a sorted column with ``np.add.reduceat``, and
:func:`~arrangedb.ops.dense_groups.dense_groups` sums an integer column of a small
range by slot.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrangedb.ops.aggregate import (LIMB_SEP, as_comparable, decimal_limbs, decimal_mean,
                                     fold_limbs, limbs_to_decimal, numeric_values,
                                     output_field, sum_type)
from arrangedb.ops.code_totals import CodeTotals, per_array
from arrangedb.ops.dense_groups import dense_groups


_COMBINE = {"n": "sum", "s": "sum", "v": "sum", "min": "min", "max": "max"}
_FEW_GROUPS = 1 << 12   # rows of partials checked for distinct groups before grouping


def partial_names(aggs: dict) -> dict[str, list[tuple[str, str]]]:
    """For each output, the partial columns it needs: (partial column, kind)."""
    plan = {}
    for name, (fn, _col) in aggs.items():
        kinds = {"count": ["n"], "sum": ["s", "v"], "mean": ["s", "n"], "min": ["min"],
                 "max": ["max"]}[fn]
        plan[name] = [(f"__{name}__{k}", k) for k in kinds]
    return plan


def _adds_up(cols: dict) -> bool:
    """Whether every partial of ``cols`` (per row, from ``Partials._per_row``) is a
    number that adds up -- no min or max, whose values stay Arrow arrays."""
    return all(c is None or isinstance(c, np.ndarray) for c in cols.values())


class Partials:
    """Partial aggregates of chunks, combined, finished. A sum of a decimal column is a
    ``decimal(38, s)`` partial; within a chunk it is summed as integer limbs
    (``<partial>#0``, ``#1``... see :mod:`arrangedb.ops.aggregate`), by the same
    kernels as the other sums, and folded back into its decimal column at once."""

    def __init__(self, by: list[str], aggs: dict, plan: dict, schema: pa.Schema,
                 weight: str | None):
        self.by, self.aggs, self.plan, self.schema, self.weight = by, aggs, plan, schema, weight
        self.decimal_sums = {   # decimal sum partials -> their type
            pname: sum_type(schema.field(col).type)
            for name, (fn, col) in aggs.items() for pname, kind in plan[name]
            if kind == "s" and pa.types.is_decimal(schema.field(col).type)}

    def of_batch(self, chunk: pa.Table) -> pa.Table:
        chunk = unified(chunk, self.by)
        cols = self._per_row(chunk)
        if _adds_up(cols):
            fast = bincount_groups(chunk, self.by, cols)
            if fast is None:
                fast = run_groups(chunk, self.by, cols)
            if fast is None:
                fast = dense_groups(chunk, self.by, cols)
            if fast is not None:
                return self.fold(fast)
        return self.fold(self.combine(self._rows(chunk, cols)))

    def partial_rows(self, chunk: pa.Table) -> pa.Table:
        """The partial columns of ``chunk`` (rows of a first phase's partials), in the
        partials' order."""
        return chunk.select(self.partial_schema().names)

    def row_partials(self, chunk: pa.Table) -> pa.Table | None:
        """The partials of each row of ``chunk`` alone, ungrouped (its group columns and
        a partial row each), for totals that add rows up as they come; None when a
        partial does not add up (a min or max) or a sum is a decimal's."""
        if self.decimal_sums:
            return None
        cols = self._per_row(chunk)
        return self._rows(chunk, cols) if _adds_up(cols) else None

    def _rows(self, chunk: pa.Table, cols: dict) -> pa.Table:
        """The group columns of ``chunk`` beside each row's partials (``cols``)."""
        n = chunk.num_rows
        table = {b: chunk.column(b) for b in self.by}
        table.update((p, np.ones(n, np.int64) if c is None else c) for p, c in cols.items())
        return pa.table(table)

    def _per_row(self, chunk: pa.Table) -> dict:
        """Per partial, its value for each row of ``chunk`` (None: one per row)."""
        n = chunk.num_rows
        w = (_decoded(chunk.column(self.weight)).to_numpy(zero_copy_only=False)
             .astype(np.int64, copy=False) if self.weight else None)
        if w is not None and n and w.min() == 1 == w.max():
            w = None   # every row once (a join's distinct rows): no weights to multiply
        cols = {}   # partial name -> per-row values (None: one per row)
        for name, (fn, col) in self.aggs.items():
            arr = _decoded(chunk.column(col)) if col is not None else None
            valid = (None if arr is None or arr.null_count == 0   # None: every row counts
                     else arr.is_valid().to_numpy(zero_copy_only=False))
            for pname, kind in self.plan[name]:
                if kind == "n" and valid is None:
                    cols[pname] = w
                elif kind == "n":
                    cols[pname] = valid.astype(np.int64) if w is None else w * valid
                elif kind == "v":
                    cols[pname] = None if valid is None else valid.astype(np.int64)
                elif kind == "s" and pname in self.decimal_sums:
                    for i, limb in enumerate(decimal_limbs(arr, w)):
                        cols[f"{pname}{LIMB_SEP}{i}"] = limb
                elif kind == "s":
                    x = numeric_values(arr)
                    cols[pname] = x if w is None else x * w   # nulls were filled with 0
                elif w is None:  # min / max
                    cols[pname] = arr
                else:  # min / max over rows present with a positive weight
                    cols[pname] = pc.if_else(pa.array(w > 0), arr, pa.nulls(n, arr.type))
        return cols

    def fold(self, table: pa.Table) -> pa.Table:
        """Grouped partials with the limb columns of decimal sums folded into them."""
        return fold_limbs(table, self.decimal_sums) if self.decimal_sums else table

    def combine(self, table: pa.Table) -> pa.Table:
        specs = [(c, _COMBINE[c.rsplit("__", 1)[1].split(LIMB_SEP)[0]])
                 for c in table.column_names if c not in self.by]
        if _distinct_groups(table, self.by):   # combined already (a grouping fed back)
            return table
        if all(fn == "sum" for _, fn in specs):   # partials of consecutive sorted chunks
            cols = {c: table.column(c) for c, _ in specs}
            fast = run_groups(table, self.by, cols)
            if fast is None:
                fast = dense_groups(table, self.by, cols)
            if fast is not None:
                return fast
        grouped = table
        narrow = {}   # min/max of decimal32/64: grouped as their integers
        for c, fn in specs:
            col = table.column(c)
            if fn in ("min", "max") and as_comparable(col.type) != col.type:
                narrow[c] = col.type
                grouped = grouped.set_column(grouped.schema.get_field_index(c), c, _viewed(
                    col, as_comparable(col.type)))
        out = grouped.group_by(self.by, use_threads=False).aggregate(specs)
        out = pa.table({c: _decoded(out.column(c)) for c in out.column_names})
        out = out.rename_columns([c.rsplit("_", 1)[0] if c not in self.by else c
                                  for c in out.column_names]).select(table.column_names)
        for c, t in narrow.items():
            out = out.set_column(out.schema.get_field_index(c), c, _viewed(out.column(c), t))
        return out

    def added(self) -> frozenset:
        """The partials that combine by adding up (counts, sums, valid rows)."""
        return frozenset(pname for name in self.aggs for pname, kind in self.plan[name]
                         if _COMBINE[kind] == "sum")

    def partial_schema(self) -> pa.Schema:
        fields = [self.schema.field(b) for b in self.by]
        for name, (fn, col) in self.aggs.items():
            for pname, kind in self.plan[name]:
                if kind in ("n", "v"):
                    typ = pa.int64()
                elif kind == "s":
                    typ = (pa.float64() if pa.types.is_floating(self.schema.field(col).type)
                           else self.decimal_sums.get(pname, pa.int64()))
                else:
                    typ = self.schema.field(col).type
                fields.append(pa.field(pname, typ))
        return pa.schema(fields)

    def as_partials(self, table: pa.Table) -> pa.RecordBatch:
        """Emit combined partial rows as they are (the first phase of a two-phase plan)."""
        table = self.fold(table)
        return pa.RecordBatch.from_arrays([table.column(f.name).combine_chunks().cast(f.type)
                                           for f in self.partial_schema()],
                                          schema=self.partial_schema())

    def of_partials(self, chunk: pa.Table) -> pa.Table:
        """Partial rows coming from a first phase: combined, never recomputed."""
        return self.combine(self.partial_rows(chunk))

    def finish(self, part: pa.Table) -> pa.RecordBatch:
        arrays = [part.column(b).combine_chunks() for b in self.by]
        fields = [self.schema.field(b) for b in self.by]
        for name, (fn, col) in self.aggs.items():
            field = output_field(name, fn, col, self.schema)
            p = {k: part.column(c).combine_chunks() for c, k in self.plan[name]}
            if fn == "count":
                arr = p["n"].fill_null(0)
            elif fn == "sum" and pa.types.is_decimal(field.type):
                none = p["v"].fill_null(0).to_numpy(zero_copy_only=False) == 0
                arr = pc.if_else(pa.array(none), pa.scalar(None, field.type), p["s"])
            elif fn == "mean" and pa.types.is_decimal(p["s"].type):
                nn = p["n"].fill_null(0).to_numpy(zero_copy_only=False)
                arr = pa.array(decimal_mean(p["s"], nn, p["s"].type.scale), pa.float64(),
                               mask=nn == 0)
            elif fn == "sum":
                s = p["s"].to_numpy(zero_copy_only=False)
                arr = pa.array(s, field.type, mask=p["v"].fill_null(0).to_numpy(
                    zero_copy_only=False) == 0)
            elif fn == "mean":
                s = p["s"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.float64)
                nn = p["n"].fill_null(0).to_numpy(zero_copy_only=False)
                with np.errstate(divide="ignore", invalid="ignore"):
                    arr = pa.array(s / np.where(nn == 0, 1, nn), pa.float64(), mask=nn == 0)
            else:
                arr = p[fn]
            arrays.append(arr.cast(field.type))
            fields.append(field)
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def bincount_groups(chunk: pa.Table, by: list[str], cols: dict) -> pa.Table | None:
    """Partials of a chunk grouped on one dictionary column, by its codes
    (:class:`~arrangedb.ops.code_totals.CodeTotals`, ~6x faster than hashing them): for
    counts and sums. None when that does not apply."""
    if len(by) != 1 or not pa.types.is_dictionary(chunk.schema.field(by[0]).type):
        return None
    column = chunk.column(by[0])
    if column.num_chunks == 0:
        return None
    first = column.chunk(0).dictionary
    if any(not c.dictionary.equals(first) for c in column.chunks[1:]):
        # chunks of several batches (or parts) code the values differently: remapped to
        # one dictionary, or the codes of one would be read as another's values
        chunk = unified(chunk, by)
        if not pa.types.is_dictionary(chunk.schema.field(by[0]).type):
            return None
        column = chunk.column(by[0])
    totals = CodeTotals(column.chunk(0).dictionary)   # one dictionary for all chunks now
    lo = 0
    for part in column.chunks:   # chunk by chunk: the codes are never concatenated
        codes = (part.indices.fill_null(0) if part.null_count else part.indices).to_numpy(
            zero_copy_only=False)
        null = part.is_null().to_numpy(zero_copy_only=False) if part.null_count else None
        hi = lo + len(codes)
        if not totals.add(codes, null, per_array(cols, lambda x: x[lo:hi])):
            return None
        lo = hi
    return totals.table(by[0])


def _distinct_groups(table: pa.Table, by: list[str]) -> bool:
    """Whether ``table``, a few rows of plain columns, holds each group once: combining
    it changes nothing, and Arrow's grouping costs ~0.15 ms even for five rows (twice
    in a small query's final phase). Dictionary and decimal columns come out of a
    grouping as other types: never taken as combined."""
    if len(by) != 1 or table.num_rows > _FEW_GROUPS or any(
            pa.types.is_dictionary(f.type) or pa.types.is_decimal(f.type)
            for f in table.schema):
        return False
    return len(pc.unique(table.column(by[0]))) == table.num_rows


def run_groups(chunk: pa.Table, by: list[str], cols: dict) -> pa.Table | None:
    """Partials of a chunk whose one integer group column is sorted (a stream in key
    order, such as a trace's changes grouped by its key): runs of equal keys summed by
    ``np.add.reduceat``, exact for integers, no hashing. None when that does not apply.

    ``cols``: per partial, its per-row values (numpy, or an Arrow column converted only
    once the keys are known to be sorted) or None for one per row."""
    if len(by) != 1:
        return None
    column = chunk.column(by[0])
    if not pa.types.is_integer(column.type) or column.null_count or len(column) == 0:
        return None
    keys = column.to_numpy()
    if (keys[1:] < keys[:-1]).any():
        return None
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    out = {by[0]: pa.array(keys[starts], column.type)}
    for p, c in cols.items():
        if c is None:
            out[p] = pa.array(np.diff(np.append(starts, len(keys))))
        elif not isinstance(c, np.ndarray) and pa.types.is_decimal(c.type):
            # decimal partials, exactly: their unscaled integers summed as limbs
            out[p] = limbs_to_decimal([np.add.reduceat(limb, starts)
                                       for limb in decimal_limbs(c)], c.type)
        else:
            values = c if isinstance(c, np.ndarray) else c.to_numpy()
            out[p] = pa.array(np.add.reduceat(values, starts))
    return pa.table(out)


def _viewed(col, t: pa.DataType):
    """A column's chunks viewed as another type of the same layout."""
    if isinstance(col, pa.ChunkedArray):
        return pa.chunked_array([c.view(t) for c in col.chunks], t)
    return col.view(t)


def _decoded(col):
    """A dictionary column as its values (partials and results hold plain columns)."""
    return col.cast(col.type.value_type) if pa.types.is_dictionary(col.type) else col


def unified(chunk: pa.Table, by: list[str]) -> pa.Table:
    """Dictionary group columns made to share one dictionary across the chunk's batches
    (Arrow groups on their codes then, but only on one dictionary). A dictionary that
    holds a null value (Arrow cannot unify those) is decoded instead."""
    for b in by:
        col = chunk.column(b)
        if pa.types.is_dictionary(col.type) and any(c.dictionary.null_count for c in col.chunks):
            chunk = chunk.set_column(chunk.schema.get_field_index(b), b, _decoded(col))
    if any(pa.types.is_dictionary(chunk.schema.field(b).type) and chunk.column(b).num_chunks > 1
           for b in by):
        return chunk.unify_dictionaries()
    return chunk


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """Dictionary columns typed as their values: what partials and results hold."""
    return pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f
                      for f in schema])
