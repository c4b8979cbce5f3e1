"""join_group_by over a trace that took deltas: the aggregation pushed below the join reads
the batches side by side (never merged) when no row counts below zero, and gives
group_by(join(...))'s result -- against DuckDB on the data as it stands after the
deltas, and against the materialised plan. A trace whose deltas retract more than they
inserted is read merged, with the same result."""

from __future__ import annotations

import importlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st

import arrangedb as adb
from arrangedb.ops.group_by import group_by as eager_group_by
from arrangedb.ops.join import join as eager_join
from arrangedb.spine import nonnegative_at
from arrangedb.spine.read import signs
from test_ops import SETTINGS, bag, sql

jgb = importlib.import_module("arrangedb.ops.join_group_by")
AGGS = {"n": ("count", None), "s": ("sum", "x"), "c": ("count", "x"), "m": ("mean", "x")}
QUERY = ("select g, count(*) n, sum(x) s, count(x) c, avg(x) m "
         "from L join R using (k) group by g")


def _refuse(what):
    def refuse(*args, **kwargs):
        raise AssertionError(f"the plan read A {what}")
    return refuse


def _linear_only(monkeypatch):
    """The join is never made, and A is never read merged."""
    monkeypatch.setattr(jgb, "join", _refuse("through the materialised join"))
    real = jgb.part_blocks
    monkeypatch.setattr(jgb, "part_blocks", lambda trace, *a, **k: (
        real(trace, *a, **k) if trace.name == "R" else _refuse("merged")()))


def _rounded(table: pa.Table) -> pa.Table:
    """Float sums and means rounded: the plans add in different orders."""
    cols = {c: table.column(c) for c in table.column_names}
    for c in ("s", "m"):
        cols[c] = pa.array([None if v is None else round(v, 6) for v in cols[c].to_pylist()],
                           pa.float64())
    return pa.table(cols)


def _sides(rng, n, nkeys):
    x = rng.integers(-50, 50, n).astype(np.float64) / 4
    L = pa.table({"k": rng.integers(0, nkeys, n), "x": pa.array(x, mask=rng.random(n) < 0.2),
                  "id": np.arange(n)})
    R = pa.table({"k": np.arange(nkeys), "g": pa.array([f"g{i % 4}" for i in range(nkeys)])})
    return L, R


def _updates(rows: pa.Table, t: int, d: int) -> pa.Table:
    n = rows.num_rows
    return rows.append_column("t", pa.array(np.full(n, t, np.uint64))).append_column(
        "d", pa.array(np.full(n, d, np.int64)))


@SETTINGS
@given(st.integers(1, 400), st.integers(1, 40), st.integers(1, 3), st.booleans(),
       st.integers(0, 2**32 - 1))
