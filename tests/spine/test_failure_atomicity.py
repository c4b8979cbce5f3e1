"""Failure atomicity: a write that fails at any disk operation or reservation leaves the
trace exactly as it was, readable, and writable once the cause is gone.

Each operation (insert, merge, merge-down, save, load) runs once to count its fault
points (:mod:`faults`), then once per point on a fresh trace with that point failing.
After each failure the trace must answer exactly as the model, accept the next insert
and merge everything, still answering as the model. An operation whose fault was
absorbed (a spiller that gives up and lets the reservation fit anyway) must have
completed: the model then includes it.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

import arrangedb
from faults import Faults, PowerLoss, injected

from arrangedb.pager.diskio import using

BASE, DELTA = 3000, 800


def _table(rng, n, lo, hi, diff=None):
    cols = {"k": pa.array(rng.integers(lo, hi, n), pa.int64()),
            "v": pa.array(rng.integers(0, 5, n), pa.int64())}
    if diff is not None:
        cols["d"] = pa.array(np.full(n, diff), pa.int64())
    return pa.table(cols)


def _model_add(model: dict, table: pa.Table) -> None:
    d = table.column("d").to_pylist() if "d" in table.column_names else [1] * table.num_rows
    for k, v, c in zip(table.column("k").to_pylist(), table.column("v").to_pylist(), d):
        model[(k, v)] = model.get((k, v), 0) + c
        if model[(k, v)] == 0:
            del model[(k, v)]


def _answer(trace) -> dict:
    t = trace.snapshot().read_all()
    return {(k, v): c for k, v, c in zip(t.column("k").to_pylist(), t.column("v").to_pylist(),
                                         t.column("count").to_pylist())}


class Scene:
    """An engine with small parts and runs (many disk operations per write), a trace
    with merges pending, and its model."""

    def __init__(self, spill_root, seed=0):
        self.rng = np.random.default_rng(seed)
        self.engine = arrangedb.Engine(spill_dir=spill_root, memory_budget="256MiB")
        ctx = self.engine.ctx
        ctx.part_bytes, ctx.window_rows, ctx.read_fan_in = 16 << 10, 512, 2
        ctx.run_bytes = 96 << 10
        self.model: dict = {}
        base = _table(self.rng, BASE, 0, 4000, diff=1)
        self.trace = self.engine.arrange(base, key=["k"], vals=["v"], diff="d")
        _model_add(self.model, base)
        for _ in range(2):
            self.insert(self.delta())

    def delta(self) -> pa.Table:
        add = _table(self.rng, DELTA, 0, 5000, diff=1)
        old = self.trace.snapshot().read_all().slice(0, DELTA // 3)   # retractions
        retract = pa.table({"k": old.column("k"), "v": old.column("v"),
                            "d": pa.array(np.full(old.num_rows, -1), pa.int64())})
        return pa.concat_tables([add, retract])

    def insert(self, table) -> None:
        self.trace.insert(table, diff="d")
        _model_add(self.model, table)

    def close(self):
        self.engine.close()


def _merge_down_delta(scene):
    """An insert that sorts into more runs than the read fan-in: merged down first."""
    return pa.concat_tables([scene.delta() for _ in range(4)])


OPERATIONS = {
    # name: (run it, what it adds to the model)
    "insert": (lambda s, d, tmp: s.trace.insert(d, diff="d"), True),
    "merge_down": (lambda s, d, tmp: s.trace.insert(d, diff="d"), True),
    "exert": (lambda s, d, tmp: s.trace.exert(1 << 40), False),
    "merge_all": (lambda s, d, tmp: s.trace.merge_all(), False),
    "save": (lambda s, d, tmp: s.trace.save(tmp / "saved"), False),
}


def _points(spill_root, tmp_path, name, monkeypatch) -> list[str]:
    s = Scene(spill_root)
    try:
        delta = _merge_down_delta(s) if name == "merge_down" else s.delta()
        run, _ = OPERATIONS[name]
        with Faults().installed(monkeypatch) as f:
            run(s, delta, tmp_path / "count")
        return f.points
    finally:
        s.close()


def _sample(points: list[str], most: int = 10) -> list[int]:
    """Fault points to try, 1-based: all when few, else every kind's first and last and
    an even spread."""
    n = len(points)
    if n <= most:
        return list(range(1, n + 1))
    chosen = set(np.linspace(1, n, most).astype(int).tolist())
    for kind in set(points):
        where = [i + 1 for i, p in enumerate(points) if p == kind]
        chosen.update((where[0], where[-1]))
    return sorted(chosen)


def test_a_failed_arrange_leaves_no_file_and_no_reservation(spill_root, monkeypatch):
    """An arrange of many runs (merged down to the read fan-in) that fails at any disk
    point or reservation leaves no page file and no reservation; the same arrange then
    succeeds."""
    rng = np.random.default_rng(4)
    table = _table(rng, 12_000, 0, 50_000)
    model: dict = {}
    _model_add(model, table)
    with arrangedb.Engine(spill_dir=spill_root, memory_budget="256MiB") as engine:
        ctx = engine.ctx
        ctx.part_bytes, ctx.window_rows, ctx.read_fan_in = 16 << 10, 512, 4
        ctx.run_bytes = 96 << 10
        spill = engine.spill.path

        def page_files():
            return [f for f in os.listdir(spill) if f.endswith((".pg", ".tmp"))]

        held = engine.budget.held
        with Faults().installed(monkeypatch) as f:
            engine.arrange(table, key=["k"], vals=["v"]).close()
        assert f.points.count("write") > 8 and not page_files()
        failures = 0
        for k in _sample(f.points, most=16):
            try:
                with Faults(fail_at=k).installed(monkeypatch):
                    trace = engine.arrange(table, key=["k"], vals=["v"])
            except Exception as e:
                if not injected(e):
                    raise
                failures += 1
                assert not page_files(), f"point {k} left {page_files()}"
                assert engine.budget.held == held, f"point {k} left reservations behind"
            else:
                assert _answer(trace) == model
                trace.close()
        assert failures >= 8, "most injected faults must surface"
        trace = engine.arrange(table, key=["k"], vals=["v"])
        assert _answer(trace) == model


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_a_failed_write_leaves_the_trace_as_it_was(name, spill_root, tmp_path, monkeypatch):
    points = _points(spill_root, tmp_path, name, monkeypatch)
    kinds = set(points)
    assert "write" in kinds and "reserve" in kinds or name == "save", kinds
    failures = 0
    for k in _sample(points):
        s = Scene(spill_root)
        target = tmp_path / f"at-{k}"
        target.mkdir()
        try:
            delta = _merge_down_delta(s) if name == "merge_down" else s.delta()
            run, adds = OPERATIONS[name]
            before = _answer(s.trace)
            assert before == s.model
            failed = False
            try:
                with Faults(fail_at=k).installed(monkeypatch):
                    run(s, delta, target)
            except Exception as e:
                if not injected(e):
                    raise
                failed = True
                failures += 1
                assert _answer(s.trace) == s.model, f"{name} failing at point {k} ({e})"
                if name == "save":   # nothing of the failed save is left to confuse a load
                    saved = target / "saved"   # (not made at all when making it failed)
                    left = os.listdir(saved) if saved.exists() else []
                    assert not [f for f in left if f.endswith((".page", ".tmp", ".json"))]
            else:
                if adds:
                    _model_add(s.model, delta)
                assert _answer(s.trace) == s.model, f"{name} absorbing point {k}"
            at_op = dict(s.model)
            # writable again: the next insert and a full merge
            s.insert(s.delta())
            assert _answer(s.trace) == s.model
            s.trace.merge_all()
            assert _answer(s.trace) == s.model
            if name == "save":   # and the directory takes a save now (retention's faults
                if failed:        # after the version landed are absorbed: then it has one)
                    s.trace.save(target / "saved")
                with arrangedb.Engine(spill_dir=spill_root) as e2:
                    assert _answer(e2.load(target / "saved")) == (s.model if failed else at_op)
        finally:
            s.close()
    assert failures >= len(_sample(points)) // 2, "most injected faults must surface"


def test_a_failed_load_leaves_nothing_open_and_the_directory_loads(spill_root, tmp_path,
                                                                   monkeypatch):
    s = Scene(spill_root)
    try:
        s.trace.save(tmp_path / "saved")
        model = dict(s.model)
    finally:
        s.close()
    with arrangedb.Engine(spill_dir=spill_root) as e:
        with Faults().installed(monkeypatch) as f:
            _answer(e.load(tmp_path / "saved"))
        points = f.points
    assert "mmap" in points
    for k in range(1, len(points) + 1):
        with arrangedb.Engine(spill_dir=spill_root) as e:
            try:
                with Faults(fail_at=k).installed(monkeypatch):
                    t = e.load(tmp_path / "saved")
                    _answer(t)
            except Exception as err:
                if not injected(err):
                    raise
            assert _answer(e.load(tmp_path / "saved")) == model


def test_a_merge_that_failed_is_abandoned_and_its_inputs_stay(spill_root, monkeypatch):
    """The reported loss: a merge failing mid-way stayed half done in the spine; retried,
    it finished over lost input and dropped its inputs' batches."""
    s = Scene(spill_root)
    try:
        updates = s.trace.stats()["updates"]
        for k in (3, 7, 15):   # failing at a few points inside the merge's writes
            with Faults(fail_at=k).installed(monkeypatch):
                try:
                    s.trace.merge_all()
                except Exception as e:
                    if not injected(e):
                        raise
            assert _answer(s.trace) == s.model
        s.trace.merge_all()
        assert _answer(s.trace) == s.model
        assert s.trace.stats()["batches"] == 1 and s.trace.stats()["updates"] <= updates
    finally:
        s.close()


