"""Per-key partials of a block against sums in Python: long runs (summed by reduceat),
short ones (summed by bincount over each row's key) and two rows every key (a view's
change: summed as two strided halves), integers exact wherever a float64 sum could
round them, nulls counted as the grouping counts them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from arrangedb.ops.key_partials import KeyPartials
from arrangedb.ops.partials import partial_names
from arrangedb.spine import Block

AGGS = {"n": ("count", None), "c": ("count", "x"), "s": ("sum", "x")}


@settings(max_examples=200, deadline=None)
@given(runs=st.lists(st.integers(1, 9), min_size=1, max_size=40),
       kind=st.sampled_from(["small", "huge", "float"]), seed=st.integers(0, 2**32 - 1),
       nulls=st.booleans(), pairs=st.booleans())
def test_per_key_partials_equal_python_sums(runs, kind, seed, nulls, pairs):
    if pairs:
        runs = [2] * len(runs)
    rng = np.random.default_rng(seed)
    n = sum(runs)
    counts = rng.choice([-3, -1, 1, 1, 2], n).astype(np.int64)
    if kind == "float":
        x = np.round(rng.random(n) * 100, 2)
    else:
        top = 2**56 if kind == "huge" else 100   # huge: float64 sums would round
        x = rng.integers(-top, top, n)
    mask = rng.random(n) < 0.3 if nulls else np.zeros(n, bool)
    bounds = np.concatenate([[0], np.cumsum(runs)]).astype(np.int64)
    block = Block(pa.table({"k": np.arange(len(runs))}), bounds,
                  pa.table({"x": pa.array(x, mask=mask)}), counts)
    got = KeyPartials(AGGS, partial_names(AGGS), {"x": "x"})(block)
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        rows = range(lo, hi)
        valid = [r for r in rows if not mask[r]]
        assert got["__n__n"][i] == sum(int(counts[r]) for r in rows)
        assert got["__c__n"][i] == sum(int(counts[r]) for r in valid)
        assert got["__s__v"][i] == len(valid)   # valid rows, each once
        want = sum(x[r] * counts[r] if kind == "float" else int(x[r]) * int(counts[r])
                   for r in valid)
        if kind == "float":
            assert abs(got["__s__s"][i] - want) < 1e-6
        else:
            assert int(got["__s__s"][i]) == want
