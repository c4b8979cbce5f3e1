"""Units of the build side: the builder cuts sorted updates into parts at key boundaries
and seals a batch that reads back what was pushed; the merger's output equals the
consolidation of its inputs, fuel by fuel, and a failed merge gives everything back."""

from __future__ import annotations

import pathlib

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrangedb.pager import MemoryBudget, SpillDirectory
from arrangedb.spine.build.builder import Builder
from arrangedb.spine.build.merger import Merger
from arrangedb.spine.data.kernels import consolidate
from arrangedb.spine.data.updates import Updates
from arrangedb.spine.storage.context import StorageContext

KEYS = pa.schema([("k", pa.int64())])
VALS = pa.schema([("v", pa.int64())])


def _updates(k, v, t, d) -> Updates:
    return Updates(pa.table({"k": np.asarray(k, np.int64)}),
                   pa.table({"v": np.asarray(v, np.int64)}),
                   np.asarray(t, np.uint64), np.asarray(d, np.int64))


def _rows(batch) -> list[tuple]:
    out = []
    for part in batch.parts:
        upd, _ = part.read()
        out += list(zip(upd.keys.column(0).to_pylist(), upd.vals.column(0).to_pylist(),
                        upd.times.tolist(), upd.diffs.tolist()))
    return out


@pytest.fixture(params=["memory", "paged"])
def ctx(request, tmp_path):
    if request.param == "memory":
        yield StorageContext(part_bytes=4 << 10)
        return
    budget = MemoryBudget("64MiB", sample_interval=0)
    spill = SpillDirectory(tmp_path)
    c = StorageContext.for_budget(budget, spill, "auto")
    c.part_bytes = 4 << 10
    yield c
    c.close()
    spill.close()
    budget.close()


def test_builder_cuts_parts_at_key_boundaries_and_reads_back_what_was_pushed(ctx):
    rng = np.random.default_rng(3)
    k = np.sort(rng.integers(0, 2_000, 20_000))
    upd = consolidate(_updates(k, rng.integers(0, 5, k.size), np.zeros(k.size), np.ones(k.size)))
    b = Builder(ctx, KEYS, VALS)
    for lo in range(0, len(upd), 3_000):   # chunks ending anywhere: the builder cuts parts
        b.push(upd.slice(lo, min(lo + 3_000, len(upd))))
    batch = b.done()
    try:
        assert len(batch.parts) > 4
        assert _rows(batch) == list(zip(upd.keys.column(0).to_pylist(),
                                        upd.vals.column(0).to_pylist(),
                                        upd.times.tolist(), upd.diffs.tolist()))
        last = [p.last_key.column(0)[0].as_py() for p in batch.parts]
        first = [p.first_key.column(0)[0].as_py() for p in batch.parts]
        assert all(a < b_ for a, b_ in zip(last[:-1], first[1:])), "a key spans two parts"
        assert len(batch) == len(upd) and batch.num_keys == len(np.unique(k))
    finally:
        batch.drop()
    if ctx.budget is not None:
        assert ctx.budget.held == 0


def test_an_aborted_builder_gives_back_its_reservation_and_file(tmp_path):
    budget = MemoryBudget("64MiB", sample_interval=0)
    spill = SpillDirectory(tmp_path)
    ctx = StorageContext.for_budget(budget, spill, "auto")
    try:
        b = Builder(ctx, KEYS, VALS)
        b.push(_updates(np.arange(50_000), np.zeros(50_000), np.zeros(50_000),
                        np.ones(50_000)))
        assert budget.held > 0 and list(pathlib.Path(spill.path).glob("*.pg*"))
        b.abort()
        assert budget.held == 0
        assert not list(pathlib.Path(spill.path).glob("*.pg*"))
    finally:
        ctx.close()
        spill.close()
        budget.close()


ROWS = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 3), st.integers(0, 4),
                          st.integers(-2, 2)), max_size=60)


@settings(max_examples=60, deadline=None)
@given(st.lists(ROWS, min_size=1, max_size=4), st.integers(0, 4), st.integers(1, 50))
def test_a_merge_equals_the_consolidation_of_its_inputs(runs, since, fuel):
    ctx = StorageContext(part_bytes=1 << 10)
    batches = []
    for rows in runs:
        k, v, t, d = (list(c) for c in zip(*rows)) if rows else ([], [], [], [])
        b = Builder(ctx, KEYS, VALS)
        b.push(consolidate(_updates(k, v, t, d)))
        batches.append(b.done())
    m = Merger(batches, since, ctx)
    steps = 0
    while not m.done:
        m.work(fuel)
        steps += 1
    every = [r for rows in runs for r in rows]
    k, v, t, d = (list(c) for c in zip(*every)) if every else ([], [], [], [])
    want = consolidate(_updates(k, v, t, d), since) if every else None
    got = _rows(m.result())
    assert got == ([] if want is None else list(zip(
        want.keys.column(0).to_pylist(), want.vals.column(0).to_pylist(),
        want.times.tolist(), want.diffs.tolist())))
    assert m.result().description.since == since


