"""Unit and property tests of the spine's pieces: codes, kernels, layout, spine levels."""

from __future__ import annotations

import math
import os

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings

import arrangedb
from arrangedb.spine.storage.context import StorageContext
from arrangedb.spine.data.ingest import Columns, SchemaError, open_batches, target_schemas
from arrangedb.spine.data.kernels import consolidate, filter_times
from arrangedb.spine.data.layout import bounds_dtype, from_layout, to_layout
from arrangedb.spine.data.codes import codes
from arrangedb.spine.data.argsort import PARALLEL_SORT_FROM, fast_argsort
from arrangedb.spine.data.order import sort_rows, sorted_rows
from arrangedb.spine.build.levels import level_of
from arrangedb.spine.trace import Trace
from arrangedb.spine.data.updates import Updates, constant


def memory_trace(data, key, vals=None, time=None, diff=None, **ctx):
    """A trace whose parts stay in memory (no pager): the spine alone."""
    schema, stream = open_batches(data)
    cols = Columns.resolve(schema, key, vals, time, diff)
    ks, vs = target_schemas(schema, cols)
    trace = Trace(StorageContext(**ctx), ks, vs, cols)
    trace.spine.insert_runs(trace.runs.build(pa.RecordBatchReader.from_batches(schema, stream),
                                         cols.time, cols.diff))
    return trace


# -- codes -------------------------------------------------------------------------------

FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=64)


@given(st.lists(FLOATS, min_size=1, max_size=50))
def test_float_codes_sort_like_total_order(xs):
    (c,) = codes([pa.table({"x": pa.array(xs, pa.float64())})], ["x"])
    for i in range(len(xs)):
        for j in range(len(xs)):
            a, b = xs[i], xs[j]
            if math.isnan(a) or math.isnan(b):
                assert (c[i] == c[j]) == (math.isnan(a) and math.isnan(b))
            elif a < b:
                assert c[i] < c[j]
            elif a == b and math.copysign(1, a) == math.copysign(1, b):
                assert c[i] == c[j]


@given(st.lists(st.text(max_size=6), min_size=1, max_size=30),
       st.lists(st.text(max_size=6), min_size=1, max_size=30))
def test_string_codes_compare_across_tables_like_bytes(xs, ys):
    cx, cy = codes([pa.table({"s": xs}), pa.table({"s": ys})], ["s"])
    for i, a in enumerate(xs):
        for j, b in enumerate(ys):
            ea, eb = a.encode(), b.encode()
            assert (cx[i] < cy[j]) == (ea < eb)
            assert (cx[i] == cy[j]) == (ea == eb)


@given(st.lists(st.one_of(st.none(), st.text(max_size=4)), min_size=1, max_size=30),
       st.lists(st.one_of(st.none(), st.text(max_size=4)), min_size=1, max_size=30),
       st.booleans())
def test_dictionary_codes_compare_like_their_values(xs, ys, repeat):
    """Dictionary columns (one dictionary per table, possibly holding a value twice) code
    exactly as their decoded strings do, nulls first."""
    def as_dict(values):
        enc = pa.array(values, pa.string()).dictionary_encode()
        d, idx = enc.dictionary, enc.indices
        if repeat and len(d):   # a dictionary holding its first value twice, codes to both
            odd = np.arange(len(idx)) % 2 == 1
            i = idx.fill_null(1).to_numpy(zero_copy_only=False)
            idx = pa.array(np.where((i == 0) & odd, len(d), i).astype(np.int32),
                           mask=idx.is_null().to_numpy(zero_copy_only=False))
            d = pa.concat_arrays([d, d.slice(0, 1)])
        return pa.DictionaryArray.from_arrays(idx, d)

    plain = codes([pa.table({"s": pa.array(xs, pa.string())}),
                   pa.table({"s": pa.array(ys, pa.string())})], ["s"])
    coded = codes([pa.table({"s": as_dict(xs)}), pa.table({"s": as_dict(ys)})], ["s"])
    both_plain, both_coded = np.concatenate(plain), np.concatenate(coded)
    assert np.array_equal(np.argsort(both_plain, kind="stable"),
                          np.argsort(both_coded, kind="stable"))
    assert np.array_equal(both_plain[:, None] == both_plain, both_coded[:, None] == both_coded)


def test_multi_column_codes_with_nulls():
    t = pa.table({"a": ["x", None, "x", "w", None], "b": [2, 1, None, 5, 1]})
    (c,) = codes([t], ["a", "b"])
    # nulls first, then by a, then by b
    assert c[1] == c[4]
    assert c[1] < c[3] < c[2] < c[0]


SIGNED_ZEROS_AND_NAN = st.sampled_from([-0.0, 0.0, math.nan, 1.0, -math.inf])


def _float_bits(x: float) -> int:
    """A float as the key it is: -0.0 apart from 0.0, every NaN one key."""
    return -1 if math.isnan(x) else int(np.float64(x).view(np.int64))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(SIGNED_ZEROS_AND_NAN, st.integers(0, 3),
                                   st.sampled_from(["p", "q"]), st.sampled_from([1, -1])),
                         min_size=1, max_size=12), min_size=2, max_size=4),
       st.booleans())
def test_keys_of_a_float_and_another_column_cancel_across_batches(batches, merged):
    """A (float, int) key holding -0.0 and 0.0, or NaN: the merged read's cuts and a
    part's key starts compare floats as the sort orders them, so a retraction in a later
    batch meets its row, and a merge keeps each key once."""
    model: dict = {}
    with arrangedb.Engine(memory_budget="64MiB", idle_merge=False) as e:
        t = None
        for rows in batches:
            table = pa.table({"a": pa.array([r[0] for r in rows], pa.float64()),
                              "b": [r[1] for r in rows], "v": [r[2] for r in rows],
                              "d": [r[3] for r in rows]})
            if t is None:
                t = e.arrange(table, key=["a", "b"], diff="d")
            else:
                t.insert(table, diff="d")
            for a, b, v, d in rows:
                k = (_float_bits(a), b, v)
                model[k] = model.get(k, 0) + d
        if merged:
            t.merge_all()
        got = t.snapshot().read_all()
        rows = list(zip(got["a"].to_pylist(), got["b"].to_pylist(), got["v"].to_pylist(),
                        got["count"].to_pylist()))
        assert {(_float_bits(a), b, v): c for a, b, v, c in rows} == \
            {k: c for k, c in model.items() if c}
        assert len(rows) == len({(_float_bits(a), b, v) for a, b, v, _ in rows})
        live_keys = {(a, b) for (a, b, _v), c in model.items() if c}
        if merged:   # one batch: each key stored once
            assert t.stats()["keys"] == len(live_keys)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 3), SIGNED_ZEROS_AND_NAN, st.integers(0, 2),
                                   st.sampled_from(["", "a", None]),
                                   st.sampled_from([1, -1])), min_size=1, max_size=12),
                min_size=1, max_size=4),
       st.booleans(), st.integers(0, 3))
