"""The incremental form of an operator whose output at a key reads only its inputs' rows
at that key: left, right, full, semi and anti joins, ``distinct``, ``threshold`` and
``top_k`` with ``since`` (and ``upto``).

Such an output changes only at keys where an input changed. For each window of the
inputs' changes in ``[since, upto)`` (read through the cursor, aligned across inputs),
the touched keys are looked up in every input at ``since - 1`` and at ``upto - 1``
(batched, sorted lookups), the operator runs over both, and the first result is
retracted and the second inserted; rows equal in both cancel. A change carries the last
time its key changed in the interval, as ``reduce``'s changes do: applied to the output
at ``since - 1`` they give the output at ``upto - 1``. Cost follows the touched keys'
rows, not the inputs' size. (The inner join has an exact form per time, dA x B + A' x
dB: :mod:`arrangedb.ops.join`.)
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from arrangedb.ops.common import check_time, columns_of
from arrangedb.spine import Block, Updates, co_blocks, codes, consolidate, is_identity


def check_window(traces, at, since, upto) -> None:
    """A clear error for a bad ``at``/``since``/``upto``; checks the traces still hold
    ``since - 1``."""
    for name, value in (("at", at), ("since", since), ("upto", upto)):
        check_time(name, value)
    if since is None:
        if upto is not None:
            raise ValueError("upto= needs since= (the incremental form)")
        return
    if at is not None:
        raise ValueError("give either at= (a snapshot) or since=/upto= (changes), not both")
    if upto is not None and upto <= since:
        raise ValueError(f"upto={upto} must be greater than since={since}")
    if since > 0:   # the changes are told from the state at since - 1
        for t in traces:
            if since <= t.since:
                raise ValueError(f"since={since} needs the state at {since - 1}, before "
                                 f"the logical compaction frontier {t.since}: those "
                                 "times have been compacted away")
            t.check_read_time(since - 1)


def lookup_block(trace, keys: pa.Table, at: int | None,
                 dictionary: frozenset = frozenset()) -> Block:
    """The accumulated rows of ``keys`` (distinct, sorted) at ``at``, as a Block."""
    res = trace.lookup(keys.rename_columns(trace.key_names), at=at, read_dictionary=dictionary)
    qi = res.column("query_index").to_numpy()
    n = keys.num_rows
    if is_identity(qi, n):   # one row per key (a dimension's)
        bounds = np.arange(n + 1, dtype=np.int64)
    else:
        bounds = np.zeros(n + 1, np.int64)   # rows per key (qi is sorted), summed
        np.cumsum(np.bincount(qi, minlength=n), out=bounds[1:])
    vals = res.select(trace.val_names) if trace.val_schema is not None else None
    return Block(keys, bounds, vals, res.column("count").to_numpy())


def per_key_changes(traces: list, since: int, upto: int | None, schema: pa.Schema,
                    rows_of, dictionary: list | None = None):
    """Batches of ``schema`` (the operator's columns, ``time``, ``diff``: module
    docstring). ``rows_of(*blocks)``: the operator over blocks of the same keys, one per
    input, yielding (output columns, counts)."""
    nk = len(traces[0].key_names)
    dictionary = [frozenset(d) for d in dictionary] if dictionary else \
        [frozenset()] * len(traces)
    for changed in co_blocks(traces, changes=(since, upto), dictionary=dictionary):
        keys, last = _touched(changed, traces)
        if not keys.num_rows:
            continue
        pieces = []
        for at, sign in ((None if upto is None else upto - 1, 1), (since - 1, -1)):
            if at is not None and at < 0:
                continue
            looked = [present_keys(lookup_block(t, keys, at, d))
                      for t, d in zip(traces, dictionary)]
            for arrays, counts in rows_of(*looked):
                if len(counts):
                    key_of = key_index(keys, pa.Table.from_arrays(
                        arrays[:nk], names=keys.column_names))
                    pieces.append((arrays, last[key_of], sign * counts))
        if pieces:
            yield from consolidated(pieces, nk, schema)


def present_keys(b: Block) -> Block:
    """The block without the keys it holds no row of (a lookup keeps every query's key:
    a join would take them as matched)."""
    sizes = np.diff(b.key_bounds)
    if (sizes > 0).all():
        return b
    keep = np.flatnonzero(sizes > 0)
    bounds = np.concatenate([[0], np.cumsum(sizes[keep])]).astype(np.int64)
    return Block(b.keys.take(pa.array(keep, pa.int64())), bounds, b.vals, b.counts)


def _touched(changed: tuple[Block, ...], traces: list) -> tuple[pa.Table, np.ndarray]:
    """The keys the inputs' change blocks hold (distinct, sorted, named as the first
    input's keys), and per key the last time it changed."""
    names = traces[0].key_names
    tables = [pa.Table.from_arrays(columns_of(b.keys) + [
        pa.array(np.maximum.reduceat(b.times, b.key_bounds[:-1]), pa.uint64())],
        names=names + ["__time"]) for b in changed if len(b)]
    if not tables:
        return pa.table({n: [] for n in names}), np.zeros(0, np.uint64)
    per_key = pa.concat_tables(tables).group_by(names).aggregate([("__time", "max")])
    per_key = per_key.sort_by([(n, "ascending") for n in names])
    return per_key.select(names), per_key.column("__time_max").to_numpy()


def key_index(keys: pa.Table, rows: pa.Table) -> np.ndarray:
    """Each row's key's position in ``keys`` (distinct; ``rows`` holds its columns under
    the same names, every row's key among them)."""
    kc, rc = codes([keys, rows], keys.column_names)
    order = np.argsort(kc, kind="stable")
    return order[np.searchsorted(kc, rc, sorter=order)]


def consolidated(pieces, nk: int, schema: pa.Schema, distinct: bool = False):
    """Batches of ``schema`` (keys, vals, time, diff) from pieces of (columns, times,
    diffs), rows equal in all but diff summed (``distinct``: known distinct already)."""
    names = schema.names
    keys = pa.concat_tables([pa.Table.from_arrays(p[0][:nk], names=names[:nk]) for p in pieces])
    val_names = names[nk:-2]
    vals = (pa.concat_tables([pa.Table.from_arrays(p[0][nk:], names=val_names)
                              for p in pieces]) if val_names else None)
    upd = Updates(keys, vals, np.concatenate([p[1] for p in pieces]),
                  np.concatenate([p[2] for p in pieces]))
    if not distinct:
        upd = consolidate(upd)
    if len(upd):
        arrays = columns_of(upd.keys) + columns_of(upd.vals) + [
            pa.array(upd.times, pa.uint64()), pa.array(upd.diffs, pa.int64())]
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)
