"""Maintained views: after every insert into their inputs, a view reads exactly as its
plan run afresh -- at the latest time, at every earlier time it keeps (all of them with
``history="all"``) -- for every operator, on random histories with retractions, skew
and nulls."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

import arrangedb
from arrangedb import distinct, group_by, join, reduce, threshold, top_k

AGGS = {"n": ("count", None), "s": ("sum", "x"), "lo": ("min", "x"), "hi": ("max", "x"),
        "u": ("count_distinct", "x"), "m": ("mean", "x")}


def _bag(table: pa.Table, weight: str | None = "count") -> Counter:
    """Rows as a multiset (floats rounded: sums kept by a view add up in another order)."""
    cols = [c for c in table.column_names if c != weight]
    rows = zip(*(table.column(c).to_pylist() for c in cols))
    counts = table.column(weight).to_pylist() if weight else [1] * table.num_rows
    out = Counter()
    for row, n in zip(rows, counts):
        out[tuple(round(v, 6) if isinstance(v, float) else v for v in row)] += n
    return +out


def _facts(rng, n, keys, skew):
    k = (rng.zipf(1.5, n) % keys) if skew else rng.integers(0, keys, n)
    x = rng.integers(-20, 100, n).astype(float)
    x = pa.array(x, mask=rng.random(n) < 0.1)   # nulls among the values
    return pa.table({"k": pa.array(k, pa.int64()), "x": x,
                     "y": pa.array(rng.integers(0, 1000, n), pa.int64())})


def _dims(rng, keys):
    k = np.arange(0, keys, 2)   # half the keys have no dimension row
    return pa.table({"k": pa.array(k, pa.int64()),
                     "g": pa.array(rng.choice(["a", "b", "c"], len(k))),
                     "gi": pa.array(rng.integers(-500, 500, len(k)), pa.int64())})


def _delta(rng, trace, n, keys, skew):
    """New rows and retractions of present rows, at the trace's upper frontier."""
    add = _facts(rng, n, keys, skew)
    snap = trace.snapshot().read_all()
    take = rng.choice(snap.num_rows, min(snap.num_rows, n // 2), replace=False) \
        if snap.num_rows else np.zeros(0, np.int64)
    gone = snap.take(pa.array(take, pa.int64())).select(["k", "x", "y"])
    d = np.concatenate([np.ones(add.num_rows, np.int64), -np.ones(gone.num_rows, np.int64)])
    return pa.concat_tables([add, gone.cast(add.schema)]).append_column("d", pa.array(d))


PLANS = {
    "reduce": lambda f, d: reduce(f, AGGS),
    "extremes per key": lambda f, d: reduce(f, {"n": ("count", None), "s": ("sum", "x"),
                                                "lo": ("min", "x"), "hi": ("max", "y")}),
    "max per key, no count": lambda f, d: reduce(f, {"hi": ("max", "y"), "s": ("sum", "y")}),
    "means and distinct counts": lambda f, d: reduce(f, {
        "n": ("count", None), "m": ("mean", "x"), "u": ("count_distinct", "y"),
        "lo": ("min", "y")}),
    "mean alone": lambda f, d: reduce(f, {"m": ("mean", "x")}),
    "distinct": lambda f, d: distinct(f),
    "top_k": lambda f, d: top_k(f, 2, by="x"),
    "threshold": lambda f, d: threshold(f, lambda c: c >= 2),
    "join": lambda f, d: join(f, d),
    "left join": lambda f, d: join(f, d, how="left"),
    "semi join": lambda f, d: join(f, d, how="semi"),
    "anti join": lambda f, d: join(f, d, how="anti"),
    "right join": lambda f, d: join(f, d, how="right"),
    "full join": lambda f, d: join(f, d, how="full"),
    "count and sum per group": lambda f, d: group_by(
        join(f, d), by="g", aggs={"n": ("count", None), "s": ("sum", "y")}),
    "sum of a column with nulls": lambda f, d: group_by(
        join(f, d), by="g", aggs={"n": ("count", None), "s": ("sum", "x")}),
    "max per group": lambda f, d: group_by(join(f, d), by="g", aggs={"hi": ("max", "x")}),
    # ids spread wider than the rows: grouped by slot, the pairs uncombined
    "count and sum per integer group": lambda f, d: group_by(
        join(f, d), by="gi", aggs={"n": ("count", None), "s": ("sum", "y")}),
}
KINDS = {"count and sum per group": "linear", "max per group": "whole",
         "count and sum per integer group": "linear",
         "extremes per key": "stored aggregates", "max per key, no count": "stored aggregates",
         "means and distinct counts": "stored aggregates", "mean alone": "stored aggregates",
         "top_k": "stored top k", "distinct": "changed rows",
         "sum of a column with nulls": "whole"}


@pytest.mark.parametrize("shape", list(PLANS))
@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2 ** 16), skew=st.booleans(), steps=st.integers(1, 4),
       fact_side=st.sampled_from(["facts", "dims", "both"]),
       history=st.sampled_from(["all", "last"]))