def test_lookups_count_vals_over_times_as_the_model(steps, merged, at):
    """A lookup of keys whose (float, int, string) vals have rows at several times -- in
    one merged batch, where a key's equal rows lie side by side, or in several -- counts
    each val at ``at`` as the model does: -0.0 apart from 0.0, every NaN one val, a null
    string apart from the empty one."""
    model: dict = {}
    with arrangedb.Engine(memory_budget="64MiB", idle_merge=False) as e:
        t = None
        for time, rows in enumerate(steps):
            table = pa.table({"k": pa.array([r[0] for r in rows], pa.int64()),
                              "f": pa.array([r[1] for r in rows], pa.float64()),
                              "i": pa.array([r[2] for r in rows], pa.int64()),
                              "s": pa.array([r[3] for r in rows], pa.string()),
                              "t": pa.array([time] * len(rows), pa.uint64()),
                              "d": pa.array([r[4] for r in rows], pa.int64())})
            if t is None:
                t = e.arrange(table, key=["k"], vals=["f", "i", "s"], time="t", diff="d")
            else:
                t.insert(table, time="t", diff="d")
            for k, f, i, s, d in rows:
                row = (k, _float_bits(f), i, s, time)
                model[row] = model.get(row, 0) + d
        if merged:
            t.merge_all()
        at = min(at, len(steps) - 1)
        queries = [3, 0, 1, 1, 2]
        got = t.lookup(pa.table({"k": pa.array(queries, pa.int64())}), at=at)
        rows = zip(got["query_index"].to_pylist(), got["f"].to_pylist(),
                   got["i"].to_pylist(), got["s"].to_pylist(), got["count"].to_pylist())
        found = {(q, _float_bits(f), i, s): c for q, f, i, s, c in rows}
        assert len(found) == got.num_rows
    expected: dict = {}
    for (k, f, i, s, time), d in model.items():
        if time <= at:
            for q, key in enumerate(queries):
                if key == k:
                    expected[(q, f, i, s)] = expected.get((q, f, i, s), 0) + d
    assert found == {r: c for r, c in expected.items() if c}


# -- kernels and layout --------------------------------------------------------------------

UPDATES = st.lists(st.tuples(st.integers(-3, 3), st.sampled_from(["", "a", "b", None]),
                             st.integers(0, 4), st.integers(-2, 2)), max_size=80)


def _updates(rows, key_only=False):
    k = pa.table({"k": pa.array([r[0] for r in rows], pa.int64())})
    v = None if key_only else pa.table({"v": pa.array([r[1] for r in rows], pa.string())})
    return Updates(k, v, np.array([r[2] for r in rows], np.uint64),
                   np.array([r[3] for r in rows], np.int64))


def _as_dict(upd, key_only=False):
    out = {}
    ks, ts, ds = upd.keys["k"].to_pylist(), upd.times.tolist(), upd.diffs.tolist()
    vs = [None] * len(ks) if key_only else upd.vals["v"].to_pylist()
    for k, v, t, d in zip(ks, vs, ts, ds):
        assert (k, v, t) not in out
        out[(k, v, t)] = d
    return out


@given(st.lists(st.integers(0, 40), max_size=60))
def test_run_index_repeats_each_run_its_length(lengths):
    """Runs of every length, empty ones anywhere: the index np.repeat would write
    (short runs are marked and summed, long ones repeated)."""
    from arrangedb.spine.data.layout import ranges, run_index

    lengths = np.array(lengths, np.int64)
    want = np.repeat(np.arange(len(lengths)), lengths)
    assert np.array_equal(run_index(lengths), want)
    starts = np.arange(len(lengths), dtype=np.int64) * 100
    assert np.array_equal(ranges(starts, lengths),
                          np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)]
                                         + [np.zeros(0, np.int64)]))


def test_large_sorts_split_across_threads_stay_exact_and_stable():
    rng = np.random.default_rng(5)
    n = PARALLEL_SORT_FROM + 12_345
    x = rng.integers(-1000, 1000, n)         # many ties: stability is visible
    assert np.array_equal(fast_argsort(x), np.argsort(x, kind="stable"))
    k = rng.integers(0, n // 4, n)
    v = rng.integers(0, 1 << 62, n).astype(np.uint64)
    order, starts = sort_rows(k, v, None)
    assert np.array_equal(order, np.lexsort((v, k)))
    assert np.array_equal(starts, _distinct_starts(k[order], v[order]))


@settings(max_examples=300)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 7), st.integers(0, 255)),
                min_size=2, max_size=200), st.booleans(), st.booleans(), st.booleans())
def test_sort_rows_orders_like_lexsort_when_val_prefixes_tie(rows, presorted, in_order,
                                                             told):
    """Vals that agree in their leading bits and differ far below them: the packed
    prefix sort ties on them, and the refinement must still order them exactly. Rows
    already in order (a delta made in key order) come back as they are. Two sorted
    runs end to end are merged whether the caller says so or the sort finds it."""
    k = np.array([r[0] for r in rows], np.int64)
    v = (np.array([r[1] for r in rows], np.uint64) << np.uint64(60)) | \
        np.array([r[2] for r in rows], np.uint64)
    if in_order:
        o = np.lexsort((v, k))
        k, v = k[o], v[o]
    elif presorted:   # two concatenated sorted runs, as a merge hands them over
        half = len(rows) // 2
        for lo, hi in ((0, half), (half, len(rows))):
            o = np.lexsort((v[lo:hi], k[lo:hi]))
            k[lo:hi], v[lo:hi] = k[lo:hi][o], v[lo:hi][o]
    order, starts = sort_rows(k, v, None, presorted_runs=presorted and told)
    expected = np.lexsort((v, k))
    if in_order:
        assert np.array_equal(order, np.arange(len(k)))
    assert np.array_equal(k[order], k[expected]) and np.array_equal(v[order], v[expected])
    assert np.array_equal(starts, _distinct_starts(k[order], v[order]))
    korder, kstarts = sort_rows(k, None, None, presorted_runs=presorted and told)   # key alone
    assert np.array_equal(k[korder], np.sort(k))
    assert np.array_equal(kstarts, _distinct_starts(k[korder]))


@settings(max_examples=300)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 255),
                          st.integers(0, 3)), min_size=2, max_size=200), st.booleans())
def test_sort_rows_orders_ties_that_differ_in_time(rows, pairs):
    """Rows whose packed prefixes tie and that differ only below them or in their times:
    a merge of two deltas (each row beside its next version: ``pairs``) ties on almost
    every row, mostly in pairs, which are ordered by one comparison; larger groups by
    a full sort."""
    k = np.array([r[0] for r in rows], np.int64)
    v = (np.array([r[1] for r in rows], np.uint64) << np.uint64(60)) | \
        np.array([r[2] for r in rows], np.uint64)
    t = np.array([r[3] for r in rows], np.uint64)
    if pairs:   # every row twice, at a later time second, the two runs concatenated
        k, v, t = (np.concatenate([x, x]) for x in (k, v, t))
        t[len(rows):] += np.uint64(1)
    order, starts = sort_rows(k, v, t, presorted_runs=pairs)
    expected = np.lexsort((t, v, k))
    for c in (k, v, t):
        assert np.array_equal(c[order], c[expected])
    assert np.array_equal(starts, _distinct_starts(k[order], v[order], t[order]))


@settings(max_examples=300)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1), st.integers(0, 3)),
                min_size=1, max_size=60),
       st.lists(st.integers(1, 4), min_size=60, max_size=60), st.booleans())
def test_sort_rows_leaves_groups_of_copies_and_orders_the_rest(rows, copies, runs):
    """A lookup across a view's batches meets each stored row with its copies (its
    retraction and reinsertion in later batches): groups of equal rows, which need no
    ordering, beside groups whose rows differ below the packed prefix, which do. Both
    come out in order, each group's copies one distinct row."""
    k = np.array([r[0] for r in rows], np.int64)
    v = (np.array([r[1] for r in rows], np.uint64) << np.uint64(60)) | \
        np.array([r[2] for r in rows], np.uint64)
    reps = np.array(copies[:len(rows)])
    if runs:   # copy j of each row in run j, each run sorted: batches read side by side
        at = [np.flatnonzero(reps > j) for j in range(4)]
        pieces = [a[np.lexsort((v[a], k[a]))] for a in at if len(a)]
        idx = np.concatenate(pieces)
    else:
        idx = np.repeat(np.arange(len(rows)), reps)
    k, v = k[idx], v[idx]
    order, starts = sort_rows(k, v, None, presorted_runs=runs)
    expected = np.lexsort((v, k))
    assert np.array_equal(k[order], k[expected]) and np.array_equal(v[order], v[expected])
    assert np.array_equal(starts, _distinct_starts(k[order], v[order]))


