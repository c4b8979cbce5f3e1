"""dense_groups: partials summed per slot of a narrow integer group column, against a
plain model (Python integers wrapped to int64, float sums, rows counted per group)."""

from __future__ import annotations

import numpy as np
import pytest
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from arrangedb.ops.dense_groups import (MAX_SLOTS, SLOTS_FLOOR, SLOTS_PER_ROW, SlotTotals,
                                        dense_groups)


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


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 400), st.integers(-300, 300), st.booleans()),
                min_size=1, max_size=6), st.integers(50, 2000), st.integers(0, 2**32 - 1))
def test_slot_totals_equal_a_plain_model(chunks, max_slots, seed):
    """Grouped partials of chunks (distinct groups within each, a null group in some)
    added per slot, the range growing either way; a chunk that would widen it past
    ``max_slots`` is refused whole and leaves the totals as they were."""
    rng = np.random.default_rng(seed)
    schema = pa.schema([("g", pa.int32()), ("n", pa.int64()), ("s", pa.float64())])
    totals = SlotTotals.for_partials(schema, ["g"], max_slots, frozenset({"n", "s"}))
    model: dict = {}
    for size, shift, null in chunks:
        keys = rng.choice(np.arange(size + 1), size=size, replace=False) + shift * 3
        n = rng.integers(-5, 6, size)
        s = np.round(rng.random(size) * 10, 2)
        part = pa.table({"g": pa.array(keys, pa.int32()), "n": n, "s": s}, schema=schema)
        if null:
            part = pa.concat_tables([part, pa.table({"g": pa.nulls(1, pa.int32()), "n": [7],
                                                     "s": [1.5]}, schema=schema)])
        before = totals.table()
        left = totals.add(part)
        values = [k for k in list(model) + keys.tolist() if k is not None]
        if values and max(values) - min(values) + 1 > max_slots:
            assert left is None and totals.table().equals(before)
            continue
        assert left.num_rows == int(null) and left.column("g").null_count == int(null)
        for k, a, b in zip(keys.tolist(), n.tolist(), s.tolist()):
            t = model.setdefault(k, [0, 0.0])
            t[0] += a
            t[1] += b
    got = totals.table()
    assert got.schema.field("g").type == pa.int32()
    assert got.column("g").to_pylist() == sorted(model)
    for row in got.to_pylist():
        assert row["n"] == model[row["g"]][0]
        assert abs(row["s"] - model[row["g"]][1]) <= 1e-9 * max(1.0, abs(model[row["g"]][1]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 400), st.booleans()),
                min_size=1, max_size=5), st.booleans(), st.integers(0, 2**32 - 1))
def test_slot_totals_add_rows_whose_groups_repeat(chunks, huge, seed):
    """Uncombined partial rows (a group on many rows of a chunk) added per slot, by a
    count over the range when the rows are many beside it and row by row when few;
    ``huge``: integer sums past what a float64 count holds exactly."""
    rng = np.random.default_rng(seed)
    schema = pa.schema([("g", pa.int64()), ("n", pa.int64()), ("s", pa.float64())])
    totals = SlotTotals.for_partials(schema, ["g"], 1 << 16, frozenset({"n", "s"}))
    model: dict = {}
    for rows, spread, null in chunks:
        keys = rng.integers(-spread, spread, rows)
        n = rng.integers(-2**40, 2**40, rows) if huge else rng.integers(-5, 6, rows)
        s = np.round(rng.random(rows) * 10, 2)
        part = pa.table({"g": pa.array(keys, mask=(rng.random(rows) < 0.1) if null else None),
                         "n": n, "s": s}, schema=schema)
        left = totals.add(part, distinct=False)
        assert left.num_rows == part.column("g").null_count
        for k, a, b, ok in zip(keys.tolist(), n.tolist(), s.tolist(),
                               part.column("g").is_valid().to_pylist()):
            if ok:
                t = model.setdefault(k, [0, 0.0])
                t[0] += a
                t[1] += b
    got = totals.table()
    assert got.column("g").to_pylist() == sorted(model)
    for row in got.to_pylist():
        assert row["n"] == model[row["g"]][0]
        assert abs(row["s"] - model[row["g"]][1]) <= 1e-9 * max(1.0, abs(model[row["g"]][1]))


def test_slot_totals_refuse_uncombined_rows_of_another_type():
    totals = SlotTotals.for_partials(pa.schema([("g", pa.int64()), ("n", pa.int64())]),
                                     ["g"], 100, frozenset({"n"}))
    assert totals.add(pa.table({"g": [1, 1], "n": [1.0, 2.0]}), distinct=False) is None
    assert totals.table().num_rows == 0