def test_a_view_reads_as_its_plan_at_every_time(tmp_path_factory, shape, seed, skew, steps,
                                                fact_side, history):
    """Every time it keeps (``history="all"``: all of them; ``"last"``: its last
    refresh's and the state before it, earlier reads refused)."""
    rng = np.random.default_rng(seed)
    keys = 40
    with arrangedb.Engine(spill_dir=tmp_path_factory.mktemp("view"),
                          memory_budget="64MiB") as e:
        facts = e.arrange(_facts(rng, 300, keys, skew), key=["k"], vals=["x", "y"])
        dims = e.arrange(_dims(rng, keys), key=["k"], vals=["g", "gi"])
        plan = PLANS[shape](facts, dims)
        view = e.view(plan, history=history)
        assert view.stats()["refresh_kind"] == KINDS.get(shape, "per key")
        weight = "count" if "count" in plan.schema.names else None
        expected = {view.upper() - 1: _bag(plan.read_all(), weight)}
        for _ in range(steps):
            if fact_side in ("facts", "both"):
                facts.insert(_delta(rng, facts, 60, keys, skew), diff="d")
            if fact_side in ("dims", "both"):
                extra = pa.table({"k": pa.array(rng.integers(0, keys, 5), pa.int64()),
                                  "g": pa.array(rng.choice(["a", "d"], 5)),
                                  "gi": pa.array(rng.integers(-9, 9, 5), pa.int64())})
                dims.insert(extra)
            before = view.upper()   # the last refresh's first time
            upper = view.refresh()
            assert upper == max(t.upper() for t in view.inputs)
            expected[upper - 1] = _bag(plan.read_all(), weight)
        if KINDS.get(shape, "").startswith("stored") and fact_side != "dims":
            assert view.stats()["keys_from_state"] > 0   # most keys: from their stored row
        names = [c for c in plan.schema.names if c != weight]
        kept_from = 0 if history == "all" else max(0, before - 1)   # its state before
        assert view.since == kept_from
        for at, want in expected.items():
            if at < kept_from:
                with pytest.raises(ValueError, match="compacted away"):
                    view.snapshot(at=at)
                continue
            got = view.snapshot(at=at).read_all()
            assert _bag(got.select(names + ["count"])) == want, at


@pytest.mark.parametrize("shape", ["count and sum per group", "extremes per key", "join",
                                   "max per group", "distinct"])
def test_a_view_keeps_its_last_refresh_and_stays_small_over_many(tmp_path, shape):
    """By default a view keeps the changes of its last refresh and the state before them:
    over many refreshes of the same keys its stored updates stay about the size of its
    contents, it reads as its plan at both times kept, earlier reads are refused with
    an error saying how to keep more, and a handle keeps what its reader holds."""
    rng = np.random.default_rng(3)
    keys = 40
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        facts = e.arrange(_facts(rng, 300, keys, False), key=["k"], vals=["x", "y"])
        dims = e.arrange(_dims(rng, keys), key=["k"], vals=["g", "gi"])
        plan = PLANS[shape](facts, dims)
        view = e.view(plan)
        weight = "count" if "count" in plan.schema.names else None
        names = [c for c in plan.schema.names if c != weight]
        held, held_at, states = None, None, {}
        for step in range(12):
            facts.insert(_delta(rng, facts, 60, keys, False), diff="d")
            upper = view.refresh()
            view.merge_all()   # merges fold the times the view let go
            states[upper - 1] = _bag(plan.read_all(), weight)
            if step == 4:   # a reader that holds the view where it is now
                held, held_at = view.handle(), upper - 1
            if step < 8:
                continue
            for at in (upper - 2, upper - 1):
                assert _bag(view.snapshot(at=at).read_all().select(names + ["count"])) \
                    == states[at], (step, at)
            assert _bag(view.snapshot(at=held_at).read_all().select(names + ["count"])) \
                == states[held_at]
        held.close()   # the handle gone, the next refresh lets its times go
        facts.insert(_delta(rng, facts, 60, keys, False), diff="d")
        upper = view.refresh()
        view.merge_all()
        with pytest.raises(ValueError, match="history='all'"):
            view.snapshot(at=held_at)
        with pytest.raises(ValueError, match="history='all'"):
            view.changes(upper - 2, upper)
        last = view.changes(upper - 1, upper).read_all()
        assert set(last.column("time").to_pylist()) <= {upper - 1}
        contents = sum(view.snapshot().read_all().column("count").to_pylist())
        assert view.stats()["updates"] <= 2 * contents + 4 * 60 + 100
        assert view.stats()["history"] == "last"