@settings(max_examples=200)
@given(st.sampled_from(["int8", "int32", "int64", "uint32", "uint64"]),
       st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
                min_size=2, max_size=100), st.integers(0, 3))
def test_sorted_rows_unpacks_the_key_codes_the_sort_packed(dtype, rows, spread):
    """The sorted key codes come out of the packed values -- whole keys of every integer
    width, negative and past 2**63 alike -- equal to gathering the keys by the order;
    a key too wide to pack whole is not unpacked (unless the rows were in order)."""
    info = np.iinfo(dtype)
    span = [16, 40, 63, 64][spread]
    keys = np.array([info.min + (a % min(2**span, info.max - info.min + 1)) for a, _ in rows],
                    dtype=object).astype(dtype)
    vals = np.array([b for _, b in rows], dtype=np.uint64)
    order, starts, lead = sorted_rows(keys, vals, None)
    assert np.array_equal(keys[order], keys[np.lexsort((vals, keys))])
    index_bits = max(int(len(rows) - 1).bit_length(), 1)
    key_bits = max((int(keys.max()) - int(keys.min())).bit_length(), 1)
    if key_bits + index_bits <= 64:
        assert lead is not None and lead.dtype == keys.dtype
        assert np.array_equal(lead, keys[order])
    else:
        assert lead is None or (lead is keys and np.array_equal(order, np.arange(len(keys))))


def _distinct_starts(*sorted_columns) -> np.ndarray:
    """The model: where a row differs from the one before in any column."""
    n = len(sorted_columns[0])
    differs = np.ones(n, dtype=bool)
    differs[1:] = False
    for c in sorted_columns:
        differs[1:] |= c[1:] != c[:-1]
    return np.flatnonzero(differs)


@given(UPDATES, st.booleans(), st.integers(0, 5))
def test_consolidate_matches_model(rows, key_only, since):
    model = {}
    for k, v, t, d in rows:
        kv = (k, None if key_only else v, max(t, since))
        model[kv] = model.get(kv, 0) + d
    model = {a: b for a, b in model.items() if b}
    got = consolidate(_updates(rows, key_only), since)
    assert _as_dict(got, key_only) == model
    order = [(k, (v is not None, v or ""), t) for (k, v, t) in
             zip(got.keys["k"].to_pylist(),
                 [None] * len(got) if key_only else got.vals["v"].to_pylist(),
                 got.times.tolist())]
    assert order == sorted(order)


@given(st.lists(st.integers(-50, 50), unique=True, max_size=80).map(sorted),
       st.data(), st.booleans(), st.integers(0, 5))
def test_consolidate_of_keys_in_order_matches_model(keys, data, key_only, since):
    """Distinct keys in rising order (a dimension read by its id) come back as they are,
    their vals never ranked: only zero diffs dropped and times advanced."""
    rows = [(k, data.draw(st.sampled_from(["b", "", "a", None])), data.draw(st.integers(0, 4)),
             data.draw(st.integers(-2, 2))) for k in keys]
    model = {(k, None if key_only else v, max(t, since)): d for k, v, t, d in rows if d}
    got = consolidate(_updates(rows, key_only), since)
    assert _as_dict(got, key_only) == model
    assert got.keys["k"].to_pylist() == sorted(k for (k, _, _) in model)


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(-3, 3),
                          st.sampled_from([0.5, -0.0, 1e300, -2.25]), st.integers(0, 3),
                          st.integers(-2, 2)), max_size=80))
def test_consolidate_with_several_numeric_vals_matches_model(rows):
    """Several fixed-width val columns are sorted as separate codes, not ranked jointly."""
    upd = Updates(pa.table({"k": pa.array([r[0] for r in rows], pa.int64())}),
                  pa.table({"n": pa.array([r[1] for r in rows], pa.int64()),
                            "x": pa.array([r[2] for r in rows], pa.float64())}),
                  np.array([r[3] for r in rows], np.uint64), np.array([r[4] for r in rows]))
    model: dict = {}
    for k, n, x, t, d in rows:
        model[(k, n, x, t)] = model.get((k, n, x, t), 0) + d
    model = {a: b for a, b in model.items() if b}
    got = consolidate(upd)
    rows_out = list(zip(got.keys["k"].to_pylist(), got.vals["n"].to_pylist(),
                        got.vals["x"].to_pylist(), got.times.tolist()))
    assert dict(zip(rows_out, got.diffs.tolist())) == model and len(rows_out) == len(model)
    assert rows_out == sorted(rows_out)


@given(UPDATES, st.booleans())
def test_layout_round_trip(rows, key_only):
    c = consolidate(_updates(rows, key_only))
    if len(c) == 0:
        return
    layout = to_layout(c)
    back = from_layout(layout)
    assert back.keys.equals(c.keys)
    assert (back.times == c.times).all() and (back.diffs == c.diffs).all()
    if not key_only:
        assert back.vals.equals(c.vals)
    assert layout.key_bounds[0] == 0 and len(layout.key_bounds) == layout.keys.num_rows + 1
    for bounds in (layout.key_bounds, layout.val_bounds):   # u32: a part's counts fit
        assert bounds is None or bounds.dtype == np.uint32


def test_snapshot_layout_is_singleton_compressed_and_stride_bounds():
    n = 10_000
    upd = Updates(pa.table({"k": np.arange(n)}), pa.table({"v": np.arange(n)}),
                  np.zeros(n, np.uint64), np.ones(n, np.int64))
    layout = to_layout(consolidate(upd))
    assert layout.times.tolist() == [0] and layout.diffs.tolist() == [1]
    assert (np.diff(layout.key_bounds.astype(np.int64)) == 1).all()  # stride 1: O(1) stored


def test_bounds_widen_only_past_two_to_the_32():
    assert bounds_dtype(0) == np.uint32 and bounds_dtype(2**32 - 1) == np.uint32
    assert bounds_dtype(2**32) == np.uint64


