"""A view's deltas: its rows with a ``__view_diff`` column, split by time, and trimmed
to the rows that change.

A touched key's output is retracted whole and inserted whole; most of it is the same
rows with the same counts, which the view's insert would sort only to cancel. Rows equal
in both (by a hash of their columns' codes, checked column by column) are dropped from
both first (:func:`changed_only`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrangedb.spine import absolute_codes, co_blocks, codes, is_absolute, roles

DIFF = "__view_diff"
CHUNK_SHARE = 16   # a piece of a refresh's changes holds up to budget / CHUNK_SHARE
VIEW_TIME = "__view_time"


def as_retractions(rows: pa.Table, cols: list[str]) -> pa.Table:
    """A view's stored rows (a lookup or snapshot: ``cols`` and ``count``) as a delta
    that retracts them."""
    return rows.select(cols).append_column(DIFF, pc.negate(rows.column("count")))


def delta_schema(view) -> pa.Schema:
    """The view's columns and ``__view_diff``: what ``View.insert_delta`` takes."""
    fields = list(view.key_schema) + (list(view.val_schema) if view.val_schema else [])
    return pa.schema(fields + [pa.field(DIFF, pa.int64())])


def change_times(traces: list, lower: int, upper: int) -> list[int]:
    """The times in ``[lower, upper)`` at which the traces hold changes, in order. One
    time is possible when ``upper = lower + 1`` (a refresh after each insert); else the
    changes are read once for their times alone."""
    if upper - lower == 1:
        return [lower]
    seen = [np.zeros(0, np.uint64)]
    for step in co_blocks(traces, changes=(lower, upper)):
        seen += [np.unique(b.times) for b in step if len(b)]
    return np.unique(np.concatenate(seen)).tolist()


def change_chunks(traces: list, time: int):
    """The traces' changes at ``time`` (a table each: key, vals, ``time``, ``diff``, as
    ``Trace.changes`` gives them) in pieces of whole keys, read as they are used: each
    piece covers one key range of every trace, its rows up to ``CHUNK_SHARE``-th of the
    budget (the caller steps through its keys). What bounds a refresh's memory however
    large the changes are."""
    schemas = [t.output_schema(roles.time_field("time"), roles.weight_field("diff"))
               for t in traces]
    budget = traces[0].ctx.budget
    max_bytes = budget.limit // CHUNK_SHARE if budget is not None else 64 << 20
    pending: list[list[pa.RecordBatch]] = [[] for _ in traces]
    held = 0

    def tables():
        return [pa.Table.from_batches(p, schema) for p, schema in zip(pending, schemas)]
    for step in co_blocks(traces, changes=(time, time + 1)):
        for got, b, schema in zip(pending, step, schemas):
            if len(b):
                got.append(b.record_batch(schema, b.times, b.counts))
                held += got[-1].nbytes
        if held >= max_bytes:
            yield tables()
            pending, held = [[] for _ in traces], 0
    if any(pending):
        yield tables()


def key_steps(changes: pa.Table, keys: list[str], keys_per_step: int):
    """``changes`` in slices of about ``keys_per_step`` keys (:func:`step_bounds`), in
    key order: (the slice, its rows' key index -- 0, 1, ... within it --, its distinct
    keys). What bounds a refresh's memory."""
    kc = codes([changes], keys)[0]
    if len(kc) > 1 and (kc[1:] < kc[:-1]).any():   # a trace's changes come sorted by key
        order = np.argsort(kc, kind="stable")
        changes, kc = changes.take(pa.array(order)), kc[order]
    first = np.ones(len(kc), dtype=bool)
    first[1:] = kc[1:] != kc[:-1]
    starts = np.append(np.flatnonzero(first), len(kc))
    for lo, hi in step_bounds(len(starts) - 1, keys_per_step):
        step = changes.slice(starts[lo], starts[hi] - starts[lo])
        new_key = first[starts[lo]:starts[hi]]
        yield step, np.cumsum(new_key) - 1, step.select(keys).filter(pa.array(new_key))


