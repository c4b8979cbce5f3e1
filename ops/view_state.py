"""A reduce view's accumulators, kept beside its rows, so that a mean and a count of
distinct values follow from the changes alone.

A view's row holds a key's mean, not the count and sum it divides, nor which values
its distinct count counted. :class:`ReduceState` keeps them: per key, its row count and,
per averaged column, the count and sum of its non-null values (one private trace, a row
per key, replaced when the key changes); per column counted distinct, the multiplicity
of each (key, value) pair (one private key-only trace per column). A change reads and
rewrites only its own keys' rows and pairs; a pair whose multiplicity crosses zero adds
or removes one distinct value -- the way differential dataflow counts distinct values
over an arrangement of the distinct pairs.

The state is a cache of the input at the view's upper frontier, not part of the view's
checkpoint: a resumed view builds it again from its loaded input, one pass
(:func:`buildable` says when the input still holds that time).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrangedb.ops.per_key import key_index
from arrangedb.ops.reduce import reduce, reduce_of_keys
from arrangedb.spine import Columns, Trace, together

ROWS = "rows"
_D = "__state_diff"


def needs_state(aggs: dict) -> bool:
    """Whether a reduce's aggregates read a state: a mean or a count of distinct values."""
    return any(fn in ("mean", "count_distinct") for fn, _ in aggs.values())


def distinct_countable(t: pa.DataType) -> bool:
    """Types whose distinct values the state tells apart exactly as the reduce does
    (floats are not: NaN and -0.0 compare otherwise as keys)."""
    return (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_boolean(t) or pa.types.is_date(t))


def buildable(trace, upper: int) -> bool:
    """Whether ``trace`` still reads exactly as it was through ``upper - 1``."""
    return upper == 0 or trace.since <= upper - 1


class Advance(NamedTuple):
    """What one time's changes did to the state, per key of the changes (in their
    order)."""

    rows: np.ndarray        # each key's new row count
    means: dict             # column -> (count, sum) of its non-null values
    distinct: dict          # column -> the change of its number of distinct values