def test_slot_totals_take_counts_and_sums_of_integer_groups_only():
    ints = pa.schema([("g", pa.int64()), ("n", pa.int64())])
    added = frozenset({"n", "s"})
    assert SlotTotals.for_partials(ints, ["g"], 100, added) is not None
    assert SlotTotals.for_partials(ints, ["g", "n"], 100, added) is None
    assert SlotTotals.for_partials(pa.schema([("g", pa.string()), ("n", pa.int64())]),
                                   ["g"], 100, added) is None
    assert SlotTotals.for_partials(pa.schema([("g", pa.int64()), ("m", pa.string())]),
                                   ["g"], 100, added) is None   # a min or max of strings
    for t in (pa.int64(), pa.float64()):   # a min or max of numbers does not add up either
        assert SlotTotals.for_partials(pa.schema([("g", pa.int64()), ("m", t)]),
                                       ["g"], 100, added) is None
    assert SlotTotals.for_partials(pa.schema([("g", pa.int64()),
                                              ("s", pa.decimal128(38, 2))]), ["g"], 100,
                                   added) is None


@pytest.mark.parametrize("group_type", [pa.int64(), pa.int8()])
def test_mins_and_maxes_over_many_chunks_of_integer_groups_equal_duckdb(group_type):
    """Per-chunk mins and maxes are compared across chunks, never added: a 300k-row
    table at 64 MiB reaches the grouping in several chunks."""
    import duckdb

    import arrangedb as adb

    n = 300_000
    rng = np.random.default_rng(0)
    t = pa.table({"g": pa.array(rng.integers(0, 3, n), group_type),
                  "v": pa.array(rng.integers(-10, 10, n), pa.int64()),
                  "f": pa.array(rng.random(n), pa.float64())})
    aggs = {"mx": ("max", "v"), "mn": ("min", "v"), "fmax": ("max", "f"),
            "fmin": ("min", "f"), "n": ("count", None), "s": ("sum", "v")}
    with adb.Engine(memory_budget="64MiB"):
        got = adb.group_by(t, by="g", aggs=aggs).read_all().sort_by("g")
    want = duckdb.sql("SELECT g, max(v) AS mx, min(v) AS mn, max(f) AS fmax, min(f) AS fmin, "
                      "count(*) AS n, sum(v) AS s FROM t GROUP BY g ORDER BY g").to_arrow_table()
    assert got.select(want.column_names).to_pydict() == want.to_pydict()


@pytest.mark.parametrize("widen", [False, True])
def test_group_by_over_many_chunks_adds_partials_per_slot(tmp_path, monkeypatch, widen):
    """A grouping of a stream of many chunks on an integer column keeps one running
    total per slot (no partial tables held, combined or spilled) and gives DuckDB's
    result, null group included; ``widen``: a late chunk's values reach past what the
    slots may hold, and the grouping goes on the general way from there."""
    import duckdb

    from arrangedb import Engine, group_by

    added = []
    add = SlotTotals.add
    monkeypatch.setattr(SlotTotals, "add", lambda self, part, **kw: (
        lambda left: added.append(left is not None) or left)(add(self, part, **kw)))
    rng = np.random.default_rng(8)
    n = 400_000
    keys = rng.integers(-10_000, 10_000, n)
    if widen:
        keys[-50_000:] = rng.integers(0, 10_000_000, 50_000)
    t = pa.table({"k": pa.array(keys, mask=rng.random(n) < 0.01),
                  "x": np.round(rng.random(n) * 100, 2), "i": rng.integers(-9, 9, n)})
    batches = t.to_batches(max_chunksize=20_000)
    with Engine(spill_dir=tmp_path, memory_budget="16MiB") as e:
        got = group_by(pa.RecordBatchReader.from_batches(t.schema, iter(batches)), by="k",
                       aggs={"n": ("count", None), "sx": ("sum", "x"), "si": ("sum", "i"),
                             "m": ("mean", "i")}, engine=e).read_all()
    assert len(added) > 3 and all(added[:3]) and (not all(added)) == widen
    con = duckdb.connect()
    con.register("t", t)
    want = con.sql("select k, count(*) n, sum(x) sx, sum(i) si, avg(i) m from t group by k "
                   "order by k nulls last").to_arrow_table()
    got = got.sort_by([("k", "ascending")])
    got = got.take(np.argsort(got.column("k").is_null().to_numpy(zero_copy_only=False),
                              kind="stable"))
    for c in ("k", "n", "si"):
        assert got.column(c).to_pylist() == want.column(c).to_pylist()
    # partials spilled through an arrangement are summed off running sums per block
    # (the general path, after widening): the last bits of small sums move
    np.testing.assert_allclose(got.column("sx").to_numpy(), want.column("sx").to_numpy(),
                               rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(got.column("m").to_numpy(), want.column("m").to_numpy(),
                               rtol=1e-9, atol=1e-6)
