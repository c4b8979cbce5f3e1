"""The idle merger: a trace left alone settles into one batch without anyone asking;
the thread keeps off while the engine is busy; an insert does not pay for the merge a
large arrange left; a failing slice is rolled back; closing the engine stops it."""

from __future__ import annotations

import threading
import time
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

import arrangedb
from arrangedb.spine.build import idle


def _table(rng, n, keys=200_000):
    return pa.table({"k": rng.integers(0, keys, n), "v": rng.integers(0, 5, n)})


def _model(*tables) -> Counter:
    c = Counter()
    for t in tables:
        c.update(zip(t.column("k").to_pylist(), t.column("v").to_pylist()))
    return c


def _snap(trace) -> Counter:
    t = trace.snapshot().read_all()
    return Counter({(k, v): n for k, v, n in zip(t.column("k").to_pylist(),
                                                 t.column("v").to_pylist(),
                                                 t.column("count").to_pylist())})


def test_a_trace_left_alone_settles_into_one_batch_and_reads_the_same(tmp_path):
    rng = np.random.default_rng(1)
    base = _table(rng, 600_000)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="16MiB") as engine:
        trace = engine.arrange(base, key=["k"], vals=["v"])
        assert len(trace.batches()) > 1 and trace.wants_merge()
        want = _model(base)
        seen = []

        def read():   # a reader while the merges go on
            seen.append(_snap(trace) == want)
        reader = threading.Thread(target=read)
        reader.start()
        assert engine.wait_merged(120)
        reader.join()
        assert len(trace.batches()) == 1 and not trace.wants_merge()
        assert engine.stats()["idle_merge_slices"] > 0
        assert seen == [True] and _snap(trace) == want
        more = _table(rng, 50_000)
        trace.insert(more)
        assert engine.wait_merged(120) and len(trace.batches()) == 1
        assert _snap(trace) == want + _model(more)


def test_the_merger_hands_freed_memory_back_once_its_work_is_done(tmp_path, monkeypatch):
    """Merges free their inputs' decoded parts and buffers: when the last slice is done,
    the idle thread settles the engine (a trim once RSS is high), before the engine
    reads as merged; a merger with nothing to do does not."""
    from arrangedb.spine.storage.context import StorageContext

    settled = []
    real = StorageContext.settle

    def spy(ctx, *args, **kwargs):
        settled.append(threading.current_thread().name)
        return real(ctx, *args, **kwargs)
    monkeypatch.setattr(StorageContext, "settle", spy)
    rng = np.random.default_rng(4)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="16MiB") as engine:
        trace = engine.arrange(_table(rng, 600_000), key=["k"], vals=["v"])
        assert len(trace.batches()) > 1
        settled.clear()   # the build's own
        assert engine.wait_merged(120) and len(trace.batches()) == 1
        assert settled == ["arrangedb-idle-merge"]
        slices = engine.stats()["idle_merge_slices"]
        trace.insert(_table(rng, 10))   # too small for the merge policy to take up
        assert engine.wait_merged(120)
        assert engine.stats()["idle_merge_slices"] == slices
        assert settled.count("arrangedb-idle-merge") == 1


def test_a_merge_holding_parts_is_not_kept_off_by_its_own_reservations(tmp_path):
    """The thread keeps off while others hold more than half the budget; what the merge
    in progress itself holds between slices (its inputs' decoded parts) is not another
    job: with 40% held elsewhere the merge would otherwise stop at its first slice,
    for good, and ``wait_merged`` would never return."""
    rng = np.random.default_rng(5)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as engine:
        trace = engine.arrange(_table(rng, 2_000_000, keys=1_000_000), key=["k"], vals=["v"])
        assert len(trace.batches()) > 2 and trace.wants_merge()
        elsewhere = engine.budget.limit * 2 // 5
        engine.budget.reserve(elsewhere, "test")   # a long-lived holder (resident data)
        try:
            assert engine.wait_merged(60)
            assert len(trace.batches()) == 1 and engine.stats()["idle_merge_slices"] > 0
        finally:
            engine.budget.release(elsewhere, "test")


def test_the_thread_keeps_off_while_the_engine_is_busy(tmp_path, monkeypatch):
    # a quiet time long enough that the test's own thread, descheduled on a loaded
    # machine between two reservations, does not make the engine look idle
    monkeypatch.setattr(idle, "QUIET_SECONDS", 0.25)
    rng = np.random.default_rng(2)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="16MiB") as engine:
        trace = engine.arrange(_table(rng, 400_000), key=["k"], vals=["v"])
        assert trace.wants_merge()
        stop = time.monotonic() + 6 * idle.QUIET_SECONDS
        while time.monotonic() < stop:   # a foreground job reserving all along
            engine.ctx.reserve(1, "test")
            engine.ctx.release(1)
            time.sleep(idle.QUIET_SECONDS / 10)
        assert engine.stats()["idle_merge_slices"] == 0
        assert engine.wait_merged(120) and engine.stats()["idle_merge_slices"] > 0