def test_a_delta_of_single_updates_keeps_stride_bounds():
    """Retractions and insertions alternating (a 1% delta): one update per leaf with short
    runs of equal (time, diff) -- the bounds stay a stride (no bytes), the diffs stored."""
    n = 10_000
    diffs = np.where(np.arange(n) % 2 == 0, -1, 1).astype(np.int64)
    upd = Updates(pa.table({"k": np.arange(n) // 2}), pa.table({"v": np.arange(n)}),
                  np.ones(n, np.uint64), diffs)
    layout = to_layout(consolidate(upd))
    assert (np.diff(layout.val_bounds.astype(np.int64)) == 1).all()
    assert layout.diffs.tolist() == diffs.tolist()
    back = from_layout(layout)
    assert (back.diffs == diffs).all() and (back.times == 1).all()


# -- spine -----------------------------------------------------------------------------------

def test_levels_are_geometric():
    assert [level_of(n) for n in (1, 2, 3, 4, 5, 8, 9, 1024, 1025)] == [0, 1, 2, 2, 3, 3, 4, 10, 11]


def test_trace_holds_logarithmically_many_batches_and_merges_are_fueled():
    rng = np.random.default_rng(7)
    trace = memory_trace(pa.table({"k": pa.array([], pa.int64())}), ["k"], [],
                         part_bytes=1 << 12, window_rows=64)
    total = 0
    saw_merge_in_progress = False
    for i in range(200):
        n = int(rng.integers(1, 200))
        total += n
        trace.insert(pa.table({"k": rng.integers(0, 10_000, n)}))
        st_ = trace.stats()
        saw_merge_in_progress |= st_["merges_in_progress"] > 0
        assert st_["batches"] <= 2 * (math.log2(total) + 2)
    assert saw_merge_in_progress  # no insert paid for a whole merge at once
    trace.merge_all()
    assert trace.stats()["batches"] == 1
    assert sum(b.num_rows for b in trace.snapshot()) == trace.stats()["keys"]


def test_exert_reclaims_retracted_data_without_inserts():
    t = pa.table({"k": np.arange(1000), "d": np.ones(1000, np.int64)})
    trace = memory_trace(t, ["k"], [], diff="d")
    trace.insert(pa.table({"k": np.arange(1000), "d": -np.ones(1000, np.int64)}))
    assert trace.stats()["updates"] > 0
    for _ in range(10):
        trace.exert(1 << 20)
    assert trace.stats()["updates"] == 0


def test_logical_compaction_waits_for_every_handle():
    t = pa.table({"k": [1, 1, 2], "t": [0, 3, 5]})
    trace = memory_trace(t, ["k"], [], time="t")
    h1, h2 = trace.handle(), trace.handle()
    h1.set_logical_compaction(4)
    assert trace.since == 0
    h2.set_logical_compaction(6)
    assert trace.since == 4
    h1.close()
    assert trace.since == 6
    with pytest.raises(ValueError, match="compaction frontier"):
        trace.snapshot(at=2)
    trace.merge_all()
    trace.exert(1 << 30)
    assert [r["time"] for r in trace.changes(0, 10).read_all().to_pylist()] == [6, 6]


def test_dropping_a_handle_releases_its_hold():
    trace = memory_trace(pa.table({"k": [1], "t": [0]}), ["k"], [], time="t")
    h1, h2 = trace.handle(), trace.handle()
    h2.set_logical_compaction(9)
    del h1
    h2.set_logical_compaction(9)
    assert trace.since == 9


def test_physical_compaction_keeps_batches_beyond_the_frontier_apart():
    trace = memory_trace(pa.table({"k": [1], "t": [0]}), ["k"], [], time="t")
    h = trace.handle()
    h.set_physical_compaction(1)
    for t in range(1, 6):
        trace.insert(pa.table({"k": [t], "t": [t]}))
    assert trace.stats()["batches"] == 6
    h.set_physical_compaction(100)
    trace.merge_all()
    assert trace.stats()["batches"] == 1


# -- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(key=["nope"]), "key column 'nope'"),
    (dict(key=["k"], vals=["w"]), "val column 'w'"),
    (dict(key=["k"], time="v"), "time column 'v' must hold integers"),
    (dict(key=["k"], diff="s"), "diff column 's' must hold integers"),
    (dict(key=["l"]), "key column 'l' has type list"),
])
def test_schema_errors_name_the_column(kwargs, message):
    t = pa.table({"k": [1], "v": [1.5], "s": ["x"], "l": [[1]]})
    kwargs.setdefault("vals", [])
    with pytest.raises(SchemaError, match=message):
        memory_trace(t, **kwargs)


def test_unstorable_val_type_is_named():
    with pytest.raises(SchemaError, match="val column 'l' has type list"):
        memory_trace(pa.table({"k": [1], "l": [[1]]}), ["k"])


def test_row_errors_leave_the_trace_unchanged():
    trace = memory_trace(pa.table({"k": [1, 2], "t": [0, 0]}), ["k"], [], time="t")
    before = trace.snapshot().read_all()
    bad = [pa.table({"k": [3, 4], "t": [1, 1]}), pa.table({"k": [5, None], "t": [1, 1]})]
    with pytest.raises(SchemaError, match="key column 'k' holds 1 null"):
        trace.insert(pa.concat_tables(bad))
    with pytest.raises(SchemaError, match="negative times"):
        trace.insert(pa.table({"k": [3], "t": [-1]}))
    assert trace.snapshot().read_all().equals(before)


def test_missing_parquet_path_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.parquet"):
        memory_trace(str(tmp_path / "nowhere.parquet"), ["k"])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 3)), max_size=200),
       st.sampled_from([1, 5, 100]))
def test_cursor_blocks_never_split_a_key(rows, window):
    t = pa.table({"k": [r[0] for r in rows], "v": [r[1] for r in rows]},
                 schema=pa.schema([("k", pa.int64()), ("v", pa.int64())]))
    trace = memory_trace(t, ["k"], ["v"], part_bytes=64, window_rows=window)
    for i in range(0, len(rows), 37):
        trace.insert(t.slice(i, 37))
    seen = []
    for block in trace.cursor(window_rows=window):
        ks = block.keys["k"].to_pylist()
        assert ks == sorted(set(ks))
        seen.extend(ks)
    assert seen == sorted(set(seen))


def test_merged_reads_take_full_steps_over_sources_of_unequal_density():
    """A dense trace (one row per id) read beside a sparse one (eight rows per id, over
    the same ids), both cut into many small parts: every row comes once, in key order,
    in about as many steps as the step size allows -- windows follow each source's
    density and run on across part ends instead of cutting the step short there."""
    from arrangedb.spine.read.reader import MergedReader

    rng = np.random.default_rng(5)
    dense = pa.table({"k": np.arange(10_000, dtype=np.int64),
                      "v": np.zeros(10_000, np.int64)})
    sparse = pa.table({"k": rng.integers(0, 10_000, 80_000),
                       "v": np.arange(80_000, dtype=np.int64)})
    ctx = dict(part_bytes=8 << 10, window_rows=2048)
    traces = [memory_trace(dense, ["k"], ["v"], **ctx),
              memory_trace(sparse, ["k"], ["v"], **ctx)]
    batches = [b for t in traces for b in t.batches()]
    assert all(len(b.parts) > 10 for b in batches)
    reader = MergedReader(batches, traces[0].ctx, tags=[0, 1])
    steps, seen, last = 0, [0, 0], -1
    from arrangedb.spine.data.kernels import key_starts

    for step in reader:
        steps += 1
        keys = np.concatenate([u.keys["k"].to_numpy() for _, u, _ in step])
        assert keys.min() > last
        last = keys.max()
        for tag, u, starts in step:
            seen[tag] += len(u)
            if starts is not None:   # rows taken across parts: their key starts joined up
                assert np.array_equal(starts, key_starts(u.keys))
    assert seen == [10_000, 80_000]
    ideal = 90_000 / (reader.window_rows * 2)
    assert steps <= 1.5 * ideal + 2, (steps, ideal)


def test_merged_steps_of_wide_rows_hold_the_bytes_of_narrow_ones():
    """A step's rows are the window of 32-byte rows scaled to the rows' width: eight
    runs of 2 KiB strings are read in steps of about the bytes a step of narrow rows
    holds, every row once, in key order."""
    from arrangedb.spine.read.reader import NOMINAL_ROW_BYTES, MergedReader

    rng = np.random.default_rng(6)
    pad = "x" * 2040
    window = 2048
    traces = [memory_trace(pa.table({"k": rng.integers(0, 1 << 30, 400),
                                     "s": [pad + "%08d" % (400 * i + j) for j in range(400)]}),
                           ["k"], ["s"], part_bytes=64 << 10, window_rows=window)
              for i in range(8)]
    reader = MergedReader([t.batches()[0] for t in traces], traces[0].ctx)
    largest, seen, last = 0, [], -1
    for step in reader:
        largest = max(largest, sum(u.nbytes for _, u, _ in step))
        keys = np.concatenate([u.keys["k"].to_numpy() for _, u, _ in step])
        assert keys.min() > last
        last = keys.max()
        seen += [v for _, u, _ in step for v in u.vals["s"].to_pylist()]
    assert sorted(seen) == sorted(pad + "%08d" % i for i in range(3200))
    assert largest <= 2 * 4 * window * NOMINAL_ROW_BYTES, largest   # 6.5 MB at once before


