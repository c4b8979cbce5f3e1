"""The planner's rewrites against the plan as written, and DuckDB as the oracle.

Every query shape is run three ways on random data (nulls, duplicates, skew, empty
sides): through the public operators (lazy plans, rewritten by the planner), through the
eager operators as written (no rewrite), and as SQL in DuckDB. The three must agree, and
the rewritten output must have the written plan's schema. ``explain()`` must name the
rewrite each shape gets.
"""

from __future__ import annotations

import decimal
import math
from collections import Counter

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrangedb as adb
from arrangedb.ops.group_by import group_by as eager_group_by
from arrangedb.ops.join import join as eager_join

SETTINGS = settings(max_examples=10, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

AMOUNTS = ["int", "float2", "decimal"]


def _amounts(rng, n, kind):
    cents = rng.integers(-500, 100_000, n)
    mask = rng.random(n) < 0.1
    if kind == "int":
        return pa.array(cents, pa.int64(), mask=mask)
    if kind == "float2":
        return pa.array(np.round(cents / 100, 2), pa.float64(), mask=mask)
    return pa.array([None if m else decimal.Decimal(int(c)).scaleb(-2)
                     for c, m in zip(cents, mask)], pa.decimal128(12, 2))


def _tables(seed, n_fact, n_dim, amount, skew):
    rng = np.random.default_rng(seed)
    nkeys = max(n_dim, 1)
    k = rng.integers(0, nkeys + 3, n_fact)          # some facts match no dimension row
    if skew and n_fact:
        k[: n_fact // 4] = 1
    fact = pa.table({
        "k": pa.array(k, pa.int64()),
        "amount": _amounts(rng, n_fact, amount),
        "cat": pa.array(rng.choice(["a", "b", "c", None], n_fact).tolist(), pa.string()),
    })
    dk = rng.integers(0, nkeys, n_dim)               # duplicate dimension keys too
    dim = pa.table({
        "k": pa.array(dk, pa.int64()),
        "region": pa.array(rng.choice(["north", "south", "east", None], n_dim).tolist(),
                           pa.string()),
        "seg": pa.array(rng.integers(0, 3, n_dim), pa.int64()),
    })
    return fact, dim


def _rows(table: pa.Table) -> list:
    def norm(v):
        if isinstance(v, float):
            return round(v, 6) if math.isfinite(v) else v
        if isinstance(v, decimal.Decimal):
            return round(float(v), 6)
        return v
    return sorted((tuple(norm(v) for v in r.values()) for r in table.to_pylist()),
                  key=repr)


def _duck(query: str, fact: pa.Table, dim: pa.Table) -> pa.Table:
    con = duckdb.connect()
    con.register("f", fact)
    con.register("d", dim)
    return con.sql(query).to_arrow_table()


# shape -> (plan over (F, D) with the public or the eager operators, SQL, the rewrite)
SHAPES = {
    "fact_sums_by_dimension_string": (
        lambda J, G, F, D: G(J(F, D), by="region",
                             aggs={"n": ("count", None), "s": ("sum", "amount"),
                                   "m": ("mean", "amount")}),
        "SELECT region, count(*) AS n, sum(amount) AS s, avg(amount) AS m "
        "FROM f JOIN d USING (k) GROUP BY region",
        "eager aggregation"),
    "expanded_join_counted_by_two_dimension_columns": (
        lambda J, G, F, D: G(J(F, D, expand=True), by=["region", "seg"],
                             aggs={"n": ("count", None), "s": ("sum", "amount")}),
        "SELECT region, seg, count(*) AS n, sum(amount) AS s "
        "FROM f JOIN d USING (k) GROUP BY region, seg",
        "eager aggregation"),
    "groups_from_both_sides": (
        lambda J, G, F, D: G(J(F, D), by=["region", "cat"], aggs={"s": ("sum", "amount")}),
        "SELECT region, cat, sum(amount) AS s FROM f JOIN d USING (k) GROUP BY region, cat",
        "dictionary codes"),
    "min_and_max": (
        lambda J, G, F, D: G(J(F, D), by="region",
                             aggs={"lo": ("min", "amount"), "hi": ("max", "amount")}),
        "SELECT region, min(amount) AS lo, max(amount) AS hi "
        "FROM f JOIN d USING (k) GROUP BY region",
        "dictionary codes"),
    "left_join": (
        lambda J, G, F, D: G(J(F, D, how="left"), by="region", aggs={"n": ("count", None)}),
        "SELECT region, count(*) AS n FROM f LEFT JOIN d USING (k) GROUP BY region",
        "dictionary codes"),
    "grouped_on_the_key": (
        lambda J, G, F, D: G(J(F, D), by="k", aggs={"s": ("sum", "amount")}),
        "SELECT k, sum(amount) AS s FROM f JOIN d USING (k) GROUP BY k",
        "eager aggregation"),
}


def _arranged(engine, fact, dim):
    F = engine.arrange(fact, key=["k"], vals=["amount", "cat"], name="fact")
    D = engine.arrange(dim, key=["k"], vals=["region", "seg"], name="dim")
    return F, D


@pytest.mark.parametrize("shape", sorted(SHAPES))
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n_fact=st.sampled_from([0, 1, 57, 3000]),
       n_dim=st.sampled_from([0, 1, 40, 700]), amount=st.sampled_from(AMOUNTS),
       skew=st.booleans())
def test_a_rewritten_plan_equals_the_plan_as_written_and_duckdb(shape, seed, n_fact, n_dim,
                                                                amount, skew):
    build, query, rewrite = SHAPES[shape]
    fact, dim = _tables(seed, n_fact, n_dim, amount, skew)
    with adb.Engine(memory_budget="64MiB") as engine:
        F, D = _arranged(engine, fact, dim)
        plan = build(adb.join, adb.group_by, F, D)
        written = build(eager_join, eager_group_by, F, D).read_all()
        got = plan.read_all()
        assert got.schema.equals(written.schema, check_metadata=True), \
            f"{got.schema} vs {written.schema}"
        assert _rows(got) == _rows(written)
        assert _rows(got) == _rows(_duck(query, fact, dim))
        assert rewrite in plan.explain()


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), amount=st.sampled_from(AMOUNTS))
def test_the_changes_of_a_grouped_join_are_aggregated_eagerly_and_equal_two_snapshots(seed, amount):
    fact, dim = _tables(seed, 2000, 300, amount, skew=False)
    more, _ = _tables(seed + 1, 300, 0, amount, skew=False)
    with adb.Engine(memory_budget="64MiB") as engine:
        F, D = _arranged(engine, fact, dim)
        gone = fact.slice(0, 100)
        F.insert(pa.concat_tables([
            more.append_column("t", pa.array(np.ones(more.num_rows, np.uint64))).append_column(
                "d", pa.array(np.ones(more.num_rows, np.int64))),
            gone.append_column("t", pa.array(np.ones(100, np.uint64))).append_column(
                "d", pa.array(np.full(100, -1, np.int64)))]), time="t", diff="d")
        aggs = {"n": ("count", None), "s": ("sum", "amount")}
        plan = adb.group_by(adb.join(F, D, since=1, upto=2), by="region", aggs=aggs)
        assert "eager aggregation of changes" in plan.explain()
        change = plan.read_all()
        written = eager_group_by(eager_join(F, D, since=1, upto=2), by="region",
                                 aggs=aggs).read_all()
        assert change.schema.equals(written.schema, check_metadata=True)
        assert _rows(change) == _rows(written)
        before = adb.group_by(adb.join(F, D, at=0), by="region", aggs=aggs).read_all()
        after = adb.group_by(adb.join(F, D, at=1), by="region", aggs=aggs).read_all()
        net = {r["region"]: (r["n"], r["s"]) for r in after.to_pylist()}
        for r in before.to_pylist():
            n, s = net.get(r["region"], (0, 0))
            net[r["region"]] = (n - r["n"], (s or 0) - (r["s"] or 0))
        for r in change.to_pylist():
            n, s = net.pop(r["region"])
            assert n == r["n"]
            assert math.isclose(float(s or 0), float(r["s"] or 0), abs_tol=1e-6)
        assert all(n == 0 for n, _ in net.values())


