"""Arrow decimal columns: their codec, their sort order, and exact aggregates.

Oracles: the decimals' own unscaled integers (Python ints) for the codec and the order,
and DuckDB for the aggregates -- compared exactly, as ``Decimal`` values, and by type
(``decimal(38, s)`` sums, ``double`` means) -- on random data with nulls, duplicates and
retractions, through reduce, group_by over a join (weighted by the join's counts),
join_group_by (pushed below the join) and group_by's spilled and two-phase plans."""

from __future__ import annotations

import decimal
import json

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings

import arrangedb as adb
from arrangedb.codecs import (CodecError, choose_codec, decode, decode_range, encode,
                              segment_sums, take)
from test_codecs import as_stored, roundtrip
from test_join_group_by import _no_join
from test_ops import sql

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])
FEW = settings(SETTINGS, max_examples=15)
decimal.getcontext().prec = 100   # Python's own Decimal arithmetic in the oracles: exact

WIDTHS = {"decimal32": (pa.decimal32, 9), "decimal64": (pa.decimal64, 18),
          "decimal128": (pa.decimal128, 38), "decimal256": (pa.decimal256, 76)}


def _unscaled(d: decimal.Decimal | None, scale: int) -> int | None:
    return None if d is None else int(d.scaleb(scale))


def _from_unscaled(ints: np.ndarray, t: pa.DataType, mask=None) -> pa.Array:
    """A decimal128 array of int64 unscaled integers, built on their words."""
    ints = np.asarray(ints, np.int64)
    words = np.stack([ints, ints >> 63], axis=1)
    validity = None if mask is None else pa.py_buffer(np.packbits(~mask, bitorder="little"))
    return pa.Array.from_buffers(t, len(ints), [validity, pa.py_buffer(words.tobytes())],
                                 null_count=-1 if mask is not None else 0)


def _decimals(ints, t: pa.DataType) -> pa.Array:
    return pa.array([None if i is None else decimal.Decimal(i).scaleb(-t.scale)
                     for i in ints], t)


@st.composite
def decimal_arrays(draw, max_size=300, kinds=tuple(WIDTHS)):
    """Random decimals of a random width, precision and scale: small values, values at
    the int64 edges and at the precision's edge, nulls, a slice now and then."""
    make, most = WIDTHS[draw(st.sampled_from(kinds))]
    precision = draw(st.integers(1, most))
    t = make(precision, draw(st.integers(0, precision)))
    top = 10 ** precision - 1
    edges = [i for i in (0, 1, -1, top, -top, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1,
                         2**31, -(2**32)) if abs(i) <= top]
    ints = st.one_of(st.integers(-min(top, 10**6), min(top, 10**6)),
                     st.integers(-top, top), st.sampled_from(edges))
    if draw(st.booleans()):
        ints = st.one_of(st.none(), ints)
    arr = _decimals(draw(st.lists(ints, max_size=max_size)), t)
    if len(arr) > 2 and draw(st.booleans()):
        lo = draw(st.integers(0, len(arr) - 1))
        arr = arr.slice(lo, draw(st.integers(0, len(arr) - lo)))
    return arr


# -- the codec -------------------------------------------------------------------------

@SETTINGS
@given(values=decimal_arrays(), how=st.sampled_from(["numpy", "memoryview"]), data=st.data())
def test_arrow_decimal_round_trips_ranges_and_takes(values, how, data):
    """The same Arrow type back, values and nulls; int64-sized integers as a frame of
    reference, others as their own 16 or 32 bytes."""
    enc, meta, _ = roundtrip(values, "arrow_decimal", how)
    assert enc.codec == "arrow_decimal"
    ints = [_unscaled(v, values.type.scale) for v in values.to_pylist()]
    fits = all(-(2**63) <= i < 2**63 for i in ints if i is not None)
    assert meta["form"] == ("ints" if fits else "wide")
    if len(values) >= 64:
        assert choose_codec(values) == "arrow_decimal"
        roundtrip(values, "auto")
    lo = data.draw(st.integers(0, len(values)))
    hi = data.draw(st.integers(lo, len(values)))
    got = decode_range(enc.codec, enc.version, meta, as_stored(enc.buffers), lo, hi)
    assert got.type == values.type and got.equals(values.slice(lo, hi - lo))
    rows = np.array(data.draw(st.lists(st.integers(0, max(len(values) - 1, 0)),
                                       max_size=20 if len(values) else 0)), np.int64)
    got = take(enc.codec, enc.version, meta, as_stored(enc.buffers), rows)
    assert got.equals(values.take(pa.array(rows, pa.int64())))