def test_a_view_history_is_last_or_all(tmp_path):
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        facts = e.arrange(_facts(np.random.default_rng(0), 50, 5, False), key=["k"],
                          vals=["x", "y"])
        with pytest.raises(ValueError, match="history='forever'"):
            e.view(reduce(facts, {"n": ("count", None)}), history="forever")
        assert e.view(reduce(facts, {"n": ("count", None)}),
                      history="all").stats()["history"] == "all"


def test_a_view_refreshes_before_it_is_read_and_reports_its_lag(tmp_path):
    rng = np.random.default_rng(1)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        facts = e.arrange(_facts(rng, 500, 30, False), key=["k"], vals=["x", "y"])
        dims = e.arrange(_dims(rng, 30), key=["k"], vals=["g"])
        per_group = e.view(group_by(join(facts, dims), by="g",
                                    aggs={"n": ("count", None), "s": ("sum", "y")}))
        assert facts.stats()["views"] == 1 and dims.stats()["views"] == 1
        facts.insert(_facts(rng, 50, 30, False))
        s = per_group.stats()   # stats do not refresh: they show the lag
        assert s["input_uppers"] == [2, 1] and s["lag"] == 1
        got = per_group.snapshot().read_all()   # a read refreshes first
        assert per_group.upper() == 2 and dims.upper() == 2   # inputs share the timeline
        want = group_by(join(facts, dims), by="g",
                        aggs={"n": ("count", None), "s": ("sum", "y")}).read_all()
        assert _bag(got.drop_columns(["count"]), None) == _bag(want, None)
        assert per_group.stats()["lag"] == 0
        h = facts.handle()
        assert facts.stats()["handles"] == 1
        h.close()
        assert facts.stats()["handles"] == 0


def test_a_view_is_a_trace_joined_viewed_again_and_checkpointed(tmp_path):
    rng = np.random.default_rng(2)
    with arrangedb.Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        facts = e.arrange(_facts(rng, 400, 30, True), key=["k"], vals=["x", "y"])
        dims = e.arrange(_dims(rng, 30), key=["k"], vals=["g"])
        per_key = e.view(reduce(facts, {"n": ("count", None), "s": ("sum", "x")}))
        joined = e.view(join(per_key, dims))   # a view of a view
        facts.insert(_delta(rng, facts, 50, 30, True), diff="d")
        fresh = e.arrange(reduce(facts, {"n": ("count", None), "s": ("sum", "x")}),
                          key=["k"], vals=["n", "s"])
        assert _bag(joined.snapshot().read_all()) == _bag(join(fresh, dims).read_all())
        per_key.checkpoint(tmp_path / "ck")
        loaded = e.load(tmp_path / "ck")
        assert _bag(loaded.snapshot().read_all()) == _bag(per_key.snapshot().read_all())
        assert loaded.upper() == per_key.upper()


def test_bad_view_arguments_are_named(tmp_path):
    rng = np.random.default_rng(3)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        facts = e.arrange(_facts(rng, 10, 5, False), key=["k"], vals=["x", "y"])
        with pytest.raises(ValueError, match=r"view key column\(s\) \['nope'\]"):
            e.view(reduce(facts, {"n": ("count", None)}), key=["nope"])
        with pytest.raises(TypeError, match="engine.view takes a plan"):
            e.view(facts)
        with pytest.raises(ValueError, match="one-shot stream"):
            e.view(group_by(facts.snapshot(), by="k", aggs={"n": ("count", None)}))


