"""CodeTotals: partials summed per dictionary code, piece by piece, against a plain model
(Python integers wrapped to int64, float sums, rows counted per group)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from arrangedb.ops.code_totals import WINDOW, CodeTotals


def _wrapped(x: int) -> int:
    return (x + 2**63) % 2**64 - 2**63


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.lists(st.integers(0, 3 * WINDOW // 2), min_size=1, max_size=4),
       st.booleans(), st.booleans(), st.integers(0, 2**32 - 1))
def test_totals_equal_a_plain_model(k, sizes, nulls, huge, seed):
    rng = np.random.default_rng(seed)
    dictionary = pa.array([f"g{i}" for i in range(k)])
    totals = CodeTotals(dictionary)
    model: dict = {}
    for n in sizes:
        codes = rng.integers(0, k, n).astype(np.int32)
        null = rng.random(n) < 0.2 if nulls else None
        ints = rng.integers(-2**62 if huge else -50, 2**62 if huge else 50, n)
        floats = np.round(rng.random(n) * 100, 2)
        ones = np.ones(n, np.int64)   # one array under two names: summed once, given twice
        assert totals.add(codes, null, {"i": ints, "f": floats, "r": None,
                                        "a": ones, "b": ones})
        for j in range(n):
            g = None if null is not None and null[j] else f"g{codes[j]}"
            t = model.setdefault(g, {"i": 0, "f": 0.0, "r": 0})
            t["i"] += int(ints[j])
            t["f"] += float(floats[j])
            t["r"] += 1
    got = totals.table("g")
    assert sorted(got.column("g").to_pylist(), key=str) == sorted(model, key=str)
    for row in got.to_pylist():
        want = model[row["g"]]
        assert row["i"] == _wrapped(want["i"])
        assert row["r"] == row["a"] == row["b"] == want["r"]
        assert abs(row["f"] - want["f"]) <= 1e-9 * max(1.0, abs(want["f"]))


def test_uint64_totals_past_float_exactness_are_refused():
    totals = CodeTotals(pa.array(["a", "b"]))
    codes = np.array([0, 1, 0], np.int32)
    assert totals.add(codes, None, {"s": np.array([1, 2, 3], np.uint64)})
    assert not totals.add(codes, None, {"s": np.full(3, 2**52, np.uint64)})
    got = totals.table("g").to_pylist()   # what was refused was not added
    assert got == [{"g": "a", "s": 4}, {"g": "b", "s": 2}]


def test_partials_keep_their_order_whichever_arrays_they_share():
    """A count and a sum's valid rows are one array in a piece without nulls, two in a
    piece with some: the table's columns follow the partials as given either way (the
    grouped chunks of one stream are concatenated, schema to schema)."""
    codes = np.array([0, 1, 1], np.int32)
    ones, valid, x = np.ones(3, np.int64), np.array([1, 0, 1], np.int64), np.ones(3)
    order = ["n__n", "p__n", "p__s", "p__v"]
    shared, apart = CodeTotals(pa.array(["a", "b"])), CodeTotals(pa.array(["a", "b"]))
    assert shared.add(codes, None, {"n__n": ones, "p__n": ones, "p__s": x, "p__v": ones})
    assert apart.add(codes, None, {"n__n": ones, "p__n": valid, "p__s": x, "p__v": valid})
    assert shared.table("g").column_names == apart.table("g").column_names == ["g", *order]