@SETTINGS
@given(values=decimal_arrays(kinds=("decimal64", "decimal128")), data=st.data())
def test_arrow_decimal_segment_sums_are_the_unscaled_sums(values, data):
    """Summed on the encoding where no sum can leave int64: each run's exact sum of
    unscaled integers; declined otherwise (nulls, wide values, 8-byte residuals)."""
    enc = encode(values, "arrow_decimal")
    n = len(values)
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), max_size=20))) if n > 1 else []
    starts = np.array([0, *cuts] if n else [], np.int64)
    got = segment_sums(enc.codec, enc.version, enc.meta, as_stored(enc.buffers), starts)
    if got is None:
        return
    assert values.null_count == 0 and enc.meta["form"] == "ints"
    ints = [_unscaled(v, values.type.scale) for v in values.to_pylist()]
    ends = [*starts[1:].tolist(), n]
    assert got.dtype == np.int64
    assert got.tolist() == [sum(ints[a:b]) for a, b in zip(starts.tolist(), ends)]


def test_arrow_decimal_amounts_take_four_bytes():
    """decimal(15, 2) amounts below 1e7 (TPC-H money): <= 4.5 bytes a value, nulls too."""
    rng = np.random.default_rng(1)
    n = 100_000
    cents = rng.integers(-10**9 + 1, 10**9, n)
    for mask in (None, rng.random(n) < 0.1):
        arr = _from_unscaled(cents, pa.decimal128(15, 2), mask)
        assert choose_codec(arr) == "arrow_decimal"
        enc, _, _ = roundtrip(arr, "auto")
        assert enc.codec == "arrow_decimal" and enc.nbytes / n <= 4.5, enc.nbytes / n


def test_arrow_decimal_empty_and_corrupt():
    for t in (pa.decimal32(3, 1), pa.decimal128(38, 10), pa.decimal256(50, 0)):
        enc, _, out = roundtrip(pa.array([], t), "arrow_decimal")
        assert out.type == t and len(out) == 0
        roundtrip(pa.nulls(100, t), "arrow_decimal")
    enc = encode(_decimals([i * 7919 % 1000 for i in range(1000)], pa.decimal128(15, 2)),
                 "arrow_decimal")
    stored = as_stored(enc.buffers)
    stored[-1] = stored[-1][:-1]
    with pytest.raises(CodecError, match="arrow_decimal"):
        decode(enc.codec, enc.version, enc.meta, stored)
    # a 32-bit decimal whose stored integers do not fit 32 bits is refused, not wrapped
    bad = encode(np.full(100, 2**40, np.int64), "for")
    meta = dict(encode(_decimals([1] * 100, pa.decimal32(9, 0)), "arrow_decimal").meta,
                ints=bad.meta)
    with pytest.raises(CodecError, match="out of range"):
        decode("arrow_decimal", 1, meta, bad.buffers)


def test_the_old_decimal_name_still_decodes_and_no_longer_encodes():
    """Page files written before the rename call scaled_float ``decimal``."""
    x = np.round(np.random.default_rng(2).uniform(0, 1e5, 1000), 2)
    enc = encode(x, "scaled_float")
    assert enc.codec == "scaled_float"
    meta = json.loads(json.dumps(enc.meta))
    out = decode("decimal", enc.version, meta, as_stored(enc.buffers))
    assert out.view(np.int64).tolist() == x.view(np.int64).tolist()
    assert segment_sums("decimal", enc.version, meta, as_stored(enc.buffers),
                        np.array([0, 10])) is not None
    with pytest.raises(CodecError, match="read-only"):
        encode(x, "decimal")
    assert choose_codec(x) == "scaled_float"


# -- sort order ------------------------------------------------------------------------

@FEW
@given(values=decimal_arrays(max_size=400, kinds=("decimal64", "decimal128", "decimal256")),
       seed=st.integers(0, 2**32 - 1))
