"""Units of storage: a part written to a page file reads back whole, through its stored
layout, and at the rows a lookup takes; dense integer keys are found without reading
them; a batch's sizes add up over its parts; dropping a batch removes its file."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from arrangedb.pager import MemoryBudget, PageFile, PageWriter, SpillDirectory
from arrangedb.spine.data.layout import select_vals, to_layout
from arrangedb.spine.data.updates import Updates
from arrangedb.spine.storage.encode import write_part
from arrangedb.spine.storage.part import expand

KEYS = pa.schema([("k", pa.int64())])
VALS = pa.schema([("s", pa.string()), ("x", pa.float64())])


@pytest.fixture
def spill(tmp_path):
    budget = MemoryBudget("64MiB", sample_interval=0)
    s = SpillDirectory(tmp_path)
    yield s, budget
    s.close()
    budget.close()


def _part(spill, keys, strings, xs, times=None, diffs=None):
    s, budget = spill
    n = len(keys)
    upd = Updates(pa.table({"k": np.asarray(keys, np.int64)}),
                  pa.table({"s": pa.array(strings, pa.string()),
                            "x": np.asarray(xs, np.float64)}),
                  np.zeros(n, np.uint64) if times is None else np.asarray(times, np.uint64),
                  np.ones(n, np.int64) if diffs is None else np.asarray(diffs, np.int64))
    w = PageWriter(s)
    part = write_part(w, 0, to_layout(upd), "auto", (KEYS, VALS), {})
    pf = w.finish(budget=budget)
    part.pagefile = pf
    return upd, part, pf


def test_a_paged_part_reads_back_whole_and_as_stored(spill):
    rng = np.random.default_rng(5)
    keys = np.repeat(np.arange(0, 3_000, 3), 2)
    strings = [["red", "green", "blue"][i % 3] for i in range(keys.size)]
    xs = np.round(rng.random(keys.size) * 100, 2)
    upd, part, pf = _part(spill, keys, strings, xs)
    try:
        got, starts = part.read()
        assert got.keys.equals(upd.keys) and got.vals.equals(upd.vals)
        assert got.diffs.tolist() == upd.diffs.tolist()
        assert starts.tolist() == list(range(0, keys.size + 1, 2))
        got2, _ = expand(part.stored_layout())
        assert got2.vals.equals(upd.vals)
        coded, _ = part.read(frozenset({"s"}))
        assert pa.types.is_dictionary(coded.vals.schema.field("s").type)
        assert coded.vals.column("s").cast(pa.string()).equals(upd.vals.column("s"))
        assert part.num_keys == 1_000 and part.num_updates == keys.size
    finally:
        pf.close()


def test_a_lookup_takes_only_the_rows_it_needs_and_dense_keys_are_computed(spill):
    keys = np.arange(100, 5_100)                      # dense ids: key i is 100 + i
    upd, part, pf = _part(spill, keys, [str(k) for k in keys], keys / 10)
    try:
        assert part.dense_first_key() == 100
        layout = part.lookup_layout(frozenset(), dense=True)
        vals, _, _, owner = select_vals(layout, np.array([0, 7, 4_999]))
        assert vals.column("s").to_pylist() == ["100", "107", "5099"]
        assert owner.tolist() == [0, 1, 2]
        part.release()
        sparse_upd, sparse, pf2 = _part(spill, keys * 2, ["a"] * keys.size, keys)
        assert sparse.dense_first_key() is None
        pf2.close()
    finally:
        pf.close()


def test_damaged_part_bytes_are_named_not_decoded(spill):
    keys = np.arange(50_000)
    _, part, pf = _part(spill, keys, ["v"] * keys.size, keys * 1.5)
    path = pf.path
    pf.close()
    with open(path, "r+b") as f:                       # flip a byte in the first region
        f.seek(128)
        b = f.read(1)
        f.seek(128)
        f.write(bytes([b[0] ^ 0xFF]))
    s, budget = spill
    damaged = PageFile.open(path, budget=budget)
    part.pagefile = damaged
    try:
        from arrangedb.pager import CorruptionError

        with pytest.raises(CorruptionError, match=os.path.basename(path)):
            part.read()
    finally:
        damaged.close()


def test_a_part_of_several_vals_per_key_stores_its_key_sums(spill, monkeypatch):
    """Under one (time, diff), with keys of several vals, a part keeps each key's sum of
    its numeric vals as written, and a grouped sum reads them instead of summing; a
    part of one val per key keeps none (they would repeat the column), and sums whose
    length is not the part's key count are named corrupt."""
    from arrangedb.codecs import CodecError
    from arrangedb.spine.storage import paged

    rng = np.random.default_rng(9)
    keys = np.repeat(np.arange(0, 4_000, 2), 4)
    xs = np.round(rng.integers(-10**6, 10**6, keys.size) / 100, 2)
    _, part, pf = _part(spill, keys, ["a"] * keys.size, xs)
    _, unique, pf2 = _part(spill, np.arange(500), ["b"] * 500, np.arange(500) / 4)
    try:
        assert [g["field"] for g in part.columns["key_sums"]] == ["x"]   # no string sums
        assert "key_sums" not in unique.columns
        monkeypatch.setattr(paged, "column_segment_sums", lambda *a: pytest.fail("summed"))
        layout, sums, counts = part.summed_layout(sums=frozenset({"x"}),
                                                  columns=frozenset())
        assert counts is None and layout.keys.num_rows == 2_000
        want = np.add.reduceat(np.rint(xs * 100).astype(np.int64), np.arange(0, keys.size, 4))
        np.testing.assert_allclose(sums["x"], want / 100, rtol=1e-12, atol=1e-9)
        # a directory naming another column's regions as the sums: 2,001 key bounds
        part.columns["key_sums"] = [{**part.columns["key_bounds"][0], "field": "x"}]
        with pytest.raises(CodecError, match="2001 key sums of 'x' for 2000 keys"):
            part.summed_layout(sums=frozenset({"x"}), columns=frozenset())
    finally:
        pf.close()
        pf2.close()