def test_an_insert_does_not_pay_for_the_merge_a_large_arrange_left(tmp_path, monkeypatch):
    """With an idle merger, a small insert gives the k-way merge of an arrange's runs an
    eighth of the fuel differential dataflow's spine gives it (about the insert's own
    size); the rest comes from idle time. Without one, it gets it all."""
    from arrangedb.spine.build.levels import level_of
    from arrangedb.spine.build.merger import Merger

    rng = np.random.default_rng(3)
    base, delta = _table(rng, 600_000), _table(rng, 2_000)
    monkeypatch.setattr(idle, "QUIET_SECONDS", 3600.0)   # the thread never finds quiet
    given = {}
    real = Merger.work

    def work(self, fuel):
        given[id(self)] = given.get(id(self), 0) + fuel
        return real(self, fuel)
    monkeypatch.setattr(Merger, "work", work)
    full = 8 << level_of(delta.num_rows)
    for idle_merge, expected in ((True, full // 8), (False, full)):
        with arrangedb.Engine(spill_dir=tmp_path / str(idle_merge), memory_budget="16MiB",
                              idle_merge=idle_merge) as engine:
            trace = engine.arrange(base, key=["k"], vals=["v"])
            top = max(i for i, lvl in enumerate(trace.spine.levels) if lvl is not None)
            assert trace.spine.levels[top].merging and trace.spine.levels[top].merger is None
            trace.insert(delta)
            merger = trace.spine.levels[top].merger
            assert merger is not None and given[id(merger)] == expected, (idle_merge, given)
            assert _snap(trace) == _model(base, delta)


def test_a_failing_slice_is_rolled_back_and_the_trace_stays_whole(tmp_path, monkeypatch):
    rng = np.random.default_rng(4)
    base = _table(rng, 300_000)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="16MiB") as engine:
        monkeypatch.setattr(idle, "QUIET_SECONDS", 3600.0)
        trace = engine.arrange(base, key=["k"], vals=["v"])
        real = trace.spine.exert
        calls = []

        def failing(fuel, policy=None):
            calls.append(fuel)
            if len(calls) == 1:
                raise OSError(28, "No space left on device (injected)")
            return real(fuel, policy)
        monkeypatch.setattr(trace.spine, "exert", failing)
        monkeypatch.setattr(idle, "QUIET_SECONDS", 0.0)
        engine.ctx.idle.notify(trace)
        deadline = time.monotonic() + 30
        while engine.ctx.idle.failures == 0:
            assert time.monotonic() < deadline, "the slice never ran"
            time.sleep(0.01)
        assert _snap(trace) == _model(base)
        trace.insert(_table(rng, 10))   # asks again: the merges finish this time
        assert engine.wait_merged(120)
        # the runs merged into one batch; the 10 rows, far smaller, are left beside it
        assert len(trace.batches()) == 2 and not trace.wants_merge()
        assert _snap(trace).total() == base.num_rows + 10


def test_closing_the_engine_stops_the_thread(tmp_path):
    rng = np.random.default_rng(5)
    engine = arrangedb.Engine(spill_dir=tmp_path, memory_budget="16MiB")
    engine.arrange(_table(rng, 300_000), key=["k"], vals=["v"])
    thread = engine.ctx.idle._thread
    assert thread is not None and thread.is_alive()
    engine.close()
    assert not thread.is_alive()


def test_the_idle_merger_can_be_turned_off(tmp_path, monkeypatch):
    rng = np.random.default_rng(6)
    monkeypatch.setenv("ARRANGEDB_IDLE_MERGE", "0")
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="16MiB") as engine:
        trace = engine.arrange(_table(rng, 300_000), key=["k"], vals=["v"])
        assert engine.ctx.idle is None and engine.wait_merged(0)
        time.sleep(0.2)
        assert trace.wants_merge() and engine.stats()["idle_merge_slices"] == 0


@pytest.mark.parametrize("budget", ["16MiB"])
def test_idle_merging_stays_within_the_budget(tmp_path, budget):
    rng = np.random.default_rng(7)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget=budget) as engine:
        engine.arrange(_table(rng, 1_000_000, keys=1 << 40), key=["k"], vals=["v"])
        assert engine.wait_merged(120)
        s = engine.stats()
        assert s["peak_held_bytes"] <= s["memory_budget"]