def test_a_checkpointed_view_resumes_over_its_loaded_inputs(tmp_path):
    """Inputs and view checkpointed; in a new engine, the view resumes from its stored
    upper over the loaded inputs and applies what they received since."""
    rng = np.random.default_rng(4)
    aggs = {"n": ("count", None), "s": ("sum", "y")}
    with arrangedb.Engine(spill_dir=tmp_path / "a", memory_budget="64MiB") as e:
        facts = e.arrange(_facts(rng, 400, 30, False), key=["k"], vals=["x", "y"])
        dims = e.arrange(_dims(rng, 30), key=["k"], vals=["g"])
        per_group = e.view(group_by(join(facts, dims), by="g", aggs=aggs))
        facts.insert(_delta(rng, facts, 40, 30, False), diff="d")
        per_group.refresh()
        for t, name in ((facts, "facts"), (dims, "dims"), (per_group, "view")):
            t.checkpoint(tmp_path / name)
        upper = per_group.upper()
    with arrangedb.Engine(spill_dir=tmp_path / "b", memory_budget="64MiB") as e:
        facts, dims = e.load(tmp_path / "facts"), e.load(tmp_path / "dims")
        plan = group_by(join(facts, dims), by="g", aggs=aggs)
        resumed = e.view(plan, path=tmp_path / "view")
        assert resumed.upper() == upper and resumed.stats()["refresh_kind"] == "linear"
        assert resumed.refreshes == 0
        facts.insert(_delta(rng, facts, 40, 30, False), diff="d")
        got = resumed.snapshot().read_all()
        assert resumed.refreshes == 1
        assert _bag(got.drop_columns(["count"]), None) == _bag(plan.read_all(), None)
        # history="last": the times before its resumed upper fold at that refresh
        assert resumed.since == upper - 1 and resumed.stats()["history"] == "last"
        with pytest.raises(ValueError, match="history='all'"):
            resumed.snapshot(at=upper - 2)
        with pytest.raises(ValueError, match="history='ever'"):
            e.view(plan, path=tmp_path / "view", history="ever")
        other = group_by(join(facts, dims), by="g", aggs={"n": ("count", None)})
        with pytest.raises(ValueError, match="the view of another plan"):
            e.view(other, path=tmp_path / "view")


@pytest.mark.parametrize("shape,key", [("reduce", ["n"]), ("top_k", ["y"]),
                                       ("distinct", ["y", "k"]),
                                       ("count and sum per group", ["n"])])
def test_a_view_keyed_otherwise_than_its_operator_is_refreshed_whole(tmp_path, shape, key):
    """The per-key paths recompute the keys of the operator's output: a view keyed by
    other columns cannot take them, and reads as its plan all the same."""
    rng = np.random.default_rng(8)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        facts = e.arrange(_facts(rng, 200, 30, True), key=["k"], vals=["x", "y"])
        dims = e.arrange(_dims(rng, 30), key=["k"], vals=["g"])
        plan = PLANS[shape](facts, dims)
        view = e.view(plan, key=key)
        assert view.stats()["refresh_kind"] == "whole"
        weight = "count" if "count" in plan.schema.names else None
        names = [c for c in plan.schema.names if c != weight]
        for _ in range(2):
            facts.insert(_delta(rng, facts, 40, 30, True), diff="d")
            got = view.snapshot().read_all().select(names + ["count"])
            assert _bag(got) == _bag(plan.read_all(), weight)


@pytest.mark.parametrize("make", [
    lambda f, d, t: reduce(f, {"n": ("count", None), "m": ("mean", "x")}, at=t),
    lambda f, d, t: distinct(f, at=t), lambda f, d, t: top_k(f, 2, by="x", at=t),
    lambda f, d, t: threshold(f, lambda c: c >= 1, at=t),
    lambda f, d, t: join(f, d, at=t), lambda f, d, t: join(f, d, how="full", at=t)],
    ids=["reduce", "distinct", "top_k", "threshold", "join", "full join"])
def test_a_view_of_a_plan_at_a_fixed_time_keeps_that_times_output(tmp_path, make):
    """``at=t`` fixes what the plan reads: later inserts do not change its output, and
    the view's refreshes (whole) leave it as it was."""
    rng = np.random.default_rng(9)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        facts = e.arrange(_facts(rng, 200, 30, False), key=["k"], vals=["x", "y"])
        dims = e.arrange(_dims(rng, 30), key=["k"], vals=["g"])
        facts.insert(_delta(rng, facts, 40, 30, False), diff="d")
        plan = make(facts, dims, 0)
        view = e.view(plan)
        assert view.stats()["refresh_kind"] == "whole"
        weight = "count" if "count" in plan.schema.names else None
        names = [c for c in plan.schema.names if c != weight]
        facts.insert(_delta(rng, facts, 40, 30, False), diff="d")
        got = view.snapshot().read_all().select(names + ["count"])
        assert _bag(got) == _bag(plan.read_all(), weight)