def step_bounds(n: int, per_step: int) -> list[tuple[int, int]]:
    """``[0, n)`` in equal steps of about ``per_step`` (at most 1.5x it). A lookup of a
    step visits every part its keys fall in, a few sparse keys nearly all of them: a
    small remainder is better folded into the steps than looked up on its own."""
    count = max(1, round(n / per_step))
    edges = np.linspace(0, n, count + 1).round().astype(np.int64).tolist()
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def queries_rows(looked_up: pa.Table | None, lo: int, n: int) -> pa.Table | None:
    """The rows of a lookup (ordered by ``query_index``) of queries ``lo`` to ``lo + n``."""
    if looked_up is None:
        return None
    a, b = np.searchsorted(looked_up.column("query_index").to_numpy(), [lo, lo + n])
    return looked_up.slice(a, b - a)


def changed_only(old: pa.Table, new: pa.Table, cols: list[str]
                  ) -> tuple[pa.Table, pa.Table]:
    """``old`` rows (retractions) and ``new`` rows (insertions) less the rows in both with
    the same count: most of a touched key's output is unchanged, and handing it over
    twice to cancel would make the view sort it twice."""
    if old.num_rows == 0 or new.num_rows == 0:
        return old, new
    per_column = _row_codes(old.select(cols), new.select(cols), cols)
    h_old, h_new = (_mixed([c[i] for c in per_column]) for i in (0, 1))
    order = np.argsort(h_old)
    ranked = h_old[order]
    pos = np.minimum(np.searchsorted(ranked, h_new), len(ranked) - 1)
    hit = ranked[pos] == h_new
    for a, b in per_column:   # a hash collision is a row that does not cancel, no more
        hit[hit] = a[order[pos[hit]]] == b[hit]
    at = order[pos[hit]]
    same = np.zeros(new.num_rows, dtype=bool)
    same[np.flatnonzero(hit)] = (old.column(DIFF).to_numpy()[at]
                                 == -new.column(DIFF).to_numpy()[hit])
    gone = order[pos[same]]
    ranked_gone = np.sort(gone)   # (not np.unique: numpy's hashing one is slow here)
    if (ranked_gone[1:] == ranked_gone[:-1]).any():   # repeated rows: consolidation's part
        return old, new
    keep_old = np.ones(old.num_rows, dtype=bool)
    keep_old[gone] = False
    return old.filter(pa.array(keep_old)), new.filter(pa.array(~same))


def _row_codes(old: pa.Table, new: pa.Table, cols: list[str]) -> list[tuple]:
    """Per column, (old codes, new codes) that are equal where the values are: each
    column's own value codes when it has them (no sort), else one joint rank."""
    if all(is_absolute([old.schema.field(c).type]) and not old.column(c).null_count
           and not new.column(c).null_count for c in cols):
        return [(absolute_codes(old, [c]), absolute_codes(new, [c])) for c in cols]
    return [tuple(codes([old, new], cols))]


def _mixed(columns: list[np.ndarray]) -> np.ndarray:
    """One uint64 per row mixing the columns' codes (equal rows, equal hashes)."""
    h = np.zeros(len(columns[0]), dtype=np.uint64)
    for c in columns:
        h *= np.uint64(0x9E3779B97F4A7C15)
        h ^= c.astype(np.int64, copy=False).view(np.uint64) if c.dtype.kind == "i" \
            else c.view(np.uint64) if c.dtype.itemsize == 8 else c.astype(np.uint64)
    return h


def at_time_table(table: pa.Table, time: int) -> pa.Table:
    return table.append_column(VIEW_TIME, pa.array(np.full(table.num_rows, time, np.uint64)))


def plain_field(f: pa.Field) -> pa.Field:
    """A column as arranged: dictionaries as their values, no role marks."""
    return pa.field(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type)


def at_time(reader: pa.RecordBatchReader, time: int) -> pa.RecordBatchReader:
    schema = reader.schema.append(pa.field(VIEW_TIME, pa.uint64()))

    def gen():
        for b in reader:
            yield pa.RecordBatch.from_arrays(
                b.columns + [pa.array(np.full(b.num_rows, time, np.uint64))], schema=schema)
    return pa.RecordBatchReader.from_batches(schema, gen())


def touched_keys(changes: list[pa.Table], inputs) -> pa.Table:
    """The distinct keys the ``inputs``' ``changes`` touch, sorted (named as the first
    input's)."""
    first = inputs[0]
    keys = pa.concat_tables([c.select(t.key_names).rename_columns(first.key_names)
                             for c, t in zip(changes, inputs)])
    return keys.group_by(first.key_names).aggregate([]).sort_by(
        [(k, "ascending") for k in first.key_names])
