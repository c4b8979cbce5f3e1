"""Eager aggregation of a grouped join's changes against the plan as written.

``group_by(join(A, B, since=, upto=), by, aggs)`` is rewritten to sum A's changes per key
below the join where only A changed (:mod:`arrangedb.ops.join_group_by_changes`). On
random traces taking random deltas -- to the summed side, to the grouped side, to both,
at several times, with retractions, nulls, duplicate dimension rows and decimals -- and
every window of times, the rewritten plan must give the written plan's groups (a group
whose changes net to zero included), counts and sums, with its schema.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrangedb as adb
from arrangedb.ops.group_by import group_by as eager_group_by
from arrangedb.ops.join import join as eager_join
from test_planner import _amounts, _rows

# shape -> (group columns, aggregates); the summed side is the fact side unless said
SHAPES = {
    "sums_by_dimension_string": ("region", {"n": ("count", None), "s": ("sum", "amount")}),
    "valid_counts_by_two_dimension_columns": (["region", "seg"],
                                              {"c": ("count", "amount"),
                                               "s": ("sum", "amount")}),
    "sums_by_key": ("k", {"s": ("sum", "amount"), "n": ("count", None)}),
    "counts_by_dimension_integer": ("seg", {"n": ("count", None)}),
    "dimension_summed_by_fact_string": ("cat", {"s": ("sum", "seg"), "n": ("count", None)}),
}


def _fact(rng, n, nkeys, amount):
    return pa.table({"k": pa.array(rng.integers(0, nkeys, n), pa.int64()),
                     "amount": _amounts(rng, n, amount),
                     "cat": pa.array(rng.choice(["a", "b", None], n).tolist(), pa.string())})


def _dim(rng, n, nkeys):
    return pa.table({"k": pa.array(rng.integers(0, nkeys, n), pa.int64()),
                     "region": pa.array(rng.choice(["north", "south", "east", None],
                                                   n).tolist(), pa.string()),
                     "seg": pa.array(rng.integers(0, 3, n), pa.int64())})


def _delta(rng, table: pa.Table, fresh: pa.Table, time: int) -> pa.Table:
    """Some of ``table``'s rows retracted and ``fresh`` inserted, at ``time``."""
    gone = table.take(pa.array(rng.choice(table.num_rows, min(table.num_rows, 15),
                                          replace=False))) if table.num_rows else table
    both = pa.concat_tables([gone, fresh])
    diff = np.concatenate([np.full(gone.num_rows, -1), np.ones(fresh.num_rows, np.int64)])
    return both.append_column("t", pa.array(np.full(both.num_rows, time), pa.uint64())) \
        .append_column("d", pa.array(diff, pa.int64()))


@pytest.mark.parametrize("shape", sorted(SHAPES))
@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), amount=st.sampled_from(["int", "float2", "decimal"]),
       changed=st.lists(st.sampled_from(["fact", "dim", "both"]), min_size=1, max_size=3),
       since=st.integers(0, 3), width=st.sampled_from([1, 2, None]))
def test_the_rewritten_changes_equal_the_plan_as_written(shape, seed, amount, changed, since,
                                                         width):
    by, aggs = SHAPES[shape]
    rng = np.random.default_rng(seed)
    nkeys = int(rng.integers(5, 60))
    fact, dim = _fact(rng, 300, nkeys, amount), _dim(rng, 40, nkeys)
    upto = None if width is None else since + width
    with adb.Engine(memory_budget="64MiB", idle_merge=False) as engine:
        F = engine.arrange(fact, key=["k"], vals=["amount", "cat"], name="fact")
        D = engine.arrange(dim, key=["k"], vals=["region", "seg"], name="dim")
        for time, which in enumerate(changed, start=1):
            if which in ("fact", "both"):
                F.insert(_delta(rng, fact, _fact(rng, 10, nkeys + 2, amount), time),
                         time="t", diff="d")
            if which in ("dim", "both"):
                D.insert(_delta(rng, dim, _dim(rng, 4, nkeys + 2), time), time="t", diff="d")
        left, right = (D, F) if shape.startswith("dimension_summed") else (F, D)
        plan = adb.group_by(adb.join(left, right, since=since, upto=upto), by=by, aggs=aggs)
        assert "eager aggregation of changes" in plan.explain()
        got = plan.read_all()
        written = eager_group_by(eager_join(left, right, since=since, upto=upto), by=by,
                                 aggs=aggs).read_all()
        assert got.schema.equals(written.schema, check_metadata=True), \
            f"{got.schema} vs {written.schema}"
        assert _rows(got) == _rows(written)