def test_a_view_holds_its_inputs_history_from_its_upper_on(tmp_path):
    """A reader compacting an input does not take away the times the view has yet to
    read; and the view alone never compacts its inputs (old times stay readable)."""
    rng = np.random.default_rng(10)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        facts = e.arrange(_facts(rng, 200, 30, False), key=["k"], vals=["x", "y"])
        plan = reduce(facts, {"n": ("count", None), "m": ("mean", "x")})
        view = e.view(plan)
        for _ in range(3):
            facts.insert(_delta(rng, facts, 30, 30, False), diff="d")
        facts.merge_all()
        assert facts.since == 0 and facts.snapshot(at=0).read_all().num_rows > 0
        assert facts.stats()["handles"] == 0   # the view's hold is not a user's handle
        h = facts.handle()
        h.set_logical_compaction(facts.upper())
        facts.merge_all()
        assert facts.since == view.upper() - 1   # held where the view has read through
        got = view.snapshot().read_all()
        assert _bag(got.drop_columns(["count"]), None) == _bag(plan.read_all(), None)
        view.close()   # its hold goes: the reader's frontier applies
        facts.merge_all()
        assert facts.since == facts.upper()
        h.close()


STATE_AGGS = {"m": ("mean", "x"), "u": ("count_distinct", "y"), "n": ("count", None)}


def test_a_resumed_view_of_means_builds_its_accumulators_from_its_inputs(tmp_path):
    """The accumulators of a mean and a distinct count are not checkpointed: a resumed
    view builds them from its loaded input as of its own upper, so that what the input
    received since is applied from them (keys kept from state, none recomputed)."""
    rng = np.random.default_rng(5)
    with arrangedb.Engine(spill_dir=tmp_path / "a", memory_budget="64MiB") as e:
        facts = e.arrange(_facts(rng, 400, 30, False), key=["k"], vals=["x", "y"])
        view = e.view(reduce(facts, STATE_AGGS))
        facts.insert(_delta(rng, facts, 40, 30, False), diff="d")
        view.checkpoint(tmp_path / "view")   # refreshes first: the view is at facts' upper
        facts.insert(_delta(rng, facts, 40, 30, False), diff="d")   # after the view's
        facts.checkpoint(tmp_path / "facts")
    with arrangedb.Engine(spill_dir=tmp_path / "b", memory_budget="64MiB") as e:
        facts = e.load(tmp_path / "facts")
        plan = reduce(facts, STATE_AGGS)
        view = e.view(plan, path=tmp_path / "view")
        assert view.upper() < facts.upper()
        got = view.snapshot().read_all()
        assert _bag(got.drop_columns(["count"]), None) == _bag(plan.read_all(), None)
        s = view.stats()
        assert s["refreshes"] == 1 and s["keys_from_state"] > 0 and s["keys_recomputed"] == 0
        assert s["state_updates"] > 0


def test_an_extreme_retracted_and_passed_by_an_insert_is_kept_from_state(tmp_path):
    """A key whose maximum (minimum) is retracted while a larger (smaller) value is
    inserted takes the inserted value from its stored row: no group is re-read. A key
    whose extreme is retracted and not passed is recomputed."""
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        facts = e.arrange(pa.table({"k": [1, 1, 1, 2, 2, 2], "x": [5, 3, 9, 4, 8, 6]}),
                          key=["k"], vals=["x"])
        view = e.view(reduce(facts, {"hi": ("max", "x"), "lo": ("min", "x")}))
        view.refresh()
        # key 1: max 9 -> 12 and min 3 -> 1 retracted and passed; key 2: max 8 retracted
        facts.insert(pa.table({"k": [1, 1, 1, 1, 2], "x": [9, 12, 3, 1, 8],
                               "d": [-1, 1, -1, 1, -1]}), diff="d")
        view.refresh()
        got = view.snapshot().read_all().sort_by("k")
        assert got.select(["k", "hi", "lo"]).to_pylist() == [
            {"k": 1, "hi": 12, "lo": 1}, {"k": 2, "hi": 6, "lo": 4}]
        s = view.stats()
        assert s["keys_from_state"] == 1 and s["keys_recomputed"] == 1


def test_a_failed_refresh_leaves_the_view_exact_at_its_next(tmp_path, monkeypatch):
    """A refresh that fails after the accumulators took its changes drops them: the next
    refresh recomputes the keys that need them and builds them again."""
    from arrangedb.ops import view as view_module

    rng = np.random.default_rng(7)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        facts = e.arrange(_facts(rng, 300, 30, False), key=["k"], vals=["x", "y"])
        plan = reduce(facts, STATE_AGGS)
        view = e.view(plan)
        facts.insert(_delta(rng, facts, 40, 30, False), diff="d")
        real = view_module.at_time_table
        monkeypatch.setattr(view_module, "at_time_table",
                            lambda *a: (_ for _ in ()).throw(OSError("disk gone")))
        with pytest.raises(OSError, match="disk gone"):
            view.refresh()
        assert view.state is None
        monkeypatch.setattr(view_module, "at_time_table", real)
        for _ in range(2):
            before = view.stats()["keys_recomputed"]
            got = view.snapshot().read_all()
            assert _bag(got.drop_columns(["count"]), None) == _bag(plan.read_all(), None)
            assert view.state is not None
            facts.insert(_delta(rng, facts, 40, 30, False), diff="d")
        assert view.stats()["keys_recomputed"] == before   # the second refresh: from state