def test_input_without_time_or_diff_keeps_them_one_element_each():
    """A snapshot load's times and diffs are stride-0 views from ingest through the
    sort: its updates cost their payload alone, and consolidation keeps them so."""
    from arrangedb.spine.data.ingest import to_updates
    from arrangedb.spine.data.updates import is_constant

    t = pa.table({"k": np.array([3, 1, 2, 1], np.int64), "v": np.array([1., 2., 3., 4.])})
    cols = Columns.resolve(t.schema, ["k"], ["v"], None, None)
    ks, vs = target_schemas(t.schema, cols)
    pieces = [to_updates(b, cols, ks, vs) for b in t.to_batches(max_chunksize=2)]
    upd = Updates.concat(pieces)
    assert is_constant(upd.times) and is_constant(upd.diffs)
    assert upd.nbytes == t.nbytes + 16
    out = consolidate(upd)
    assert is_constant(out.times) and is_constant(out.diffs)
    assert out.keys["k"].to_pylist() == [1, 1, 2, 3] and out.diffs.tolist() == [1] * 4


@pytest.mark.parametrize("limit", [8 << 20, 128 << 20, 256 << 20, 512 << 20, 4 << 30])
def test_readers_hold_at_most_a_quarter_of_the_budget_in_decoded_parts(limit):
    from arrangedb.pager import MemoryBudget

    with MemoryBudget(limit, sample_interval=0) as budget:
        ctx = StorageContext.for_budget(budget, None)
    assert 8 <= ctx.read_fan_in <= 16
    assert ctx.read_fan_in * 2 * ctx.part_bytes <= max(limit // 4, 16 * (256 << 10))
    assert ctx.read_fan_in == (16 if limit >= 128 << 20 else 8)


def test_runs_hold_half_the_budget_by_their_sort_cost(tmp_path, monkeypatch):
    """Runs are cut when input plus what sorting it holds reaches half the budget: at
    most that, and (but the last) filled to it -- a chunk of input that would take a
    run past it is split, not left whole for the next run."""
    from arrangedb import Engine
    from arrangedb.spine.build import runs as runs_module

    sealed = []
    real = runs_module.RunBuilder.seal
    monkeypatch.setattr(runs_module.RunBuilder, "seal", lambda self, buffered, reserved, *a: (
        sealed.append((reserved, sum(len(u) for u in buffered))) or real(self, buffered,
                                                                          reserved, *a)))
    n = 1_500_000
    t = pa.table({"k": np.random.default_rng(0).integers(0, 1 << 40, n), "v": np.arange(n)})
    with Engine(spill_dir=tmp_path, memory_budget="32MiB") as engine:
        trace = engine.arrange(t, key=["k"], vals=["v"])
        assert len(trace.snapshot().read_all()) == n
        costs = [runs_module.sort_cost(reserved, rows) for reserved, rows in sealed]
        assert max(costs) <= 16 << 20
        assert min(costs[:-1]) >= 0.99 * (16 << 20)   # cut at 64k-row chunks: ~0.81
    assert len(sealed) >= 4 and sum(rows for _, rows in sealed) == n


@pytest.mark.parametrize("kind, budget, want", [
    ("table", "16MiB", "half"), ("parquet", "16MiB", "half"), ("stream", "16MiB", 3),
    ("table", "512MiB", 1), ("parquet", "512MiB", 1)])
def test_an_input_of_known_size_spreads_over_half_the_fan_in_of_runs(tmp_path, monkeypatch,
                                                                      kind, budget, want):
    """A table or a Parquet file, whose size is known before it is read, sorts into half
    the read fan-in of runs (each run's sort holding at least ``_SPREAD_RUN_BYTES``)
    when it is several runs anyway; a stream, of unknown size, into runs as large as the
    budget allows; an input that one run holds stays one run."""
    import pyarrow.parquet as pq

    from arrangedb import Engine
    from arrangedb.spine.build import runs as runs_module

    monkeypatch.setattr(runs_module, "_SPREAD_RUN_BYTES", 1 << 20)
    sealed = []
    real = runs_module.RunBuilder.seal
    monkeypatch.setattr(runs_module.RunBuilder, "seal", lambda self, buffered, reserved, *a: (
        sealed.append(sum(len(u) for u in buffered)) or real(self, buffered, reserved, *a)))
    n = 200_000
    rng = np.random.default_rng(3)
    t = pa.table({"k": rng.integers(0, 5000, n), "v": rng.integers(0, 3, n)})
    data = {"table": t, "stream": iter(t.to_batches(max_chunksize=1 << 14))}.get(kind)
    if kind == "parquet":
        data = str(tmp_path / "t.parquet")
        pq.write_table(t, data, row_group_size=1 << 15)
    with Engine(spill_dir=tmp_path, memory_budget=budget) as engine:
        trace = engine.arrange(data, key=["k"], vals=["v"])
        got = trace.snapshot().read_all()
        half = engine.ctx.read_fan_in // 2
    assert sum(sealed) == n
    assert len(sealed) == (half if want == "half" else want) and half != 3
    want = pa.table({"k": t["k"], "v": t["v"]}).group_by(["k", "v"]).aggregate(
        [("k", "count")]).sort_by([("k", "ascending"), ("v", "ascending")])
    assert got["k"].to_pylist() == want["k"].to_pylist()
    assert got["v"].to_pylist() == want["v"].to_pylist()
    assert got["count"].to_pylist() == want["k_count"].to_pylist()


@pytest.mark.parametrize("misjudged", [False, True])
def test_runs_of_known_input_that_will_be_merged_have_larger_parts(tmp_path, monkeypatch,
                                                                   misjudged):
    """An input of known size that sorts into more runs than a read walks writes the
    runs that merging down will take with parts as large as a merge's fan-in allows
    (a merge reads fewer runs at once than a read); those runs are merged away whatever
    the count, so what remains has parts of the base size. ``misjudged``: the runs
    come out fewer than foreseen, and the leading large-part runs left over are merged
    too."""
    from arrangedb import Engine
    from arrangedb.spine.build import runs as runs_module

    sealed = []   # (run, part_bytes) per run
    real = runs_module.RunBuilder.seal

    def seal(self, buffered, reserved, *a):
        done = real(self, buffered, reserved, *a)   # keys in any order: one batch a run
        assert len(done) == 1
        sealed.append((done[0], a[4] if len(a) > 4 else None))
        return done
    monkeypatch.setattr(runs_module.RunBuilder, "seal", seal)
    monkeypatch.setattr(runs_module, "_MERGE_FAN_IN", 4)   # half the read fan-in
    if misjudged:   # foresee 8 more runs than there will be
        ahead = runs_module.RunBuilder.merged_ahead
        monkeypatch.setattr(runs_module.RunBuilder, "merged_ahead",
                            lambda self, *a: ahead(self, *a) + 8)
    n = 900_000
    rng = np.random.default_rng(4)
    t = pa.table({"k": rng.integers(0, 50_000, n), "v": rng.integers(0, 1000, n)})
    with Engine(spill_dir=tmp_path, memory_budget="64MiB", idle_merge=False) as engine:
        engine.ctx.read_fan_in, engine.ctx.run_bytes = 8, 6 << 20
        base = engine.ctx.part_bytes
        trace = engine.arrange(t, key=["k"], vals=["v"])
        got = trace.snapshot().read_all()
        batches = trace.batches()
    large = [id(run) for run, part in sealed if part == 2 * base]
    assert len(sealed) >= 12 and len(large) >= len(sealed) - 8 - 1
    assert [part for _, part in sealed[:len(large)]] == [2 * base] * len(large)
    assert len(batches) <= 8 and not {id(b) for b in batches} & set(large)
    want = pa.table({"k": t["k"], "v": t["v"]}).group_by(["k", "v"]).aggregate(
        [("k", "count")]).sort_by([("k", "ascending"), ("v", "ascending")])
    assert got["k"].to_pylist() == want["k"].to_pylist()
    assert got["count"].to_pylist() == want["k_count"].to_pylist()


@pytest.mark.parametrize("kind", ["batch", "parquet"])
def test_one_large_input_batch_is_sorted_within_a_small_budget(tmp_path, kind):
    """A single batch far larger than a run (a RecordBatch, Parquet's 256k-row batches of
    narrow rows) is cut by what sorting it would hold, never handed to one run whole."""
    import pyarrow.parquet as pq

    from arrangedb import Engine

    keys = np.random.default_rng(2).integers(0, 1 << 40, 2_000_000 if kind == "batch"
                                             else 600_000)
    data = pa.record_batch({"k": keys})
    if kind == "parquet":
        data = str(tmp_path / "k.parquet")
        pq.write_table(pa.table({"k": keys}), data)
    with Engine(spill_dir=tmp_path, memory_budget="32MiB" if kind == "batch" else "16MiB") as e:
        got = e.arrange(data, key=["k"]).snapshot().read_all()
    want = np.unique(keys, return_counts=True)
    assert np.array_equal(got["k"].to_numpy(), want[0])
    assert np.array_equal(got["count"].to_numpy(), want[1])


@pytest.mark.parametrize("where", ["sort", "write"])
def test_a_failed_run_gives_back_every_reservation(tmp_path, monkeypatch, where):
    from arrangedb import Engine
    from arrangedb.spine.build import builder as builder_module
    from arrangedb.spine.build import runs as runs_module

    def boom(*a, **k):
        raise RuntimeError("injected")

    if where == "sort":
        monkeypatch.setattr(runs_module, "consolidate", boom)
    else:
        monkeypatch.setattr(builder_module.Builder, "done", boom)
    with Engine(spill_dir=tmp_path, memory_budget="32MiB") as e:
        with pytest.raises(RuntimeError, match="injected"):
            e.arrange(pa.table({"k": np.arange(100_000), "v": np.arange(100_000)}),
                      key=["k"], vals=["v"])
        assert e.budget.held == 0
        assert not [f for f in os.listdir(e.spill.path) if f.endswith((".pg", ".tmp"))]


def test_allocator_tuning_is_applied_once_and_can_be_turned_off():
    import platform
    import subprocess
    import sys

    code = ("from arrangedb.pager import MemoryBudget, process_memory; "
            "MemoryBudget('8MiB', sample_interval=0).close(); print(process_memory._tuned)")
    def tuned(env_value):
        env = dict(os.environ, ARRANGEDB_TUNE_MALLOC=env_value)
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, check=True).stdout.strip()
    assert tuned("0") == "False"
    if platform.libc_ver()[0] == "glibc":
        assert tuned("1") == "True"


