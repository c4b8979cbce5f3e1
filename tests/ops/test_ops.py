"""Operators against DuckDB as the oracle, on random data, through the public API.

Results are compared as multisets. Joins with ``expand=True`` are SQL joins; without it
every row carries the product of the two sides' counts, which ``expand`` undoes.
Incremental outputs are checked against the difference of two snapshots.
"""

from __future__ import annotations

from collections import Counter

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrangedb as adb
from arrangedb.ops.join import match_keys
from test_spine_units import memory_trace

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def bag(table: pa.Table, columns=None) -> Counter:
    table = table.select(columns) if columns else table
    return Counter(tuple(r.values()) for r in table.to_pylist())


def weighted_bag(table: pa.Table, columns, weight="count") -> Counter:
    c = Counter()
    for r in table.to_pylist():
        c[tuple(r[k] for k in columns)] += r[weight]
    return +c


def sql(query: str, **tables) -> pa.Table:
    con = duckdb.connect()
    for name, t in tables.items():
        con.register(name, t)
    return con.sql(query).to_arrow_table()


KEY_KINDS = ["int", "string", "multi"]


def make_side(rng, n, nkeys, kind, val_name, skew=False, null_vals=False):
    k = rng.integers(0, nkeys, n) if nkeys else np.zeros(n, np.int64)
    if skew and n:
        k[: max(1, n // 10)] = 0                       # one key holds 10% of the rows
    v = rng.integers(0, 4, n)
    vals = pa.array(v, pa.int64(), mask=(rng.random(n) < 0.2) if null_vals else None)
    cols = {}
    if kind == "int":
        cols["k"] = pa.array(k, pa.int64())
    elif kind == "string":
        cols["k"] = pa.array([f"ké{x}" if x % 3 else "" if x == 0 else f"k{x}" for x in k],
                             pa.string())
    else:
        cols["k"] = pa.array(k // 3, pa.int64())
        cols["k2"] = pa.array([f"s{x % 3}" for x in k], pa.string())
    cols[val_name] = vals
    return pa.table(cols)


def key_cols(kind):
    return ["k", "k2"] if kind == "multi" else ["k"]


@pytest.fixture
def engine(tmp_path):
    with adb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        yield e


sides = st.tuples(st.integers(0, 200), st.integers(0, 200), st.integers(1, 40),
                  st.booleans(), st.booleans(), st.integers(0, 2**32 - 1))


@pytest.mark.parametrize("kind", KEY_KINDS)
@SETTINGS
@given(sides)
def test_join_matches_duckdb(engine, kind, params):
    nl, nr, nkeys, skew, nulls, seed = params
    rng = np.random.default_rng(seed)
    L = make_side(rng, nl, nkeys, kind, "a", skew, nulls)
    R = make_side(rng, nr, nkeys + 5, kind, "b", skew, nulls)
    keys = key_cols(kind)
    lt, rt = engine.arrange(L, key=keys), engine.arrange(R, key=keys)
    on = " and ".join(f"L.{k} = R.{k}" for k in keys)
    kl = ", ".join(f"L.{k}" for k in keys)
    cols = keys + ["a", "b"]
    got = adb.join(lt, rt, expand=True, batch_rows=97).read_all()
    assert bag(got, cols) == bag(sql(f"select {kl}, a, b from L join R on {on}", L=L, R=R))
    assert weighted_bag(adb.join(lt, rt).read_all(), cols) == bag(got, cols)
    got = adb.join(lt, rt, how="left", expand=True).read_all()
    assert bag(got, cols) == bag(sql(f"select {kl}, a, b from L left join R on {on}", L=L, R=R))
    either = ", ".join(f"coalesce(L.{k}, R.{k}) as {k}" for k in keys)
    for how in ("right", "full"):   # unmatched rows of the right side: null left vals
        got = adb.join(lt, rt, how=how, expand=True, batch_rows=89).read_all()
        want = sql(f"select {either}, a, b from L {how} join R on {on}", L=L, R=R)
        assert bag(got, cols) == bag(want), how
        assert weighted_bag(adb.join(lt, rt, how=how).read_all(), cols) == bag(got, cols)
    for how, q in (("semi", "semi"), ("anti", "anti")):
        got = adb.join(lt, rt, how=how, expand=True).read_all()
        want = sql(f"select {kl}, a from L {q} join R on {on}", L=L, R=R)
        assert bag(got, keys + ["a"]) == bag(want), how


@SETTINGS
@given(st.lists(st.integers(0, 80), min_size=2, max_size=6), st.integers(1, 15),
       st.booleans(), st.integers(0, 2**32 - 1))
def test_expand_join_over_a_left_side_of_several_runs(still_engine, sizes, nkeys, retract,
                                                      seed):
    """A left trace of several runs (an appender's chunks, none merged): a bag read takes
    each run's rows on its own when all are insertions, else merges them -- a later run
    retracting rows of the first must cancel them, never fail as a negative count."""
    rng = np.random.default_rng(seed)
    chunks = [make_side(rng, n, nkeys, "int", "a") for n in sizes]
    chunks = [c.append_column("d", pa.array(np.ones(c.num_rows, np.int64))) for c in chunks]
    if retract and chunks[0].num_rows:
        gone = chunks[0].take(rng.choice(chunks[0].num_rows, chunks[0].num_rows // 2,
                                         replace=False))
        chunks.append(gone.set_column(2, "d", pa.array(-np.ones(gone.num_rows, np.int64))))
    R = make_side(rng, 30, nkeys + 3, "int", "b")
    lt = still_engine.arrange(chunks[0], key=["k"], vals=["a"], diff="d")
    load = lt.appender()
    for c in chunks[1:]:
        load.add(c)
    load.finish()
    assert len([c for c in chunks if c.num_rows]) < 2 or len(lt.batches()) > 1
    net = Counter()
    for c in chunks:
        for r in c.to_pylist():
            net[(r["k"], r["a"])] += r["d"]
    L = pa.table({"k": pa.array([k for (k, _), n in net.items() for _ in range(n)], pa.int64()),
                  "a": pa.array([a for (_, a), n in net.items() for _ in range(n)], pa.int64())})
    rt = still_engine.arrange(R, key=["k"])
    got = adb.join(lt, rt, expand=True, batch_rows=53).read_all()
    assert bag(got, ["k", "a", "b"]) == bag(sql("select L.k, a, b from L join R on L.k = R.k",
                                                L=L, R=R))
    got = adb.join(lt, rt, how="left", expand=True).read_all()
    assert bag(got, ["k", "a", "b"]) == bag(sql("select L.k, a, b from L left join R "
                                                "on L.k = R.k", L=L, R=R))


@pytest.mark.parametrize("kind", KEY_KINDS)
@SETTINGS
@given(sides)
def test_reduce_matches_duckdb(engine, kind, params):
    n, _, nkeys, skew, nulls, seed = params
    rng = np.random.default_rng(seed)
    T = make_side(rng, n, nkeys, kind, "a", skew, nulls)
    keys = key_cols(kind)
    tr = engine.arrange(T, key=keys)
    aggs = {"n": ("count", None), "na": ("count", "a"), "s": ("sum", "a"), "lo": ("min", "a"),
            "hi": ("max", "a"), "cd": ("count_distinct", "a"), "m": ("mean", "a")}
    got = adb.reduce(tr, aggs).read_all()
    kl = ", ".join(keys)
    want = sql(f"select {kl}, count(*) n, count(a) na, cast(sum(a) as bigint) s, min(a) lo, "
               f"max(a) hi, count(distinct a) cd, avg(a) m from T group by {kl}", T=T)
    assert bag(got) == bag(want)


@SETTINGS
@given(sides)
def test_group_by_over_a_join_matches_duckdb(tmp_path_factory, params):
    nl, nr, nkeys, skew, nulls, seed = params
    rng = np.random.default_rng(seed)
    L = make_side(rng, nl, nkeys, "int", "a", skew, nulls)
    R = make_side(rng, nr, nkeys, "int", "b", skew, nulls)
    with adb.Engine(spill_dir=tmp_path_factory.mktemp("s"), memory_budget="64MiB") as e:
        lt, rt = e.arrange(L, key=["k"]), e.arrange(R, key=["k"])
        got = adb.group_by(adb.join(lt, rt), by=["b"],
                           aggs={"n": ("count", None), "s": ("sum", "a"), "m": ("mean", "a"),
                                 "lo": ("min", "a"), "hi": ("max", "a")}, engine=e).read_all()
    want = sql("select b, count(*) n, cast(sum(a) as bigint) s, avg(a) m, min(a) lo, max(a) hi "
               "from L join R using (k) group by b", L=L, R=R)
    assert bag(got) == bag(want)


@pytest.mark.parametrize("dictionary", [False, True])
def test_group_by_spills_partials_when_groups_do_not_fit(tmp_path, dictionary):
    """Many groups under a tiny budget: partials go through an arrangement, result exact
    (a dictionary group column's partials spill as its plain strings)."""
    rng = np.random.default_rng(3)
    batches = [pa.record_batch({"g": rng.integers(0, 200_000, 50_000),
                                "x": rng.integers(0, 100, 50_000),
                                "count": rng.integers(1, 3, 50_000)}) for _ in range(8)]
    T = pa.Table.from_batches(batches)
    if dictionary:
        batches = [pa.record_batch({"g": pc.cast(b.column("g"), pa.string()).dictionary_encode(),
                                    "x": b.column("x"), "count": b.column("count")})
                   for b in batches]
    aggs = {"n": ("count", None), "s": ("sum", "x")}
    if not dictionary:
        aggs["hi"] = ("max", "x")
    with adb.Engine(spill_dir=tmp_path, memory_budget="8MiB") as e:
        got = adb.group_by(iter(batches), by="g", aggs=aggs, engine=e,
                           weight="count").read_all()
        assert e.stats()["bytes_spilled"] > 0
    if dictionary:
        assert got.schema.field("g").type == pa.string()
        got = got.set_column(0, "g", pc.cast(got.column("g"), pa.int64()))
        want = sql("select g, sum(count) n, sum(x * count) s from T group by g", T=T)
    else:
        want = sql("select g, sum(count) n, sum(x * count) s, max(x) hi from T group by g",
                   T=T)
    assert bag(got) == bag(want.cast(got.schema))


def test_group_by_of_one_large_table_spills_its_partials_too(tmp_path):
    """A table read whole (one chunk) is grouped a slice at a time, so that its groups'
    partials spill as a stream's do instead of being asked of the budget at once."""
    rng = np.random.default_rng(4)
    n = 600_000
    T = pa.table({"g": rng.permutation(n), "x": rng.integers(0, 100, n)})
    assert T.column("g").num_chunks == 1
    with adb.Engine(spill_dir=tmp_path, memory_budget="8MiB") as e:
        got = adb.group_by(T, by="g", aggs={"n": ("count", None), "s": ("sum", "x")},
                           engine=e).read_all()
        assert e.stats()["bytes_spilled"] > 0
    want = sql("select g, count(*) n, sum(x) s from T group by g", T=T)
    assert bag(got) == bag(want.cast(got.schema))


def test_a_join_of_long_strings_comes_in_batches_of_a_share_of_the_budget(tmp_path):
    """Batches are cut in bytes as well as rows: 2 KiB strings joined many to many (10k
    output rows a key) under 32 MiB come in batches of about 2 MiB (a sixteenth of the
    budget), not 64k rows (128 MB)."""
    keys = 20
    L = pa.table({"k": np.repeat(np.arange(keys), 50),
                  "s": ["z" * 2040 + "%08d" % i for i in range(50 * keys)]})
    R = pa.table({"k": np.repeat(np.arange(keys), 200), "b": np.arange(200 * keys)})
    with adb.Engine(spill_dir=tmp_path, memory_budget="32MiB") as e:
        lt, rt = e.arrange(L, key=["k"]), e.arrange(R, key=["k"])
        reader = adb.join(lt, rt).to_reader()
        sizes = [next(reader).nbytes for _ in range(4)]
        reader.close()
    assert max(sizes) <= 3 << 20, sizes


def test_top_k_distinct_threshold(engine):
    T = pa.table({"k": [1, 1, 1, 1, 2, 2, 3], "v": [5, 9, 7, 9, 1, 2, 4]})
    t = engine.arrange(T, key=["k"])
    got = adb.top_k(t, 2, "v").read_all()
    assert weighted_bag(got, ["k", "v"]) == Counter({(1, 9): 2, (2, 2): 1, (2, 1): 1, (3, 4): 1})
    got = adb.top_k(t, 1, "v", descending=False).read_all()
    assert weighted_bag(got, ["k", "v"]) == Counter({(1, 5): 1, (2, 1): 1, (3, 4): 1})
    assert bag(adb.distinct(t).read_all()) == Counter(
        {(1, 5, 1): 1, (1, 7, 1): 1, (1, 9, 1): 1, (2, 1, 1): 1, (2, 2, 1): 1, (3, 4, 1): 1})
    assert bag(adb.threshold(t, lambda c: c >= 2).read_all()) == Counter({(1, 9, 2): 1})


def _history(rng, n, nkeys, times):
    """Random updates with retractions: inserts at random times, some retracted later."""
    k = rng.integers(0, nkeys, n)
    v = rng.integers(0, 3, n)
    t = rng.integers(0, times, n)
    d = np.ones(n, np.int64)
    retract = rng.random(n) < 0.3
    rk, rv = k[retract], v[retract]
    rt = np.minimum(t[retract] + rng.integers(0, times, retract.sum()), times - 1)
    return pa.table({"k": np.concatenate([k, rk]), "v": np.concatenate([v, rv]),
                     "t": np.concatenate([t, rt]).astype(np.uint64),
                     "d": np.concatenate([d, -np.ones(len(rk), np.int64)])})


def _apply(old: Counter, changes: pa.Table, cols) -> Counter:
    new = Counter(old)
    for r in changes.to_pylist():
        new[tuple(r[c] for c in cols)] += r["diff"]
    return Counter({k: v for k, v in new.items() if v})


@SETTINGS
@given(st.integers(0, 150), st.integers(0, 150), st.integers(1, 20), st.integers(1, 8),
       st.integers(0, 2**32 - 1))
def test_incremental_join_is_the_difference_of_snapshots(tmp_path_factory, nl, nr, nkeys,
                                                        times, seed):
    rng = np.random.default_rng(seed)
    with adb.Engine(spill_dir=tmp_path_factory.mktemp("s"), memory_budget="64MiB") as e:
        L = e.arrange(_history(rng, nl, nkeys, times), key=["k"], vals=["v"], time="t",
                      diff="d")
        R = e.arrange(_history(rng, nr, nkeys, times).rename_columns(["k", "w", "t", "d"]),
                      key=["k"], vals=["w"], time="t", diff="d")
        since = int(rng.integers(0, times))
        upto = int(rng.integers(since + 1, times + 2))
        cols = ["k", "v", "w"]
        old = (weighted_bag(adb.join(L, R, at=since - 1).read_all(), cols)
               if since else Counter())
        new = weighted_bag(adb.join(L, R, at=upto - 1).read_all(), cols)
        ch = adb.join(L, R, since=since, upto=upto).read_all()
        assert ch.schema.names == ["k", "v", "w", "time", "diff"]
        assert all(since <= t < upto for t in ch.column("time").to_pylist())
        assert _apply(old, ch, cols) == new
        # the changes are exact at every time in between, not only at the end
        mid = (since + upto) // 2
        at_mid = weighted_bag(adb.join(L, R, at=mid).read_all(), cols) if mid >= since else old
        early = ch.filter(pa.compute.less_equal(ch.column("time"), mid))
        assert _apply(old, early, cols) == at_mid


@SETTINGS
@given(st.integers(0, 200), st.integers(1, 20), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_incremental_reduce_is_the_difference_of_snapshots(tmp_path_factory, n, nkeys, times,
                                                          seed):
    rng = np.random.default_rng(seed)
    with adb.Engine(spill_dir=tmp_path_factory.mktemp("s"), memory_budget="64MiB") as e:
        T = e.arrange(_history(rng, n, nkeys, times), key=["k"], vals=["v"], time="t",
                      diff="d")
        aggs = {"n": ("count", None), "s": ("sum", "v"), "hi": ("max", "v")}
        since = int(rng.integers(0, times))
        upto = int(rng.integers(since + 1, times + 2))
        cols = ["k", "n", "s", "hi"]
        old = bag(adb.reduce(T, aggs, at=since - 1).read_all(), cols) if since else Counter()
        new = bag(adb.reduce(T, aggs, at=upto - 1).read_all(), cols)
        ch = adb.reduce(T, aggs, since=since, upto=upto).read_all()
        assert _apply(old, ch, cols) == new


def test_bad_input_is_refused_before_any_work(engine):
    a = engine.arrange(pa.table({"k": [1, 2], "s": ["x", "y"]}), key=["k"])
    b = engine.arrange(pa.table({"k": ["1"], "v": [1]}), key=["k"])
    with pytest.raises(TypeError, match="key types differ"):
        adb.join(a, b)
    with pytest.raises(ValueError, match="unknown how"):
        adb.join(a, a, how="outer")
    with pytest.raises(ValueError, match="unknown function"):
        adb.reduce(a, {"x": ("median", "s")})
    with pytest.raises(TypeError, match="numeric"):
        adb.reduce(a, {"x": ("sum", "s")})
    with pytest.raises(KeyError, match="no column 'nope'"):
        adb.reduce(a, {"x": ("max", "nope")})
    neg = engine.arrange(pa.table({"k": [1], "d": [-1]}), key=["k"], vals=[], diff="d")
    with pytest.raises(ValueError, match="non-negative counts"):
        adb.join(neg, engine.arrange(pa.table({"k": [1]}), key=["k"]), expand=True).read_all()
    with pytest.raises(ValueError, match="expand=True applies to snapshots"):
        adb.join(a, a, how="left", since=0, expand=True)


def test_join_output_is_streamed_in_bounded_batches(engine):
    """A skewed key whose cross product is 1M rows comes out in batches of batch_rows."""
    L = pa.table({"k": np.zeros(1000, np.int64), "a": np.arange(1000)})
    R = pa.table({"k": np.zeros(1000, np.int64), "b": np.arange(1000)})
    lt, rt = engine.arrange(L, key=["k"]), engine.arrange(R, key=["k"])
    sizes = [b.num_rows for b in adb.join(lt, rt, batch_rows=50_000)]
    assert sum(sizes) == 1_000_000 and max(sizes) <= 50_000


def test_join_clashing_names_are_prefixed(engine):
    a = engine.arrange(pa.table({"k": [1], "x": [1], "y": [2]}), key=["k"])
    b = engine.arrange(pa.table({"id": [1], "x": [3], "z": [4]}), key=["id"])
    out = adb.join(a, b).read_all()
    assert out.column_names == ["k", "left_x", "y", "right_x", "z", "count"]
    assert out.to_pylist() == [{"k": 1, "left_x": 1, "y": 2, "right_x": 3, "z": 4, "count": 1}]


@SETTINGS
@given(st.sampled_from(["int8", "int64", "uint64"]), st.sampled_from([1, 3, 1000]),
       st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(0, 2**32 - 1))
def test_match_keys_pairs_equal_keys(dtype, spread, lfill, rfill, seed):
    """Both matching kernels (direct-address over a narrow span, merge over a wide one),
    at the ends of each integer type's range, against a set intersection."""
    info = np.iinfo(dtype)
    spread = 1 if dtype == "int8" else spread   # -128..127: offsets overflow int8
    base = info.max - 255 * spread if dtype == "uint64" else info.min
    rng = np.random.default_rng(seed)

    def table(fill):
        picked = np.flatnonzero(rng.random(256) < fill)
        return pa.table({"k": np.array([base + int(p) * spread for p in picked], dtype)})

    lt, rt = table(lfill), table(rfill)
    li, ri = match_keys(lt, rt)
    lk, rk = lt["k"].to_numpy(), rt["k"].to_numpy()
    assert list(lk[li]) == list(rk[ri])
    assert sorted(lk[li].tolist()) == sorted(set(lk.tolist()) & set(rk.tolist()))


def test_match_keys_offsets_do_not_wrap_narrow_ints():
    """-128 sets the direct-address table's origin (the fillers make the keys dense
    enough for it): 0's offset (128) does not fit int8, and wrapped it would land on
    -27's slot."""
    fill = list(range(-128, -99))
    left = pa.table({"k": pa.array(fill + [0, 100], pa.int8())})
    right = pa.table({"k": pa.array(fill + [-27, 100], pa.int8())})
    li, ri = match_keys(left, right)
    n = len(fill)
    assert (li.tolist(), ri.tolist()) == (list(range(n)) + [n + 1], list(range(n)) + [n + 1])


def _string_side(rng, n, nkeys, name, cardinality):
    """Keys in [0, nkeys), string vals from ``cardinality`` values (a fifth null)."""
    pool = np.array([f"v{i}é" * (1 + i % 3) for i in range(cardinality)], dtype=object)
    vals = pool[rng.integers(0, cardinality, n)] if n else np.zeros(0, object)
    return pa.table({"k": pa.array(rng.integers(0, nkeys, n), pa.int64()),
                     name: pa.array(vals, pa.string(), mask=rng.random(n) < 0.2)})


def _signed_bag(table: pa.Table, columns, weight) -> Counter:
    c = Counter()
    for r in table.to_pylist():
        c[tuple(r[k] for k in columns)] += r[weight]
    return c


def _plain(table: pa.Table) -> pa.Table:
    return table.cast(pa.schema([f.with_type(f.type.value_type)
                                 if pa.types.is_dictionary(f.type) else f for f in table.schema]))


@SETTINGS
@given(st.integers(0, 300), st.integers(0, 300), st.integers(1, 40),
       st.sampled_from([3, 5000]), st.booleans(), st.integers(0, 2**32 - 1))
def test_join_read_dictionary_is_the_same_join(tmp_path_factory, nl, nr, nkeys, cardinality,
                                               retract, seed):
    """Dictionary-typed val columns carry the same values as the plain join's, for every
    how, from dict-coded parts (3 values) and from parts stored otherwise (5000), over
    several batches (accumulated) and incrementally."""
    rng = np.random.default_rng(seed)
    L = _string_side(rng, nl, nkeys, "a", cardinality)
    R = _string_side(rng, nr, nkeys, "b", 3)

    def change(t, table, name, card):   # a second batch: retract some rows, insert others
        gone = table.slice(0, table.num_rows // 2)
        rows = pa.concat_tables([gone, _string_side(rng, table.num_rows // 3, nkeys, name,
                                                    card)])
        diffs = [-1] * gone.num_rows + [1] * (rows.num_rows - gone.num_rows)
        t.insert(rows.append_column("t", pa.array([1] * len(diffs), pa.uint64()))
                 .append_column("d", pa.array(diffs, pa.int64())), time="t", diff="d")

    with adb.Engine(spill_dir=tmp_path_factory.mktemp("d"), memory_budget="64MiB") as e:
        paged = (e.arrange(L, key=["k"]), e.arrange(R, key=["k"]))
        resident = (memory_trace(L, key=["k"]), memory_trace(R, key=["k"]))
        for lt, rt in (paged, resident):
            if retract:
                change(lt, L, "a", cardinality)
                change(rt, R, "b", 3)
            for how, names in (("inner", ["a", "b"]), ("left", ["b"]), ("semi", "a")):
                for expand in (False, True):
                    got = adb.join(lt, rt, how=how, expand=expand,
                                   read_dictionary=names).read_all()
                    for n in [names] if isinstance(names, str) else names:
                        assert got.schema.field(n).type == pa.dictionary(pa.int32(),
                                                                         pa.string())
                    want = adb.join(lt, rt, how=how, expand=expand).read_all()
                    assert bag(_plain(got)) == bag(want), (how, expand)
            if retract:   # both sides changed: looked-up and read vals, all as codes
                got = adb.join(lt, rt, since=1, upto=2, read_dictionary=["a", "b"]).read_all()
                assert bag(_plain(got)) == bag(adb.join(lt, rt, since=1, upto=2).read_all())
                # and against the snapshots' difference (read whole, not looked up)
                cols = ["k", "a", "b"]
                diff = _signed_bag(adb.join(lt, rt, at=1).read_all(), cols, "count")
                diff.subtract(_signed_bag(adb.join(lt, rt, at=0).read_all(), cols, "count"))
                assert {k: v for k, v in diff.items() if v} == \
                    {k: v for k, v in _signed_bag(_plain(got), cols, "diff").items() if v}


def test_read_dictionary_hands_over_stored_codes(engine):
    """From a dict-coded paged part the dictionary is the stored one (3 entries), never
    rebuilt from per-row strings; bad names and types are refused before any work."""
    rng = np.random.default_rng(5)
    L = _string_side(rng, 5000, 100, "a", 3)
    lt = engine.arrange(L, key=["k"])
    part = lt.batches()[0].parts[0]
    assert type(part).__name__ == "PagedPart" and part.columns["vals"][0]["codec"] == "dict"
    upd, _ = part.read(frozenset({"a"}))
    assert len(upd.vals.column("a").chunk(0).dictionary) == 3
    queries = pa.table({"k": pa.array([5, 1, 5, 999, 42], pa.int64())})
    coded = lt.lookup(queries, read_dictionary=["a"])
    assert coded.schema.field("a").type == pa.dictionary(pa.int32(), pa.string())
    assert _plain(coded).equals(lt.lookup(queries))
    with pytest.raises(KeyError, match="read_dictionary"):
        lt.lookup(queries, read_dictionary=["k"])
    with pytest.raises(KeyError, match="read_dictionary: 'k' is not a val column"):
        adb.join(lt, lt, read_dictionary=["k"])
    nums = engine.arrange(pa.table({"k": [1], "x": [1.5]}), key=["k"])
    with pytest.raises(TypeError, match="column 'left_x' is double"):
        adb.join(nums, nums, read_dictionary=["left_x"])


@SETTINGS
@given(st.integers(0, 3000), st.sampled_from([1, 7, 30, 126]), st.booleans(),
       st.sampled_from([1, 2, 10**17]), st.sampled_from([pa.int8(), pa.uint64(), pa.int32()]),
       st.integers(0, 2**32 - 1))
def test_group_by_on_a_dictionary_column_is_the_same_group_by(tmp_path_factory, n, ngroups,
                                                               null_keys, weight_scale,
                                                               index_type, seed):
    """Grouping on dictionary codes (bincount; Arrow's hashing for min/max and for weights
    too large for exact float sums) gives what grouping on the strings gives, with null
    keys, several dictionaries in one stream, narrow and unsigned index types, and signed,
    zero and huge weights."""
    rng = np.random.default_rng(seed)
    pool = pa.array([f"g{i}" for i in range(ngroups)])
    batches = []
    for lo in range(0, n, 700):
        m = min(700, n - lo)
        perm = pa.array(rng.permutation(ngroups))       # each batch its own dictionary
        dictionary = pool.take(perm)
        if null_keys:   # a value twice, and a null value, in the dictionary too
            dictionary = pa.concat_arrays([dictionary, dictionary.slice(0, 1),
                                           pa.nulls(1, pa.string())])
        idx = pa.array(rng.integers(0, len(dictionary), m), index_type,
                       mask=(rng.random(m) < 0.1) if null_keys else None)
        batches.append(pa.record_batch({
            "g": pa.DictionaryArray.from_arrays(idx, dictionary),
            "x": pa.array(rng.integers(-50, 50, m), mask=rng.random(m) < 0.1),
            "f": rng.normal(size=m),
            "count": rng.integers(-1, 3, m) * weight_scale}))
    schema = batches[0].schema if batches else pa.schema(
        [("g", pa.dictionary(index_type, pa.string())), ("x", pa.int64()), ("f", pa.float64()),
         ("count", pa.int64())])
    plain = [_plain(pa.Table.from_batches([b])).to_batches()[0] for b in batches]
    for aggs in ({"n": ("count", None), "s": ("sum", "x"), "m": ("mean", "f"),
                  "nx": ("count", "x")},
                 {"n": ("count", None), "hi": ("max", "x")}):
        with adb.Engine(spill_dir=tmp_path_factory.mktemp("g"), memory_budget="64MiB") as e:
            got = adb.group_by(pa.RecordBatchReader.from_batches(schema, iter(batches)), by="g",
                               aggs=aggs, engine=e).read_all()
            want = adb.group_by(pa.RecordBatchReader.from_batches(_plain(
                schema.empty_table()).schema, iter(plain)), by="g", aggs=aggs,
                engine=e).read_all()
        assert got.schema == want.schema
        rows = lambda t: sorted(((r["g"] is None, r["g"] or ""), tuple(   # noqa: E731
            round(v, 6) if isinstance(v, float) else v for k, v in r.items() if k != "g"))
            for r in t.to_pylist())
        assert rows(got) == rows(want)


@SETTINGS
@given(st.integers(0, 20000), st.integers(1, 500), st.sampled_from(["int64", "uint64", "int8"]),
       st.sampled_from(["sorted", "descending", "shuffled"]), st.integers(0, 2**32 - 1))
def test_group_by_on_sorted_integer_keys_matches_duckdb(tmp_path_factory, n, nkeys, dtype,
                                                        order, seed):
    """A stream in key order (a trace's changes grouped by its key) is summed run by run,
    and so are the partials of its consecutive chunks (an 8 MiB budget cuts 128 KiB
    chunks); descending (uint64 too: its differences wrap) and shuffled streams must not
    be."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    g = np.sort(rng.integers(max(info.min, -nkeys), min(info.max, nkeys), n)).astype(dtype)
    if dtype == "uint64":
        g = g + np.uint64(2**63)   # beyond int64
    if order == "descending":
        g = g[::-1].copy()
    elif order == "shuffled":
        rng.shuffle(g)
    T = pa.table({"g": pa.array(g), "x": pa.array(rng.integers(-9, 9, n),
                                                  mask=rng.random(n) < 0.1),
                  "count": rng.integers(-1, 4, n)})
    # signed weights: a change stream, whose linear aggregates are net changes
    aggs = {"n": ("count", None), "s": ("sum", "x"), "nx": ("count", "x")}
    with adb.Engine(spill_dir=tmp_path_factory.mktemp("r"), memory_budget="8MiB") as e:
        got = adb.group_by(pa.RecordBatchReader.from_batches(T.schema, T.to_batches(317)),
                           by="g", aggs=aggs, engine=e, weight="count").read_all()
    want = sql("select g, sum(count) n, cast(sum(x * count) as bigint) s, "
               "sum(case when x is null then 0 else count end) nx "
               "from T group by g", T=T)
    rows = lambda t: sorted((r["g"], r["n"], r["s"], r["nx"])   # noqa: E731
                            for r in t.to_pylist())
    assert rows(got) == rows(want)


@SETTINGS
@given(st.integers(1, 30000), st.integers(1, 300), st.sampled_from(["int64", "int8", "string"]),
       st.integers(0, 2**32 - 1))
def test_every_aggregate_over_many_chunks_matches_duckdb(tmp_path_factory, n, ngroups, kind,
                                                         seed):
    """Every aggregate (counts, sums, means, mins, maxes, of integers and floats with
    nulls) grouped over a stream the grouping takes in several chunks (an 8 MiB budget
    cuts 128 KiB ones), on integer groups (their running totals per slot) and strings."""
    rng = np.random.default_rng(seed)
    g = rng.integers(-ngroups, ngroups, n)
    groups = pa.array([f"g{v}" for v in g]) if kind == "string" else pa.array(
        g.astype(kind) if kind == "int64" else np.clip(g, -128, 127).astype(kind))
    T = pa.table({"g": groups, "x": pa.array(rng.integers(-10**6, 10**6, n),
                                             mask=rng.random(n) < 0.1),
                  "f": pa.array(np.round(rng.normal(size=n) * 100, 3),
                                mask=rng.random(n) < 0.1)})
    aggs = {"n": ("count", None), "nx": ("count", "x"), "s": ("sum", "x"), "m": ("mean", "x"),
            "lo": ("min", "x"), "hi": ("max", "x"), "fs": ("sum", "f"), "flo": ("min", "f"),
            "fhi": ("max", "f")}
    with adb.Engine(spill_dir=tmp_path_factory.mktemp("r"), memory_budget="8MiB") as e:
        got = adb.group_by(pa.RecordBatchReader.from_batches(T.schema, T.to_batches(997)),
                           by="g", aggs=aggs, engine=e).read_all()
    want = sql("select g, count(*) n, count(x) nx, sum(x) s, avg(x) m, min(x) lo, max(x) hi, "
               "sum(f) fs, min(f) flo, max(f) fhi from T group by g", T=T)
    assert got.num_rows == want.num_rows

    def rows(t):
        return sorted((r["g"], *(round(r[c], 6) if isinstance(r[c], float) else r[c]
                                 for c in aggs)) for r in t.to_pylist())
    for a, b in zip(rows(got), rows(want)):
        assert a[:7] == b[:7] and a[8:] == b[8:], (a, b)
        assert (a[7] is None) == (b[7] is None) and (a[7] is None or abs(a[7] - b[7]) < 1e-6)


def test_incremental_join_pairs_looked_up_rows_with_their_keys(engine):
    """A looked-up old state can hold no row for one changed key and two for another:
    as many rows as keys, yet row i is not key i's (the one-row-per-key kernel must not
    take it for a key-level block)."""
    R = engine.arrange(pa.table({"k": [2, 2], "b": ["x", "y"]}), key=["k"])
    L = engine.arrange(pa.table({"k": pa.array([], pa.int64()), "a": pa.array([], pa.string())}),
                       key=["k"])
    L.insert(pa.table({"k": [1, 2], "a": ["p", "q"], "t": pa.array([1, 1], pa.uint64()),
                       "d": [1, 1]}), time="t", diff="d")
    got = adb.join(L, R, since=1, upto=2).read_all()
    assert bag(got, ["k", "a", "b", "diff"]) == Counter({(2, "q", "x", 1): 1, (2, "q", "y", 1): 1})
    # and the mirror term, A_old x dB
    R.insert(pa.table({"k": [1, 3], "b": ["z", "w"], "t": pa.array([2, 2], pa.uint64()),
                       "d": [1, 1]}), time="t", diff="d")
    got = adb.join(R, L, since=2, upto=3).read_all()
    assert bag(got, ["k", "b", "a", "diff"]) == Counter({(1, "z", "p", 1): 1})


@pytest.mark.parametrize("dtype", ["int8", "int64", "uint64"])
def test_match_keys_against_a_range_of_ids(dtype):
    """One side holding every id of a range (a dimension's dense ids) matches by offset:
    overlapping on either end, inside, outside, on either side of the join."""
    info = np.iinfo(dtype)
    base = info.max - 100 if dtype == "uint64" else info.min
    ids = lambda lo, hi: np.arange(lo, hi, dtype=np.int64)   # noqa: E731

    def table(offsets):
        return pa.table({"k": np.array([base + int(o) for o in offsets], dtype)})

    rng = np.random.default_rng(2)
    sparse = np.sort(rng.choice(100, 40, replace=False))
    for dense in (ids(0, 100), ids(10, 50), ids(60, 100), ids(0, 1), ids(99, 100)):
        for lt, rt in ((table(sparse), table(dense)), (table(dense), table(sparse))):
            li, ri = match_keys(lt, rt)
            lk, rk = lt["k"].to_numpy(), rt["k"].to_numpy()
            assert list(lk[li]) == list(rk[ri])
            assert sorted(lk[li].tolist()) == sorted(set(lk.tolist()) & set(rk.tolist()))


def test_a_nan_or_inf_stays_in_its_own_group(engine):
    """Float sums and means are summed group by group: one group's NaN or inf reaches no
    other group (a running sum differenced at the bounds carried it into every later
    one), as DuckDB's are."""
    nan, inf = float("nan"), float("inf")
    T = pa.table({"k": pa.array([1, 1, 2, 3, 3, 4, 5], pa.int64()),
                  "x": [1.0, nan, inf, 2.0, 0.5, -inf, 4.0]})
    t = engine.arrange(T, key=["k"], vals=["x"])
    got = adb.reduce(t, {"s": ("sum", "x"), "m": ("mean", "x")}).read_all()
    want = sql("select k, sum(x) s, avg(x) m from T group by k order by k", T=T)
    plain = lambda tbl: [tuple("nan" if v != v else v for v in r.values())  # noqa: E731
                         for r in tbl.to_pylist()]
    assert plain(got.sort_by("k")) == plain(want)
