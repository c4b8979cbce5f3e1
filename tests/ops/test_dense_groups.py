"""dense_groups: partials summed per slot of a narrow integer group column, against a
plain model (Python integers wrapped to int64, float sums, rows counted per group)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from arrangedb.ops.dense_groups import MAX_SLOTS, SLOTS_FLOOR, SLOTS_PER_ROW, dense_groups


def _wrapped(x: int) -> int:
    return (x + 2**63) % 2**64 - 2**63


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(["int8", "int16", "int32", "int64", "uint8", "uint32", "uint64"]),
       st.integers(1, 3000), st.sampled_from([1, 50, 10_000, 1 << 40]), st.booleans(),
       st.booleans(), st.integers(0, 2**32 - 1))
def test_groups_equal_a_plain_model(dtype, n, spread, huge, arrow, seed):
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    spread = min(spread, int(info.max) - int(info.min))
    lo = int(info.min) + int(rng.random() * (int(info.max) - int(info.min) - spread))
    keys = np.array([lo + int(o) for o in rng.integers(0, spread + 1, n)], dtype)
    ints = rng.integers(-2**62 if huge else -50, 2**62 if huge else 50, n)
    floats = np.round(rng.random(n) * 100, 2)
    ones = np.ones(n, np.int64)   # one array under two names: summed once, given twice
    cols = {"i": ints, "f": floats, "r": None, "a": ones, "b": ones}
    if arrow:
        cols = {**cols, "i": pa.chunked_array([pa.array(ints)]), "f": pa.array(floats)}
    got = dense_groups(pa.table({"g": keys}), ["g"], cols)
    span = int(keys.max()) - int(keys.min()) + 1
    if span > min(SLOTS_PER_ROW * n + SLOTS_FLOOR, MAX_SLOTS):
        assert got is None
        return
    model: dict = {}
    for j in range(n):
        t = model.setdefault(int(keys[j]), {"i": 0, "f": 0.0, "r": 0})
        t["i"] += int(ints[j])
        t["f"] += float(floats[j])
        t["r"] += 1
    assert got.schema.field("g").type == pa.from_numpy_dtype(np.dtype(dtype))
    assert got.column("g").to_pylist() == sorted(model)   # ascending, one row per group
    for row in got.to_pylist():
        want = model[row["g"]]
        assert row["i"] == _wrapped(want["i"])
        assert row["r"] == row["a"] == row["b"] == want["r"]
        assert abs(row["f"] - want["f"]) <= 1e-9 * max(1.0, abs(want["f"]))


def test_other_columns_are_left_to_hashing():
    keys = pa.array([1, 2, 1], pa.int64())
    s = np.array([1.0, 2.0, 3.0])
    assert dense_groups(pa.table({"g": pa.array([1, None, 1], pa.int64())}), ["g"],
                        {"s": s}) is None                                    # a null group
    assert dense_groups(pa.table({"g": pa.array(["a", "b", "a"])}), ["g"], {"s": s}) is None
    assert dense_groups(pa.table({"g": keys, "h": keys}), ["g", "h"], {"s": s}) is None
    assert dense_groups(pa.table({"g": keys}), ["g"],
                        {"s": pa.array([1, None, 2], pa.int64())}) is None   # a null partial
    # uint64 totals past what float64 holds exactly
    assert dense_groups(pa.table({"g": keys}), ["g"],
                        {"s": np.full(3, 2**62, np.uint64)}) is None
    assert dense_groups(pa.table({"g": keys}), ["g"], {"s": np.array([1, 2, 3], np.uint64)}
                        ).to_pylist() == [{"g": 1, "s": 4}, {"g": 2, "s": 2}]