def test_a_merge_waiting_for_fuel_holds_no_decoded_part(tmp_path):
    """Runs enter the spine with a merge in progress; until fuel reaches it, its readers
    have decoded nothing, so the budget holds nothing for it. (No idle merger: it would
    bring fuel whenever the engine rests, between any two lines here.)"""
    from arrangedb import Engine

    with Engine(spill_dir=tmp_path, memory_budget="32MiB", idle_merge=False) as e:
        keys = np.random.default_rng(3).integers(0, 1 << 40, 2_000_000)
        t = e.arrange(pa.record_batch({"k": keys}), key=["k"])
        assert t.stats()["merges_in_progress"] >= 1
        assert e.budget.held == 0
        assert t.snapshot().read_all()["count"].to_numpy().sum() == len(keys)
        assert e.budget.held == 0


def _delta(rng, n, keys, t=1):
    return pa.table({"k": rng.integers(0, keys, n), "v": rng.integers(0, 5, n),
                     "time": pa.array(np.full(n, t, np.uint64)),
                     "diff": pa.array(rng.choice([-1, 1], n).astype(np.int64))})


def _accumulated(table: pa.Table) -> dict:
    out: dict = {}
    for k, v, d in zip(*(table[c].to_pylist() for c in ("k", "v", "diff" if "diff" in
                                                          table.column_names else "count"))):
        out[(k, v)] = out.get((k, v), 0) + d
    return {kv: c for kv, c in out.items() if c}


def test_a_small_insert_stays_resident_until_pressure_pages_it_out(tmp_path):
    """An insert that sorts into one small run is kept in memory (reserved); when the
    budget runs short its spiller writes it to a page file, and reads see the same rows
    before and after."""
    from arrangedb import Engine

    rng = np.random.default_rng(5)
    base = _delta(rng, 200_000, 50_000, t=0)
    delta = _delta(rng, 20_000, 50_000, t=1)
    # the budget's accounting is checked to the byte: no idle merge alongside
    with Engine(spill_dir=tmp_path, memory_budget="32MiB", idle_merge=False) as e:
        tr = e.arrange(base, key=["k"], vals=["v"], time="time", diff="diff")
        tr.insert(delta)
        s = e.stats()
        assert s["resident_bytes"] > 0 and e.budget.held == s["resident_bytes"]
        assert tr.stats()["bytes_in_memory"] == s["resident_bytes"]
        want_changes = _accumulated(delta)
        want_snapshot = _accumulated(pa.concat_tables([base, delta]))
        assert _accumulated(tr.changes(1, 2).read_all()) == want_changes
        payload = tr.stats()["payload_bytes"]
        ask = e.budget.limit - s["resident_bytes"] // 2    # more than is free: spillers run
        e.budget.reserve(ask, "pressure")
        e.budget.release(ask)
        s = e.stats()
        assert s["resident_bytes"] == 0 and s["resident_batches_paged_out"] == 1
        assert tr.stats()["bytes_in_memory"] == 0 and e.budget.held == 0
        assert tr.stats()["payload_bytes"] == payload      # counted alike in either form
        assert [f for f in os.listdir(e.spill.path) if f.startswith("resident")]
        assert _accumulated(tr.changes(1, 2).read_all()) == want_changes
        assert _accumulated(tr.snapshot().read_all()) == want_snapshot


def test_resident_runs_stay_within_their_share_and_merges_release_them(tmp_path):
    from arrangedb import Engine

    rng = np.random.default_rng(6)
    with Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        tr = e.arrange(_delta(rng, 1000, 100, t=0), key=["k"], vals=["v"], time="time",
                       diff="diff")
        assert e.stats()["resident_bytes"] == 0          # arrange: always page files
        big = _delta(rng, 2_000_000, 1 << 30)            # 48 MB: runs beyond the share
        tr.insert(big)
        assert e.stats()["resident_bytes"] <= e.budget.limit // 4
        assert tr.stats()["bytes_on_disk"] > 0
        for t in (2, 3, 4):
            tr.insert(_delta(rng, 1000, 100, t=t))
        assert _accumulated(tr.changes(1, 2).read_all()) == _accumulated(big)
        tr.merge_all()
        assert e.stats()["resident_bytes"] == 0 and e.budget.held == 0
        assert tr.stats()["bytes_in_memory"] == 0


