"""Right by default: multiplicities survive every step, change streams aggregate as
changes, operators run in their inputs' engine, stats mean what they say.

Each trap a user fell into writing queries from the README alone is a regression test
here, through the public API; a property test composes random pipelines (join ->
arrange -> join -> group_by, with duplicates and retractions) and checks them against
DuckDB on the same data.
"""

from __future__ import annotations

import os
from collections import Counter

import duckdb
import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings

import arrangedb as adb

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def sql(query: str, **tables) -> pa.Table:
    con = duckdb.connect()
    for name, t in tables.items():
        con.register(name, t)
    return con.sql(query).to_arrow_table()


def rows(table: pa.Table, columns) -> Counter:
    return Counter(tuple(r[c] for c in columns) for r in table.to_pylist())


@pytest.fixture
def engine(tmp_path):
    with adb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        yield e


def _two_hop(rng, n_lines=3000, n_orders=400, n_customers=60):
    """lineitem (duplicated rows: equal revenue on one order), orders, customers."""
    lines = pa.table({"l_orderkey": rng.integers(0, n_orders, n_lines),
                      "revenue": rng.integers(1, 5, n_lines)})   # few values: duplicates
    orders = pa.table({"o_orderkey": np.arange(n_orders),
                       "o_custkey": rng.integers(0, n_customers, n_orders)})
    customers = pa.table({"c_custkey": np.arange(n_customers),
                          "nation": pa.array([f"n{i % 7}" for i in range(n_customers)])})
    return lines, orders, customers


def test_rearranging_a_join_keeps_its_duplicates(engine):
    """The reported loss: re-arranging a join's output by another key dropped the
    join's count unless diff="count" was passed; revenue vanished with no error."""
    lines, orders, customers = _two_hop(np.random.default_rng(1))
    L = engine.arrange(lines, key=["l_orderkey"], vals=["revenue"])
    O = engine.arrange(orders, key=["o_orderkey"], vals=["o_custkey"])
    C = engine.arrange(customers, key=["c_custkey"], vals=["nation"])
    by_customer = engine.arrange(adb.join(L, O), key=["o_custkey"], vals=["revenue"])
    got = adb.group_by(adb.join(by_customer, C), by="nation",
                       aggs={"revenue": ("sum", "revenue"), "n": ("count", None)}).read_all()
    want = sql("select nation, sum(revenue) revenue, count(*) n from lines "
               "join orders on l_orderkey = o_orderkey join customers on o_custkey = c_custkey "
               "group by nation", lines=lines, orders=orders, customers=customers)
    assert rows(got, ["nation", "revenue", "n"]) == rows(want, ["nation", "revenue", "n"])
    # dropping the multiplicity is a choice, made explicitly
    dropped = engine.arrange(adb.join(L, O), key=["o_custkey"], vals=["revenue"], diff=False)
    assert dropped.stats()["updates"] < by_customer.stats()["updates"] or \
        sum(dropped.snapshot().read_all().column("count").to_pylist()) < lines.num_rows


def test_insert_takes_a_streams_weight_and_time(engine):
    A = engine.arrange(pa.table({"k": [1, 2], "v": ["a", "b"]}), key=["k"], vals=["v"])
    B = engine.arrange(pa.table({"k": [1, 1, 2], "w": ["x", "x", "y"]}), key=["k"], vals=["w"])
    T = engine.arrange(pa.table({"k": pa.array([], pa.int64()), "v": pa.array([], pa.string())}),
                       key=["k"], vals=["v"])
    T.insert(adb.join(A, B).read_all().select(["k", "v", "count"]))
    assert rows(T.snapshot().read_all(), ["k", "v", "count"]) == \
        Counter({(1, "a", 2): 1, (2, "b", 1): 1})
    # a change stream carries its times: inserted at them, with its diffs
    A.insert(pa.table({"k": [1], "v": ["a"], "t": pa.array([3], pa.uint64()), "d": [-1]}),
             time="t", diff="d")
    T.insert(adb.join(A, B, since=3, upto=4).read_all().select(["k", "v", "time", "diff"]))
    assert rows(T.snapshot(at=2).read_all(), ["k", "count"]) == Counter({(1, 2): 1, (2, 1): 1})
    assert rows(T.snapshot().read_all(), ["k", "count"]) == Counter({(2, 1): 1})