def test_decimal_keys_and_vals_sort_by_value(tmp_path_factory, values, seed):
    """Arranged by a decimal key (the key's unscaled integers, or their words beyond
    int64), vals of decimals with nulls: snapshots come back in value order, stored."""
    values = values.slice(0, len(values))
    n = len(values)
    rng = np.random.default_rng(seed)
    keys = values.filter(values.is_valid()) if values.null_count else values
    t = pa.table({"k": keys, "v": values.take(pa.array(rng.integers(0, max(n, 1),
                                                                     len(keys))))})
    with adb.Engine(spill_dir=tmp_path_factory.mktemp("o"), memory_budget="16MiB") as e:
        trace = e.arrange(t, key=["k"], vals=["v"])
        trace.merge_all()
        got = trace.snapshot().read_all()
    scale = values.type.scale
    want = sorted(((_unscaled(k, scale), _unscaled(v, scale)) for k, v in
                   zip(t.column("k").to_pylist(), t.column("v").to_pylist())),
                  key=lambda r: (r[0], r[1] is not None, r[1] or 0))
    pairs = [(_unscaled(k, scale), _unscaled(v, scale)) for k, v, c in
             zip(got.column("k").to_pylist(), got.column("v").to_pylist(),
                 got.column("count").to_pylist()) for _ in range(c)]
    assert pairs == want
    assert got.schema.field("k").type == values.type


# -- exact aggregates against DuckDB ---------------------------------------------------

def _money(rng, n, t, nulls=0.15, distinct=None):
    """Random unscaled integers for ``t``: spread over its precision (up to 1e13 for the
    narrow types, as TPC-H sums reach), drawn from ``distinct`` values for duplicates."""
    top = min(10 ** t.precision - 1, 10**13 if t.precision <= 18 else 10 ** (t.precision - 6))
    digits = rng.integers(0, len(str(top)) + 1, distinct or n)    # magnitudes of all sizes
    pool = [min(int.from_bytes(rng.bytes(16), "little") % 10 ** int(d), top)
            * int(rng.choice([-1, 1])) for d in digits]
    ints = [pool[i] for i in rng.integers(0, len(pool), n)] if n else []
    return _decimals([None if rng.random() < nulls else i for i in ints], t)


def _expanded(name: str, diff: str = "d") -> str:
    """SQL for a table's rows repeated by their net counts (retractions cancelled)."""
    return (f"(select x.* exclude (c) from (select * exclude ({diff}), sum({diff}) c "
            f"from {name} group by all having sum({diff}) > 0) x, range(x.c::bigint))")


def _assert_same(got: pa.Table, want: pa.Table, by: list[str], exact_means: bool = True):
    """Equal exactly, value by value, and typed as DuckDB types them.

    Means are DuckDB's to the last bit for decimals of up to 18 digits (the sum as a
    double, divided by 10**scale, then by the count); for wider ones DuckDB's own double
    is not the correctly rounded mean either, so they are compared to a few ulps."""
    got, want = got.sort_by([(b, "ascending") for b in by]), want.sort_by(
        [(b, "ascending") for b in by])
    assert got.num_rows == want.num_rows
    for name in want.column_names:
        assert got.schema.field(name).type == want.schema.field(name).type, name
        a, b = got.column(name).to_pylist(), want.column(name).to_pylist()
        if name == "m" and not exact_means:
            assert [x is None for x in a] == [y is None for y in b]
            a = [x if x is None else pytest.approx(x, rel=1e-15) for x in a]
        assert a == b, name


TYPES = [pa.decimal128(15, 2), pa.decimal128(18, 0), pa.decimal128(12, 6),
         pa.decimal128(38, 4), pa.decimal64(10, 3), pa.decimal128(30, 10)]
AGG_SQL = "sum(v) s, avg(v) m, min(v) lo, max(v) hi, count(v) c"
AGGS = {"s": ("sum", "v"), "m": ("mean", "v"), "lo": ("min", "v"), "hi": ("max", "v"),
        "c": ("count", "v")}


def _cast_duckdb(want: pa.Table, t: pa.DataType) -> pa.Table:
    """DuckDB knows no decimal32/64: its min and max come back as decimal128."""
    return want.cast(pa.schema([f.with_type(t) if f.name in ("lo", "hi") else f
                                for f in want.schema]))


