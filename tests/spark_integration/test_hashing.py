"""spark_hash and partition_ids equal Spark's own hash(...) and repartition(n, *keys).

The Spark tests run one ``local[2]`` session over random data: every supported key
type, nulls, empty and multibyte UTF-8 strings of 0..40 bytes, negative numbers, the
edges of each type, timestamps in s, ms, us and ns, multi-column keys. The tests without
Spark check the vectorized hash against a row-at-a-time transcription of Spark's
Murmur3_x86_32, and that chunking, slicing and dictionary encoding do not change the
result.
"""

from __future__ import annotations

import decimal
import os
import shutil

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrangedb.spark_integration.hashing import partition_ids, spark_hash

needs_java = pytest.mark.skipif(
    shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
    reason="Spark needs Java 17 (see `make java`)")


# -- a row-at-a-time transcription of org.apache.spark.unsafe.hash.Murmur3_x86_32 -------

M = 0xFFFFFFFF


def _rotl(x, r):
    return ((x << r) | (x >> (32 - r))) & M


def _mix_k1(k1):
    return (_rotl((k1 * 0xCC9E2D51) & M, 15) * 0x1B873593) & M


def _mix_h1(h1, k1):
    return (_rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & M


def _fmix(h1, length):
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & M
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & M
    return h1 ^ (h1 >> 16)


def ref_hash_int(v, seed):
    return _fmix(_mix_h1(seed, _mix_k1(v & M)), 4)


def ref_hash_long(v, seed):
    h1 = _mix_h1(seed, _mix_k1(v & M))
    return _fmix(_mix_h1(h1, _mix_k1((v >> 32) & M)), 8)


def ref_hash_bytes(b: bytes, seed):
    aligned = len(b) - len(b) % 4
    h1 = seed
    for i in range(0, aligned, 4):
        h1 = _mix_h1(h1, _mix_k1(int.from_bytes(b[i:i + 4], "little")))
    for i in range(aligned, len(b)):
        signed = b[i] - 256 if b[i] >= 128 else b[i]     # Java's byte, sign-extended
        h1 = _mix_h1(h1, _mix_k1(signed & M))
    return _fmix(h1, len(b))


def ref_spark_hash(values_and_kinds) -> int:
    h = 42
    for v, kind in values_and_kinds:
        if v is None:
            continue
        if kind == "int":
            h = ref_hash_int(v, h)
        elif kind == "long":
            h = ref_hash_long(v, h)
        else:
            h = ref_hash_bytes(v, h)
    return h - (1 << 32) if h >= 1 << 31 else h


# -- without Spark ------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=45)), max_size=30),
       st.lists(st.one_of(st.none(), st.integers(-2**31, 2**31 - 1)), min_size=30, max_size=30),
       st.lists(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)), min_size=30, max_size=30))
def test_vectorized_hash_equals_row_at_a_time(blobs, ints, longs):
    n = len(blobs)
    t = pa.table({"b": pa.array(blobs, pa.binary()),
                  "s": pa.array([None if b is None else b.decode("latin-1") for b in blobs]),
                  "i": pa.array(ints[:n], pa.int32()),
                  "l": pa.array(longs[:n], pa.int64())})
    for keys in (["b"], ["i", "b", "l"], ["l", "i"]):
        kinds = {"b": "bytes", "i": "int", "l": "long"}
        want = [ref_spark_hash([(t.column(k)[r].as_py(), kinds[k]) for k in keys])
                for r in range(n)]
        assert spark_hash(t, keys).tolist() == want
    strings = [None if s is None else s.encode() for s in t.column("s").to_pylist()]
    assert spark_hash(t, ["s"]).tolist() == [ref_spark_hash([(s, "bytes")]) for s in strings]


