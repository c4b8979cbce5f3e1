"""Where the run builder cuts an input into runs (spine/build/runs.py): a batch is cut
only where a run's share or the resident room ends, never into pieces that one run
would take back together."""

import numpy as np
import pyarrow as pa

from arrangedb import Engine
import arrangedb.spine.build.runs as runs_module


def _insert_counting_runs(tmp_path, monkeypatch, n: int, budget: str):
    """Arrange one row, insert ``n`` updates at time 1 as one Table; the rows each
    sealed run took (in how many slices), the engine's resident batch cap and the
    trace."""
    sealed = []
    seal = runs_module.RunBuilder.seal

    def counting(self, buffered, *args, **kwargs):
        sealed.append([len(u) for u in buffered])
        return seal(self, buffered, *args, **kwargs)

    monkeypatch.setattr(runs_module.RunBuilder, "seal", counting)
    rng = np.random.default_rng(n)
    engine = Engine(spill_dir=tmp_path, memory_budget=budget, idle_merge=False)
    trace = engine.arrange(pa.table({"k": [0], "v": [0]}), key=["k"], vals=["v"])
    sealed.clear()
    delta = pa.table({"k": rng.integers(0, n // 3, n), "v": rng.integers(0, 1 << 40, n),
                      "t": np.ones(n, np.uint64), "d": rng.choice([-1, 1], n)})
    trace.insert(delta, time="t", diff="d")
    return engine, trace, sealed, delta


def _model(delta: pa.Table) -> dict:
    out: dict = {(0, 0): 1}
    for k, v, d in zip(*(delta[c].to_pylist() for c in ("k", "v", "d"))):
        out[(k, v)] = out.get((k, v), 0) + d
    return {r: c for r, c in out.items() if c}


def _snapshot(trace) -> dict:
    t = trace.snapshot().read_all()
    return dict(zip(zip(t["k"].to_pylist(), t["v"].to_pylist()), t["count"].to_pylist()))


def test_a_delta_within_a_run_is_sorted_from_one_slice(tmp_path, monkeypatch):
    """150k updates in one Table: one run, from one slice of the input (a Table is not
    cut into 64k-row pieces to be concatenated again)."""
    engine, trace, sealed, delta = _insert_counting_runs(tmp_path, monkeypatch, 150_000,
                                                         "512MiB")
    with engine:
        assert sealed == [[150_000]]
        assert _snapshot(trace) == _model(delta)


def test_a_delta_past_the_resident_room_is_cut_at_it(tmp_path, monkeypatch):
    """At 32 MiB a resident batch holds at most 2 MiB: 300k updates (~9.6 MB) are cut
    into several runs, each kept resident within that cap, and together the model."""
    engine, trace, sealed, delta = _insert_counting_runs(tmp_path, monkeypatch, 300_000,
                                                         "32MiB")
    with engine:
        assert len(sealed) > 1 and sum(map(sum, sealed)) == 300_000
        cap = engine.ctx.resident.batch_cap
        resident = [b for b in trace.batches() if b.bytes_in_memory]
        assert resident and all(b.bytes_in_memory <= cap for b in resident)
        assert _snapshot(trace) == _model(delta)