def test_deltas_are_summed_batch_by_batch(tmp_path_factory, monkeypatch, n, nkeys, steps,
                                         merged, seed):
    """Each step retracts a random share of the rows (some whole keys: their groups may
    go) and inserts changed values; unmerged, or merged into one batch of several times."""
    rng = np.random.default_rng(seed)
    L, R = _sides(rng, n, nkeys)
    with adb.Engine(spill_dir=tmp_path_factory.mktemp("s"), memory_budget="16MiB",
                    idle_merge=False) as e:
        lt = e.arrange(L, key=["k"], vals=["x", "id"], name="L")
        rt = e.arrange(R, key=["k"], vals=["g"], name="R")
        now = L
        for step in range(1, steps + 1):
            gone = now.filter(pc.or_(pa.array(rng.random(now.num_rows) < 0.4),
                                     pc.is_in(now["k"], pa.array([step % nkeys]))))
            new = gone.slice(0, gone.num_rows // 2)
            new = new.set_column(1, "x", pc.add(new["x"], 1.0))
            lt.insert(pa.concat_tables([_updates(gone, step, -1), _updates(new, step, 1)]),
                      time="t", diff="d")
            now = pa.concat_tables([now.filter(pc.invert(pc.is_in(now["id"], gone["id"]))), new])
        if merged:
            lt.merge_all()
        assert nonnegative_at(lt)
        want = sql(QUERY, L=now, R=R)
        plain = eager_group_by(eager_join(lt, rt), by="g", aggs=AGGS).read_all()
        with monkeypatch.context() as m:
            _linear_only(m)
            got = adb.join_group_by(lt, rt, by="g", aggs=AGGS, engine=e).read_all()
            natural = adb.group_by(adb.join(lt, rt), by="g", aggs=AGGS).read_all()
    assert bag(_rounded(got)) == bag(_rounded(want)) == bag(_rounded(plain))
    assert bag(_rounded(natural)) == bag(_rounded(want))


def test_a_group_whose_rows_are_all_retracted_is_gone(tmp_path, monkeypatch):
    L = pa.table({"k": [1, 1, 2, 3], "x": pa.array([1.0, None, 2.0, None])})
    R = pa.table({"k": [1, 2, 3], "g": ["a", "b", "c"]})
    with adb.Engine(spill_dir=tmp_path, memory_budget="16MiB", idle_merge=False) as e:
        lt = e.arrange(L, key=["k"], vals=["x"], name="L")
        rt = e.arrange(R, key=["k"], vals=["g"], name="R")
        # group a loses its rows, b its only value (a null comes in), c is untouched
        lt.insert(pa.table({"k": [1, 1, 2, 2], "x": pa.array([1.0, None, 2.0, None]),
                            "t": pa.array([1, 1, 1, 1], pa.uint64()),
                            "d": pa.array([-1, -1, -1, 1], pa.int64())}), time="t", diff="d")
        for merge in (False, True):
            if merge:
                lt.merge_all()
            with monkeypatch.context() as m:
                _linear_only(m)
                got = adb.join_group_by(lt, rt, by="g", aggs=AGGS, engine=e).read_all()
            assert got.sort_by("g").to_pylist() == [
                {"g": "b", "n": 1, "s": None, "c": 0, "m": None},
                {"g": "c", "n": 1, "s": None, "c": 0, "m": None}]


@pytest.mark.parametrize("merge", [False, True])
def test_retracting_more_than_was_inserted_reads_merged(tmp_path, merge):
    """A delta leaving a row at -1: no longer a collection, so the batches are not summed
    side by side; the result is the materialised plan's (the group is there, n = 0)."""
    L = pa.table({"k": [1, 2], "x": [1.0, 2.0]})
    R = pa.table({"k": [1, 2], "g": ["a", "a"]})
    with adb.Engine(spill_dir=tmp_path, memory_budget="16MiB", idle_merge=False) as e:
        lt = e.arrange(L, key=["k"], vals=["x"], name="L")
        rt = e.arrange(R, key=["k"], vals=["g"], name="R")
        assert nonnegative_at(lt)
        lt.insert(pa.table({"k": [2, 1], "x": [2.0, 5.0], "t": pa.array([1, 1], pa.uint64()),
                            "d": pa.array([-1, -1], pa.int64())}), time="t", diff="d")
        if merge:
            lt.merge_all()
        assert not nonnegative_at(lt)
        assert nonnegative_at(lt, at=0)   # before the delta
        aggs = {k: AGGS[k] for k in ("n", "s", "c")}   # (no mean over negative counts)
        got = adb.join_group_by(lt, rt, by="g", aggs=aggs, engine=e).read_all()
        want = eager_group_by(eager_join(lt, rt), by="g", aggs=aggs).read_all()
    assert bag(got) == bag(want)
    assert got.column("n").to_pylist() == [0]


def test_the_sign_is_found_again_after_each_write(tmp_path):
    with adb.Engine(spill_dir=tmp_path, memory_budget="16MiB", idle_merge=False) as e:
        lt = e.arrange(pa.table({"k": [1, 2], "x": [1.0, 2.0]}), key=["k"], vals=["x"])
        retract = pa.table({"k": [1], "x": [1.0], "t": pa.array([1], pa.uint64()),
                            "d": pa.array([-1], pa.int64())})
        lt.insert(retract, time="t", diff="d")
        assert nonnegative_at(lt) and nonnegative_at(lt)   # (the second answer is kept)
        lt.insert(retract.set_column(2, "t", pa.array([2], pa.uint64())), time="t", diff="d")
        assert not nonnegative_at(lt)
        assert nonnegative_at(lt, at=1)


def test_a_merged_delta_stores_its_key_sums_weighed_by_each_rows_total(tmp_path, monkeypatch):
    """Inserts merged with their retractions: a part of two times stores each key's sum
    of value x total, which a read at the latest time takes; a read before the delta
    sums the rows visible then."""
    rng = np.random.default_rng(5)
    n, nkeys = 20_000, 2_000
    L = pa.table({"k": rng.integers(0, nkeys, n), "x": rng.integers(0, 10_000, n),
                  "id": np.arange(n)})
    R = pa.table({"k": np.arange(nkeys), "g": pa.array([f"g{i % 3}" for i in range(nkeys)])})
    gone = L.filter(pa.array(rng.random(n) < 0.05))
    new = gone.set_column(1, "x", pc.add(gone["x"], 7))
    after = pa.concat_tables([L.filter(pc.invert(pc.is_in(L["id"], gone["id"]))), new])
    aggs = {k: AGGS[k] for k in ("n", "s")}
    with adb.Engine(spill_dir=tmp_path, memory_budget="16MiB", idle_merge=False) as e:
        lt = e.arrange(L, key=["k"], vals=["x", "id"], name="L")
        rt = e.arrange(R, key=["k"], vals=["g"], name="R")
        lt.insert(pa.concat_tables([_updates(gone, 1, -1), _updates(new, 1, 1)]),
                  time="t", diff="d")
        lt.merge_all()
        parts = lt.batches()[0].parts
        assert all(len(p.layout().times) > 1 for p in parts)
        assert any(g["field"] == "x" for p in parts for g in p.columns.get("key_sums", ()))
        with monkeypatch.context() as m:
            _linear_only(m)
            got = adb.join_group_by(lt, rt, by="g", aggs=aggs, engine=e).read_all()
            before = adb.join_group_by(lt, rt, by="g", aggs=aggs, at=0, engine=e).read_all()
    q = "select g, count(*) n, cast(sum(x) as bigint) s from L join R using (k) group by g"
    for table, data in ((got, after), (before, L)):
        want = sql(q, L=data, R=R).sort_by("g")
        table = table.sort_by("g")
        assert table.select(["n", "s"]).to_pylist() == want.select(["n", "s"]).to_pylist()


def test_a_large_delta_is_read_merged_rather_than_looked_up(tmp_path, monkeypatch):
    """Retractions over more than 1/16 of the trace: checking them key by key would cost
    more than reading the trace merged, which the plan then does, with the same result."""
    monkeypatch.setattr(signs, "ALWAYS_CHECKED", 0)   # (a small trace stands for a large one)
    L = pa.table({"k": np.arange(64) % 8, "x": np.arange(64.0)})
    R = pa.table({"k": np.arange(8), "g": ["a", "b"] * 4})
    aggs = {k: AGGS[k] for k in ("n", "s")}
    with adb.Engine(spill_dir=tmp_path, memory_budget="16MiB", idle_merge=False) as e:
        lt = e.arrange(L, key=["k"], vals=["x"], name="L")
        rt = e.arrange(R, key=["k"], vals=["g"], name="R")
        small, large = L.slice(0, 1), L.slice(1, 8)
        for delta, checked in ((small, True), (large, False)):
            lt.insert(_updates(delta, lt.upper(), -1), time="t", diff="d")
            assert nonnegative_at(lt) is checked
        got = adb.join_group_by(lt, rt, by="g", aggs=aggs, engine=e).read_all()
    want = sql("select g, count(*) n, sum(x) s from L join R using (k) group by g",
               L=L.slice(9), R=R)
    assert bag(got) == bag(want)


def _retract(trace, keys, t):
    """Retract one row (k, 0.0) per key at time ``t``."""
    trace.insert(pa.table({"k": keys, "x": [0.0] * len(keys),
                           "t": pa.array([t] * len(keys), pa.uint64()),
                           "d": pa.array([-1] * len(keys), pa.int64())}),
                 time="t", diff="d")


@SETTINGS
@given(st.lists(st.tuples(st.lists(st.tuples(st.integers(0, 5), st.integers(-2, 1)),
                                   min_size=1, max_size=12),
                          st.sampled_from(["none", "exert", "merge_all"]),
                          st.sampled_from([None, "before"])),
                min_size=1, max_size=8))
def test_the_sign_after_each_write_is_the_models(tmp_path_factory, monkeypatch, steps):
    """Inserts that retract (sometimes more than is there), merges in between, the sign
    asked at the latest time or the time before each write: always the model's answer,
    whether it was kept, found for the new retractions alone, or found again."""
    monkeypatch.setattr(signs, "ALWAYS_CHECKED", 1 << 30)   # always looked up
    base = pa.table({"k": np.arange(6), "x": np.zeros(6)})
    counts = {k: [1] for k in range(6)}   # per key, its count at each time so far
    with adb.Engine(spill_dir=tmp_path_factory.mktemp("s"), memory_budget="16MiB",
                    idle_merge=False) as e:
        lt = e.arrange(base, key=["k"], vals=["x"])
        for t, (rows, merge, when) in enumerate(steps, start=1):
            for k in counts:
                counts[k].append(counts[k][-1])
            for k, d in rows:
                counts[k][-1] += d
            lt.insert(pa.table({"k": [k for k, _ in rows], "x": [0.0] * len(rows),
                                "t": pa.array([t] * len(rows), pa.uint64()),
                                "d": pa.array([d for _, d in rows], pa.int64())}),
                      time="t", diff="d")
            if merge == "exert":
                lt.exert(4)
            elif merge == "merge_all":
                lt.merge_all()
            at = None if when is None else t - 1
            want = all(c[-1 if at is None else at] >= 0 for c in counts.values())
            assert nonnegative_at(lt, at) == want, (t, at, counts)


def test_after_a_yes_only_new_retractions_are_looked_up(tmp_path, monkeypatch):
    """Once every row was found counting at least zero, an insert without retractions
    needs no lookup, and a new retracting insert, while unmerged, has its own keys looked
    up and no other batch's."""
    looked = []
    real = signs.row_counts
    monkeypatch.setattr(signs, "row_counts", lambda trace, keys, vals, at: (
        looked.append(keys.column(0).to_pylist()), real(trace, keys, vals, at))[1])
    base = pa.table({"k": np.arange(1000), "x": np.zeros(1000)})
    with adb.Engine(spill_dir=tmp_path, memory_budget="16MiB", idle_merge=False) as e:
        lt = e.arrange(base, key=["k"], vals=["x"])

        _retract(lt, [3, 5], 1)
        assert nonnegative_at(lt) and looked == [[3, 5]]
        lt.insert(pa.table({"k": [7], "x": [1.0], "t": pa.array([2], pa.uint64()),
                            "d": pa.array([1], pa.int64())}), time="t", diff="d")
        assert nonnegative_at(lt) and looked == [[3, 5]]
        _retract(lt, list(range(500, 900)), 3)   # lands apart from the first: looked up alone
        assert len(lt.batches()) > 2
        assert nonnegative_at(lt) and looked[1:] == [list(range(500, 900))]
        _retract(lt, [5], 4)                     # 5 again: below zero
        assert not nonnegative_at(lt)


def test_a_retracting_insert_merged_away_has_everything_doubtful_checked_again(tmp_path):
    """A retracting insert that a merge took into another batch before the sign was
    asked hides which rows it lowered: the spine numbered it, no batch of its own
    carries the number, so every doubtful batch is looked up again."""
    base = pa.table({"k": np.arange(100), "x": np.zeros(100)})
    with adb.Engine(spill_dir=tmp_path, memory_budget="16MiB", idle_merge=False) as e:
        lt = e.arrange(base, key=["k"], vals=["x"])

        _retract(lt, [5], 1)
        assert nonnegative_at(lt)
        _retract(lt, [5], 2)
        newest = max(lt.batches(), key=lambda b: b.retraction_seq or 0)
        newest.retraction_seq = None   # as a merge's output, which carries no number
        assert not nonnegative_at(lt)