def test_chunks_slices_and_dictionaries_do_not_change_the_hash():
    rng = np.random.default_rng(3)
    n = 1000
    t = random_table(rng, n)
    keys = [c for c in t.column_names if c != "rid"]
    want = spark_hash(t.combine_chunks(), keys)
    # several chunks, each a slice of a larger array (non-zero Arrow offsets)
    pieces = [t.slice(a, b - a) for a, b in [(0, 1), (1, 333), (333, 334), (334, 1000)]]
    chunked = pa.concat_tables(pieces)
    assert chunked.column("s").num_chunks == 4
    assert (spark_hash(chunked, keys) == want).all()
    for p, (a, b) in zip(pieces, [(0, 1), (1, 333), (333, 334), (334, 1000)]):
        assert (spark_hash(p.to_batches()[0], keys) == want[a:b]).all()
    enc = t.set_column(t.column_names.index("s"), "s", t.column("s").dictionary_encode())
    assert (spark_hash(enc, keys) == want).all()
    views = t.set_column(t.column_names.index("s"), "s", t.column("s").cast(pa.string_view()))
    assert (spark_hash(views, keys) == want).all()
    assert (partition_ids(t, keys, 7) == np.mod(want.astype(np.int64), 7)).all()
    assert spark_hash(t.slice(0, 0), keys).shape == (0,)


def test_unsupported_types_and_bad_arguments():
    t = pa.table({"u": pa.array([1, 2], pa.uint32()), "k": pa.array([1, 2]),
                  "lst": pa.array([[1], [2]])})
    with pytest.raises(TypeError, match="'u'.*uint32"):
        spark_hash(t, ["k", "u"])
    with pytest.raises(TypeError, match="'lst'.*list"):
        partition_ids(t, ["lst"], 4)
    with pytest.raises(ValueError):
        partition_ids(t, ["k"], 0)
    with pytest.raises(ValueError):
        spark_hash(t, [])


# -- random data covering every supported type ---------------------------------------------

CHARS = list("abcxyz019 _-") + ["é", "ß", "ж", "日", "本", "€", "😀", "🎉"]


def random_strings(rng, n):
    out = []
    for _ in range(n):
        s = "".join(rng.choice(CHARS, rng.integers(0, 41)))
        while len(s.encode()) > 40:
            s = s[:-1]
        out.append(s)
    return out


WIDE = decimal.Context(prec=60)


def random_decimals(rng, n, precision, scale, edges):
    top = 10 ** precision - 1
    digits = rng.integers(1, precision + 1, n)
    vals = [int(rng.integers(0, 10 ** int(d), dtype=np.uint64)) if d <= 19
            else int(rng.integers(0, 10 ** 19, dtype=np.uint64)) * 10 ** (int(d) - 19)
            + int(rng.integers(0, 10 ** (int(d) - 19), dtype=np.uint64))
            for d in digits]
    vals = [min(v, top) * (-1 if neg else 1) for v, neg in zip(vals, rng.random(n) < 0.5)]
    vals[:len(edges)] = edges
    return pa.array([decimal.Decimal(v).scaleb(-scale, WIDE) for v in vals],
                    pa.decimal128(precision, scale), mask=rng.random(n) < 0.05)