INTS = pa.schema([("i", pa.int64()), ("u", pa.uint64())])


@pytest.mark.parametrize("counts", ["all 3", "a few odd"])
def test_stored_key_sums_of_integers_under_one_time(spill, monkeypatch, counts):
    """Integer key sums as stored and read back: under one stored (time, diff) the plain
    sums (the reader weighs them by the diff), under one time with a few leaves counted
    otherwise the sums of value x count -- both wrapping modulo 2**64 as summing the
    values would, never summed or taken again as they are read."""
    from arrangedb.spine.storage import paged

    s, budget = spill
    rng = np.random.default_rng(11)
    n = 6_000
    keys = np.repeat(np.arange(n // 4, dtype=np.int64), 4)
    # random, sorted within each key (a column sorted throughout is stored as deltas,
    # which decode instead of summing)
    i = np.sort(rng.integers(-10**6, 10**6, (n // 4, 4)), axis=1).ravel()
    u = np.uint64(2**63 - 2**20) + np.sort(rng.integers(0, 2**20, (n // 4, 4)), axis=1
                                           ).ravel().astype(np.uint64)   # sums wrap
    if counts == "all 3":
        diffs = np.full(n, 3, np.int64)
    else:
        diffs = np.ones(n, np.int64)
        diffs[rng.choice(n, n // 20, replace=False)] = 2
        diffs[rng.choice(n, n // 50, replace=False)] = -1
    upd = Updates(pa.table({"k": keys}), pa.table({"i": i, "u": u}),
                  np.zeros(n, np.uint64), diffs)
    w = PageWriter(s)
    part = write_part(w, 0, to_layout(upd), "auto", (KEYS, INTS), {})
    pf = w.finish(budget=budget)
    part.pagefile = pf
    try:
        assert sorted(g["field"] for g in part.columns["key_sums"]) == ["i", "u"]
        monkeypatch.setattr(paged, "column_segment_sums", lambda *a: pytest.fail("summed"))
        monkeypatch.setattr(paged, "take_column", lambda *a: pytest.fail("taken"))
        _, sums, got_counts = part.summed_layout(sums=frozenset({"i", "u"}),
                                                 columns=frozenset())
        weights = np.ones(n, np.int64) if counts == "all 3" else diffs
        assert (got_counts is None) == (counts == "all 3")
        for name, values in (("i", i), ("u", u)):
            want = [sum(int(v) * int(d) for v, d in zip(values[k:k + 4], weights[k:k + 4]))
                    for k in range(0, n, 4)]
            want = np.array([x % 2**64 for x in want], np.uint64).view(np.int64)
            assert sums[name].tolist() == want.tolist()
    finally:
        pf.close()



def test_nulls_of_a_val_column_are_known_without_a_read(tmp_path, monkeypatch):
    """Parts record how many values of each val column are null as they are written
    (paged and resident ones), so ``holds_nulls`` answers without reading a column that
    holds none; a null stored, even retracted since, or a part written without the
    count, is settled by reading the column."""
    from arrangedb import Engine
    from arrangedb.spine import Trace, holds_nulls

    data = pa.table({"k": np.arange(2000), "x": np.arange(2000) * 0.5,
                     "y": pa.array([None] + list(range(1999)), pa.int64())})
    reads = []
    snapshot = Trace.snapshot
    monkeypatch.setattr(Trace, "snapshot", lambda *a, **k: reads.append(1) or snapshot(*a, **k))
    with Engine(spill_dir=tmp_path, memory_budget="64MiB", idle_merge=False) as e:
        t = e.arrange(data, key=["k"])
        t.insert(data.slice(5, 3).append_column("d", pa.array([1, 1, 1])), diff="d")
        kinds = {type(p).__name__ for b in t.batches() for p in b.parts}
        assert kinds == {"PagedPart", "ResidentPart"}
        assert not holds_nulls(t, "x") and not reads
        assert holds_nulls(t, "y") and reads
        t.insert(data.slice(0, 1).append_column("d", pa.array([-1])), diff="d")
        assert not holds_nulls(t, "y")   # retracted: the stored null is read and cancels
        for b in t.batches():
            for p in b.parts:
                for g in getattr(p, "columns", {}).get("vals", []):
                    g.pop("nulls", None)   # as a part written before parts counted them
        reads.clear()
        assert not holds_nulls(t, "x") and reads


def test_nulls_of_keys_and_of_no_such_column(tmp_path):
    """Keys hold no nulls (a key-only trace's too); a name that is no column is refused."""
    from arrangedb import Engine
    from arrangedb.spine import holds_nulls

    with Engine(spill_dir=tmp_path, memory_budget="64MiB", idle_merge=False) as e:
        t = e.arrange(pa.table({"k": np.arange(100), "y": np.arange(100)}), key=["k"])
        t.insert(pa.table({"k": [5], "y": [1]}))   # a resident part beside the paged one
        keys_only = e.arrange(pa.table({"k": np.arange(100)}), key=["k"])
        assert not holds_nulls(t, "k") and not holds_nulls(keys_only, "k")
        for trace in (t, keys_only):
            with pytest.raises(KeyError, match="nope"):
                holds_nulls(trace, "nope")
