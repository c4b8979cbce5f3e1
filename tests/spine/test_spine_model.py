"""The spine against an independent model: a dict from (key, val) to a list of (time, diff).

A hypothesis state machine arranges, inserts, moves handle frontiers, exerts, and after
every step compares snapshot, lookup and changes with what the model says. The model
shares no code with the engine, so it stays an independent oracle.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from arrangedb.pager import MemoryBudget, SpillDirectory
from arrangedb.spine.storage.context import StorageContext
from arrangedb.spine.storage.resident import ResidentBatches
from arrangedb.spine.data.ingest import Columns, target_schemas
from arrangedb.spine.trace import Trace

INT_KEYS = st.sampled_from([0, 1, 2, 3, -1, 2**63 - 1, -(2**63), 17, 1000])
STR_KEYS = st.sampled_from(["", "a", "ab", "abc", "abd", "b", "é", "a\x00", "zz" * 20])
VALS = st.one_of(st.none(), st.sampled_from(["", "x", "xy", "y", "z"]))
KINDS = ["int", "str", "multi", "key_only"]


def schema_for(kind):
    if kind == "int":
        return pa.schema([("k", pa.int64()), ("v", pa.string())]), ["k"], ["v"]
    if kind == "str":
        return pa.schema([("k", pa.string()), ("v", pa.string())]), ["k"], ["v"]
    if kind == "multi":
        return (pa.schema([("k1", pa.string()), ("k2", pa.int64()), ("v", pa.string())]),
                ["k1", "k2"], ["v"])
    return pa.schema([("k", pa.int64())]), ["k"], []


def key_strategy(kind):
    if kind == "str":
        return STR_KEYS.map(lambda s: (s,))
    if kind == "multi":
        return st.tuples(STR_KEYS, INT_KEYS)
    return INT_KEYS.map(lambda i: (i,))


class Model:
    def __init__(self):
        self.updates = defaultdict(list)   # (key tuple, val) -> [(time, diff)]

    def add(self, key, val, time, diff):
        self.updates[(key, val)].append((time, diff))

    def at(self, t):
        out = {}
        for kv, ups in self.updates.items():
            c = sum(d for tt, d in ups if t is None or tt <= t)
            if c:
                out[kv] = c
        return out

    def changes(self, since, upto, frontier):
        out = defaultdict(int)
        for kv, ups in self.updates.items():
            for tt, d in ups:
                tt = max(tt, frontier)
                if since <= tt and (upto is None or tt < upto):
                    out[(kv, tt)] += d
        return {k: v for k, v in out.items() if v}


def rows_of(table, key_names, val_names, extra):
    cols = {c: table.column(c).to_pylist() for c in table.column_names}
    out = []
    for i in range(table.num_rows):
        key = tuple(cols[c][i] for c in key_names)
        val = cols[val_names[0]][i] if val_names else None
        out.append((key, val) + tuple(cols[e][i] for e in extra))
    return out


class SpineMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.trace = None
        self.model = Model()
        self.handles = []
        self.since = 0

    @initialize(kind=st.sampled_from(KINDS), part_bytes=st.sampled_from([256, 4096, 1 << 20]),
                window=st.sampled_from([1, 7, 1000]), run_bytes=st.sampled_from([None, 300]),
                storage=st.sampled_from(["memory", "paged"]))
    def arrange(self, kind, part_bytes, window, run_bytes, storage):
        self.kind = kind
        self.schema, self.key_names, self.val_names = schema_for(kind)
        # small runs: one insert becomes several runs, handed to the spine as a merge
        self.ctx = StorageContext(part_bytes=part_bytes, window_rows=window, run_bytes=run_bytes)
        if storage == "paged":
            # page files, and small inserts kept resident until paged out (page_out rule)
            self.budget = MemoryBudget("256MiB", sample_interval=0)
            self.spill = SpillDirectory()
            self.ctx.budget, self.ctx.spill = self.budget, self.spill
            self.ctx.resident = ResidentBatches(self.ctx, self.budget)
        full = self.schema.append(pa.field("t", pa.uint64())).append(pa.field("d", pa.int64()))
        self.full_schema = full
        cols = Columns.resolve(full, self.key_names, self.val_names, "t", "d")
        ks, vs = target_schemas(full, cols)
        self.trace = Trace(self.ctx, ks, vs, cols)
        self.trace.spine.insert_runs(self.trace.runs.build(full.empty_table(), "t", "d"))

    def _table(self, rows):
        data = {name: [] for name in self.full_schema.names}
        for key, val, t, d in rows:
            for name, part in zip(self.key_names, key):
                data[name].append(part)
            if self.val_names:
                data["v"].append(val)
            data["t"].append(t)
            data["d"].append(d)
        return pa.table(data, schema=self.full_schema)

    @rule(data=st.data())
    def insert(self, data):
        rows = data.draw(st.lists(st.tuples(key_strategy(self.kind), VALS,
                                             st.integers(0, 6), st.integers(-2, 2)),
                                  min_size=0, max_size=40))
        if not self.val_names:
            rows = [(k, None, t, d) for k, _, t, d in rows]
        upper = self.trace.upper()   # times drawn as offsets from the upper frontier
        rows = [(k, v, upper + t, d) for k, v, t, d in rows]
        table = self._table(rows)
        self.trace.insert(pa.RecordBatchReader.from_batches(
            table.schema, table.to_batches(max_chunksize=5)))
        for k, v, t, d in rows:
            self.model.add(k, v, t, d)

    @rule()
    def new_handle(self):
        self.handles.append(self.trace.handle())

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, 10), step=st.integers(0, 2))
    def advance_logical(self, i, step):
        h = self.handles[i % len(self.handles)]
        h.set_logical_compaction(h.logical + step)
        self.since = self.trace.since

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, 10), t=st.integers(0, 8))
    def set_physical(self, i, t):
        h = self.handles[i % len(self.handles)]
        h.set_physical_compaction(max(t, h.physical or 0))

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, 10))
    def drop_handle(self, i):
        self.handles.pop(i % len(self.handles)).close()

    @precondition(lambda self: self.ctx.resident is not None)
    @rule(wanted=st.sampled_from([1, 1 << 40]))
    def page_out(self, wanted):
        """Memory pressure: the budget's spiller writes resident batches to page files."""
        before = self.ctx.resident.bytes
        # a batch a merge in progress is reading is pinned: paging it out frees nothing
        free = sum(b.stored_bytes for b in self.trace.batches()
                   if b.pagefile is None and not any(p.pins for p in b.parts))
        freed = self.ctx.resident.spill(wanted)
        assert self.ctx.resident.bytes == before - freed
        assert freed >= min(wanted, free)

    @rule(fuel=st.sampled_from([1, 10, 1000, 1 << 40]))
    def exert(self, fuel):
        self.trace.exert(fuel)

    @invariant()
    def resident_bytes_are_reserved(self):
        store = self.trace.ctx.resident if self.trace is not None else None
        if store is not None:
            live = [b for b in self.trace.batches() if b.pagefile is None]
            assert store.bytes == sum(b.stored_bytes for b in live)
            assert self.budget.held >= store.bytes
            if not self.trace.stats()["merges_in_progress"]:   # they hold parts between calls
                assert self.budget.held == store.bytes

    def teardown(self):
        if self.trace is not None:
            self.trace.close()
            if self.ctx.resident is not None:
                self.ctx.close()
                self.spill.close()
                self.budget.close()

    @invariant()
    def frontier_is_meet_of_handles(self):
        if self.trace is None:
            return
        live = [h.logical for h in self.handles]
        if live:
            assert self.trace.since == max(self.since, min(live)) or self.trace.since == min(live)
        assert self.trace.since >= self.since or self.since == 0
        self.since = self.trace.since

    @rule(dt=st.integers(0, 40))
    def check_snapshot(self, dt):
        at = self.since + dt
        got = rows_of(self.trace.snapshot(at).read_all(), self.key_names, self.val_names,
                      ["count"])
        keys_in_order = [r[0] for r in got]
        assert keys_in_order == sorted(keys_in_order, key=_sort_key)
        assert {(k, v): c for k, v, c in got} == self.model.at(at)
        assert len(got) == len(self.model.at(at))

    @rule(data=st.data())
    def check_lookup(self, data):
        at = self.since + data.draw(st.integers(0, 40))
        queries = data.draw(st.lists(key_strategy(self.kind), max_size=8))
        if data.draw(st.booleans()):   # distinct and sorted, as a join asks: no sort then
            queries = sorted(set(queries), key=_sort_key)
        table = pa.table({n: [q[i] for q in queries] for i, n in enumerate(self.key_names)},
                         schema=pa.schema([self.schema.field(n) for n in self.key_names]))
        got = rows_of(self.trace.lookup(table, at), self.key_names, self.val_names,
                      ["query_index", "count"])
        snap = self.model.at(at)
        expected = Counter((qi, q, v, c) for qi, q in enumerate(queries)
                           for (k, v), c in snap.items() if k == q)
        assert Counter((qi, k, v, c) for k, v, qi, c in got) == expected
        assert [r[2] for r in got] == sorted(r[2] for r in got)  # by query_index

    @rule(since=st.integers(0, 40), width=st.integers(1, 8))
    def check_changes(self, since, width):
        frontier = self.trace.since
        upto = since + width
        if frontier and (since and since < frontier or upto <= frontier):
            return
        got = rows_of(self.trace.changes(since, upto).read_all(), self.key_names,
                      self.val_names, ["time", "diff"])
        assert {((k, v), t): d for k, v, t, d in got} == self.model.changes(since, upto, frontier)


def _sort_key(key):
    return tuple((x.encode() if isinstance(x, str) else x) for x in key)


SpineMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=25,
                                          deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
TestSpineModel = SpineMachine.TestCase


def test_snapshot_distinct_rows_compress_to_one_update():
    from arrangedb.spine.data.layout import to_layout
    from arrangedb.spine.data.kernels import consolidate
    from arrangedb.spine.data.updates import Updates

    n = 1000
    upd = Updates(pa.table({"k": np.arange(n)}), pa.table({"v": np.arange(n)}),
                  np.zeros(n, np.uint64), np.ones(n, np.int64))
    layout = to_layout(consolidate(upd))
    assert len(layout.times) == 1 and len(layout.diffs) == 1
    assert layout.num_updates == n