@pytest.mark.parametrize("aggs", [AGGS, {"n": ("count", None), "lo": ("min", "y"),
                                          "hi": ("max", "y"), "s": ("sum", "y")}],
                         ids=["per key", "stored aggregates"])
def test_a_refresh_in_many_steps_equals_one_in_one(tmp_path, monkeypatch, aggs):
    """Touched keys are recomputed a bounded number at a time, all at one time (those a
    reduce view keeps from their stored rows, beside the others, with their stored rows
    retracted step by step)."""
    from arrangedb.ops import view as view_module

    monkeypatch.setattr(view_module, "KEYS_PER_STEP", 3)
    rng = np.random.default_rng(6)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        facts = e.arrange(_facts(rng, 300, 40, True), key=["k"], vals=["x", "y"])
        plan = reduce(facts, aggs)
        view = e.view(plan, history="all")
        for _ in range(3):
            facts.insert(_delta(rng, facts, 50, 40, True), diff="d")
            assert _bag(view.snapshot().read_all().drop_columns(["count"]), None) == \
                _bag(plan.read_all(), None)
        assert len(set(view.changes(1, view.upper()).read_all().column("time").to_pylist())) == 3
        assert view.stats()["keys_recomputed"] > 3 * 3   # several steps in each refresh


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 16), k=st.integers(1, 4), descending=st.booleans(),
       by=st.sampled_from(["x", "y", ["y", "x"], ["x", "y"]]), repeats=st.booleans(),
       step=st.sampled_from([3, 1 << 15]))
def test_a_top_k_view_kept_from_its_stored_rows_equals_top_k(tmp_path_factory, seed, k,
                                                              descending, by, repeats, step):
    """Keys whose retractions stay behind their stored first k take their new rows from
    the stored ones and the changes; the view reads as ``top_k`` run afresh, ties,
    repeated rows (counts above 1) and nulls included, in steps of any number of keys."""
    from arrangedb.ops import view as view_module

    rng = np.random.default_rng(seed)
    with pytest.MonkeyPatch.context() as patch, arrangedb.Engine(
            spill_dir=tmp_path_factory.mktemp("top_k"), memory_budget="64MiB") as e:
        patch.setattr(view_module, "KEYS_PER_STEP", step)
        start = _facts(rng, 200, 12, False)
        if repeats:   # the same rows again: counts of 2
            start = pa.concat_tables([start, start.slice(0, 80)])
        facts = e.arrange(start, key=["k"], vals=["x", "y"])
        plan = top_k(facts, k, by=by, descending=descending)
        view = e.view(plan)
        assert view.stats()["refresh_kind"] == "stored top k"
        for _ in range(3):
            facts.insert(_delta(rng, facts, 40, 12, False), diff="d")
            assert _bag(view.snapshot().read_all()) == _bag(plan.read_all())
        assert view.stats()["keys_from_state"] > 0
        assert view.stats()["keys_recomputed"] > 0   # and some re-read


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2 ** 16), step=st.sampled_from([2, 5, 1 << 15]),
       slots=st.sampled_from([0, 16]))
def test_a_distinct_view_changes_only_at_rows_crossing_zero(tmp_path_factory, seed, step,
                                                            slots):
    """Rows held twice lose one copy and stay; rows retracted whole leave; new rows come
    in once however often inserted -- in steps of any number of keys, the changed rows
    matched slot by slot or by a sort."""
    from arrangedb.ops import view as view_module, view_distinct

    rng = np.random.default_rng(seed)
    with pytest.MonkeyPatch.context() as patch, arrangedb.Engine(spill_dir=tmp_path_factory.mktemp("distinct"),
                          memory_budget="64MiB") as e:
        start = _facts(rng, 150, 15, True)
        facts = e.arrange(pa.concat_tables([start, start.slice(0, 60)]), key=["k"],
                          vals=["x", "y"])
        patch.setattr(view_module, "KEYS_PER_STEP", step)
        patch.setattr(view_distinct, "MAX_SLOTS", slots)
        plan = distinct(facts)
        view = e.view(plan, history="all")
        assert view.stats()["refresh_kind"] == "changed rows"
        for _ in range(3):
            delta = _delta(rng, facts, 40, 15, True)
            facts.insert(pa.concat_tables([delta, delta.slice(0, 10)]), diff="d")
            assert _bag(view.snapshot().read_all()) == _bag(plan.read_all())
        assert _bag(view.snapshot(at=1).read_all()) == _bag(distinct(facts, at=1).read_all())