def test_a_group_whose_changes_net_to_zero_is_still_a_group_with_its_null_sums():
    with adb.Engine(memory_budget="64MiB", idle_merge=False) as engine:
        A = engine.arrange(pa.table({"k": [1, 2, 3], "x": [10, 20, None]}), key=["k"],
                           vals=["x"])
        B = engine.arrange(pa.table({"k": [1, 2, 3], "g": ["a", "b", "c"]}), key=["k"],
                           vals=["g"])
        A.insert(pa.table({"k": [1, 1, 3], "x": [10, 15, None],
                           "t": pa.array([1, 1, 1], pa.uint64()), "d": [-1, 1, 1]}),
                 time="t", diff="d")
        plan = adb.group_by(adb.join(A, B, since=1, upto=2), by="g",
                            aggs={"n": ("count", None), "s": ("sum", "x")})
        assert "eager aggregation of changes" in plan.explain()
        # a: one price moved (no net row); c: a row of null x (its sum null)
        assert plan.read_all().sort_by("g").to_pydict() == {"g": ["a", "c"], "n": [0, 1],
                                                              "s": [5, None]}


def test_shapes_the_rule_does_not_fit_run_as_written():
    with adb.Engine(memory_budget="64MiB") as engine:
        A = engine.arrange(pa.table({"k": [1, 2], "x": [1, 2]}), key=["k"], vals=["x"])
        B = engine.arrange(pa.table({"k": [1, 2], "g": ["a", "b"]}), key=["k"], vals=["g"])
        A.insert(pa.table({"k": [1], "x": [5]}))
        for by, aggs in (("g", {"m": ("mean", "x")}),        # mean of changes: not linear
                         ("time", {"n": ("count", None)}),   # grouped on the changes' time
                         ("g", {"s": ("sum", "diff")})):     # their diff
            plan = adb.group_by(adb.join(A, B, since=1), by=by, aggs=aggs)
            assert "eager aggregation of changes" not in plan.explain()


def test_changes_over_many_windows_are_looked_up_a_few_windows_at_once(monkeypatch):
    """A's changed keys are looked up in B several windows at a time, flushed before a
    key range where B changed too: the groups equal the plan as written."""
    import arrangedb.ops.join_group_by_changes as jgbc

    rng = np.random.default_rng(11)
    nkeys = 6000
    fact, dim = _fact(rng, 20_000, nkeys, "float2"), _dim(rng, nkeys, nkeys)
    lookups = []
    real = jgbc.lookup_block
    monkeypatch.setattr(jgbc, "lookup_block",
                        lambda trace, keys, *a: lookups.append(keys.num_rows) or
                        real(trace, keys, *a))
    by, aggs = SHAPES["sums_by_dimension_string"]
    with adb.Engine(memory_budget="64MiB", idle_merge=False) as engine:
        F = engine.arrange(fact, key=["k"], vals=["amount", "cat"], name="fact")
        D = engine.arrange(dim, key=["k"], vals=["region", "seg"], name="dim")
        F.ctx.window_rows = 256   # windows of ~1k changed rows: many of them
        F.insert(_delta(rng, fact, _fact(rng, 8000, nkeys, "float2"), 1), time="t", diff="d")
        middle = dim.filter(pa.compute.less(dim.column("k"), 3000)).slice(0, 3)
        D.insert(_delta(rng, middle, _dim(rng, 2, 10), 1), time="t", diff="d")
        plan = adb.group_by(adb.join(F, D, since=1, upto=2), by=by, aggs=aggs)
        got = plan.read_all()
        written = eager_group_by(eager_join(F, D, since=1, upto=2), by=by,
                                 aggs=aggs).read_all()
        assert _rows(got) == _rows(written)
        windows = F.ctx.window_rows
    assert len(lookups) >= 2 and max(lookups) > windows   # several windows per lookup