def test_a_plan_that_asks_for_codes_is_rewritten_to_the_same_output():
    fact, dim = _tables(3, 500, 50, "int", skew=False)
    with adb.Engine(memory_budget="64MiB") as engine:
        F, D = _arranged(engine, fact, dim)
        plan = adb.group_by(adb.join(F, D, read_dictionary=["region"]), by="region",
                            aggs={"s": ("sum", "amount")})
        got = plan.read_all()
        assert "eager aggregation" in plan.explain()
        written = eager_group_by(eager_join(F, D, read_dictionary=["region"]), by="region",
                                 aggs={"s": ("sum", "amount")}).read_all()
        assert got.schema.equals(written.schema) and _rows(got) == _rows(written)


def test_a_shape_no_rule_fits_runs_as_written_and_says_so():
    fact, dim = _tables(4, 200, 20, "int", skew=False)
    with adb.Engine(memory_budget="64MiB") as engine:
        F, D = _arranged(engine, fact, dim)
        plan = adb.group_by(adb.join(F, D), by="seg", aggs={"n": ("count", "count")})
        text = plan.explain()
        assert "rewrites: none" in text and "trace 'fact'" in text
        assert plan.read_all().num_rows == len(set(dim.column("seg").to_pylist()))


# -- the plan type ---------------------------------------------------------------------------

