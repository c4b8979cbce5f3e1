"""Exertion: ``exert`` compacts everything behind the logical frontier, lone batches too;
the idle merger follows each trace's policy, a plain function the user can replace."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa

import arrangedb
from arrangedb.spine.build.exertion import LevelState, default_exertion, never, together
from arrangedb.spine.build.levels import level_of


def _history(engine, rng, inserts=30, n=500):
    """``inserts`` batches of ``n`` updates at times 0, 10, 20, ... with retractions."""
    trace = None
    for i in range(inserts):
        t = pa.table({"k": rng.integers(0, 300, n), "v": rng.integers(0, 3, n),
                      "t": pa.array(np.full(n, i * 10, np.uint64)),
                      "d": rng.choice([-1, 1, 2], n)})
        if trace is None:
            trace = engine.arrange(t, key=["k"], vals=["v"], time="t", diff="d")
        else:
            trace.insert(t, time="t", diff="d")
    return trace


def _snap(trace) -> Counter:
    t = trace.snapshot().read_all()
    return Counter(dict(zip(zip(t.column("k").to_pylist(), t.column("v").to_pylist()),
                            t.column("count").to_pylist())))


def _rows_at_one_time(trace) -> int:
    """Updates the trace would store with every time advanced to one: a (key, val)
    each with a nonzero count -- the rows of its snapshot."""
    return trace.snapshot().read_all().num_rows


def test_exert_compacts_every_batch_behind_the_frontier(tmp_path):
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB", idle_merge=False) as e:
        trace = _history(e, np.random.default_rng(3))
        before = _snap(trace)
        h = trace.handle()
        h.set_logical_compaction(300)   # every time is now behind the frontier
        trace.exert(10 ** 9)
        assert trace.stats()["updates"] == _rows_at_one_time(trace)
        assert trace.stats()["batches"] == 1
        assert _snap(trace) == before


def test_a_lone_batch_behind_the_frontier_is_compacted_by_exert(tmp_path):
    rng = np.random.default_rng(4)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB", idle_merge=False) as e:
        trace = _history(e, rng, inserts=6)
        trace.merge_all()
        assert trace.stats()["batches"] == 1
        stored = trace.stats()["updates"]
        before = _snap(trace)
        trace.handle().set_logical_compaction(100)
        trace.exert(10 ** 9)
        assert trace.stats()["updates"] < stored   # times advanced: (k, v) rows collapse
        assert trace.stats()["updates"] == _rows_at_one_time(trace)
        assert _snap(trace) == before


def test_the_idle_merger_follows_the_traces_policy(tmp_path):
    rng = np.random.default_rng(5)
    seen: list[list[LevelState]] = []

    def recording(levels):
        seen.append(levels)
        return default_exertion(levels)

    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        lazy = _history(e, rng, inserts=8)
        lazy.exertion = never
        busy = _history(e, rng, inserts=8)
        busy.exertion = recording
        busy.handle().set_logical_compaction(100)
        busy.notify_idle()
        lazy.notify_idle()
        assert e.wait_merged(60)
        assert busy.stats()["batches"] == 1 and busy.stats()["since"] == 100
        assert lazy.stats()["batches"] > 1 and not lazy.wants_merge()
        assert seen and all(isinstance(s, LevelState) for levels in seen for s in levels)
        assert any(len(levels) > 1 for levels in seen)


def test_the_default_policy_merges_batches_in_proportion():
    """Work while a merge is in progress, while a batch holds at least 1/16 of the
    largest's updates, or while a lone batch is behind the logical frontier; a batch far
    smaller than the largest (a delta) is left alone, and ``together`` never compacts a
    lone batch."""
    one = LevelState(level=10, batches=1, updates=1000, merging=False, behind=False)
    assert default_exertion([]) is None
    assert default_exertion([one]) is None
    assert default_exertion([one, LevelState(6, 1, 63, False, False)])
    assert default_exertion([one, LevelState(6, 1, 62, False, False)]) is None   # 1/16.1
    assert default_exertion([LevelState(6, 1, 63, False, True), one])
    assert default_exertion([one, LevelState(5, 1, 30, False, False)]) is None
    assert default_exertion([one, LevelState(5, 1, 30, False, True)]) is None
    assert default_exertion([one, LevelState(5, 2, 60, True, False)])
    assert default_exertion([LevelState(10, 1, 1000, False, True)])
    assert default_exertion([LevelState(10, 2, 1000, True, False)])
    assert together([LevelState(10, 1, 1000, False, True)]) is None
    assert together([one, LevelState(7, 1, 100, False, False)])
    assert together([one, LevelState(3, 1, 8, False, False)]) is None


def test_an_idle_trace_leaves_a_small_delta_beside_its_large_batch(tmp_path):
    """The idle merger settles an arrange's runs, merges an insert of a fair share of
    the trace into it, and leaves a delta far smaller than the trace unmerged: rewriting
    the whole trace for it would make every insert meanwhile wait."""
    rng = np.random.default_rng(6)

    def table(n):
        return pa.table({"k": rng.integers(0, 1 << 20, n), "v": rng.integers(0, 9, n)})
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        trace = e.arrange(table(400_000), key=["k"], vals=["v"])
        assert e.wait_merged(60) and trace.stats()["batches"] == 1
        trace.insert(table(40_000))   # a tenth
        assert e.wait_merged(60) and trace.stats()["batches"] == 1
        slices = e.stats()["idle_merge_slices"]
        trace.insert(table(4_000))    # 1/110
        assert e.wait_merged(60) and trace.stats()["batches"] == 2
        assert e.stats()["idle_merge_slices"] == slices and not trace.wants_merge()
        before = _snap(trace)
        assert sum(before.values()) == 444_000
        trace.merge_all()             # asked for: one batch
        assert trace.stats()["batches"] == 1 and _snap(trace) == before


def test_a_merge_whose_retractions_cancel_stays_on_the_level_of_its_size(tmp_path):
    """A view's state merged with each change and compacted keeps its size: the merged
    batch goes back to the level that size calls for, not one up per merge (as
    differential dataflow's spine draws a large layer down). Climbing a level a change,
    it left the changes after it so far below that the level-judged idle merges no
    longer took them in, and every lookup read them all."""
    rng = np.random.default_rng(7)
    n = 50_000
    vals = rng.integers(0, 1000, n)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB", idle_merge=False) as e:
        trace = e.arrange(pa.table({"k": np.arange(n), "v": vals}), key=["k"], vals=["v"])
        handle = trace.handle()
        for step in range(1, 7):
            moved = rng.choice(n, n // 10, replace=False)
            new = vals[moved] + 1000 * step
            t = pa.array(np.full(2 * len(moved), step, np.uint64))
            trace.insert(pa.table({"k": np.concatenate([moved, moved]),
                                   "v": np.concatenate([vals[moved], new]), "t": t,
                                   "d": np.repeat([-1, 1], len(moved))}),
                         time="t", diff="d")
            vals[moved] = new
            handle.set_logical_compaction(step)
            trace.exert(10 ** 9)
            levels = [i for i, lvl in enumerate(trace.spine.levels) if lvl is not None]
            assert trace.stats()["updates"] == n and levels == [level_of(n)], (step, levels)
        got = trace.snapshot().read_all().sort_by("k")
        assert got.column("v").to_numpy().tolist() == vals.tolist()