def test_group_by_over_changes_nets_retractions(engine):
    """The reported trap: a retraction (diff -1) counted +1."""
    orders = engine.arrange(pa.table({"c": [1, 1, 2], "amount": [10, 20, 30]}), key=["c"],
                            vals=["amount"])
    customers = engine.arrange(pa.table({"c": [1, 2], "region": ["eu", "us"]}), key=["c"],
                               vals=["region"])
    orders.insert(pa.table({"c": [1, 2], "amount": [20, 5], "t": pa.array([1, 1], pa.uint64()),
                            "d": [-1, 1]}), time="t", diff="d")
    changes = adb.join(orders, customers, since=1, upto=2)
    got = adb.group_by(changes, by="region",
                       aggs={"n": ("count", None), "s": ("sum", "amount")}).read_all()
    assert rows(got, ["region", "n", "s"]) == Counter({("eu", -1, -20): 1, ("us", 1, 5): 1})
    for fn in ("min", "max", "mean"):
        with pytest.raises(ValueError, match=r"not linear.*reduce\(trace, aggs, since=, upto=\)"):
            adb.group_by(adb.join(orders, customers, since=1, upto=2), by="region",
                         aggs={"x": (fn, "amount")}).read_all()
    # the same stream with its weight dropped on purpose counts rows
    n = adb.group_by(adb.join(orders, customers, since=1, upto=2), by="region",
                     aggs={"n": ("count", None)}, weight=False).read_all()
    assert rows(n, ["region", "n"]) == Counter({("eu", 1): 1, ("us", 1): 1})


def test_group_by_runs_in_the_engine_of_its_input(tmp_path):
    """group_by made a second engine (its own budget, a spill directory under $TMPDIR)."""
    t = pa.table({"k": np.arange(5000), "g": np.arange(5000) % 1000, "x": np.ones(5000)})
    spill_a, spill_b = tmp_path / "a", tmp_path / "b"
    spill_a.mkdir()
    spill_b.mkdir()
    with adb.Engine(spill_dir=spill_a, memory_budget="64MiB") as a, \
            adb.Engine(spill_dir=spill_b, memory_budget="64MiB") as b:
        ta = a.arrange(t, key=["k"])
        tb = b.arrange(t, key=["k"])
        before = set(os.listdir(os.environ.get("TMPDIR", "/tmp")))
        got = adb.group_by(adb.join(ta, tb), by="left_g",
                           aggs={"n": ("count", None)}).read_all()
        assert got.num_rows == 1000   # ran, in a's engine: the stream names it
        assert set(os.listdir(os.environ.get("TMPDIR", "/tmp"))) - before == set()
        with pytest.raises(ValueError, match="2 engines are open.*engine="):
            adb.group_by(t, by="g", aggs={"n": ("count", None)})
        assert adb.group_by(t, by="g", aggs={"n": ("count", None)}, engine=b).read_all() \
            .num_rows == 1000
    with pytest.raises(ValueError, match="none is open"):
        adb.group_by(t, by="g", aggs={"n": ("count", None)})


def test_stats_keys_are_distinct_keys(tmp_path):
    """keys summed over batches: 1.47M reported for ~500k distinct customers."""
    rng = np.random.default_rng(3)
    # no idle merger: the keys must be counted over batches that are still apart
    with adb.Engine(spill_dir=tmp_path, memory_budget="64MiB", idle_merge=False) as engine:
        t = engine.arrange(pa.table({"k": rng.integers(0, 500, 4000),
                                     "v": rng.random(4000)}), key=["k"])
        for i in range(3):
            t.insert(pa.table({"k": rng.integers(0, 700, 500), "v": rng.random(500)}))
        assert t.stats()["batches"] > 1
        snap = t.snapshot().read_all()
        assert t.stats()["keys"] == len(set(snap.column("k").to_pylist()))
        t.merge_all()
        assert t.stats()["keys"] == len(set(snap.column("k").to_pylist()))


