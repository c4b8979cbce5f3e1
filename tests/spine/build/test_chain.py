"""Runs of an input read in key order go on into one batch (spine/build/chain.py)."""

import numpy as np
import pyarrow as pa
import pytest

from arrangedb import Engine


def _arranged(tmp_path, table: pa.Table):
    """``table`` arranged by k (val v) with runs of ~1 MiB of sort; its batches and
    snapshot."""
    with Engine(spill_dir=tmp_path, memory_budget="64MiB", idle_merge=False) as engine:
        engine.ctx.run_bytes, engine.ctx.read_fan_in = 1 << 20, 100   # no merging down
        trace = engine.arrange(table, key=["k"], vals=["v"])
        return trace.batches(), trace.snapshot().read_all()


def _model(table: pa.Table) -> pa.Table:
    return table.group_by(["k", "v"]).aggregate([("k", "count")]).sort_by(
        [("k", "ascending"), ("v", "ascending")])


def _same(got: pa.Table, table: pa.Table) -> None:
    want = _model(table)
    assert got["k"].to_pylist() == want["k"].to_pylist()
    assert got["v"].to_pylist() == want["v"].to_pylist()
    assert got["count"].to_pylist() == want["k_count"].to_pylist()


@pytest.mark.parametrize("rows_per_key", [1, 7, 3000])
def test_an_input_in_key_order_arranges_into_one_batch(tmp_path, rows_per_key):
    """Keys in order (each with ``rows_per_key`` rows whose vals come in any order, and
    duplicate rows): many runs, one batch, the rows as the model has them. A key's rows
    are never split between two runs, even where a run is cut among them."""
    rng = np.random.default_rng(rows_per_key)
    n = 200_000
    k = np.repeat(np.arange(n // rows_per_key + 1) * 3, rows_per_key)[:n]
    t = pa.table({"k": k, "v": rng.integers(0, 50, n)})
    batches, got = _arranged(tmp_path, t)
    assert len(batches) == 1
    keys = pa.concat_tables([p.first_key for p in batches[0].parts])["k"].to_numpy()
    assert (np.diff(keys) > 0).all()   # no key in two parts
    _same(got, t)


def test_an_input_in_any_order_keeps_a_batch_per_run(tmp_path):
    rng = np.random.default_rng(1)
    n = 200_000
    t = pa.table({"k": rng.integers(0, 20_000, n), "v": rng.integers(0, 50, n)})
    batches, got = _arranged(tmp_path, t)
    assert len(batches) > 1
    _same(got, t)


def test_a_run_that_goes_back_in_key_order_starts_a_new_batch(tmp_path):
    """Three stretches in key order, the second starting below where the first ended:
    the runs chain within each stretch only."""
    rng = np.random.default_rng(2)
    n = 100_000
    parts = [np.arange(n) * 2, np.arange(n) * 2 + 1, np.arange(n) * 2 + 2 * n]
    t = pa.table({"k": np.concatenate(parts), "v": rng.integers(0, 50, 3 * n)})
    batches, got = _arranged(tmp_path, t)
    assert 2 <= len(batches) < 6   # each stretch is several runs
    for b in batches:
        keys = pa.concat_tables([p.first_key for p in b.parts])["k"].to_numpy()
        assert (np.diff(keys) > 0).all()
    _same(got, t)


def test_a_large_input_in_key_order_has_the_parts_of_a_batch_read_alone(tmp_path,
                                                                        monkeypatch):
    """Its one batch is cut as a merge's output is (parts grow with the input, up to the
    large part size), where its runs alone would have been cut at the base size."""
    from arrangedb.spine.build.builder import Builder

    cut_at = []   # the part size of each part written
    real = Builder._emit

    def emit(self, *a):
        cut_at.append(self.part_bytes)
        return real(self, *a)
    monkeypatch.setattr(Builder, "_emit", emit)
    rng = np.random.default_rng(3)
    n = 2_000_000
    t = pa.table({"k": np.repeat(np.arange(n // 4), 4), "v": rng.integers(0, 50, n)})
    with Engine(spill_dir=tmp_path, memory_budget="64MiB", idle_merge=False) as engine:
        engine.ctx.run_bytes, engine.ctx.read_fan_in = 8 << 20, 100
        base, large = engine.ctx.part_bytes, engine.ctx.large_part_bytes
        trace = engine.arrange(t, key=["k"], vals=["v"])
        batches = trace.batches()
        got = trace.snapshot().read_all()
    assert len(batches) == 1 and large > base and set(cut_at) == {large}
    _same(got, t)


def test_batches_with_grown_parts_are_merged_when_others_remain(tmp_path):
    """Two stretches in key order, the second going back: two batches of grown parts,
    which a read would walk side by side, one large part of each -- merged into one."""
    rng = np.random.default_rng(4)
    n = 1_000_000
    k = np.concatenate([np.repeat(np.arange(n // 4) * 2, 4),
                        np.repeat(np.arange(n // 4) * 2 + 1, 4)])
    t = pa.table({"k": k, "v": rng.integers(0, 50, 2 * n)})
    sealed = []
    with Engine(spill_dir=tmp_path, memory_budget="64MiB", idle_merge=False) as engine:
        engine.ctx.run_bytes, engine.ctx.read_fan_in = 8 << 20, 100
        real = engine.ctx.new_writer
        engine.ctx.new_writer = lambda *a: sealed.append(1) or real(*a)
        trace = engine.arrange(t, key=["k"], vals=["v"])
        batches = trace.batches()
        got = trace.snapshot().read_all()
    assert len(batches) == 1 and len(sealed) >= 3   # two chains and the merge's output
    _same(got, t)


def test_a_run_that_cancels_out_leaves_the_batch_open(tmp_path):
    """Keys in order whose middle stretch is inserted and retracted at once (each row
    twice, diffs +1 and -1): the runs of that stretch consolidate to nothing, and the
    rows on either side still make one batch."""
    n = 60_000
    k = np.arange(3 * n)
    mid = (k >= n) & (k < 2 * n)
    keys = np.concatenate([k[:n], np.repeat(k[mid], 2), k[2 * n:]])
    diffs = np.concatenate([np.ones(n, np.int64), np.tile([1, -1], n), np.ones(n, np.int64)])
    t = pa.table({"k": keys, "v": keys % 7, "t": np.zeros(len(keys), np.uint64), "d": diffs})
    with Engine(spill_dir=tmp_path, memory_budget="64MiB", idle_merge=False) as engine:
        engine.ctx.run_bytes, engine.ctx.read_fan_in = 1 << 20, 100
        trace = engine.arrange(t, key=["k"], vals=["v"], time="t", diff="d")
        batches = [b for b in trace.batches() if len(b)]
        got = trace.snapshot().read_all()
    assert len(batches) == 1
    kept = np.concatenate([k[:n], k[2 * n:]])
    assert got["k"].to_pylist() == kept.tolist() and set(got["count"].to_pylist()) == {1}


def _arranged_file(tmp_path, monkeypatch, table: pa.Table, row_group_rows: int,
                   files: int = 1):
    """``table`` written as Parquet in row groups of ``row_group_rows`` (in ``files``
    files of a directory, in order, when more than one) and arranged from it by k (val
    v) under a budget that one run holds it in; its batches, snapshot and how many runs
    were sealed."""
    import pyarrow.parquet as pq

    from arrangedb.spine.build.runs import RunBuilder

    path = tmp_path / "in"
    if files == 1:
        path = tmp_path / "in.parquet"
        pq.write_table(table, path, row_group_size=row_group_rows)
    else:
        path.mkdir()
        step = -(-table.num_rows // files)
        for i in range(files):
            pq.write_table(table.slice(i * step, step), path / f"part-{i:05d}.parquet",
                           row_group_size=row_group_rows)
    sealed = []
    real = RunBuilder.seal

    def seal(self, *a, **k):
        sealed.append(1)
        return real(self, *a, **k)
    monkeypatch.setattr(RunBuilder, "seal", seal)
    with Engine(spill_dir=tmp_path, memory_budget="512MiB", idle_merge=False) as engine:
        trace = engine.arrange(str(path), key=["k"], vals=["v"])
        return trace.batches(), trace.snapshot().read_all(), len(sealed)


def test_a_file_in_key_order_is_sealed_batch_by_batch_into_one_batch(tmp_path,
                                                                      monkeypatch):
    """A run would hold the whole file, yet each batch read is sealed as it comes (its
    encoding beside the reading of the next), and the runs chain: one batch. A key's
    rows that straddle two batches stay in one run."""
    rng = np.random.default_rng(5)
    n = 1_000_000
    t = pa.table({"k": np.repeat(np.arange(n // 3 + 1), 3)[:n], "v": rng.integers(0, 50, n)})
    batches, got, sealed = _arranged_file(tmp_path, monkeypatch, t, 250_000)
    assert len(batches) == 1 and sealed >= 4
    _same(got, t)


def test_small_files_in_key_order_are_not_sealed_file_by_file(tmp_path, monkeypatch):
    """A directory of 200 small files, each read as batches of its own: sealed a few
    MiB at a time, not a file at a time."""
    rng = np.random.default_rng(6)
    n = 400_000
    t = pa.table({"k": np.arange(n), "v": rng.integers(0, 50, n)})
    batches, got, sealed = _arranged_file(tmp_path, monkeypatch, t, 1_000, files=200)
    assert len(batches) == 1 and sealed <= n * 16 // (2 << 20) + 2
    _same(got, t)


def test_a_file_whose_key_order_breaks_is_sealed_in_runs_after(tmp_path, monkeypatch):
    """Its first half in key order, the rest not: what was read in order is sealed as
    it came; from the first batch out of order on, the rest is one run, as any input
    (a run holds it all). Two batches, the rows as the model has them."""
    rng = np.random.default_rng(7)
    n = 500_000
    k = np.concatenate([np.arange(n), rng.integers(0, n, n)])
    t = pa.table({"k": k, "v": rng.integers(0, 50, 2 * n)})
    batches, got, sealed = _arranged_file(tmp_path, monkeypatch, t, 250_000)
    assert len(batches) == 2 and sealed == 2
    _same(got, t)