def test_failed_writes_give_their_reservations_back(spill_root, tmp_path, monkeypatch):
    s = Scene(spill_root)
    try:
        held = s.engine.budget.held
        delta = _merge_down_delta(s)
        for k in (2, 5, 9, 14, 20):
            try:
                with Faults(fail_at=k).installed(monkeypatch):
                    s.trace.insert(delta, diff="d")
            except Exception as e:
                if not injected(e):
                    raise
            else:
                pytest.fail(f"the insert absorbed fault point {k}")
            assert s.engine.budget.held == held, f"point {k} left reservations behind"
    finally:
        s.close()


def test_a_save_cut_by_power_loss_leaves_no_save_or_a_whole_one(spill_root, tmp_path):
    """Power lost at any operation of a save: after the machine comes back (every write
    and directory change not fsync'd undone), the directory holds either no manifest --
    and takes a new save -- or one that loads exactly the saved trace."""
    s = Scene(spill_root)
    try:
        s.trace.save(tmp_path / "first")   # pages resident batches out: saves alike from now
        counter = PowerLoss()
        with using(counter):
            s.trace.save(tmp_path / "count")
        assert counter.ops > 5
        for k in _sample(["op"] * counter.ops, most=30):
            target = tmp_path / f"cut-{k}" / "saved"
            disk = PowerLoss(cut_at=k)
            try:
                with using(disk):
                    s.trace.save(target)
            except OSError as cut:
                assert injected(cut)
            else:   # cut in retention, after the version was durable
                assert list(target.glob("manifest-*.json"))
            disk.restore()
            if not list(target.glob("manifest*.json")):
                s.trace.save(target)   # the leftovers of the cut save are no obstacle
            with arrangedb.Engine(spill_dir=spill_root) as e:
                assert _answer(e.load(target)) == s.model, f"power lost at operation {k}"
    finally:
        s.close()