def test_an_insert_of_a_few_batch_shares_stays_resident_as_several_runs(tmp_path):
    """An insert larger than one resident batch may hold is cut into runs that each fit
    it, while the resident share has room: nothing is written, and its changes read
    back as they went in. (Cut only by the sort's share, its two runs would both be too
    large to stay, and the whole insert would be paged out.)"""
    from arrangedb import Engine

    rng = np.random.default_rng(8)
    # no idle merger: the runs are counted, and a merge of them would write them out
    with Engine(spill_dir=tmp_path, memory_budget="64MiB", idle_merge=False) as e:
        tr = e.arrange(_delta(rng, 1000, 100, t=0), key=["k"], vals=["v"], time="time",
                       diff="diff")
        on_disk, batches = tr.stats()["bytes_on_disk"], len(tr.batches())
        delta = _delta(rng, 300_000, 1 << 30)     # ~10 MB: 2.4 batch shares of 4 MiB
        tr.insert(delta)
        runs = len(tr.batches()) - batches
        assert runs >= 3
        assert tr.stats()["bytes_on_disk"] == on_disk
        s = e.stats()
        assert 0 < s["resident_bytes"] <= e.budget.limit // 4
        assert s["resident_bytes"] == e.budget.held == tr.stats()["bytes_in_memory"]
        assert _accumulated(tr.changes(1, 2).read_all()) == _accumulated(delta)
        tr.merge_all()
        assert e.stats()["resident_bytes"] == 0 and e.budget.held == 0


def test_saving_a_trace_writes_its_resident_batches_and_keeps_them(tmp_path):
    """A save encodes resident batches straight into its directory; in memory they stay
    resident (an insert's delta is read back soon)."""
    from arrangedb import Engine

    rng = np.random.default_rng(7)
    base, delta = _delta(rng, 5000, 500, t=0), _delta(rng, 500, 500, t=1)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with Engine(spill_dir=tmp_path / "a", memory_budget="32MiB") as e:
        tr = e.arrange(base, key=["k"], vals=["v"], time="time", diff="diff")
        tr.insert(delta)
        assert e.stats()["resident_bytes"] > 0
        resident = e.stats()["resident_bytes"]
        tr.save(tmp_path / "saved")
        assert e.stats()["resident_bytes"] == resident
        want = _accumulated(tr.snapshot().read_all())
    with Engine(spill_dir=tmp_path / "b", memory_budget="32MiB") as e:
        loaded = e.load(tmp_path / "saved")
        assert _accumulated(loaded.snapshot().read_all()) == want
        assert _accumulated(loaded.changes(1, 2).read_all()) == _accumulated(delta)


@given(st.lists(st.integers(-2**63, 2**63 - 1), unique=True, max_size=50),
       st.lists(st.integers(-2**63, 2**63 - 1), max_size=30),
       st.integers(-3, 3), st.sampled_from([np.int64, np.uint64]))
def test_key_positions_match_a_search(keys, queries, dense_from, dtype):
    """Lookups find keys by offset when a part's codes are consecutive (dense ids), by
    binary search otherwise: both give what a search gives."""
    from arrangedb.spine.read.lookup import _positions

    if dense_from:      # consecutive keys, queries around and inside them
        keys = list(range(dense_from * 10, dense_from * 10 + len(keys)))
        queries = [q % (len(keys) + 6) + dense_from * 10 - 3 for q in queries]
    if dtype is np.uint64:
        keys = [k % 2**64 for k in keys]
        queries = [q % 2**64 for q in queries]
    codes = np.array(sorted(set(keys)), dtype=dtype)
    q = np.array(sorted(queries), dtype=dtype)
    pos, hit = _positions(codes, q)
    want = {i: j for i, x in enumerate(q) for j, k in enumerate(codes) if k == x}
    assert list(np.flatnonzero(hit)) == sorted(want)
    assert list(pos) == [want[i] for i in sorted(want)]


def test_a_resident_batch_owns_its_buffers(tmp_path):
    """An input already sorted comes through consolidation as it is, and a slice pins
    its parent: a batch kept in memory copies both, so the caller may reuse its arrays
    and the parent's memory goes with the parent."""
    from arrangedb import Engine

    k = np.arange(1000, dtype=np.int64)
    v = np.arange(1000, dtype=np.int64) * 3
    with Engine(spill_dir=tmp_path, memory_budget="32MiB") as e:
        tr = e.arrange(pa.table({"k": k[:1], "v": v[:1]}), key=["k"], vals=["v"])
        tr.insert(pa.table({"k": k, "v": v}))             # zero-copy views, sorted
        assert e.stats()["resident_bytes"] > 0
        want = tr.snapshot().read_all()
        k[:] = 5
        v[:] = 999
        assert tr.snapshot().read_all().equals(want)
        before = pa.total_allocated_bytes()
        parent = pa.table({"k": pa.array(np.arange(4_000_000, dtype=np.int64)),
                           "v": pa.array(np.zeros(4_000_000, np.int64))})
        tr.insert(parent.slice(2_000_000, 1000))
        del parent
        assert pa.total_allocated_bytes() - before < 1 << 20


def test_a_failed_page_out_fails_only_the_reservation_that_needed_it(tmp_path, monkeypatch):
    """Paging out runs inside another caller's reserve: a full spill directory there
    surfaces as that reservation not fitting, not as an I/O error, and the resident
    batch stays whole and readable."""
    from arrangedb import Engine
    from arrangedb.pager import BudgetExceeded, SpillError

    rng = np.random.default_rng(9)
    delta = _delta(rng, 20_000, 5_000, t=1)
    with Engine(spill_dir=tmp_path, memory_budget="32MiB") as e:
        tr = e.arrange(_delta(rng, 1000, 5_000, t=0), key=["k"], vals=["v"], time="time",
                       diff="diff")
        tr.insert(delta)
        held = e.stats()["resident_bytes"]
        assert held > 0

        def full(*a, **k):
            raise SpillError(28, "No space left on device")
        monkeypatch.setattr(e.ctx, "new_writer", full)
        with pytest.raises(BudgetExceeded):
            e.budget.reserve(e.budget.limit, "too much")
        assert isinstance(e.ctx.resident.spill_error, SpillError)
        assert e.stats()["resident_bytes"] == held == e.budget.held
        assert _accumulated(tr.changes(1, 2).read_all()) == _accumulated(delta)


def test_closing_a_trace_mid_merge_gives_back_what_the_merge_held(tmp_path):
    """A merge that has started holds decoded parts and a builder's buffer; closing its
    trace stops it: nothing stays reserved and no half-written file stays behind."""
    from arrangedb import Engine

    with Engine(spill_dir=tmp_path, memory_budget="32MiB", idle_merge=False) as e:
        keys = np.random.default_rng(3).integers(0, 1 << 40, 2_000_000)
        t = e.arrange(pa.record_batch({"k": keys}), key=["k"])
        t.exert(100_000)
        assert t.stats()["merges_in_progress"] >= 1 and e.budget.held > 0
        t.close()
        assert e.budget.held == 0
        assert not [f for f in os.listdir(e.spill.path) if f.endswith((".pg", ".tmp"))]


def test_a_resident_batch_a_merge_is_reading_is_not_paged_out(tmp_path):
    """Paging out a batch whose arrays a reader holds would release its reservation and
    free nothing: pinned batches are skipped until their readers let go."""
    from arrangedb import Engine

    rng = np.random.default_rng(1)

    def tab(n, t):
        return pa.table({"k": rng.integers(0, 1 << 40, n), "v": rng.integers(0, 100, n),
                         "time": np.full(n, t, np.int64), "diff": np.ones(n, np.int64)})

    with Engine(spill_dir=tmp_path, memory_budget="256MiB", idle_merge=False) as e:
        tr = e.arrange(tab(30_000, 0), key=["k"], vals=["v"], time="time", diff="diff")
        tr.insert(tab(30_000, 1))
        resident = e.stats()["resident_bytes"]
        assert resident > 0
        tr.exert(2_000)                      # the merge reads the resident part
        assert tr.stats()["merges_in_progress"] == 1
        held = e.budget.held
        assert e.ctx.resident.spill(1 << 40) == 0
        assert e.stats()["resident_bytes"] == resident and e.budget.held == held
        tr.merge_all()
        assert e.stats()["resident_bytes"] == 0 and e.budget.held == 0
        assert tr.snapshot().read_all()["count"].to_numpy().sum() == 60_000