def test_a_linear_view_of_decimal_sums_adds_them_exactly(tmp_path):
    """A grouped join's decimal sums kept from its changes: a decimal(38, s) total plus a
    change of the same type stays that type (Arrow's addition would widen it past 38
    digits), exactly, negative amounts and totals beyond int64 included."""
    import decimal

    D = decimal.Decimal
    big = D("12345678901234567890123.45")   # beyond int64 when unscaled
    amounts = pa.array([D("1.50"), D("-2.25"), big, D("3.00")], pa.decimal128(30, 2))
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        left = e.arrange(pa.table({"k": [1, 1, 1, 2], "amt": amounts}), key=["k"],
                         vals=["amt"])
        right = e.arrange(pa.table({"k": [1, 2], "g": ["x", "y"]}), key=["k"], vals=["g"])
        plan = group_by(join(left, right), by="g",
                        aggs={"n": ("count", None), "s": ("sum", "amt")})
        view = e.view(plan)
        assert view.stats()["refresh_kind"] == "linear"
        for step in ([D("4.00"), 1], [big, 2], [D("-7.77"), 1]):
            left.insert(pa.table({"k": [step[1]], "amt": pa.array([step[0]],
                                                                   pa.decimal128(30, 2))}))
            got = view.snapshot().read_all().drop_columns(["count"]).sort_by("g")
            assert got.to_pylist() == plan.read_all().sort_by("g").to_pylist()
        x = D("1.50") - D("2.25") + big + D("4.00") - D("7.77")
        assert got.column("s").to_pylist() == [x, D("3.00") + big]


def _plain(table: pa.Table, weight: str | None = "count") -> Counter:
    """:func:`_bag` with NaN as a value of its own (NaN is not equal to itself)."""
    return Counter({tuple("nan" if isinstance(v, float) and v != v else v for v in row): n
                    for row, n in _bag(table, weight).items()})


SPECIAL_PLANS = {
    "sums, means and extremes": lambda f, d: reduce(f, {
        "n": ("count", None), "s": ("sum", "x"), "m": ("mean", "x"), "lo": ("min", "x"),
        "hi": ("max", "x")}),
    "mean alone": lambda f, d: reduce(f, {"m": ("mean", "x")}),
    "count and sum per group": lambda f, d: group_by(
        join(f, d), by="g", aggs={"n": ("count", None), "s": ("sum", "x")}),
}


@pytest.mark.parametrize("shape", list(SPECIAL_PLANS))
def test_nan_and_inf_inserted_and_retracted_leave_a_view_as_its_plan(tmp_path, shape):
    """A NaN or inf cannot be taken back out of a stored sum (NaN - NaN, inf - inf are
    NaN): the keys and groups whose changes retract one are counted again, and minimums
    and maximums skip NaN as reduce's do. After each step the view reads as its plan."""
    nan, inf = float("nan"), float("inf")
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        facts = e.arrange(pa.table({"k": pa.array([1, 1, 2, 2, 3, 4], pa.int64()),
                                    "x": [1.0, nan, 5.0, inf, 2.0, -inf]}),
                          key=["k"], vals=["x"])
        dims = e.arrange(pa.table({"k": pa.array([1, 2, 3, 4], pa.int64()),
                                   "g": ["a", "a", "b", "b"]}), key=["k"], vals=["g"])
        plan = SPECIAL_PLANS[shape](facts, dims)
        view = e.view(plan)
        weight = "count" if "count" in plan.schema.names else None
        steps = [([1, 2], [nan, inf], -1),     # the specials retracted
                 ([1, 3, 4], [nan, inf, 7.0], 1),
                 ([3, 4], [inf, -inf], -1),
                 ([1, 1], [nan, 9.0], 1),
                 ([1], [nan], -1)]
        for keys, xs, d in steps:
            facts.insert(pa.table({"k": pa.array(keys, pa.int64()), "x": xs,
                                   "d": [d] * len(keys)}), diff="d")
            view.refresh()
            # the plan over the facts as one consolidated batch: no retraction to cancel
            whole = e.arrange(facts.snapshot().read_all(), key=["k"], vals=["x"],
                              diff="count")
            want = _plain(SPECIAL_PLANS[shape](whole, dims).read_all(), weight)
            assert _plain(plan.read_all(), weight) == want, (keys, xs, d)
            assert _plain(view.snapshot().read_all()) == want, (keys, xs, d)
            whole.close()