def test_a_plan_runs_when_consumed_and_each_time_at_the_latest_time():
    with adb.Engine(memory_budget="64MiB") as engine:
        F = engine.arrange(pa.table({"k": [1, 2], "v": [10, 20]}), key=["k"], vals=["v"])
        D = engine.arrange(pa.table({"k": [1, 2], "r": ["x", "y"]}), key=["k"], vals=["r"])
        plan = adb.group_by(adb.join(F, D), by="r", aggs={"s": ("sum", "v")})
        assert isinstance(plan, adb.Plan) and plan.schema.names == ["r", "s"]
        first = plan.read_all().sort_by("r").to_pydict()
        F.insert(pa.table({"k": [1], "v": [5]}))   # after the plan was made
        second = plan.read_all().sort_by("r").to_pydict()
        assert first == {"r": ["x", "y"], "s": [10, 20]}
        assert second == {"r": ["x", "y"], "s": [15, 20]}
        assert sum(b.num_rows for b in plan) == 2 and len(plan.to_batches()) >= 1
        assert plan.to_pandas().shape == (2, 2)


def test_a_plan_is_an_arrow_stream_for_pyarrow_duckdb_and_the_engine():
    with adb.Engine(memory_budget="64MiB") as engine:
        F = engine.arrange(pa.table({"k": [1, 1, 2], "v": [1, 2, 3]}), key=["k"], vals=["v"])
        plan = adb.reduce(F, {"s": ("sum", "v")})
        assert pa.table(plan).sort_by("k").to_pydict() == {"k": [1, 2], "s": [3, 3]}
        assert sorted(duckdb.sql("SELECT k, s FROM plan").fetchall()) == [(1, 3), (2, 3)]
        again = engine.arrange(plan, key=["k"], vals=["s"])
        assert again.snapshot().read_all().column("s").to_pylist() == [3, 3]
        grouped = adb.group_by(plan, by="s", aggs={"n": ("count", None)})
        assert grouped.read_all().to_pydict() == {"s": [3], "n": [2]}