def test_a_val_column_of_only_nulls_is_stored_sorted_and_read_back(tmp_path):
    """Ingest accepts a null-typed val column (an all-null column of a join's output):
    it ranks as one value, holds no bytes, and reads back, paged or resident."""
    from arrangedb import Engine

    with Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        t = e.arrange(pa.table({"k": np.array([3, 1, 2, 1]), "v": pa.nulls(4)}),
                      key=["k"], vals=["v"])
        t.insert(pa.table({"k": np.array([1]), "v": pa.nulls(1), "time": np.array([1]),
                           "diff": np.array([-1])}), time="time", diff="diff")
        snap = t.snapshot().read_all()
        assert snap["k"].to_pylist() == [1, 2, 3] and snap["count"].to_pylist() == [1, 1, 1]
        assert snap["v"].null_count == 3
        assert t.lookup(pa.table({"k": [1]}))["count"].to_pylist() == [1]
        t.merge_all()
        assert t.snapshot().read_all()["count"].to_pylist() == [1, 1, 1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2), st.integers(0, 3),
                          st.integers(-2, 2)), max_size=60),
       st.booleans(), st.one_of(st.none(), st.integers(0, 3)))
def test_leaf_totals_sum_each_leafs_visible_updates(rows, key_only, at):
    """Against the layout expanded back to one row per update (``from_layout``): each
    leaf's total is the sum of its diffs at times up to ``at``, whatever the singleton
    compression stored."""
    from arrangedb.spine.data.layout import leaf_totals

    upd = consolidate(Updates(pa.table({"k": [r[0] for r in rows]}),
                              None if key_only else pa.table({"v": [r[1] for r in rows]}),
                              np.array([r[2] for r in rows], np.uint64),
                              np.array([r[3] for r in rows], np.int64)))
    if len(upd) == 0:
        return
    layout = to_layout(upd)
    leaves = layout.key_bounds if key_only else layout.val_bounds
    got = leaf_totals(leaves, layout.times, layout.diffs, at)
    back = from_layout(layout)
    model = {}
    for i, k in enumerate(back.keys.column("k").to_pylist()):
        leaf = (k,) if key_only else (k, back.vals.column("v")[i].as_py())
        visible = at is None or int(back.times[i]) <= at
        model[leaf] = model.get(leaf, 0) + (int(back.diffs[i]) if visible else 0)
    assert got.tolist() == list(model.values())   # leaves in key, val order, as stored


def test_leaf_update_index_of_single_update_leaves_is_their_starts():
    """Leaves of one stored update, or sharing the one before (a run of equal (time,
    diff) pairs stored once): the index is each leaf's own start; the general path
    (ranges over every leaf) gives the same."""
    from arrangedb.spine.data.layout import leaf_update_index, ranges

    rng = np.random.default_rng(3)
    stored = rng.choice([0, 1], 1000, p=[0.3, 0.7])
    stored[0] = 1
    bounds = np.concatenate([[0], np.cumsum(stored)])
    idx, counts = leaf_update_index(bounds)
    starts = np.where(stored == 0, bounds[:-1] - 1, bounds[:-1])
    assert (counts == 1).all()
    assert np.array_equal(idx, ranges(starts, counts))
    stored[5] = 3   # a leaf of several updates: the general path
    bounds = np.concatenate([[0], np.cumsum(stored)])
    idx, counts = leaf_update_index(bounds)
    assert len(idx) == counts.sum() == len(stored) + 2


@given(st.integers(0, 5), st.one_of(st.none(), st.integers(0, 6)), st.integers(0, 4),
       st.booleans())
def test_filter_times_of_one_stored_time_matches_the_mask(since, upto, time, one_view):
    """Rows all at one time -- a stride-0 view (a delta's stored time) or a full array --
    are kept or dropped together, as the per-row mask keeps them."""
    n = 5
    times = constant(time, n, np.uint64) if one_view else np.full(n, time, np.uint64)
    upd = Updates(pa.table({"k": np.arange(n)}), None, times, np.ones(n, np.int64))
    got = filter_times(upd, since, upto)
    keep = since <= time and (upto is None or time < upto)
    assert len(got) == (n if keep else 0)
    assert got.keys["k"].to_pylist() == (list(range(n)) if keep else [])


def test_a_step_settles_counting_what_it_freed_and_not_when_it_fails(tmp_path, monkeypatch):
    """``StorageContext.settling()``: what malloc held freed as the step began reaches
    the trim as ``free_before`` (what earlier work left freed is not the step's to hand
    back); a step that raises settles nothing."""
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB", idle_merge=False) as e:
        ctx, asked = e.ctx, []
        monkeypatch.setattr(ctx.budget, "heap_free", lambda: 12345)
        monkeypatch.setattr(ctx.budget, "trim_if_high",
                            lambda share=0.5, free_before=0: asked.append(free_before))
        with ctx.settling():
            monkeypatch.setattr(ctx.budget, "heap_free", lambda: 99999)   # freed meanwhile
        assert asked == [12345]
        with pytest.raises(RuntimeError):
            with ctx.settling():
                raise RuntimeError("the step failed")
        assert asked == [12345]


def test_an_insert_of_another_kind_of_value_is_refused_whatever_its_values():
    """A string of digits is not an integer and a bool is not a string: only values of
    the trace's kind convert, and a refused insert stores nothing."""
    with arrangedb.Engine(memory_budget="64MiB", idle_merge=False) as e:
        t = e.arrange(pa.table({"k": pa.array([1, 2], pa.int64()), "s": ["a", "b"],
                                "x": [0.5, 1.5]}), key=["k"])
        for bad in ({"k": ["3"], "s": ["c"], "x": [1.0]},
                    {"k": [True], "s": ["d"], "x": [1.0]},
                    {"k": pa.array([6], pa.timestamp("s")), "s": ["e"], "x": [1.0]},
                    {"k": [4], "s": [True], "x": [1.0]},
                    {"k": [5], "s": [1.5], "x": [1.0]},
                    {"k": [5], "s": ["f"], "x": ["1.0"]}):
            with pytest.raises(SchemaError, match="has type .*, the arrangement's is"):
                t.insert(pa.table(bad))
        with pytest.raises(SchemaError, match="lookup key column 'k' has type string"):
            t.lookup(pa.table({"k": ["1"]}))
        t.insert(pa.table({"k": pa.array([7], pa.int32()), "s": pa.array(["g"], pa.large_string()),
                           "x": pa.array([3], pa.int64())}))   # within a kind: converted
        got = t.snapshot().read_all()
        assert got.column("k").to_pylist() == [1, 2, 7]
        assert got.column("x").to_pylist() == [0.5, 1.5, 3.0]
        with pytest.raises(SchemaError, match="not all of its values fit"):   # int8
            e.arrange(pa.table({"k": pa.array([1], pa.int8())}), key=["k"]).insert(
                pa.table({"k": [300]}))


def test_payload_of_rows_is_the_payload_of_those_rows_gathered():
    """``payload_bytes(table, rows)`` (a resident part's keys, counted once each) equals
    the payload of the rows taken, for strings with nulls, integers and booleans over
    several chunks."""
    from arrangedb.spine.storage.part import payload_bytes

    rng = np.random.default_rng(13)
    t = pa.table({"s": pa.array(rng.choice(["a", "bbb", "cc", None], 1000).tolist()),
                  "i": rng.integers(0, 9, 1000),
                  "b": rng.integers(0, 2, 1000).astype(bool)})
    t = pa.concat_tables([t.slice(0, 400), t.slice(400)])
    for k in (0, 1, 300, 1000):
        rows = np.sort(rng.choice(1000, k, replace=False))
        assert payload_bytes(t, rows) == payload_bytes(t.take(pa.array(rows, pa.int64())))