def test_join_output_columns(engine):
    """The key keeps the left side's name, the right key is not repeated; keys of
    different names join; clashing val names are prefixed."""
    L = engine.arrange(pa.table({"o_custkey": [1, 2], "v": [1, 2]}), key=["o_custkey"])
    R = engine.arrange(pa.table({"c_custkey": [1, 3], "v": [5, 6]}), key=["c_custkey"])
    out = adb.join(L, R).read_all()
    assert out.column_names == ["o_custkey", "left_v", "right_v", "count"]
    assert out.schema.field("count").metadata == {b"arrangedb.role": b"weight"}
    changes = adb.join(L, R, since=0, upto=1).read_all()
    assert changes.column_names[-2:] == ["time", "diff"]


# -- random pipelines against DuckDB -------------------------------------------------------

@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(1, 300), st.integers(1, 30),
       st.integers(1, 12), st.booleans())
def test_random_pipelines_match_duckdb(tmp_path_factory, seed, n, nk1, nk2, skew):
    """join -> arrange by another key -> join -> group_by, with duplicate rows, rows
    retracted again, and (incremental) the changes of a later insert."""
    rng = np.random.default_rng(seed)
    k1 = rng.integers(0, nk1, n)
    if skew:
        k1[: n // 2] = 0
    A = pa.table({"k1": k1, "x": rng.integers(-3, 4, n), "d": np.ones(n, np.int64)})
    # retract some rows again (a multiset never goes below zero)
    back = A.slice(0, n // 4)
    A_all = pa.concat_tables([A, back.set_column(2, "d", pa.array(-np.ones(back.num_rows,
                                                                           np.int64)))])
    B = pa.table({"b1": rng.integers(0, nk1, 2 * nk1), "k2": rng.integers(0, nk2, 2 * nk1)})
    C = pa.table({"c2": np.arange(nk2), "g": pa.array([f"g{i % 3}" for i in range(nk2)])})
    delta = pa.table({"k1": rng.integers(0, nk1, n // 3 + 1),
                      "x": rng.integers(-3, 4, n // 3 + 1),
                      "t": pa.array(np.ones(n // 3 + 1, np.uint64)),
                      "d": np.ones(n // 3 + 1, np.int64)})
    with adb.Engine(spill_dir=tmp_path_factory.mktemp("p"), memory_budget="32MiB") as e:
        ta = e.arrange(A_all, key=["k1"], vals=["x"], diff="d")
        tb = e.arrange(B, key=["b1"], vals=["k2"])
        tc = e.arrange(C, key=["c2"], vals=["g"])
        mid = e.arrange(adb.join(ta, tb), key=["k2"], vals=["x"])
        got = adb.group_by(adb.join(mid, tc), by="g",
                           aggs={"n": ("count", None), "s": ("sum", "x")}).read_all()
        # incremental: the delta's changes through the first join, re-arranged as changes
        ta.insert(delta, time="t", diff="d")
        mid.insert(adb.join(ta, tb, since=1, upto=2))
        change = adb.group_by(adb.join(mid, tc, since=1, upto=2), by="g",
                              aggs={"n": ("count", None), "s": ("sum", "x")}).read_all()
    base = sql("select * from A where 1=1 except all select k1, x, 1 from back",
               A=A, back=back.select(["k1", "x", "d"]))
    query = ("select g, count(*) n, sum(x) s from {src} a join B on k1 = b1 "
             "join C on k2 = c2 group by g")
    want = sql(query.format(src="base"), base=base, B=B, C=C)
    assert rows(got, ["g", "n", "s"]) == rows(want, ["g", "n", "s"])
    after = pa.concat_tables([base.select(["k1", "x"]), delta.select(["k1", "x"])])
    want_after = sql(query.format(src="after"), after=after, B=B, C=C)
    before = {r["g"]: (r["n"], r["s"]) for r in want.to_pylist()}
    expected = Counter()
    for r in want_after.to_pylist():
        n0, s0 = before.pop(r["g"], (0, 0))
        if (r["n"] - n0, r["s"] - s0) != (0, 0):
            expected[(r["g"], r["n"] - n0, r["s"] - s0)] += 1
    for g, (n0, s0) in before.items():
        expected[(g, -n0, -s0)] += 1
    got_change = Counter((r["g"], r["n"], r["s"]) for r in change.to_pylist()
                         if (r["n"], r["s"]) != (0, 0))
    assert got_change == expected
