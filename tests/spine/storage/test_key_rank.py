"""The key rank index: positions of integer keys among a part's sorted keys, against a
binary search of the keys themselves; and lookups through it, against a model, in paged
parts written and merged by an engine and loaded back from a checkpoint."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrangedb
from arrangedb.spine.storage import keyrank
from arrangedb.spine.storage.paged import PagedPart
from arrangedb.spine.storage.keyrank import RANK_SPAN, rank_index, rank_positions

KEY_SETS = st.lists(st.integers(-300, 300), min_size=1, max_size=200, unique=True)


def _model(keys: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pos = np.searchsorted(keys, queries)
    hit = (pos < len(keys)) & (keys[np.minimum(pos, len(keys) - 1)] == queries)
    return pos[hit], hit


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=KEY_SETS, queries=st.lists(st.integers(-400, 400), max_size=100),
       offset=st.sampled_from([0, -2**63 + 400, 2**40]))
def test_positions_equal_a_binary_search(monkeypatch, keys, queries, offset):
    monkeypatch.setattr(keyrank, "RANK_MIN_KEYS", 1)
    keys = np.array(sorted(k + offset for k in keys), np.int64)
    queries = np.unique(np.array([q + offset for q in queries] or [offset], np.int64))
    index = rank_index(pa.table({"k": keys}))
    span = int(keys[-1]) - int(keys[0]) + 1
    if span > RANK_SPAN * len(keys) or _strided(keys):
        assert index is None   # sparse keys are searched; strided ones decode by arange
        return
    _assert_positions_as_searched(keys, queries, index)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.integers(0, 600), min_size=80, max_size=200, unique=True),
       data=st.data())
def test_positions_of_queries_within_the_keys_range(monkeypatch, keys, data):
    """A part's share of a lookup: every query between the first and last key, all of
    them keys, or some falling in gaps -- each answered as a binary search would."""
    monkeypatch.setattr(keyrank, "RANK_MIN_KEYS", 1)
    keys = np.array(sorted(keys), np.int64)
    index = rank_index(pa.table({"k": keys}))
    if index is None:
        return
    chosen = data.draw(st.lists(st.sampled_from(keys.tolist()), min_size=1, unique=True))
    gaps = data.draw(st.lists(st.integers(int(keys[0]), int(keys[-1])), max_size=5))
    queries = np.unique(np.array(chosen + gaps, np.int64))
    _assert_positions_as_searched(keys, queries, index)


def _assert_positions_as_searched(keys: np.ndarray, queries: np.ndarray, index) -> None:
    words, ranks = index
    pos, hit = rank_positions(int(keys[0]), int(keys[-1]), words.__getitem__,
                              ranks.__getitem__, pa.array(queries))
    want_pos, want_hit = _model(keys, queries)
    assert hit.tolist() == want_hit.tolist()
    assert pos.tolist() == want_pos.tolist()


def _strided(keys) -> bool:
    """Keys at one step from each other (dense ids among them)."""
    return len(set(np.diff(np.sort(np.asarray(keys, np.int64))).tolist())) <= 1


def test_no_index_where_it_does_not_apply(monkeypatch):
    monkeypatch.setattr(keyrank, "RANK_MIN_KEYS", 1)
    sparse = np.arange(0, 100 * 2 * RANK_SPAN, 2 * RANK_SPAN)
    assert rank_index(pa.table({"k": sparse})) is None
    assert rank_index(pa.table({"k": np.arange(50)})) is None   # dense
    assert rank_index(pa.table({"k": np.arange(7, 400, 3)})) is None   # a stride
    assert rank_index(pa.table({"k": ["a", "c"]})) is None
    assert rank_index(pa.table({"a": [1, 3], "b": [1, 3]})) is None
    assert rank_index(pa.table({"k": pa.array([2**63 + 1, 2**63 + 3], pa.uint64())})) is None
    monkeypatch.setattr(keyrank, "RANK_MIN_KEYS", 4096)
    assert rank_index(pa.table({"k": np.arange(0, 200, 3)})) is None   # few keys


def _stores_rank(trace) -> bool:
    return any("key_rank" in getattr(part, "columns", {})
               for batch in trace.batches() for part in batch.parts)


@pytest.mark.parametrize("key_type", [pa.int64(), pa.uint64(), pa.int32()])
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.integers(0, 100), min_size=40, max_size=100, unique=True),
       later=st.lists(st.tuples(st.integers(0, 100), st.sampled_from([-1, 1])), max_size=30),
       queries=st.lists(st.integers(-5, 105), max_size=60),
       merge=st.booleans())
def test_lookups_through_the_index_equal_the_model(tmp_path, monkeypatch, key_type, keys,
                                                   later, queries, merge):
    monkeypatch.setattr(keyrank, "RANK_MIN_KEYS", 4)
    keys = [3 * k for k in keys]   # one key in three or closer: the index applies
    later = [(3 * k + 1, d) for k, d in later]   # keys between them, in other batches
    queries = sorted({3 * q + r for q in queries for r in (0, 1)}
                     | ({2**63 + 5} if key_type == pa.uint64() else set()))
    model: dict = {}
    for k in keys:
        model[k] = model.get(k, 0) + 1
    for k, d in later:
        model[k] = model.get(k, 0) + d
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB", idle_merge=False) as e:
        trace = e.arrange(pa.table({"k": pa.array(keys, key_type),
                                    "v": pa.array([k * 10 for k in keys], pa.int64())}),
                          key=["k"], vals=["v"])
        assert _stores_rank(trace) != _strided(keys)
        if later:
            trace.insert(pa.table({"k": pa.array([k for k, _ in later], key_type),
                                   "v": pa.array([k * 10 for k, _ in later], pa.int64()),
                                   "d": pa.array([d for _, d in later], pa.int64())}),
                         diff="d")
        if merge:
            trace.merge_all()
        asked = [q for q in queries if q >= 0 and (key_type != pa.int32() or q < 2**31)]
        got = trace.lookup(pa.table({"k": pa.array(asked, key_type)}))
        totals: dict = {}
        for k, v, c in zip(got["k"].to_pylist(), got["v"].to_pylist(),
                           got["count"].to_pylist()):
            assert v == k * 10
            totals[k] = totals.get(k, 0) + c
        assert {k: c for k, c in totals.items() if c} == \
            {k: c for k, c in model.items() if c and k in set(asked)}


def test_a_loaded_checkpoint_looks_up_through_the_index(tmp_path, monkeypatch):
    monkeypatch.setattr(keyrank, "RANK_MIN_KEYS", 4)
    keys = np.arange(0, 30_000, 4, dtype=np.int64)
    keys = keys[keys % 20 != 8]   # not one step apart: the index applies
    table = pa.table({"k": keys, "v": keys * 2})
    queries = pa.table({"k": pa.array(np.arange(-3, 30_003, 3, dtype=np.int64))})
    with arrangedb.Engine(spill_dir=tmp_path / "a", memory_budget="64MiB") as e:
        trace = e.arrange(table, key=["k"], vals=["v"])
        want = trace.lookup(queries).sort_by("k")
        trace.checkpoint(tmp_path / "ckpt")
    decoded = []
    real_decode = PagedPart._decode

    def spy(self, names, *args, **kwargs):
        decoded.extend(names)
        return real_decode(self, names, *args, **kwargs)

    monkeypatch.setattr(PagedPart, "_decode", spy)
    with arrangedb.Engine(spill_dir=tmp_path / "b", memory_budget="64MiB") as e:
        loaded = e.load(tmp_path / "ckpt")
        assert _stores_rank(loaded)
        got = loaded.lookup(queries).sort_by("k")
    assert "keys" not in decoded   # placed by the index, not decoded and searched
    assert got.select(["k", "v", "count"]).equals(want.select(["k", "v", "count"]))
    assert got["k"].to_pylist() == [k for k in range(0, 30_000, 12) if k % 20 != 8]