@pytest.mark.parametrize("t", TYPES, ids=str)
@FEW
@given(n=st.integers(0, 3000), nkeys=st.integers(1, 50), distinct=st.integers(1, 400),
       seed=st.integers(0, 2**32 - 1))
def test_reduce_is_exact(tmp_path_factory, t, n, nkeys, distinct, seed):
    rng = np.random.default_rng(seed)
    T = pa.table({"k": rng.integers(0, nkeys, n), "v": _money(rng, n, t, distinct=distinct),
                  "d": rng.choice([1, 1, 1, 2, 3], n)})
    gone = T.take(pa.array(rng.choice(n, n // 5, replace=False), pa.int64()))
    T = pa.concat_tables([T, gone.set_column(2, "d", pa.array(np.full(len(gone), -1)))])
    with adb.Engine(spill_dir=tmp_path_factory.mktemp("r"), memory_budget="16MiB") as e:
        trace = e.arrange(T, key=["k"], vals=["v"], diff="d")
        got = adb.reduce(trace, AGGS).read_all()
    assert got.schema.field("s").type == pa.decimal128(38, t.scale)
    assert got.schema.field("m").type == pa.float64()
    D = T.cast(pa.schema([T.schema.field("k"), pa.field("v", pa.decimal128(t.precision,
                                                                           t.scale)),
                          T.schema.field("d")]))
    want = sql(f"select k, {AGG_SQL} from {_expanded('T')} group by k", T=D)
    _assert_same(got, _cast_duckdb(want, t), ["k"], exact_means=t.precision <= 18)


def _side(rng, n, nkeys, t, val, group=None):
    cols = {"k": rng.integers(0, nkeys, n), val: _money(rng, n, t, distinct=max(n // 3, 1))}
    if group:
        cols[group] = pa.array([f"g{x}" for x in rng.integers(0, 5, n)])
    cols["d"] = rng.choice([1, 1, 2], n)
    return pa.table(cols)


@pytest.mark.parametrize("t", [pa.decimal128(15, 2), pa.decimal128(38, 3)], ids=str)
@FEW
@given(nl=st.integers(0, 800), nr=st.integers(0, 300), nkeys=st.integers(1, 60),
       seed=st.integers(0, 2**32 - 1))
def test_group_by_over_a_join_and_join_group_by_are_exact(tmp_path_factory, monkeypatch, t,
                                                          nl, nr, nkeys, seed):
    """Rows weighed by the join's counts (both sides hold rows counted twice): group_by
    over the join, join_group_by pushed below it (on the encoding's sums and on decoded
    values), and its materialised plan for min and max."""
    rng = np.random.default_rng(seed)
    A = _side(rng, nl, nkeys, t, "v")
    B = _side(rng, nr, nkeys, t, "w", group="g")
    with adb.Engine(spill_dir=tmp_path_factory.mktemp("j"), memory_budget="16MiB") as e:
        at, bt = (e.arrange(A, key=["k"], vals=["v"], diff="d"),
                  e.arrange(B, key=["k"], vals=["w", "g"], diff="d"))
        over_join = adb.group_by(adb.join(at, bt), by="g", aggs=AGGS, engine=e).read_all()
        linear = {n: a for n, a in AGGS.items() if a[0] in ("sum", "mean", "count")}
        with monkeypatch.context() as m:
            _no_join(m)
            pushed = adb.join_group_by(at, bt, by="g", aggs=linear, engine=e).read_all()
        at.merge_all()   # one batch: its parts summed on their encoding where they can be
        with monkeypatch.context() as m:
            _no_join(m)
            merged = adb.join_group_by(at, bt, by="g", aggs=linear, engine=e).read_all()
        extremes = adb.join_group_by(at, bt, by="g", aggs={"lo": ("min", "v"),
                                                           "hi": ("max", "v")},
                                     engine=e).read_all()
    q = (f"select {{g}}, {AGG_SQL} from {_expanded('A')} a join {_expanded('B')} b "
         f"using (k) group by {{g}}")
    want = sql(q.format(g="g"), A=A, B=B)
    exact = t.precision <= 18
    _assert_same(over_join, want, ["g"], exact)
    lin = want.select(["g", *linear])
    _assert_same(pushed, lin, ["g"], exact)
    _assert_same(merged, lin, ["g"], exact)
    _assert_same(extremes, want.select(["g", "lo", "hi"]), ["g"])


def test_join_group_by_on_the_key_skips_keys_the_other_side_lacks(tmp_path):
    """Rows [0, 2, 2] (a repeated A key after a skipped one) were read as the run 0..2:
    grouped by the key, an A key that B lacks got another key's partials."""
    t = pa.decimal128(15, 2)
    A = pa.table({"k": [4, 3, 2], "v": _decimals([-7352] * 3, t), "d": [2, 1, 1]})
    B = pa.table({"k": [2, 4, 1, 4], "g": ["a", "b", "c", "c"]})
    with adb.Engine(spill_dir=tmp_path, memory_budget="16MiB") as e:
        at, bt = e.arrange(A, key=["k"], vals=["v"], diff="d"), e.arrange(B, key=["k"])
        got = adb.join_group_by(at, bt, by="k", aggs={"s": ("sum", "v")},
                                engine=e).read_all()
    want = sql(f"select k, sum(v) s from {_expanded('A')} a join B using (k) group by k",
               A=A, B=B)
    _assert_same(got, want, ["k"])


@pytest.mark.parametrize("b_count", [1, 2, "mixed"])
def test_join_group_by_sums_decimals_on_their_encoding(tmp_path, monkeypatch, b_count):
    """A's parts hold each row once: their decimal column is summed per key on its frame
    of reference residuals, never decoded; B's counts (one, two, mixed) weigh the sums."""
    from arrangedb.codecs.arrow_decimal import ArrowDecimal

    rng = np.random.default_rng(6)
    n, nkeys = 20_000, 3000
    t = pa.decimal128(15, 2)
    cents = rng.permutation(n) * 1013 - 10**6          # distinct: no (key, val) twice
    A = pa.table({"k": rng.integers(0, nkeys, n), "v": _from_unscaled(cents, t)})
    counts = (np.full(nkeys, b_count) if b_count != "mixed"
              else rng.choice([1, 1, 1, 1, 1, 1, 1, 1, 1, 3], nkeys))
    B = pa.table({"k": np.arange(nkeys), "g": rng.integers(0, 7, nkeys), "d": counts})
    summed = []
    real = ArrowDecimal.segment_sums
    monkeypatch.setattr(ArrowDecimal, "segment_sums",
                        lambda *a: summed.append(real(*a)) or summed[-1])
    with adb.Engine(spill_dir=tmp_path, memory_budget="16MiB") as e:
        at, bt = e.arrange(A, key=["k"]), e.arrange(B, key=["k"], diff="d")
        at.merge_all()
        with monkeypatch.context() as m:
            _no_join(m)
            got = adb.join_group_by(at, bt, by="g", aggs={"s": ("sum", "v"),
                                                          "m": ("mean", "v")},
                                    engine=e).read_all()
    assert summed and all(x is not None for x in summed)
    want = sql(f"select g, sum(v) s, avg(v) m from A join {_expanded('B')} b using (k) "
               "group by g", A=A, B=B)
    _assert_same(got, want, ["g"])


def test_group_by_spills_and_splits_decimal_partials_exactly(tmp_path):
    """Many groups under a tiny budget: decimal(38, s) partial sums go through an
    arrangement; and the partial / final phases carry them between them, exact."""
    rng = np.random.default_rng(4)
    t = pa.decimal128(15, 2)
    batches = [pa.record_batch({"g": rng.integers(0, 100_000, 40_000),
                                "v": _money(rng, 40_000, t, distinct=5000),
                                "count": rng.integers(1, 4, 40_000)}) for _ in range(6)]
    T = pa.Table.from_batches(batches)
    aggs = {"n": ("count", None), "s": ("sum", "v"), "m": ("mean", "v"), "hi": ("max", "v")}
    with adb.Engine(spill_dir=tmp_path, memory_budget="8MiB") as e:
        got = adb.group_by(iter(batches), by="g", aggs=aggs, engine=e,
                           weight="count").read_all()
        assert e.stats()["bytes_spilled"] > 0
        halves = [adb.group_by(iter(batches[i::2]), by="g", aggs=aggs, engine=e,
                               weight="count", phase="partial").read_all() for i in (0, 1)]
        assert halves[0].schema.field("__s__s").type == pa.decimal128(38, 2)
        final = adb.group_by(pa.concat_tables(halves), by="g", aggs=aggs, engine=e,
                             phase="final", source_schema=T.schema).read_all()
    want = sql("select g, count(*) n, sum(v) s, avg(v) m, max(v) hi from "
               "(select t.* from T t, range(t.count)) group by g", T=T)
    _assert_same(got, want, ["g"])
    _assert_same(final, want, ["g"])


def test_sums_of_large_amounts_over_many_rows_do_not_overflow(tmp_path):
    """1e13-sized unscaled amounts, a million rows in one group, weights up to 2**40:
    far past int64 and float64's exact integers, still exact to the cent."""
    rng = np.random.default_rng(5)
    n = 1_000_000
    cents = rng.integers(10**12, 10**13, n)
    v = _from_unscaled(cents, pa.decimal128(15, 2))
    weights = rng.integers(1, 2**40, n)
    T = pa.table({"g": np.zeros(n, np.int64), "v": v, "count": weights})
    with adb.Engine(spill_dir=tmp_path, memory_budget="256MiB") as e:
        got = adb.group_by(T, by="g", aggs={"s": ("sum", "v"), "m": ("mean", "v")},
                           engine=e, weight="count").read_all()
        trace = e.arrange(T.select(["g", "v"]), key=["g"], vals=["v"])
        plain = adb.reduce(trace, {"s": ("sum", "v")}).read_all()
    exact = sum(int(c) * int(w) for c, w in zip(cents.tolist(), weights.tolist()))
    assert got.column("s")[0].as_py() == decimal.Decimal(exact).scaleb(-2)
    assert plain.column("s")[0].as_py() == decimal.Decimal(int(cents.sum())).scaleb(-2)
    assert got.column("m")[0].as_py() == pytest.approx(exact / 100 / int(weights.sum()),
                                                       rel=1e-15)


def test_a_sum_past_38_digits_is_an_overflow_error(tmp_path):
    big = decimal.Decimal("9" * 36 + ".99")
    T = pa.table({"g": [1, 1], "v": pa.array([big, big], pa.decimal128(38, 2))})
    with adb.Engine(spill_dir=tmp_path, memory_budget="16MiB") as e:
        with pytest.raises(OverflowError, match="decimal128"):
            adb.group_by(T, by="g", aggs={"s": ("sum", "v")}, engine=e).read_all()
        trace = e.arrange(T, key=["g"], vals=["v"])
        with pytest.raises(OverflowError, match="decimal128"):
            adb.reduce(trace, {"s": ("sum", "v")}).read_all()


# -- Spark's result types ----------------------------------------------------------------

@pytest.mark.parametrize("p, s, sum_type, mean_type", [
    (15, 2, (25, 2), (19, 6)), (38, 10, (38, 10), (38, 14)), (30, 28, (38, 28), (34, 32)),
    (1, 0, (11, 0), (5, 4)),
])
def test_spark_decimal_result_types(p, s, sum_type, mean_type):
    from arrangedb.spark_integration.api import spark_decimal_result

    assert spark_decimal_result("sum", pa.decimal128(p, s)) == pa.decimal128(*sum_type)
    assert spark_decimal_result("mean", pa.decimal128(p, s)) == pa.decimal128(*mean_type)
    assert spark_decimal_result("min", pa.decimal128(p, s)) is None


def test_exact_spark_means_are_rounded_half_up():
    """Spark's AVG of decimals: the exact quotient, rounded half away from zero."""
    from arrangedb.ops.aggregate import decimal_quotient

    sums = _decimals([5, -5, 15, 2**70, None, 7, 1], pa.decimal128(38, 0))
    got = decimal_quotient(sums, np.array([10, 10, 10, 3, 1, 0, 2**40]), pa.decimal128(38, 0))
    assert got.to_pylist() == [1, -1, 2, (2**70 + 1) // 3, None, None, 0]
    got = decimal_quotient(_decimals([1, -2], pa.decimal128(15, 2)), np.array([3, 3]),
                           pa.decimal128(19, 6))
    assert got.to_pylist() == [decimal.Decimal("0.003333"), decimal.Decimal("-0.006667")]