class ReduceState:
    """The accumulators of ``reduce(trace, aggs)``'s view (module docstring)."""

    def __init__(self, trace, aggs: dict):
        self.source = trace   # the reduce's input: keys whose sums cannot follow, recounted
        self.means = sorted({c for fn, c in aggs.values() if fn == "mean"})
        self.distincts = sorted({c for fn, c in aggs.values() if fn == "count_distinct"})
        self.key_names = list(trace.key_names)
        vals = [pa.field(ROWS, pa.int64())]
        for c in self.means:
            vals += [pa.field(f"n:{c}", pa.int64()), pa.field(f"s:{c}", _sum_type(trace, c))]
        self.acc = Trace(trace.ctx, trace.key_schema, pa.schema(vals),
                         Columns(self.key_names, [f.name for f in vals], None, _D),
                         f"{trace.name or 'trace'}.state")
        self.pairs = {}
        for c in self.distincts:
            schema = pa.schema(list(trace.key_schema) + [trace.val_schema.field(c)])
            self.pairs[c] = Trace(trace.ctx, schema, None,
                                  Columns(self.key_names + [c], None, None, _D),
                                  f"{trace.name or 'trace'}.pairs.{c}")
        for t in self._traces():   # read at their latest only: no lone compaction
            t.exertion = together
        self._handles = [t.handle() for t in self._traces()]

    def _spec(self) -> dict:
        """The accumulators as ``reduce`` aggregates of the input."""
        spec = {ROWS: ("count", None)}
        for c in self.means:
            spec |= {f"n:{c}": ("count", c), f"s:{c}": ("sum", c)}
        return spec

    def _traces(self) -> list[Trace]:
        return [self.acc, *self.pairs.values()]

    @classmethod
    def built(cls, trace, aggs: dict, at: int | None) -> "ReduceState":
        """The state of ``trace`` as it is at time ``at`` (None: its latest)."""
        state = cls(trace, aggs)
        try:
            spec = state._spec()
            zeros = [f"s:{c}" for c in state.means]

            def accumulators():   # a sum over only nulls is null: here, zero
                for b in reduce(trace, spec, at=at):
                    t = pa.Table.from_batches([b])
                    for name in zeros:
                        col = t.column(name)
                        t = t.set_column(t.schema.get_field_index(name), name,
                                         col.fill_null(pa.scalar(0, col.type)))
                    yield t.append_column(_D, pa.array(np.ones(t.num_rows, np.int64)))
            state._load(state.acc, accumulators())
            for c, pairs in state.pairs.items():
                def present(c=c):
                    for b in trace.snapshot(at):
                        t = pa.Table.from_batches([b]).select(state.key_names + [c, "count"])
                        yield t.filter(pc.is_valid(t.column(c))).rename_columns(
                            state.key_names + [c, _D])
                state._load(pairs, present())
            state._compact()
        except BaseException:
            state.close()
            raise
        return state

    @staticmethod
    def _load(trace: Trace, tables) -> None:
        first = next(tables, None)
        if first is None:
            return
        schema = first.schema

        def gen():
            yield from first.to_batches()
            for t in tables:
                yield from t.cast(schema).to_batches()
        reader = pa.RecordBatchReader.from_batches(schema, gen())
        trace.add_runs(trace.runs.build(reader, False, _D))
        trace.notify_idle()   # the runs merge in idle time, not at the first refresh

    def advance(self, keys: pa.Table, per_key: pa.Table, changes: pa.Table, time: int
                ) -> Advance:
        """Apply one time's ``changes`` (at ``time``); ``keys``: their distinct keys,
        sorted, and ``per_key`` the changes summed per key (``__d_sum``; per averaged
        column c, ``c__nv_sum`` the diffs of its non-null values, ``c__w_sum`` their
        weighted sum, and for floats ``c__outbad_sum`` the NaN and inf values retracted:
        a sum cannot give those back, so their keys are counted again from the input)."""
        n = keys.num_rows
        old = self.acc.lookup(keys)
        qi = old.column("query_index").to_numpy()
        new = {}
        for name, change in [(ROWS, per_key.column("__d_sum"))] + [
                (f, per_key.column(f"{c}__{w}_sum")) for c in self.means
                for f, w in ((f"n:{c}", "nv"), (f"s:{c}", "w"))]:
            t = self.acc.val_schema.field(name).type
            dtype = np.float64 if pa.types.is_floating(t) else np.int64
            before = np.zeros(n, dtype)
            before[qi] = old.column(name).to_numpy()
            with np.errstate(invalid="ignore"):   # inf - inf: NaN, recounted below
                new[name] = before + change.fill_null(0).to_numpy().astype(dtype, copy=False)
        bad = np.zeros(n, dtype=bool)
        for c in self.means:
            if f"{c}__outbad_sum" in per_key.column_names:
                bad |= per_key.column(f"{c}__outbad_sum").to_numpy() > 0
        if bad.any():
            self._recounted(keys, bad, new, time)
        alive = new[ROWS] > 0
        rows = {k: keys.column(k).filter(pa.array(alive)) for k in self.key_names}
        for name, v in new.items():
            rows[name] = pa.array(v[alive], self.acc.val_schema.field(name).type)
        rows[_D] = pa.array(np.ones(int(alive.sum()), np.int64))
        gone = old.select(self.key_names + self.acc.val_names).append_column(
            _D, pc.negate(old.column("count")))
        self.acc.insert(pa.concat_tables([gone, pa.table(rows)]), time=False, diff=_D)
        distinct = {c: self._advance_pairs(c, keys, changes) for c in self.distincts}
        self._compact()
        means = {c: (new[f"n:{c}"], new[f"s:{c}"]) for c in self.means}
        return Advance(new[ROWS], means, distinct)

    def _recounted(self, keys: pa.Table, bad: np.ndarray, new: dict, time: int) -> None:
        """``new``'s accumulators of the ``bad`` keys, counted from their rows at
        ``time`` instead (a key with no row left: zeros)."""
        at = np.flatnonzero(bad)
        asked = keys.take(pa.array(at)).rename_columns(self.source.key_names)
        got = reduce_of_keys(self.source, asked, self._spec(), time)
        for name in new:
            new[name][at] = 0
        if got.num_rows:
            where = at[key_index(asked, got.select(self.source.key_names))]
            for name in new:
                col = got.column(name)
                new[name][where] = col.fill_null(pa.scalar(0, col.type)).to_numpy()

    def _advance_pairs(self, c: str, keys: pa.Table, changes: pa.Table) -> np.ndarray:
        """Insert the changes' (key, value) multiplicities of column ``c``; per key of
        ``keys``, how many values entered less how many left."""
        cols = self.key_names + [c]
        t = changes.select(cols + ["diff"]).filter(pc.is_valid(changes.column(c)))
        t = t.group_by(cols).aggregate([("diff", "sum")])
        t = t.filter(pc.not_equal(t.column("diff_sum"), 0))
        found = self.pairs[c].lookup(t.select(cols))
        before = np.zeros(t.num_rows, np.int64)
        before[found.column("query_index").to_numpy()] = found.column("count").to_numpy()
        after = before + t.column("diff_sum").to_numpy()
        crossed = ((before <= 0) & (after > 0)).astype(np.int64) - \
            ((before > 0) & (after <= 0))
        at = key_index(keys, t.select(self.key_names))
        self.pairs[c].insert(t, time=False, diff="diff_sum")
        return np.bincount(at, weights=crossed, minlength=keys.num_rows).astype(np.int64)

    def _compact(self) -> None:
        """Only the latest accumulators are read: history may merge away."""
        for h in self._handles:
            h.set_logical_compaction(h.trace.upper())

    def updates(self) -> int:
        return sum(t.stats()["updates"] for t in self._traces())

    def close(self) -> None:
        for h in self._handles:
            h.close()
        for t in self._traces():
            t.close()


def _sum_type(trace, c: str) -> pa.DataType:
    return pa.float64() if pa.types.is_floating(trace.val_schema.field(c).type) else pa.int64()