def random_table(rng, n) -> pa.Table:
    def nulls(p=0.08):
        return rng.random(n) < p

    ints = rng.integers(-(2 ** 31), 2 ** 31, n)
    ints[:4] = [0, -1, 2 ** 31 - 1, -(2 ** 31)]
    longs = rng.integers(-(2 ** 63), 2 ** 63 - 1, n, dtype=np.int64)
    longs[:4] = [0, -1, 2 ** 63 - 1, -(2 ** 63)]
    small = rng.integers(-5, 5, n)                      # many equal keys
    dbl = rng.normal(0, 1e6, n)
    dbl[:6] = [0.0, -0.0, np.nan, np.inf, -np.inf, 5e-324]
    flt = (rng.normal(0, 1e3, n)).astype(np.float32)
    flt[:5] = [0.0, -0.0, np.nan, np.inf, -np.inf]
    big_edges = [0, -1, 1, 127, 128, -128, -129, 255, 256, -256, -257, 2 ** 63, -(2 ** 63),
                 2 ** 63 - 1, -(2 ** 63) - 1, 10 ** 38 - 1, -(10 ** 38 - 1), 2 ** 64, -(2 ** 64)]
    return pa.table({
        "rid": pa.array(np.arange(n), pa.int64()),
        "i8": pa.array(rng.integers(-128, 128, n).astype(np.int8), mask=nulls()),
        "i16": pa.array(rng.integers(-(2 ** 15), 2 ** 15, n).astype(np.int16), mask=nulls()),
        "i32": pa.array(ints.astype(np.int32), mask=nulls()),
        "small": pa.array(small.astype(np.int32), mask=nulls(0.2)),
        "i64": pa.array(longs, mask=nulls()),
        "s": pa.array(random_strings(rng, n), pa.string(), mask=nulls()),
        "ls": pa.array(random_strings(rng, n), pa.large_string(), mask=nulls()),
        "bin": pa.array([rng.bytes(int(k)) for k in rng.integers(0, 20, n)], pa.binary(),
                        mask=nulls()),
        "b": pa.array(rng.random(n) < 0.5, mask=nulls()),
        "f32": pa.array(flt, mask=nulls()),
        "f64": pa.array(dbl, mask=nulls()),
        "dt": pa.array(rng.integers(-40000, 40000, n).astype(np.int32), pa.date32(),
                       mask=nulls()),
        "ts": pa.array(rng.integers(-(2 ** 50), 2 ** 50, n), pa.timestamp("us", tz="UTC"),
                       mask=nulls()),
        "ts_ns": pa.array(rng.integers(-(2 ** 62), 2 ** 62, n), pa.timestamp("ns", tz="UTC"),
                          mask=nulls()),
        "ts_ms": pa.array(rng.integers(-(2 ** 44), 2 ** 44, n), pa.timestamp("ms", tz="UTC"),
                          mask=nulls()),
        "void": pa.nulls(n),
        "dec": random_decimals(rng, n, 18, 4, [0, -1, 1, 10 ** 18 - 1, -(10 ** 18 - 1)]),
        "dec_big": random_decimals(rng, n, 38, 10, big_edges),
        "dec_mid": random_decimals(rng, n, 20, 0, [0, -1, 2 ** 63, -(2 ** 63) - 1]),
    })


KEY_SETS = [["s", "i64"], ["small", "s"], ["i8", "i16", "b", "dt"], ["f32", "f64", "ts"], ["ts_ns", "void", "ts_ms"],
            ["dec", "dec_big", "dec_mid", "ls", "bin"],
            ["i32", "ls", "small", "f64", "dec_big"]]


# -- against Spark --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(spark):
    table = random_table(np.random.default_rng(20240601), 4000)
    return table, spark.createDataFrame(table)


@pytest.mark.spark
@needs_java
def test_spark_hash_equals_sparks_hash(data):
    from pyspark.sql import functions as F
    table, df = data
    single = [c for c in table.column_names if c != "rid"]
    exprs = [F.hash(c).alias(c) for c in single]
    exprs += [F.hash(*ks).alias("|".join(ks)) for ks in KEY_SETS]
    got = df.select("rid", *exprs).toArrow().sort_by("rid")
    assert got.num_rows == table.num_rows
    for name, ks in [(c, [c]) for c in single] + [("|".join(ks), ks) for ks in KEY_SETS]:
        want = got.column(name).to_numpy()
        mine = spark_hash(table, ks)
        bad = np.flatnonzero(mine != want)
        assert bad.size == 0, (name, [table.slice(int(i), 1).select(ks).to_pylist()
                                      for i in bad[:3]], mine[bad[:3]], want[bad[:3]])


@pytest.mark.spark
@needs_java
@pytest.mark.parametrize("keys,n", [(["s"], 8), (["small", "s"], 3),
                                    (["i64", "dec_big", "ls", "f64"], 13),
                                    (["dt", "b", "i8", "ts_ns"], 1)])
def test_partition_ids_equal_sparks_repartition(data, keys, n):
    from pyspark.sql import functions as F
    table, df = data
    got = (df.repartition(n, *keys)
           .select("rid", F.spark_partition_id().alias("pid")).toArrow().sort_by("rid"))
    assert got.column("rid").to_pylist() == list(range(table.num_rows))
    mine = partition_ids(table, keys, n)
    assert mine.dtype == np.int32
    assert (mine == got.column("pid").to_numpy()).all()
    assert len(np.unique(mine)) == n          # every partition gets rows
