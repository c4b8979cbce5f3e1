"""Engine.load_all: directories saved one per commit, read as one trace without merging."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

import arrangedb


def _updates(rng, n, t):
    return pa.table({"k": rng.integers(0, 40, n), "v": rng.integers(0, 5, n),
                     "time": np.full(n, t, np.int64), "diff": rng.choice([-1, 1, 2], n)})


def _model(tables, at):
    c = Counter()
    for t in tables:
        for k, v, tm, d in zip(*(t.column(x).to_pylist() for x in ("k", "v", "time", "diff"))):
            if tm <= at:
                c[(k, v)] += d
    return +Counter({r: m for r, m in c.items() if m})


def _snapshot(trace, at):
    out = Counter()
    for rb in trace.snapshot(at):
        d = rb.to_pydict()
        for k, v, m in zip(d["k"], d["v"], d["count"]):
            out[(k, v)] += m
    return +out


@settings(max_examples=15, deadline=None)
@given(commits=st.integers(1, 5), fresh=st.integers(0, 2), seed=st.integers(0, 1000))
def test_load_all_reads_as_one_trace_of_every_commit(tmp_path_factory, commits, fresh, seed):
    rng = np.random.default_rng(seed)
    root = tmp_path_factory.mktemp("load_all")
    tables, paths = [], []
    with arrangedb.Engine(spill_dir=root / "spill", memory_budget=64 << 20) as eng:
        for i in range(commits):
            t = _updates(rng, int(rng.integers(0, 200)), i)
            tables.append(t)
            tr = eng.arrange(t, key="k", vals=["v"], time="time", diff="diff")
            tr.save(root / f"c{i}")
            paths.append(root / f"c{i}")
            tr.close()
        extra = [_updates(rng, 50, commits + j) for j in range(fresh)]
        trace = eng.load_all(paths, then=[pa.RecordBatchReader.from_batches(
            e.schema, e.to_batches()) for e in extra])
        everything = tables + extra
        for at in range(commits + fresh):
            assert _snapshot(trace, at) == _model(everything, at)
        assert trace.upper() == commits + fresh
        assert len(trace.batches()) >= 1


def test_load_all_refuses_directories_of_other_schemas(tmp_path):
    with arrangedb.Engine(spill_dir=tmp_path / "spill") as eng:
        a = eng.arrange(pa.table({"k": [1], "v": [1]}), key="k")
        b = eng.arrange(pa.table({"k": [1], "w": ["x"]}), key="k")
        a.save(tmp_path / "a")
        b.save(tmp_path / "b")
        with pytest.raises(ValueError, match="differ in schema"):
            eng.load_all([tmp_path / "a", tmp_path / "b"])