def test_a_plan_is_read_in_the_batches_its_consumer_asks_for_unless_it_gave_its_own(
        monkeypatch):
    """``to_reader(batch_rows=)`` sizes the last operator's batches when the plan left
    them to it; ``engine.arrange`` asks for batches as large as its runs take."""
    from arrangedb.ops import plan as plan_module

    n = 3000
    t = pa.table({"k": np.arange(n), "v": np.arange(n) % 7})
    with adb.Engine(memory_budget="64MiB") as engine:
        F = engine.arrange(t, key=["k"], vals=["v"])
        D = engine.arrange(pa.table({"k": np.arange(n), "r": np.arange(n) % 3}), key=["k"],
                           vals=["r"])
        joined = adb.join(F, D)
        assert [b.num_rows for b in joined.to_reader(batch_rows=1000)] == [1000] * 3
        given = adb.join(F, D, batch_rows=500)
        assert {b.num_rows for b in given.to_reader(batch_rows=1000)} == {500}
        by_position = adb.join(F, D, None, "inner", None, None, False, 500)
        assert {b.num_rows for b in by_position.to_reader(batch_rows=1000)} == {500}
        assert engine.arrange(by_position, key=["k"]).snapshot().read_all().num_rows == n
        asked = []
        real = plan_module.Node.open
        monkeypatch.setattr(plan_module.Node, "open", lambda self, batch_rows=None: (
            asked.append(batch_rows) or real(self, batch_rows)))
        again = engine.arrange(joined, key=["r"], vals=["v"])
        assert asked and asked[0] >= 1 << 16
        got = again.snapshot().read_all().to_pydict()
        counts = Counter(zip(np.arange(n) % 3, np.arange(n) % 7))
        assert dict(zip(zip(got["r"], got["v"]), got["count"])) == counts


def test_a_rewritten_plan_is_read_in_the_batches_its_consumer_asks_for():
    """The planner's rewrites (eager aggregation, dictionary codes and the cast back to
    the written types) leave the batch size to the consumer as the written plan did."""
    n = 3000
    with adb.Engine(memory_budget="64MiB") as engine:
        F = engine.arrange(pa.table({"k": np.arange(n), "v": np.arange(n) % 7}), key=["k"],
                           vals=["v"])
        D = engine.arrange(pa.table({"k": np.arange(n), "r": np.arange(n),
                                     "s": [f"s{i}" for i in range(n)]}),
                           key=["k"], vals=["r", "s"])
        for by, aggs, rule in (("r", {"n": ("count", None), "t": ("sum", "v")}, "eager"),
                               ("s", {"n": ("count", None), "t": ("sum", "v")}, "eager"),
                               ("s", {"n": ("count", None), "t": ("max", "v")}, "dictionary")):
            plan = adb.group_by(adb.join(F, D), by=by, aggs=aggs)
            assert f"- {rule}" in plan.explain()
            assert [b.num_rows for b in plan.to_reader(batch_rows=1000)] == [1000] * 3
            given = adb.group_by(adb.join(F, D), by=by, aggs=aggs, batch_rows=500)
            assert {b.num_rows for b in given.to_reader(batch_rows=1000)} == {500}


def test_a_plan_over_a_one_shot_stream_runs_once_and_then_says_why_not():
    t = pa.table({"g": ["a", "b", "a"], "x": [1, 2, 3]})
    with adb.Engine(memory_budget="64MiB"):
        plan = adb.group_by(pa.RecordBatchReader.from_batches(t.schema, t.to_batches()),
                            by="g", aggs={"s": ("sum", "x")})
        assert plan.read_all().sort_by("g").to_pydict() == {"g": ["a", "b"], "s": [4, 2]}
        with pytest.raises(RuntimeError, match="one-shot"):
            plan.read_all()
        table_plan = adb.group_by(t, by="g", aggs={"s": ("sum", "x")})
        assert table_plan.read_all().equals(table_plan.read_all())


def test_bad_arguments_fail_where_the_plan_is_written():
    with adb.Engine(memory_budget="64MiB") as engine:
        F = engine.arrange(pa.table({"k": [1], "v": [1]}), key=["k"], vals=["v"])
        with pytest.raises(KeyError, match="nope"):
            adb.group_by(adb.join(F, F), by="nope", aggs={"n": ("count", None)})
        with pytest.raises(ValueError, match="how"):
            adb.join(F, F, how="outer")


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), amount=st.sampled_from(AMOUNTS),
       retract=st.booleans(), pieces=st.integers(2, 5))
