"""Every operator's incremental form (``since``/``upto``) is the difference of two
snapshot results: the changes applied to the output at ``since - 1`` give the output at
``upto - 1``, at times within the interval -- on random histories with retractions,
skew, nulls and keys present on one side only."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

import arrangedb
from arrangedb import distinct, join, reduce, threshold, top_k

OPS = {
    "inner join": lambda f, d, **w: join(f, d, **w),
    "left join": lambda f, d, **w: join(f, d, how="left", **w),
    "right join": lambda f, d, **w: join(f, d, how="right", **w),
    "full join": lambda f, d, **w: join(f, d, how="full", **w),
    "semi join": lambda f, d, **w: join(f, d, how="semi", **w),
    "anti join": lambda f, d, **w: join(f, d, how="anti", **w),
    "distinct": lambda f, d, **w: distinct(f, **w),
    "threshold": lambda f, d, **w: threshold(f, lambda c: c >= 2, **w),
    "top_k": lambda f, d, **w: top_k(f, 2, by="x", **w),
    "reduce": lambda f, d, **w: reduce(f, {"n": ("count", None), "m": ("mean", "x"),
                                          "u": ("count_distinct", "y")}, **w),
}


def _bag(table: pa.Table, weight: str) -> Counter:
    cols = [c for c in table.column_names if c not in (weight, "time")]
    out = Counter()
    counts = table.column(weight).to_pylist() if weight in table.column_names else \
        [1] * table.num_rows   # reduce: a row per key
    for row, n in zip(zip(*(table.column(c).to_pylist() for c in cols)), counts):
        out[tuple(round(v, 6) if isinstance(v, float) else v for v in row)] += n
    return Counter({r: n for r, n in out.items() if n})


def _facts(rng, n, keys, skew):
    k = (rng.zipf(1.5, n) % keys) if skew else rng.integers(0, keys, n)
    x = pa.array(rng.integers(0, 8, n).astype(float), mask=rng.random(n) < 0.1)
    return pa.table({"k": pa.array(k, pa.int64()), "x": x,
                     "y": pa.array(rng.integers(0, 4, n), pa.int64())})


@pytest.mark.parametrize("op", list(OPS))
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2 ** 16), skew=st.booleans(), steps=st.integers(2, 5),
       window=st.tuples(st.integers(0, 5), st.integers(1, 6)))
def test_changes_take_the_output_from_since_to_upto(tmp_path_factory, op, seed, skew, steps,
                                                     window):
    rng = np.random.default_rng(seed)
    keys = 12
    with arrangedb.Engine(spill_dir=tmp_path_factory.mktemp("inc"),
                          memory_budget="64MiB") as e:
        facts = e.arrange(_facts(rng, 60, keys, skew), key=["k"], vals=["x", "y"])
        dims = e.arrange(pa.table({"k": pa.array(np.arange(0, keys, 2), pa.int64()),
                                   "g": pa.array(rng.choice(["a", "b"], keys // 2))}),
                         key=["k"], vals=["g"])
        for step in range(1, steps):
            snap = facts.snapshot().read_all()
            gone = snap.take(pa.array(rng.choice(snap.num_rows, min(8, snap.num_rows),
                                                 replace=False), pa.int64()))
            add = _facts(rng, 10, keys, skew)
            d = np.r_[np.ones(add.num_rows), -gone.column("count").to_numpy()]
            facts.insert(pa.concat_tables([add, gone.select(["k", "x", "y"])]).append_column(
                "d", pa.array(d.astype(np.int64))), diff="d")
            if step % 2:   # keys enter and leave the other side too
                dims.insert(pa.table({"k": pa.array(rng.integers(0, keys, 2), pa.int64()),
                                      "g": pa.array(rng.choice(["a", "c"], 2))}))
            for t in (facts, dims):   # one timeline for both inputs
                t.advance_upper(step + 1)
        since = min(window[0], steps - 1)
        upto = min(since + window[1], steps) if window[1] < 6 else None
        make = OPS[op]
        before = _bag(make(facts, dims, at=since - 1).read_all(), "count") \
            if since > 0 else Counter()
        after = _bag(make(facts, dims, at=None if upto is None else upto - 1).read_all(),
                     "count")
        changes = make(facts, dims, since=since, upto=upto).read_all()
        times = changes.column("time").to_numpy()
        assert ((times >= since) & (times < (upto or steps))).all()
        got = before.copy()
        got.update(_bag(changes, "diff"))
        assert Counter({r: n for r, n in got.items() if n}) == after


def test_a_bad_window_is_named(tmp_path):
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        f = e.arrange(pa.table({"k": pa.array([1, 2], pa.int64()), "x": [1.0, 2.0]}),
                      key=["k"], vals=["x"])
        with pytest.raises(ValueError, match="upto= needs since="):
            distinct(f, upto=3).read_all()
        with pytest.raises(ValueError, match="either at="):
            top_k(f, 1, by="x", at=0, since=0).read_all()
        with pytest.raises(ValueError, match="must be greater than since"):
            join(f, f, how="left", since=2, upto=2).read_all()
