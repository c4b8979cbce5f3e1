"""Time frontiers: inserts advance a trace's ``upper``; an insert without times goes at
it; earlier times are refused with nothing stored; batches tile time (adjacent, never
overlapping) through merges; reads at a time are exact while later inserts go on."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

import arrangedb


def _rows(rng, n, t=None, d=None):
    cols = {"k": pa.array(rng.integers(0, 50, n), pa.int64()),
            "v": pa.array(rng.integers(0, 4, n), pa.int64())}
    if t is not None:
        cols["t"] = pa.array(np.full(n, t), pa.uint64())
    if d is not None:
        cols["d"] = pa.array(np.full(n, d), pa.int64())
    return pa.table(cols)


def _tiles(trace) -> list[tuple[int, int]]:
    """The batches' time intervals (the runs of one input share one)."""
    return sorted({(b.description.lower, b.description.upper) for b in trace.batches()})


def _assert_tiled(trace):
    tiles = _tiles(trace)
    if not tiles:
        return
    assert tiles[0][0] == 0 and tiles[-1][1] == trace.upper()
    for (_, hi), (lo, _) in zip(tiles, tiles[1:]):
        assert hi == lo, tiles


def test_an_insert_without_times_goes_at_the_upper_frontier(tmp_path):
    rng = np.random.default_rng(0)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        base = _rows(rng, 100)
        t = e.arrange(base, key=["k"], vals=["v"])
        assert t.upper() == 1
        delta = _rows(rng, 30)
        t.insert(delta)
        assert t.upper() == 2
        changes = t.changes(1, 2).read_all()
        assert set(changes.column("time").to_pylist()) == {1}
        assert changes.column("diff").to_numpy().sum() == 30
        assert t.snapshot(at=0).read_all().column("count").to_numpy().sum() == 100
        t.insert(_rows(rng, 5, t=7), time="t")
        assert t.upper() == 8
        t.insert(_rows(rng, 5))
        assert t.upper() == 9 and t.changes(8, 9).read_all().num_rows > 0
        _assert_tiled(t)


def test_an_insert_before_the_upper_frontier_is_refused_and_nothing_is_stored(tmp_path):
    rng = np.random.default_rng(1)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        t = e.arrange(_rows(rng, 200, t=5), key=["k"], vals=["v"], time="t")
        assert t.upper() == 6
        before = t.snapshot().read_all()
        batches = t.stats()["batches"]
        late = pa.concat_tables([_rows(rng, 50, t=9), _rows(rng, 50, t=3)])
        with pytest.raises(ValueError, match=r"time 3, before the trace's upper frontier 6"):
            t.insert(late, time="t")
        assert t.upper() == 6 and t.stats()["batches"] == batches
        assert t.snapshot().read_all().equals(before)
        app = t.appender()
        with pytest.raises(ValueError, match="upper frontier 6"):
            app.add(_rows(rng, 10, t=4), time="t")
        t.insert(_rows(rng, 10, t=6), time="t")   # at the frontier: accepted
        assert t.upper() == 7


def test_an_appenders_chunks_share_one_time_interval(tmp_path):
    rng = np.random.default_rng(2)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        t = e.arrange(_rows(rng, 10), key=["k"], vals=["v"])
        app = t.appender()
        app.add(_rows(rng, 20, t=3), time="t")
        app.add(_rows(rng, 20))             # no times: at the upper frontier, 1
        app.finish()
        assert t.upper() == 4
        _assert_tiled(t)
        assert sorted(set(t.changes(1, 4).read_all().column("time").to_pylist())) == [1, 3]


@settings(max_examples=15, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 300),
                                st.sampled_from(["insert", "exert", "merge", "compact"])),
                      min_size=1, max_size=12),
       seed=st.integers(0, 2 ** 16))
def test_batches_tile_time_through_inserts_and_merges(tmp_path_factory, steps, seed):
    rng = np.random.default_rng(seed)
    with arrangedb.Engine(spill_dir=tmp_path_factory.mktemp("tile"), memory_budget="64MiB",
                          idle_merge=False) as e:
        t = e.arrange(_rows(rng, 100), key=["k"], vals=["v"])
        h = t.handle()
        for gap, n, action in steps:
            if action == "insert":
                t.insert(_rows(rng, n, t=t.upper() + gap, d=int(rng.choice([-1, 1]))),
                         time="t", diff="d")
            elif action == "exert":
                t.exert(n * 10)
            elif action == "merge":
                t.merge_all()
            else:
                h.set_logical_compaction(max(h.logical, t.upper() - gap))
            _assert_tiled(t)


def test_reads_at_a_time_are_exact_while_later_inserts_go_on(tmp_path):
    rng = np.random.default_rng(3)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        t = e.arrange(_rows(rng, 500), key=["k"], vals=["v"])
        t.insert(_rows(rng, 100, d=-1), diff="d")
        through_1 = t.snapshot(at=1).read_all()
        for _ in range(5):
            t.insert(_rows(rng, 100))
        t.merge_all()
        assert t.snapshot(at=1).read_all().equals(through_1)
        assert t.upper() == 7


def test_the_upper_frontier_survives_a_checkpoint(tmp_path):
    rng = np.random.default_rng(4)
    with arrangedb.Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        t = e.arrange(_rows(rng, 100), key=["k"], vals=["v"])
        t.insert(_rows(rng, 10, t=12), time="t")
        t.checkpoint(tmp_path / "ck")
        t.close()
        loaded = e.load(tmp_path / "ck")
        assert loaded.upper() == 13
        with pytest.raises(ValueError, match="upper frontier 13"):
            loaded.insert(_rows(rng, 10, t=12), time="t")
        loaded.insert(_rows(rng, 10))
        assert loaded.upper() == 14


def test_changes_are_refused_from_the_compaction_frontier_on_down(tmp_path):
    """changes(since=F) needs the state at F - 1, which compaction to F folded onto F."""
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        t = e.arrange(pa.table({"k": [1, 2, 3], "t": pa.array([0, 1, 2], pa.uint64())}),
                      key=["k"], time="t")
        h = t.handle()
        h.set_logical_compaction(2)
        h.set_physical_compaction(2)
        t.merge_all()
        for since in (1, 2):
            with pytest.raises(ValueError, match="compaction frontier 2"):
                t.changes(since, 3)
        assert t.changes(3, 4).read_all().num_rows == 0
        whole = t.changes(0, 3).read_all()   # from the start: everything, at the frontier
        assert sorted(whole.column("k").to_pylist()) == [1, 2, 3]
        with pytest.raises(ValueError, match="since=-1"):
            t.changes(-1)


def test_the_largest_time_is_refused_and_the_trace_goes_on(tmp_path):
    """An update at 2**64 - 1 would move the upper frontier past what a time holds."""
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        t = e.arrange(pa.table({"k": [1], "v": [1]}), key=["k"])
        last = pa.array([2**64 - 1], pa.uint64())
        with pytest.raises(arrangedb.SchemaError, match="largest uint64"):
            t.insert(pa.table({"k": [2], "v": [2], "t": last}), time="t")
        t.insert(pa.table({"k": [2], "v": [2], "t": pa.array([2**64 - 2], pa.uint64())}),
                 time="t")
        assert t.upper() == 2**64 - 1
        assert t.snapshot().read_all().num_rows == 2
