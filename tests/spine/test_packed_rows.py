"""Rows sorted as packed values (spine/data/packed_rows.py), against a model: the sorted
distinct rows and their counts, as Python sorts and counts tuples."""

from __future__ import annotations

from collections import Counter

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
from hypothesis import given, settings

from arrangedb.spine.data.kernels import consolidate
from arrangedb.spine.data.argsort import PARALLEL_SORT_FROM
from arrangedb.spine.data.packed_rows import distinct_sorted
from arrangedb.spine.data.updates import Updates

DTYPES = ["int8", "int32", "int64", "uint16", "uint32", "uint64"]


def _column(dtype: str, raw: list[int], span_bits: int) -> np.ndarray:
    """``raw`` folded into a span of ``span_bits`` bits from the dtype's minimum (its
    extremes, negatives and values past 2**63 included)."""
    info = np.iinfo(dtype)
    width = min(2 ** span_bits, int(info.max) - int(info.min) + 1)
    return np.array([int(info.min) + r % width for r in raw], dtype=object).astype(dtype)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from(DTYPES), st.integers(1, 64)), min_size=1,
                max_size=3),
       st.data())
def test_distinct_sorted_matches_the_model(specs, data):
    n = data.draw(st.integers(1, 60))
    pool = data.draw(st.integers(1, 8))   # few distinct raw values: duplicates are common
    columns = [_column(dt, data.draw(st.lists(st.integers(0, 2**64 - 1), min_size=pool,
                                              max_size=pool)) * n, bits)[:n]
               for dt, bits in specs]
    if data.draw(st.booleans()):
        perm = np.random.default_rng(data.draw(st.integers(0, 99))).permutation(n)
        columns = [c[perm] for c in columns]
    got = distinct_sorted(columns)
    need = sum(max((int(c.max()) - int(c.min())).bit_length(), 1) for c in columns)
    if need > 64:
        assert got is None
        return
    rows = Counter(zip(*(c.tolist() for c in columns)))
    expected = sorted(rows)
    out, counts = got
    assert [c.dtype for c in out] == [c.dtype for c in columns]
    assert list(zip(*(c.tolist() for c in out))) == expected
    assert (counts.tolist() if counts is not None else [1] * len(expected)) == \
        [rows[r] for r in expected]


@settings(max_examples=300)
@given(st.lists(st.tuples(st.integers(-4, 4), st.integers(0, 3), st.integers(-3, 3)),
                min_size=1, max_size=60),
       st.sampled_from(["int64", "uint32"]), st.booleans())
def test_weights_are_summed_per_distinct_row(rows, dtype, ordered):
    """A delta's diffs packed below its rows: each distinct row's sum, zero sums dropped
    (a retraction and its insertion of the same row cancel)."""
    if ordered:
        rows = sorted(rows)
    k = np.array([r[0] for r in rows], np.int64)
    v = np.array([r[1] for r in rows], dtype)
    w = np.array([r[2] for r in rows], np.int64)
    model = Counter()
    for a, b, d in rows:
        model[(a, b)] += d
    expected = sorted(r for r, d in model.items() if d)
    got = distinct_sorted([k, v], weights=w)
    (sk, sv), sums = got
    assert list(zip(sk.tolist(), sv.tolist())) == expected and sv.dtype == v.dtype
    assert sums.tolist() == [model[r] for r in expected]


def test_rows_in_order_come_back_as_given():
    k = np.arange(10, dtype=np.int64)
    v = np.arange(10, dtype=np.int32) * 3
    out, counts = distinct_sorted([k, v])
    assert out[0] is k and out[1] is v and counts is None


def test_floats_are_not_packed():
    assert distinct_sorted([np.arange(4, dtype=np.int64), np.ones(4)]) is None


def test_large_input_sorted_on_two_threads_keeps_every_duplicate():
    rng = np.random.default_rng(3)
    n = PARALLEL_SORT_FROM + 7_777
    k = rng.integers(-1000, 1000, n)
    v = rng.integers(0, 50, n).astype(np.uint32)
    (sk, sv), counts = distinct_sorted([k, v])
    uniq, expected = np.unique(np.stack([k, v.astype(np.int64)]), axis=1, return_counts=True)
    assert np.array_equal(sk, uniq[0]) and np.array_equal(sv, uniq[1].astype(np.uint32))
    assert np.array_equal(counts, expected) and counts.sum() == n


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(-5, 5), st.integers(-3, 3), st.integers(0, 2**40)),
                max_size=80),
       st.integers(0, 3), st.sampled_from([1, -1, 3, None]), st.integers(0, 4),
       st.sampled_from(["int64", "int32", "uint64"]))
def test_consolidate_of_integer_rows_at_one_time(rows, time, diff, since, vtype):
    """An arrangement's input read from a file (one time, one diff, integer key and
    vals) or a delta at one time (``diff`` None: each row's own, -2..2) takes the packed
    path: the result equals the model's, sorted, zero sums dropped."""
    k = pa.array([r[0] for r in rows], pa.int64())
    a = pa.array([abs(r[1]) if vtype == "uint64" else r[1] for r in rows], vtype)
    b = pa.array([r[2] for r in rows], pa.int64())
    n = len(rows)
    diffs = (np.full(n, diff, np.int64) if diff is not None
             else np.array([r[2] % 5 - 2 for r in rows], np.int64))
    upd = Updates(pa.table({"k": k}), pa.table({"a": a, "b": b}),
                  np.full(n, time, np.uint64), diffs)
    got = consolidate(upd, since)
    model = Counter()
    for row, d in zip(zip(k.to_pylist(), a.to_pylist(), b.to_pylist()), diffs.tolist()):
        model[row] += d
    out = list(zip(got.keys["k"].to_pylist(), got.vals["a"].to_pylist(),
                   got.vals["b"].to_pylist()))
    assert out == sorted(r for r, d in model.items() if d)
    assert got.diffs.tolist() == [model[r] for r in out]
    assert got.times.tolist() == [max(time, since)] * len(out)
    assert got.vals.schema == upd.vals.schema and got.keys.schema == upd.keys.schema


def test_rows_in_order_consolidate_into_the_input_tables():
    """Integer rows already sorted and distinct come back as the input's own tables, so
    that the run builder sees they share the caller's buffers (and copies a run it keeps
    in memory); rows it had to sort come back in arrays of their own."""
    n = 1000
    keys, vals = pa.table({"k": np.arange(n) // 2}), pa.table({"v": np.arange(n) % 2})
    upd = Updates(keys, vals, np.zeros(n, np.uint64), np.ones(n, np.int64))
    got = consolidate(upd)
    assert got.keys is keys and got.vals is vals
    shuffled = upd.take(np.random.default_rng(0).permutation(n))
    got = consolidate(shuffled)
    assert got.keys.equals(keys) and got.vals.equals(vals)
    assert got.keys.column(0).chunk(0).buffers()[1].address != \
        shuffled.keys.column(0).chunk(0).buffers()[1].address