def test_stored_aggregates_of_unsigned_columns_and_a_key_only_distinct_view(tmp_path):
    """A maximum of uint64 values past 2**63, and retractions of unsigned values, are
    kept as the plan gives them; a distinct view of a key-only trace refreshes."""
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        big = 2**63 + 5
        u = e.arrange(pa.table({"k": pa.array([1, 2], pa.int64()),
                                "y": pa.array([big, 200], pa.uint64()),
                                "z": pa.array([7, 200], pa.uint8())}), key=["k"], vals=["y", "z"])
        plan = reduce(u, {"n": ("count", None), "hi": ("max", "y"), "s": ("sum", "z")})
        view = e.view(plan)
        u.insert(pa.table({"k": pa.array([1, 2], pa.int64()),
                           "y": pa.array([3, 200], pa.uint64()),
                           "z": pa.array([1, 200], pa.uint8()), "d": [1, -1]}), diff="d")
        assert _bag(view.snapshot().read_all()) == _bag(plan.read_all(), None)
        assert view.snapshot().read_all().column("hi").to_pylist() == [big]
        keys = e.arrange(pa.table({"k": pa.array([1, 1, 2], pa.int64())}), key=["k"], vals=[])
        dv = e.view(distinct(keys))
        keys.insert(pa.table({"k": pa.array([2, 3], pa.int64())}))
        assert _bag(dv.snapshot().read_all()) == _bag(distinct(keys).read_all())


@pytest.mark.parametrize("by", ["g", "gi"])
def test_a_null_summed_after_a_linear_view_is_made_reads_as_its_plan(tmp_path, by):
    """A linear view's refresh sums the fact side's changes per key below the join when
    only that side changed; a null among those changes (a group of nulls alone sums to
    null, which changes cannot tell) sends the refresh to the whole recompute, and a
    change of the dimension to the joined rows' path."""
    rng = np.random.default_rng(3)
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        facts = e.arrange(_facts(rng, 400, 30, False), key=["k"], vals=["x", "y"])
        solo = pa.table({"k": pa.array([100], pa.int64()), "g": ["solo"],
                         "gi": pa.array([777], pa.int64())})   # a group with no facts yet
        dims = e.arrange(pa.concat_tables([_dims(rng, 30), solo]), key=["k"],
                         vals=["g", "gi"])
        plan = group_by(join(facts, dims), by=by, aggs={"n": ("count", None), "s": ("sum", "y")})
        view = e.view(plan)
        assert view.stats()["refresh_kind"] == "linear"
        steps = [pa.table({"k": pa.array([0, 100], pa.int64()), "x": [1.0, 2.0],
                           "y": pa.array([None, None], pa.int64())}),   # solo's sum: null
                 pa.table({"k": pa.array([4, 6], pa.int64()), "x": [1.0, 2.0],
                           "y": pa.array([7, 8], pa.int64())})]
        for step in steps:
            facts.insert(step)
            assert _bag(view.snapshot().read_all().drop_columns(["count"]), None) == \
                _bag(plan.read_all(), None)
        dims.insert(pa.table({"k": pa.array([0], pa.int64()), "g": ["z"],
                              "gi": pa.array([123], pa.int64())}))
        assert _bag(view.snapshot().read_all().drop_columns(["count"]), None) == \
            _bag(plan.read_all(), None)


def test_a_summed_column_named_apart_from_its_input_is_checked_for_nulls(tmp_path):
    """A summed column renamed in the join's output (``left_x``: both sides have an x)
    is looked for nulls under its input's name: a group whose values are all null
    sums to null, which a linear view could not tell from zero."""
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        facts = e.arrange(pa.table({"k": pa.array([1, 1], pa.int64()),
                                    "x": pa.array([None, 5], pa.int64())}), key=["k"], vals=["x"])
        dims = e.arrange(pa.table({"k": pa.array([1], pa.int64()), "g": pa.array([7], pa.int64()),
                                   "x": pa.array([0], pa.int64())}), key=["k"], vals=["g", "x"])
        plan = group_by(join(facts, dims), by="g",
                        aggs={"n": ("count", None), "s": ("sum", "left_x")})
        view = e.view(plan)
        assert view.stats()["refresh_kind"] == "whole"
        facts.insert(pa.table({"k": pa.array([1], pa.int64()), "x": pa.array([5], pa.int64()),
                               "d": [-1]}), diff="d")
        got = view.snapshot().read_all().drop_columns(["count"]).to_pylist()
        assert got == plan.read_all().to_pylist() == [{"g": 7, "n": 1, "s": None}]