def test_eager_aggregation_over_an_unmerged_trace_equals_the_plan_as_written(
        seed, amount, retract, pieces):
    """The runs of several inserts, read side by side without a merge (or merged, when a
    batch retracts): the same answer as the written plan and DuckDB."""
    fact, dim = _tables(seed, 4000, 300, amount, skew=True)
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, fact.num_rows), pieces - 1, replace=False))
    chunks = [fact.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, fact.num_rows])]
    aggs = {"n": ("count", None), "s": ("sum", "amount"), "m": ("mean", "amount")}
    # no idle merger: the runs must stay unmerged until the plan reads them
    with adb.Engine(memory_budget="64MiB", idle_merge=False) as engine:
        F = engine.arrange(chunks[0], key=["k"], vals=["amount", "cat"], name="fact")
        for c in chunks[1:]:
            F.insert(c)
        D = engine.arrange(dim, key=["k"], vals=["region", "seg"], name="dim")
        kept = fact
        if retract:
            gone = chunks[0].slice(0, 50)
            F.insert(gone.append_column("d", pa.array(np.full(50, -1, np.int64))), diff="d")
            kept = pa.concat_tables([chunks[0].slice(50), *chunks[1:]])
        assert len(F.batches()) > 1
        plan = adb.group_by(adb.join(F, D), by="region", aggs=aggs)
        got = plan.read_all()
        written = eager_group_by(eager_join(F, D), by="region", aggs=aggs).read_all()
        assert got.schema.equals(written.schema, check_metadata=True)
        assert _rows(got) == _rows(written)
        assert _rows(got) == _rows(_duck(
            "SELECT region, count(*) AS n, sum(amount) AS s, avg(amount) AS m "
            "FROM f JOIN d USING (k) GROUP BY region", kept, dim))


@pytest.mark.parametrize("seed", [4, 8, 16])
def test_group_values_new_in_a_later_batch_keep_their_groups(tmp_path, seed):
    """A dimension whose inserts bring group values its first batch lacks: each batch
    codes the strings with its own dictionary, and a block holds chunks of several. The
    grouping remaps them to one dictionary (they were once read with the first one's,
    putting rows in a null group). Idle merging off: the batches must stay apart."""
    rng = np.random.default_rng(seed)
    aggs = {"n": ("count", None), "s": ("sum", "y")}
    with adb.Engine(spill_dir=tmp_path, memory_budget="64MiB", idle_merge=False) as e:
        facts = e.arrange(pa.table({"k": pa.array(rng.integers(0, 40, 400)),
                                    "y": pa.array(rng.integers(0, 1000, 400))}),
                          key=["k"], vals=["y"])
        dims = e.arrange(pa.table({"k": pa.array(np.arange(0, 40, 2)),
                                   "g": pa.array(rng.choice(["a", "b", "c"], 20))}),
                         key=["k"], vals=["g"])
        for _ in range(2):
            dims.insert(pa.table({"k": pa.array(rng.integers(0, 40, 5)),
                                  "g": pa.array(rng.choice(["a", "d"], 5))}))
        plan = adb.group_by(adb.join(facts, dims), by="g", aggs=aggs)
        assert "eager aggregation" in plan.explain()
        got = plan.read_all().sort_by("g")
        want = eager_group_by(eager_join(facts, dims), by="g", aggs=aggs).read_all()
        assert got.to_pydict() == want.sort_by("g").to_pydict()
        assert None not in got.column("g").to_pylist()


def test_a_grouped_left_join_whose_later_chunks_hold_only_nulls(tmp_path):
    """group_by over a left join, on a string of the left side, summing a right-side
    column: the first chunks of the join's output have no null sums, the later ones only
    nulls (their keys have no right row), so their partials share arrays differently;
    the chunks' partials still concatenate, and the result is the plan's as written."""
    n = 200_000
    rng = np.random.default_rng(0)
    k = np.arange(n)
    aggs = {"n": ("count", None), "p": ("sum", "price")}
    with adb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        left = e.arrange(pa.table({"k": k, "st": rng.choice(["a", "b", "c"], n)}),
                         key=["k"], vals=["st"])
        right = e.arrange(pa.table({"k": k[: n // 2], "price": np.ones(n // 2)}),
                          key=["k"], vals=["price"])
        got = adb.group_by(adb.join(left, right, how="left"), by="st", aggs=aggs).read_all()
        written = eager_group_by(eager_join(left, right, how="left"), by="st",
                                 aggs=aggs).read_all()
    assert got.sort_by("st").to_pylist() == written.sort_by("st").to_pylist()