def test_an_inserts_fuel_counts_the_work_a_merge_did_ahead():
    """``pay`` asks a merge to have done what inserts gave it so far; work done ahead
    (idle slices, a step longer than the fuel) counts, so a merge that kept up costs an
    insert nothing, and one behind does what it is behind."""
    ctx = StorageContext(part_bytes=1 << 10)
    ctx.window_rows = 1024   # steps of ~2k rows
    batches = []
    for seed in range(2):
        rng = np.random.default_rng(seed)
        k = np.sort(rng.integers(0, 50_000, 40_000))
        b = Builder(ctx, KEYS, VALS)
        b.push(consolidate(_updates(k, rng.integers(0, 3, k.size), np.zeros(k.size),
                                    np.ones(k.size))))
        batches.append(b.done())
    m = Merger(batches, 0, ctx)
    total = m.remaining

    def worked():
        return total - m.remaining
    m.work(3_000)                     # ahead of any insert
    ahead = worked()
    assert 3_000 <= ahead < total // 2
    m.pay(ahead)                      # already done: nothing more
    assert worked() == ahead
    m.pay(10_000)                     # behind by 10_000: at least that much more
    assert worked() >= ahead + 10_000
    m.pay(total)
    assert m.done


def test_a_failed_merge_is_abandoned_and_gives_back_everything(tmp_path, monkeypatch):
    budget = MemoryBudget("64MiB", sample_interval=0)
    spill = SpillDirectory(tmp_path)
    ctx = StorageContext.for_budget(budget, spill, "auto")
    ctx.part_bytes = 8 << 10
    try:
        batches = []
        for s in range(3):
            b = Builder(ctx, KEYS, VALS)
            b.push(_updates(np.arange(s, 30_000, 3), np.zeros(10_000), np.zeros(10_000),
                            np.ones(10_000)))
            batches.append(b.done())
        held, files = budget.held, set(pathlib.Path(spill.path).glob("*.pg*"))
        assert len(files) == 3
        m = Merger(batches, 0, ctx)
        m.work(5_000)
        import arrangedb.spine.build.merger as merger_module

        def boom(*a, **k):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(merger_module, "consolidate", boom)
        with pytest.raises(OSError):
            m.work(1 << 40)
        assert m.failed
        with pytest.raises(RuntimeError, match="abandoned"):
            m.work(1)
        assert set(pathlib.Path(spill.path).glob("*.pg*")) == files      # the half-written output is gone
        assert budget.held == held                          # and so are its reservations
        for b in batches:
            b.drop()
    finally:
        ctx.close()
        spill.close()
        budget.close()


def _mean_part_rows(batches) -> float:
    parts = [p for b in batches for p in b.parts]
    return sum(p.num_updates for p in parts) / len(parts)


def test_batches_read_on_their_own_are_cut_into_larger_parts():
    """An arrange's only run and a spine merge's output are read alone, so they take
    parts up to ``large_part_bytes``; runs merged down to the read fan-in are read side
    by side and keep the base size, as do batches of only a few base parts."""
    from arrangedb.spine.build.runs import RunBuilder
    from arrangedb.spine.data.ingest import Columns

    rng = np.random.default_rng(7)
    t = pa.table({"k": rng.integers(0, 1 << 40, 200_000), "v": rng.integers(0, 9, 200_000)})
    cols = Columns(["k"], ["v"], None, None)
    base, large = 64 << 10, 256 << 10
    ctx = StorageContext(part_bytes=base, large_part_bytes=large, read_fan_in=2)
    assert ctx.whole_part_bytes(4 * base) == base
    assert ctx.whole_part_bytes(1 << 30) == large

    (alone,) = RunBuilder(ctx, KEYS, VALS, cols).build(t, None, None)
    (few,) = RunBuilder(ctx, KEYS, VALS, cols).build(t.slice(0, 2_000), None, None)
    many_ctx = StorageContext(part_bytes=base, large_part_bytes=large, read_fan_in=2,
                              run_bytes=1 << 20)
    runs = RunBuilder(many_ctx, KEYS, VALS, cols).build(t, None, None)
    merged = Merger(runs, 0, many_ctx, whole=True).finish()

    per_base = base // 16          # rows of 16 bytes (key, val) in a base part
    assert len(runs) == 2 and _mean_part_rows(runs) <= 1.2 * per_base
    assert _mean_part_rows([alone]) >= 3 * per_base
    assert _mean_part_rows([merged]) >= 3 * per_base
    assert len(few.parts) == 1
    assert _rows(merged) == _rows(alone)
