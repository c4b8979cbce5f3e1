"""join_group_by: the aggregation pushed below the join gives group_by(join(...))'s result.

Oracles: DuckDB on random sides (nulls, skew, string and multi-column keys), and the
materialised plan itself on random histories with retractions, read at random times,
over one batch (the stored-layout read) and several (the accumulating cursor). The
pushed-down plan is checked to run without the join (which is made to fail), so a
silent fallback would not pass for it."""

from __future__ import annotations

import importlib
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import arrangedb as adb
from arrangedb.ops.code_totals import CodeTotals
from arrangedb.ops.group_by import group_by as eager_group_by
from arrangedb.ops.join import join as eager_join
from arrangedb.spine.read.cursor import blocks, part_blocks
from arrangedb.spine.data.updates import is_constant
from test_ops import (KEY_KINDS, SETTINGS, _history, bag, engine, key_cols,  # noqa: F401
                      make_side, sides, sql)

jgb = importlib.import_module("arrangedb.ops.join_group_by")   # the module, not the function

AGGS = {"n": ("count", None), "na": ("count", "a"), "s": ("sum", "a"), "m": ("mean", "a")}


def _no_join(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the pushed-down plan materialised the join")
    monkeypatch.setattr(jgb, "join", refuse)


def _rounded(table: pa.Table) -> pa.Table:
    """Means rounded: the two plans sum in different orders."""
    if "m" not in table.column_names:
        return table
    m = pa.array([None if x is None else round(x, 9) for x in table.column("m").to_pylist()],
                 pa.float64())
    return table.set_column(table.column_names.index("m"), "m", m)


@pytest.mark.parametrize("kind", KEY_KINDS)
@SETTINGS
@given(sides)
def test_matches_duckdb(tmp_path_factory, monkeypatch, kind, params):
    nl, nr, nkeys, skew, nulls, seed = params
    rng = np.random.default_rng(seed)
    L = make_side(rng, nl, nkeys, kind, "a", skew, nulls)
    R = make_side(rng, nr, nkeys, kind, "b", skew, nulls)
    keys = key_cols(kind)
    _no_join(monkeypatch)
    with adb.Engine(spill_dir=tmp_path_factory.mktemp("s"), memory_budget="64MiB") as e:
        lt, rt = e.arrange(L, key=keys), e.arrange(R, key=keys)
        by_val = adb.join_group_by(lt, rt, by="b", aggs=AGGS, engine=e).read_all()
        by_key = adb.join_group_by(lt, rt, by=keys, aggs=AGGS, engine=e).read_all()
        # aggregating the right side, grouped on a left val: the sides swap
        swapped = adb.join_group_by(lt, rt, by="a", aggs={"s": ("sum", "b")},
                                    engine=e).read_all()
    q = "select {g}, count(*) n, count(a) na, cast(sum(a) as bigint) s, avg(a) m " \
        "from L join R using ({k}) group by {g}"
    kl = ", ".join(keys)
    assert bag(_rounded(by_val)) == bag(_rounded(sql(q.format(g="b", k=kl), L=L, R=R)))
    assert bag(_rounded(by_key)) == bag(_rounded(sql(q.format(g=kl, k=kl), L=L, R=R)))
    want = sql(f"select a, cast(sum(b) as bigint) s from L join R using ({kl}) group by a",
               L=L, R=R)
    assert bag(swapped) == bag(want)


def _plain(L, R, by, aggs, at):
    """The materialised plan, as written (the eager operators: no planner rewrite)."""
    return eager_group_by(eager_join(L, R, at=at), by=by, aggs=aggs).read_all()


@SETTINGS
@given(st.integers(0, 150), st.integers(0, 150), st.integers(1, 20), st.integers(1, 6),
       st.integers(1, 3), st.booleans(), st.integers(0, 2**32 - 1))
def test_histories_at_any_time_equal_the_materialised_plan(tmp_path_factory, monkeypatch,
                                                           nl, nr, nkeys, times, inserts,
                                                           merged, seed):
    """Retractions, several batches or one (merged), paged parts, any ``at``."""
    rng = np.random.default_rng(seed)
    aggs = {"n": ("count", None), "s": ("sum", "v"), "c": ("count", "v")}
    with adb.Engine(spill_dir=tmp_path_factory.mktemp("s"), memory_budget="16MiB") as e:
        hist_l = _history(rng, nl, nkeys, times)
        hist_r = _history(rng, nr, nkeys, times).rename_columns(["k", "w", "t", "d"])
        L = e.arrange(hist_l.slice(0, 0), key=["k"], vals=["v"], time="t", diff="d")
        R = e.arrange(hist_r, key=["k"], vals=["w"], time="t", diff="d")
        tl = hist_l.column("t").to_numpy()
        for group in np.array_split(np.unique(tl), inserts):   # inserts in time order
            if len(group):
                L.insert(hist_l.filter(pa.array(np.isin(tl, group))), time="t", diff="d")
        if merged:
            L.merge_all()
            R.merge_all()
        at = int(rng.integers(0, times))
        want = _plain(L, R, "w", aggs, at)
        with monkeypatch.context() as m:
            _no_join(m)
            got = adb.join_group_by(L, R, by="w", aggs=aggs, at=at, engine=e).read_all()
            got_all = adb.join_group_by(L, R, by="w", aggs=aggs, engine=e).read_all()
        want_all = _plain(L, R, "w", aggs, None)
    assert bag(got) == bag(want)
    assert bag(got_all) == bag(want_all)


@pytest.mark.parametrize("by, aggs, how", [
    ("b", {"lo": ("min", "a")}, "inner"),                        # not linear
    ("a", {"s": ("sum", "a")}, "inner"),                         # grouped on the summed side
    ("k", {"s": ("sum", "a"), "t": ("sum", "b")}, "inner"),     # both sides summed
    ("b", {"s": ("sum", "a")}, "left"),                          # not inner
    ("count", {"s": ("sum", "a")}, "inner"),                     # the join's own count column
])
def test_other_plans_run_materialised_with_the_same_result(engine, monkeypatch, by, aggs,
                                                          how):
    rng = np.random.default_rng(5)
    L = make_side(rng, 300, 20, "int", "a", True, True)
    R = make_side(rng, 200, 25, "int", "b", False, True)
    lt, rt = engine.arrange(L, key=["k"]), engine.arrange(R, key=["k"])

    def refuse(*args, **kwargs):
        raise AssertionError("pushed below the join, which this plan does not allow")
    monkeypatch.setattr(jgb, "_fused", refuse)
    got = adb.join_group_by(lt, rt, by=by, aggs=aggs, how=how, engine=engine).read_all()
    want = adb.group_by(adb.join(lt, rt, how=how), by=by, aggs=aggs, engine=engine).read_all()
    assert bag(got) == bag(want)


def test_float_sums_and_nulls_in_the_group_column(engine, monkeypatch):
    rng = np.random.default_rng(3)
    n = 5000
    L = pa.table({"k": rng.integers(0, 700, n), "x": np.round(rng.random(n) * 100, 2)})
    region = pa.array([None if i % 11 == 0 else f"r{i % 5}" for i in range(600)])
    R = pa.table({"k": np.arange(600), "region": region})
    lt, rt = engine.arrange(L, key=["k"]), engine.arrange(R, key=["k"])
    lt.merge_all()
    _no_join(monkeypatch)
    got = adb.join_group_by(lt, rt, by="region", aggs={"n": ("count", None),
                                                       "s": ("sum", "x")},
                            engine=engine).read_all().sort_by("region")
    want = sql("select region, count(*) n, sum(x) s from L join R using (k) group by region "
               "order by region nulls last", L=L, R=R)
    assert got.column("region").to_pylist() == want.column("region").to_pylist()
    assert got.column("n").to_pylist() == want.column("n").to_pylist()
    np.testing.assert_allclose(got.column("s").to_numpy(), want.column("s").to_numpy(),
                               rtol=1e-12)


@SETTINGS
@given(st.integers(1, 3000), st.integers(1, 300), st.booleans(), st.integers(0, 2**32 - 1))
def test_sums_on_the_encoding_match_duckdb(tmp_path_factory, monkeypatch, n, nkeys, twice,
                                           seed):
    """Each (key, val) once -- or, ``twice``, a few of them twice (counted 2 once
    consolidated) -- at one time: A's parts are summed on their encodings (decimal
    amounts, integers) without decoding them, and the result is DuckDB's."""
    rng = np.random.default_rng(seed)
    L = pa.table({"k": rng.integers(0, nkeys, n),
                  "x": (rng.permutation(n) - 300) / 100,   # distinct: no (key, val) twice
                  "i": rng.permutation(n) * 7 - 100})
    if twice:
        L = pa.concat_tables([L, L.take(np.flatnonzero(rng.random(n) < 0.03))])
    R = pa.table({"k": np.arange(nkeys), "g": rng.integers(0, 4, nkeys)})
    _no_join(monkeypatch)
    storage = importlib.import_module("arrangedb.spine.storage.paged")
    sums, summed = [], storage.column_segment_sums
    monkeypatch.setattr(storage, "column_segment_sums",
                        lambda *a: sums.append(summed(*a)) or sums[-1])
    aggs = {"n": ("count", None), "sx": ("sum", "x"), "mx": ("mean", "x"),
            "si": ("sum", "i"), "ci": ("count", "i")}
    with adb.Engine(spill_dir=tmp_path_factory.mktemp("s"), memory_budget="16MiB") as e:
        lt, rt = e.arrange(L, key=["k"]), e.arrange(R, key=["k"])
        got = adb.join_group_by(lt, rt, by="g", aggs=aggs, engine=e).read_all().sort_by("g")
        kept = [p for b in lt.batches() for p in b.parts if "key_sums" in p.columns]
    if n >= 64 and nkeys >= 8:   # (smaller columns are stored plain, and a column
        # sorted throughout -- one key's vals -- as deltas, which decode instead)
        assert any(x is not None for x in sums) or kept   # summed as read, or as written
    want = sql("select g, count(*) n, sum(x) sx, avg(x) mx, sum(i) si, count(i) ci "
               "from L join R using (k) group by g order by g", L=L, R=R)
    for c in ("g", "n", "si", "ci"):
        assert got.column(c).to_pylist() == want.column(c).to_pylist()
    for c in ("sx", "mx"):
        np.testing.assert_allclose(got.column(c).to_numpy(), want.column(c).to_numpy(),
                                   rtol=1e-12, atol=1e-9)


def test_parts_counted_differently_are_gathered_apart(tmp_path, monkeypatch):
    """Parts of one batch whose rows all count 1 before parts whose rows all count -1:
    a count and a sum's valid rows are one array in the former, two in the latter
    (-rows and rows), and the partials gathered across them for one block of the other
    side keep them apart -- else the valid rows cancel and the sum reads as null."""
    nkeys = 6_000   # the other side in one part, this one in several
    rng = np.random.default_rng(8)
    k = np.repeat(np.arange(nkeys), 20)   # as many rows counted 1 as counted -1
    L = pa.table({"k": k, "x": rng.permutation(len(k)) - 7,
                  "d": np.where(k < nkeys // 2, 1, -1).astype(np.int64)})
    R = pa.table({"k": np.arange(nkeys), "g": pa.array(["all"] * nkeys)})
    # counts and sums only: over negative weights, group_by refuses a mean
    aggs = {"n": ("count", None), "s": ("sum", "x")}
    with adb.Engine(spill_dir=tmp_path, memory_budget="16MiB") as e:
        lt = e.arrange(L, key=["k"], vals=["x"], diff="d")
        rt = e.arrange(R, key=["k"])
        lt.merge_all()
        assert len(lt.batches()[0].parts) > 2 and len(rt.batches()[0].parts) == 1
        want = _plain(lt, rt, "g", aggs, None)
        with monkeypatch.context() as m:
            _no_join(m)
            got = adb.join_group_by(lt, rt, by="g", aggs=aggs, engine=e).read_all()
    assert want.column("s").null_count == 0
    assert bag(_rounded(got)) == bag(_rounded(want))


def test_bad_input_is_refused(engine):
    L = engine.arrange(pa.table({"k": [1, 2], "a": [1, 2]}), key=["k"])
    R = engine.arrange(pa.table({"k": [1, 2], "b": ["x", "y"]}), key=["k"])
    S = engine.arrange(pa.table({"k": ["1"], "b": ["x"]}), key=["k"])
    with pytest.raises(KeyError, match="no column 'zz'"):
        adb.join_group_by(L, R, by="zz", aggs={"n": ("count", None)})
    with pytest.raises(TypeError, match="numeric"):
        adb.join_group_by(L, R, by="k", aggs={"s": ("sum", "b")})
    with pytest.raises(ValueError, match="unknown function"):
        adb.join_group_by(L, R, by="b", aggs={"s": ("median", "a")})
    with pytest.raises(TypeError, match="key types differ"):
        adb.join_group_by(L, S, by="b", aggs={"n": ("count", None)})
    with pytest.raises(ValueError, match="unknown how"):
        adb.join_group_by(L, R, by="b", aggs={"n": ("count", None)}, how="outer")


def _accumulated(block_iter, names) -> Counter:
    c = Counter()
    for b in block_iter:
        rows = b.row_keys().to_pylist()
        vals = b.vals.to_pylist() if b.vals is not None else [{}] * len(rows)
        for r, v, n in zip(rows, vals, b.counts.tolist()):
            c[tuple({**r, **v}[x] for x in names)] += n
    return Counter({k: v for k, v in c.items() if v})


@SETTINGS
@given(st.integers(0, 300), st.integers(1, 30), st.integers(1, 6), st.booleans(),
       st.booleans(), st.integers(0, 2**32 - 1))
def test_part_blocks_hold_what_the_cursor_holds(tmp_path_factory, n, nkeys, times, merged,
                                                key_only, seed):
    rng = np.random.default_rng(seed)
    hist = _history(rng, n, nkeys, times)
    if key_only:
        hist = hist.drop_columns(["v"])
    with adb.Engine(spill_dir=tmp_path_factory.mktemp("s"), memory_budget="16MiB") as e:
        t = e.arrange(hist, key=["k"], vals=None if key_only else ["v"], time="t", diff="d")
        again = hist.slice(0, n // 3)   # the same rows once more, after the trace's upper
        again = again.set_column(again.schema.get_field_index("t"), "t",
                                 pa.array(again.column("t").to_numpy() + np.uint64(t.upper())))
        t.insert(again, time="t", diff="d")
        if merged:
            t.merge_all()
        names = ["k"] if key_only else ["k", "v"]
        for at in (None, int(rng.integers(0, times))):
            got = list(part_blocks(t, at))
            for b in got:   # each block: distinct sorted keys, nonzero counts
                assert len(b.key_bounds) == b.num_keys + 1 and (np.diff(b.key_bounds) > 0).all()
                assert (np.asarray(b.counts) != 0).all()
            assert _accumulated(got, names) == _accumulated(blocks(t, at), names)


@SETTINGS
@given(st.integers(1, 400), st.integers(1, 40), st.booleans(), st.booleans(),
       st.integers(0, 3), st.integers(0, 2**32 - 1))
def test_part_blocks_sum_columns_on_their_encoding(tmp_path_factory, n, nkeys, history,
                                                   nulls, copies, seed):
    """Columns asked summed come as per-key sums -- equal to summing the decoded values
    -- from every part holding one stored (time, diff); from parts at one time whose
    rows count differently (rows repeated ``copies`` times: consolidated, a few count
    more), as per-key sums of value x count; the other columns asked for are there."""
    rng = np.random.default_rng(seed)
    x = np.round(rng.integers(-10**6, 10**6, n) / 100, 2)
    data = pa.table({"k": rng.integers(0, nkeys, n), "i": rng.integers(-50, 10**6, n),
                     "x": pa.array(x, mask=rng.random(n) < 0.2 if nulls else None),
                     "s": pa.array([f"s{v}" for v in rng.integers(0, 5, n)])})
    if copies:   # some rows again: they consolidate to counts of 2, 3...
        again = [data.take(np.flatnonzero(rng.random(n) < 0.05)) for _ in range(copies)]
        data = pa.concat_tables([data, *again])
    with adb.Engine(spill_dir=tmp_path_factory.mktemp("s"), memory_budget="16MiB") as e:
        t = e.arrange(data, key=["k"], vals=["i", "x", "s"])
        if history:   # a retraction at a later time: parts with several (time, diff)
            t.insert(data.slice(0, n // 2).append_column("d", pa.array(
                np.full(n // 2, -1, np.int64))), diff="d")
            t.merge_all()
        plain = list(part_blocks(t))
        got = list(part_blocks(t, sums=frozenset({"i", "x"}), columns=frozenset({"s"})))
    assert len(got) == len(plain)
    summed = 0
    for g, p in zip(got, plain):
        assert g.keys.equals(p.keys) and (g.key_bounds == p.key_bounds).all()
        assert g.vals.column("s").equals(p.vals.column("s"))
        assert (np.asarray(g.counts) == np.asarray(p.counts)).all()
        for name in ("i", "x"):
            weighted = name in (g.weighted_sums or {})
            if name not in (g.key_sums or {}) and not weighted:
                assert g.vals.column(name).equals(p.vals.column(name))
                continue
            summed += 1
            assert name not in g.vals.column_names and weighted != is_constant(g.counts)
            assert p.vals.column(name).null_count == 0
            values = p.vals.column(name).to_numpy()
            starts = p.key_bounds[:-1].astype(np.int64)
            got = (g.weighted_sums if weighted else g.key_sums)[name]
            weights = np.asarray(p.counts, np.int64) if weighted else 1
            if name == "i":
                assert got.tolist() == np.add.reduceat(values * weights, starts).tolist()
            else:   # decimals: each key's sum, from the exact cents rounded once
                cents = np.rint(values * 100).astype(np.int64)
                want = np.add.reduceat(cents * weights, starts) / 100
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)
    if not history and not copies and n >= 64 and nkeys >= 8:   # one (time, diff), and
        # columns stored with frame-of-reference residuals (see the decimals test above)
        assert summed >= 1


@pytest.mark.parametrize("every", [997, 11])
def test_rows_counted_twice_are_summed_weighted(tmp_path, monkeypatch, every):
    """One row in ``every`` twice (counted 2 once consolidated, all at one time): a few
    such rows leave the leaf bounds stored as runs, from whose metadata each row's count
    is read; more of them (still under an eighth) as a list, decoded. Either way the
    part sums its prices on their encoding, weighted by the counts, and the result is
    DuckDB's."""
    storage = importlib.import_module("arrangedb.spine.storage.paged")
    from_list, decoded = storage.leaf_counts, []
    monkeypatch.setattr(storage, "leaf_counts", lambda *a: decoded.append(1) or from_list(*a))
    rng = np.random.default_rng(every)
    n = 20_000
    L = pa.table({"k": rng.integers(0, 2_000, n),
                  "x": np.round(rng.integers(1, 10**6, n) / 100, 2),
                  "i": rng.integers(-10**6, 10**6, n),
                  "u": rng.integers(0, 10**6, n).astype(np.uint64)})
    L = pa.concat_tables([L, L.take(np.arange(0, n, every))])
    R = pa.table({"k": np.arange(2_000), "g": pa.array(rng.integers(0, 5, 2_000))})
    aggs = {"n": ("count", None), "sx": ("sum", "x"), "si": ("sum", "i"), "su": ("sum", "u")}
    summed = frozenset({"x", "i", "u"})
    with adb.Engine(spill_dir=tmp_path, memory_budget="16MiB") as e:
        lt, rt = e.arrange(L, key=["k"]), e.arrange(R, key=["k"])
        lt.merge_all()
        weighted = [b for b in part_blocks(lt, sums=summed, columns=frozenset())
                    if b.weighted_sums]
        assert weighted and all(set(b.weighted_sums) == summed for b in weighted)
        from_runs = len(weighted) - len(decoded)
        _no_join(monkeypatch)
        got = adb.group_by(adb.join(lt, rt), by="g", aggs=aggs).read_all().sort_by("g")
    # few odd rows: some part read its counts from the runs; many: every part decoded them
    assert from_runs > 0 if every > 100 else from_runs == 0
    want = sql("select g, count(*) n, sum(x) sx, sum(i) si, sum(u) su from L join R "
               "using (k) group by g order by g", L=L, R=R)
    for c in ("g", "n", "si", "su"):
        assert got.column(c).to_pylist() == want.column(c).to_pylist()
    np.testing.assert_allclose(got.column("sx").to_numpy(), want.column("sx").to_numpy(),
                               rtol=1e-12)


@pytest.mark.parametrize("n", [40, 20_000])
@pytest.mark.parametrize("special", [np.inf, -np.inf, np.nan])
def test_rows_counted_otherwise_with_values_that_are_not_finite(tmp_path, n, special):
    """Sums weighed by the usual count and corrected at the few rows counted otherwise
    would make inf - inf (NaN) where a row counted once holds inf among rows counted
    twice: such sums, on the stored part (40 rows: one key of many vals, key sums stored;
    20k: over 2k keys) and row by row, weigh every row instead. The result is the plan's
    as written, which SQL's expansion gives too."""
    rng = np.random.default_rng(5)
    x = np.round(rng.random(n) * 100, 2)
    x[n // 3] = special
    k = np.zeros(n, np.int64) if n == 40 else rng.integers(0, 2_000, n)
    d = np.where(np.arange(n) == n // 3, 1, 2).astype(np.int64)   # the special row once
    d[::97] = 1
    fact = pa.table({"k": k, "x": x, "d": d})
    dim = pa.table({"k": np.arange(2_000), "g": [f"g{i % 3}" for i in range(2_000)]})
    aggs = {"s": ("sum", "x"), "m": ("mean", "x"), "n": ("count", None)}
    with adb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        F = e.arrange(fact, key=["k"], vals=["x"], diff="d")
        D = e.arrange(dim, key=["k"], vals=["g"])
        plan = adb.group_by(adb.join(F, D), by="g", aggs=aggs)
        assert "eager aggregation" in plan.explain()
        got = plan.read_all().sort_by("g")
        want = eager_group_by(eager_join(F, D), by="g", aggs=aggs).read_all().sort_by("g")
    assert got.column("n").to_pylist() == want.column("n").to_pylist()
    for c in ("s", "m"):
        np.testing.assert_allclose(got.column(c).to_numpy(), want.column(c).to_numpy(),
                                   rtol=1e-9)   # (NaN equal to NaN, inf to inf)
    assert np.isnan(want.column("s").to_numpy()).any() == np.isnan(special)


def test_signed_rows_of_the_other_side_and_one_global_group_give_the_plan_as_written():
    """A dimension holding a retraction without its insertion (count -1) makes joined
    rows of signed counts: a group whose count nets to zero still has its sum (Z-set
    semantics), so it is kept. A grouping of no columns (one global group) is not
    rewritten: it answers as written."""
    aggs = {"n": ("count", None), "s": ("sum", "x")}
    with adb.Engine(memory_budget="64MiB") as e:
        F = e.arrange(pa.table({"k": [1, 2, 3], "x": [2.5, 0.0, 7.0]}), key=["k"],
                      vals=["x"], name="fact")
        D = e.arrange(pa.table({"k": [1, 2, 3], "seg": [2, 2, 1], "d": [1, -1, 1]}),
                      key=["k"], vals=["seg"], diff="d", name="dim")
        plan = adb.group_by(adb.join(F, D), by="seg", aggs=aggs)
        assert "eager aggregation" in plan.explain()
        want = eager_group_by(eager_join(F, D), by="seg", aggs=aggs).read_all()
        assert want.sort_by("seg").to_pydict() == {"seg": [1, 2], "n": [1, 0], "s": [7.0, 2.5]}
        assert plan.read_all().sort_by("seg").equals(want.sort_by("seg"))
        whole = adb.group_by(adb.join(F, D), by=[], aggs=aggs)
        assert whole.read_all().to_pydict() == \
            eager_group_by(eager_join(F, D), by=[], aggs=aggs).read_all().to_pydict()


def test_summed_right_side_with_its_own_key_name(engine, monkeypatch):
    """The right side summed per key and grouped on the key: the output names the key
    as the left trace does, whatever the right trace calls it."""
    L = pa.table({"k": np.arange(6) % 4, "a": np.arange(6)})
    R = pa.table({"id": np.arange(30) % 5, "b": np.arange(30)})
    lt, rt = engine.arrange(L, key=["k"]), engine.arrange(R, key=["id"])
    _no_join(monkeypatch)
    got = adb.join_group_by(lt, rt, by="k", aggs={"s": ("sum", "b"), "n": ("count", None)},
                            engine=engine).read_all()
    want = sql("select k, cast(sum(b) as bigint) s, count(*) n from L join R on k = id "
               "group by k", L=L, R=R)
    assert bag(got) == bag(want)


@pytest.mark.parametrize("step", [2, 1])
def test_dimension_codes_counted_piece_by_piece(tmp_path, monkeypatch, step):
    """A fact side of several batches, each of several parts, meets every block of a
    dimension as several pieces, with keys on one side only and nulls in the group
    column: each piece's group codes are counted on their own, never concatenated with
    the other pieces', and the result is DuckDB's. ``step`` 2: even dimension keys, odd
    fact keys miss; 1: the dimension's keys are a range (matched by offset, the fact's
    pieces sliced), and one fact batch holds each of its keys once (pieces equal to
    the dimension's blocks)."""
    rng = np.random.default_rng(11)
    nkeys = 100_000
    R = pa.table({"k": np.arange(0, step * nkeys, step),
                  "g": pa.array([None if i % 13 == 0 else f"g{i % 7}" for i in range(nkeys)])})
    facts = [pa.table({"k": rng.integers(-100, step * nkeys + 100, 60_000),
                       "x": np.round(rng.random(60_000) * 100, 2),
                       "i": rng.integers(-50, 50, 60_000)}) for _ in range(3)]
    if step == 1:
        facts[2] = pa.table({"k": R.column("k"), "x": np.round(rng.random(nkeys) * 100, 2),
                             "i": rng.integers(-50, 50, nkeys)})
    aggs = {"n": ("count", None), "sx": ("sum", "x"), "si": ("sum", "i"),
            "ci": ("count", "i")}
    counted = []
    table = CodeTotals.table
    monkeypatch.setattr(CodeTotals, "table",
                        lambda self, by: counted.append(by) or table(self, by))
    # no idle merger: the inserts must stay batches of their own
    with adb.Engine(spill_dir=tmp_path, memory_budget="16MiB", idle_merge=False) as e:
        lt, rt = e.arrange(facts[0], key=["k"]), e.arrange(R, key=["k"])
        lt.insert(facts[1])
        lt.insert(facts[2])
        assert len(lt.batches()) > 1 and len(rt.batches()[0].parts) > 1
        with monkeypatch.context() as m:
            _no_join(m)
            got = adb.join_group_by(lt, rt, by="g", aggs=aggs, engine=e).read_all()
    assert counted   # grouped by the dimension's codes, piece by piece
    L = pa.concat_tables(facts)
    want = sql("select g, count(*) n, sum(x) sx, sum(i) si, count(i) ci from L join R "
               "using (k) group by g order by g nulls last", L=L, R=R)
    got = got.sort_by([("g", "ascending")])
    got = got.take(np.argsort(got.column("g").is_null().to_numpy(zero_copy_only=False),
                              kind="stable"))
    for c in ("g", "n", "si", "ci"):
        assert got.column(c).to_pylist() == want.column(c).to_pylist()
    np.testing.assert_allclose(got.column("sx").to_numpy(), want.column("sx").to_numpy(),
                               rtol=1e-12)


def test_a_group_column_named_apart_from_its_trace_column(tmp_path, monkeypatch):
    """Both sides hold a val ``g``: the join names them ``left_g`` and ``right_g``, and a
    grouping on ``right_g`` -- the dimension's ``g``, read as codes -- is counted by the
    dimension's codes under its output name, as the plan as written groups it."""
    rng = np.random.default_rng(4)
    nkeys = 50_000
    L = pa.table({"k": rng.integers(0, nkeys, 200_000), "g": rng.integers(0, 9, 200_000),
                  "x": np.round(rng.random(200_000) * 10, 2)})
    R = pa.table({"k": np.arange(nkeys), "g": pa.array([f"r{i % 6}" for i in range(nkeys)])})
    aggs = {"n": ("count", None), "s": ("sum", "x")}
    counted = []
    table = CodeTotals.table
    monkeypatch.setattr(CodeTotals, "table",
                        lambda self, by: counted.append(by) or table(self, by))
    with adb.Engine(spill_dir=tmp_path, memory_budget="16MiB") as e:
        lt, rt = e.arrange(L, key=["k"]), e.arrange(R, key=["k"])
        want = _plain(lt, rt, "right_g", aggs, None)
        with monkeypatch.context() as m:
            _no_join(m)
            got = adb.join_group_by(lt, rt, by="right_g", aggs=aggs, engine=e).read_all()
    assert counted and set(counted) == {"right_g"}
    got, want = got.sort_by("right_g"), want.sort_by("right_g")
    for c in ("right_g", "n"):
        assert got.column(c).to_pylist() == want.column(c).to_pylist()
    np.testing.assert_allclose(got.column("s").to_numpy(), want.column("s").to_numpy(),
                               rtol=1e-12)


def test_integer_group_column_of_a_dimension_groups_by_slot(tmp_path, monkeypatch):
    """Grouped on an integer of the dimension with many values (a customer id per
    order), over a fact side of several batches, some with no keys in a block: the
    pairs of every batch are grouped at once per block, by slot (dense_groups), never
    hashed into a dictionary, and the result is DuckDB's."""
    rng = np.random.default_rng(12)
    nkeys = 80_000
    R = pa.table({"k": np.arange(nkeys), "c": rng.integers(-20_000, 20_000, nkeys)})
    facts = [pa.table({"k": rng.integers(lo, hi, 50_000), "x": np.round(rng.random(50_000), 2),
                       "i": rng.integers(-50, 50, 50_000)})
             for lo, hi in ((0, nkeys), (0, nkeys // 3), (2 * nkeys // 3, nkeys + 500))]
    partials_module = importlib.import_module("arrangedb.ops.partials")
    slotted = []
    dense = partials_module.dense_groups
    monkeypatch.setattr(partials_module, "dense_groups",
                        lambda *a: (lambda out: slotted.append(out is not None) or out)(dense(*a)))
    monkeypatch.setattr(importlib.import_module("arrangedb.ops.coded_groups"), "CodeTotals",
                        None)   # no dictionary path for an integer
    aggs = {"n": ("count", None), "sx": ("sum", "x"), "si": ("sum", "i")}
    with adb.Engine(spill_dir=tmp_path, memory_budget="16MiB", idle_merge=False) as e:
        lt, rt = e.arrange(facts[0], key=["k"]), e.arrange(R, key=["k"])
        lt.insert(facts[1])
        lt.insert(facts[2])
        assert len(lt.batches()) == 3 and len(rt.batches()[0].parts) > 1
        with monkeypatch.context() as m:
            _no_join(m)
            got = adb.join_group_by(lt, rt, by="c", aggs=aggs, engine=e).read_all()
    assert any(slotted)
    L = pa.concat_tables(facts)
    want = sql("select c, count(*) n, sum(x) sx, sum(i) si from L join R using (k) "
               "group by c order by c", L=L, R=R)
    got = got.sort_by("c")
    for c in ("c", "n", "si"):
        assert got.column(c).to_pylist() == want.column(c).to_pylist()
    # per-key sums come off running sums of a part: small groups differ in the last bits
    np.testing.assert_allclose(got.column("sx").to_numpy(), want.column("sx").to_numpy(),
                               rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("budget", ["8MiB", "64MiB"])
def test_ids_spread_wider_than_a_block_are_grouped_once(tmp_path, monkeypatch, budget):
    """Grouped on an id of the dimension spread wider than a block's pairs (a customer
    per order): a block's pairs go to the grouping uncombined -- grouping them there
    would barely shrink them -- and are added up by slot (64 MiB) or combined with
    other blocks' (8 MiB: the range is past what the slots may hold). DuckDB's result."""
    rng = np.random.default_rng(21)
    norders, ncustomers = 200_000, 150_000
    R = pa.table({"k": np.arange(norders), "c": rng.integers(0, ncustomers, norders)})
    L = pa.table({"k": rng.integers(0, norders, 600_000), "x": np.round(rng.random(600_000), 2),
                  "i": rng.integers(-50, 50, 600_000)})
    sparse = []
    check = jgb._sparse_ints
    monkeypatch.setattr(jgb, "_sparse_ints",
                        lambda *a: (lambda out: sparse.append(out) or out)(check(*a)))
    aggs = {"n": ("count", None), "sx": ("sum", "x"), "si": ("sum", "i")}
    with adb.Engine(spill_dir=tmp_path, memory_budget=budget, idle_merge=False) as e:
        lt, rt = e.arrange(L, key=["k"]), e.arrange(R, key=["k"])
        got = adb.group_by(adb.join(lt, rt), by="c", aggs=aggs).read_all().sort_by("c")
    assert sparse and all(sparse)
    want = sql("select c, count(*) n, sum(x) sx, sum(i) si from L join R using (k) "
               "group by c order by c", L=L, R=R)
    for c in ("c", "n", "si"):
        assert got.column(c).to_pylist() == want.column(c).to_pylist()
    np.testing.assert_allclose(got.column("sx").to_numpy(), want.column("sx").to_numpy(),
                               rtol=1e-12, atol=1e-9)
