"""End-to-end through the public API: Engine, arrange, insert, reads, stats, save/load."""

from __future__ import annotations

import json
import os
import textwrap

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import arrangedb
from arrangedb import Engine, SchemaError


@pytest.fixture
def engine(tmp_path):
    with Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        yield e


def _orders(n=20_000, seed=0):
    rng = np.random.default_rng(seed)
    return pa.table({
        "customer_id": rng.integers(0, n // 10, n),
        "order_id": np.arange(n),
        "amount": rng.integers(1, 1000, n),
        "status": rng.choice(np.array(["F", "O", "P"]), n),
    })


def _snapshot_dict(trace, at=None):
    t = trace.snapshot(at).read_all()
    names = [c for c in t.column_names if c != "count"]
    return {tuple(r[c] for c in names): r["count"] for r in t.to_pylist()}


@pytest.mark.parametrize("kind", ["table", "batch", "reader", "iterable", "parquet_file",
                                  "parquet_dir"])
def test_arrange_accepts_every_input_kind(engine, tmp_path, kind):
    t = _orders(5000)
    if kind == "table":
        data = t
    elif kind == "batch":
        data = t.combine_chunks().to_batches()[0]
    elif kind == "reader":
        data = pa.RecordBatchReader.from_batches(t.schema, t.to_batches(max_chunksize=777))
    elif kind == "iterable":
        data = iter(t.to_batches(max_chunksize=500))
    elif kind == "parquet_file":
        data = str(tmp_path / "o.parquet")
        pq.write_table(t, data, row_group_size=1000)
    else:
        data = tmp_path / "dir"
        os.makedirs(data)
        pq.write_table(t.slice(0, 2000), data / "a.parquet")
        pq.write_table(t.slice(2000), data / "b.parquet")
    trace = engine.arrange(data, key=["customer_id"], vals=["order_id", "amount"])
    got = trace.snapshot().read_all()
    assert got.column_names == ["customer_id", "order_id", "amount", "count"]
    assert got.num_rows == 5000 and set(got["count"].to_pylist()) == {1}
    assert got["customer_id"].to_pylist() == sorted(t["customer_id"].to_pylist())
    assert sorted(got["order_id"].to_pylist()) == list(range(5000))
    assert engine.budget.held == 0     # the ingest buffer and read-ahead are given back


def test_pages_are_on_disk_and_stats_add_up(engine):
    t = _orders(50_000)
    trace = engine.arrange(t, key=["customer_id"], vals=["order_id", "amount", "status"])
    s = trace.stats()
    assert s["updates"] == 50_000
    assert s["keys"] == len(set(t["customer_id"].to_pylist()))
    assert s["bytes_on_disk"] > 0 and s["bytes_in_memory"] == 0
    assert s["batches"] == 1
    assert s["payload_bytes"] > 0
    assert s["overhead_bytes_per_update"] < 16
    assert s["peak_rss_bytes"] > 0
    assert engine.stats()["bytes_spilled"] >= s["bytes_on_disk"]


def test_overhead_counts_every_byte_of_the_files(engine):
    """The 8,220-byte file of a 3-row trace reported 64 bytes stored: the directory,
    codec metadata and padding were left out. Now every byte beyond the payload counts."""
    trace = engine.arrange(pa.table({"k": [1, 2, 3], "v": ["a", "b", "c"]}), key=["k"],
                           vals=["v"])
    trace.merge_all()
    s = trace.stats()
    (batch,) = trace.spine.batches()
    size = os.stat(batch.pagefile.path).st_size
    assert s["file_bytes"] == batch.pagefile.file_bytes
    assert batch.pagefile.data_bytes <= s["file_bytes"] <= size   # holes aside, all of it
    assert s["file_bytes"] > 4 * s["stored_bytes"]                # mostly directory here
    assert s["overhead_bytes_per_update"] == (s["file_bytes"] - s["payload_bytes"]) / 3
    assert s["buffer_overhead_bytes_per_update"] == (s["stored_bytes"] - s["payload_bytes"]) / 3


def test_insert_time_and_diff_columns_and_reads_at_times(engine):
    base = pa.table({"k": [1, 2, 3], "v": ["a", "b", "c"]})
    trace = engine.arrange(base, key=["k"], vals=["v"])
    trace.insert(pa.table({"k": [2, 2], "v": ["b", "z"], "t": [5, 5], "d": [-1, 1]}),
                 time="t", diff="d")
    assert _snapshot_dict(trace, at=4) == {(1, "a"): 1, (2, "b"): 1, (3, "c"): 1}
    assert _snapshot_dict(trace) == {(1, "a"): 1, (2, "z"): 1, (3, "c"): 1}
    changes = trace.changes(5, 6).read_all().to_pylist()
    assert changes == [{"k": 2, "v": "b", "time": 5, "diff": -1},
                       {"k": 2, "v": "z", "time": 5, "diff": 1}]
    look = trace.lookup(pa.table({"k": [2, 9, 1, 2]}), at=4).to_pylist()
    assert look == [{"query_index": 0, "k": 2, "v": "b", "count": 1},
                    {"query_index": 2, "k": 1, "v": "a", "count": 1},
                    {"query_index": 3, "k": 2, "v": "b", "count": 1}]


def test_multi_column_string_keys(engine):
    t = pa.table({"a": ["x", "", "x", "é", "x"], "b": [2, 1, 1, 0, 2], "v": [1, 2, 3, 4, 5]})
    trace = engine.arrange(t, key=["a", "b"])
    got = trace.snapshot().read_all()
    assert list(zip(got["a"].to_pylist(), got["b"].to_pylist())) == \
        [("", 1), ("x", 1), ("x", 2), ("x", 2), ("é", 0)]
    look = trace.lookup(pa.table({"b": [2], "a": ["x"]}))
    assert sorted(look["v"].to_pylist()) == [1, 5]


def test_bad_input_is_refused_before_anything_is_stored(engine, tmp_path):
    t = _orders(100)
    with pytest.raises(SchemaError, match="key column 'custommer_id'"):
        engine.arrange(t, key=["custommer_id"])
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        engine.arrange(str(tmp_path / "missing.parquet"), key=["k"])
    trace = engine.arrange(t, key=["customer_id"], vals=["amount"])
    before = trace.snapshot().read_all()
    with pytest.raises(SchemaError, match="time column 'amount'|negative"):
        trace.insert(pa.table({"customer_id": [1], "amount": [-5]}), time="amount")
    with pytest.raises(SchemaError, match="val column 'amount'"):
        trace.insert(pa.table({"customer_id": [1]}))
    with pytest.raises(SchemaError, match="key column 'customer_id' has type string"):
        trace.insert(pa.table({"customer_id": ["x"], "amount": [1]}))
    assert trace.snapshot().read_all().equals(before)


def test_save_and_load_reuses_the_arrangement(tmp_path):
    t = _orders(30_000)
    with Engine(spill_dir=tmp_path, memory_budget="64MiB") as e1:
        trace = e1.arrange(t, key=["customer_id"], vals=["order_id", "amount"])
        expected = trace.snapshot().read_all()
        trace.save(tmp_path / "saved")
    with Engine(spill_dir=tmp_path, memory_budget="64MiB") as e2:
        loaded = e2.load(tmp_path / "saved")
        assert loaded.snapshot().read_all().equals(expected)
        loaded.insert(pa.table({"customer_id": [1], "order_id": [-1], "amount": [7]}))
        loaded.merge_all()
        assert loaded.stats()["updates"] == 30_001
    # the saved files belong to the directory and survive both engines
    with Engine(spill_dir=tmp_path, memory_budget="64MiB") as e3:
        assert e3.load(tmp_path / "saved").snapshot().read_all().equals(expected)


def test_closed_engine_removes_its_spill_directory(tmp_path):
    e = Engine(spill_dir=tmp_path, memory_budget="64MiB")
    e.arrange(_orders(1000), key=["customer_id"])
    spill = e.stats()["spill_dir"]
    assert os.path.isdir(spill)
    e.close()
    assert not os.path.exists(spill)


@pytest.mark.parametrize("key_type, first", [(pa.int8(), -100), (pa.int32(), -7),
                                             (pa.int64(), 10**12), (pa.uint64(), 2**63 - 100_000)])
@pytest.mark.parametrize("history", ["one batch", "updated", "merged"])
def test_lookups_in_dense_id_parts_find_keys_without_reading_them(tmp_path, monkeypatch,
                                                                  key_type, first, history):
    """A part whose keys are every integer of a range (a dimension's ids) is looked up by
    offset from its first key, its keys and one-val-per-key bounds never decoded whole:
    the rows equal the snapshot's, for queries in and out of range (beyond int64 too)."""
    import importlib
    trace_mod = importlib.import_module("arrangedb.spine.read.lookup")
    dense_calls = []
    real = trace_mod._dense_positions
    monkeypatch.setattr(trace_mod, "_dense_positions",
                        lambda *a: dense_calls.append(1) or real(*a))
    rng = np.random.default_rng(11)
    n = 100_000 if key_type != pa.int8() else 128   # several parts of 256 KiB
    keys = pa.array(np.arange(n, dtype=np.int64) + first if first < 2**62
                    else [first + i for i in range(n)], key_type)
    engine = Engine(spill_dir=tmp_path, memory_budget="16MiB")
    t = engine.arrange(pa.table({"k": keys, "v": rng.integers(0, 50, n)}),
                       key=["k"], vals=["v"])
    if history != "one batch":
        some = keys.take(pa.array(rng.choice(n, n // 10, replace=False)))
        t.insert(pa.table({"k": some, "v": rng.integers(50, 60, len(some)),
                           "time": pa.array(np.ones(len(some), np.uint64)),
                           "diff": np.ones(len(some), np.int64)}), time="time", diff="diff")
    if history == "merged":
        t.merge_all()
    assert t.stats()["parts"] > 1 or key_type == pa.int8()
    hi = first + n - 1
    wanted = [first - 5, first - 1, first, first + 1, hi - 1, hi, hi + 1, hi + 40]
    wanted += [first + int(i) for i in rng.integers(0, n, 200)]
    if key_type == pa.uint64():
        wanted += [2**64 - 1, 2**63, 2**63 - 1]
    info = (np.iinfo(np.int8) if key_type == pa.int8() else None)
    if info is not None:
        wanted = [w for w in wanted if info.min <= w <= info.max]
    queries = pa.table({"k": pa.array(wanted, key_type)})
    for at in (0, 1) if history != "one batch" else (0,):
        got = t.lookup(queries, at=at).to_pydict()
        snap = t.snapshot(at).read_all().to_pydict()
        rows = {}
        for k, v, c in zip(snap["k"], snap["v"], snap["count"]):
            rows.setdefault(k, []).append((v, c))
        expected = sorted((i, k, v, c) for i, k in enumerate(wanted) for v, c in rows.get(k, []))
        assert sorted(zip(got["query_index"], got["k"], got["v"], got["count"])) == expected
    engine.close()
    assert dense_calls   # the parts' keys were found by offset


@pytest.mark.parametrize("history", ["one batch", "two batches", "merged"])
def test_lookup_of_sorted_distinct_keys_matches_the_general_path(still_engine, history):
    """Sorted distinct queries (a join's) skip the sort and, from one batch at one time,
    the accumulation: the same rows as queries that go the general way."""
    rng = np.random.default_rng(3)
    n = 20_000
    engine = still_engine
    t = engine.arrange(pa.table({"k": rng.integers(0, 5_000, n), "v": rng.integers(0, 4, n)}),
                       key=["k"], vals=["v"])
    if history != "one batch":
        t.insert(pa.table({"k": rng.integers(0, 5_000, 500), "v": rng.integers(0, 4, 500),
                           "time": pa.array(np.ones(500, np.uint64)),
                           "diff": rng.choice([-1, 1], 500)}), time="time", diff="diff")
    if history == "merged":
        t.merge_all()
    assert t.stats()["batches"] == (2 if history == "two batches" else 1)
    q = np.unique(rng.integers(-10, 5_100, 3_000))
    for at in (0, 1):
        fast = t.lookup(pa.table({"k": q}), at=at)
        general = t.lookup(pa.table({"k": np.append(q, q[:1])}), at=at)   # a duplicate
        general = general.filter(pc.less(general["query_index"], len(q)))
        assert fast.num_rows > 0
        assert fast.equals(general)
        snap = t.snapshot(at).read_all().to_pydict()
        wanted = set(q.tolist())
        expected = sorted((k, v, c) for k, v, c in zip(snap["k"], snap["v"], snap["count"])
                          if k in wanted)
        got = fast.to_pydict()
        assert sorted(zip(got["k"], got["v"], got["count"])) == expected
        assert [q[i] for i in got["query_index"]] == got["k"]
        assert fast["query_index"].to_numpy().tolist() == sorted(fast["query_index"].to_numpy())
        # as stored: the same counts once summed per (query, key, val)
        raw = t.lookup(pa.table({"k": q}), at=at, consolidate=False)
        summed = Counter()
        for row in zip(*(raw[c].to_pylist() for c in ("query_index", "k", "v", "count"))):
            summed[row[:3]] += row[3]
        assert {r: c for r, c in summed.items() if c} == {row[:3]: row[3] for row in zip(
            *(fast[c].to_pylist() for c in ("query_index", "k", "v", "count")))}


@pytest.mark.parametrize("vals", [["v"], []])
def test_cursor_blocks_know_their_key_bounds_across_parts_and_windows(engine, vals):
    """Blocks of a many-part batch, read in small windows, carry the key bounds their
    reader knew from the layout: the same as found by comparing the rows' keys."""
    from arrangedb.spine.data.kernels import key_starts

    rng = np.random.default_rng(5)
    n = 60_000 if vals else 400_000
    table = pa.table({"k": rng.integers(0, n // 9 if vals else n * 10, n),
                      "v": rng.integers(0, 50, n)})
    t = engine.arrange(table.select(["k"] + vals), key=["k"], vals=vals)
    t.merge_all()
    assert t.stats()["parts"] > 1
    seen = 0
    for block in t.cursor(window_rows=1000):
        assert np.array_equal(block.key_bounds, key_starts(block.row_keys()))
        seen += len(block)
    assert seen == t.snapshot().read_all().num_rows


def test_appender_fills_a_trace_from_chunks_without_merging_them(still_engine):
    engine = still_engine
    rng = np.random.default_rng(9)
    chunks = [pa.table({"k": rng.integers(0, 300, 2_000), "v": rng.integers(0, 5, 2_000)})
              for _ in range(5)]
    whole = engine.arrange(pa.concat_tables(chunks), key=["k"], vals=["v"])
    t = engine.arrange(chunks[0].slice(0, 0), key=["k"], vals=["v"])
    load = t.appender()
    for c in chunks:
        load.add(c)
    assert t.stats()["updates"] == 0           # nothing visible before finish
    load.finish()
    assert t.stats()["batches"] == 5           # five runs, read k-way: no merge work done
    assert t.snapshot().read_all().equals(whole.snapshot().read_all())
    t.insert(chunks[0])                         # and it stays an ordinary trace
    got = t.lookup(pa.table({"k": [7]}))
    want = whole.lookup(pa.table({"k": [7]}))
    assert (pc.sum(got["count"]).as_py()
            == pc.sum(want["count"]).as_py()
            + int(((chunks[0]["k"].to_numpy()) == 7).sum()))


def test_a_part_that_breaks_its_columns_codec_is_encoded_by_its_own_choice(engine):
    """The codec is chosen once per column from the first part; a later part it does not
    fit (here: non-decimal floats after cents) gets its own choice, not plain."""
    n = 300_000
    cents = np.round(np.random.default_rng(2).uniform(1, 5_000, n), 2)
    cents[200_000:] = np.tile([0.1 + 0.2, 1 / 3, 2 / 7], n)[: n - 200_000]   # compressible
    t = engine.arrange(pa.table({"k": np.arange(n), "amount": cents}), key=["k"],
                       vals=["amount"])
    t.merge_all()
    parts = t.batches()[0].parts
    codecs = [p.columns["vals"][0]["codec"] for p in parts]
    assert len(parts) > 2 and codecs[0] == "scaled_float" and codecs[-1] == "zstd", codecs
    got = t.snapshot().read_all()
    assert np.array_equal(got["amount"].to_numpy().view(np.int64), cents.view(np.int64))


@pytest.mark.parametrize("vals_per_key", [0, 1, 3])
def test_distinct_rows_read_back_through_their_single_stored_update(engine, vals_per_key,
                                                                     monkeypatch):
    """A batch of distinct rows at one time stores one (time, diff) per part: reads expand
    it without its leaf bounds. Key-only, one val per key, several vals per key."""
    from arrangedb.spine.storage import part as part_module

    expanded = []
    real = part_module.expand_singleton
    monkeypatch.setattr(part_module, "expand_singleton",
                        lambda *a: expanded.append(1) or real(*a))
    n = 300_000   # several parts of 1 MiB even key-only (8 bytes a row)
    keys = np.arange(n) // max(vals_per_key, 1) * 7
    table = pa.table({"k": keys, "v": np.arange(n) % max(vals_per_key, 1)})
    vals = ["v"] if vals_per_key else []
    t = engine.arrange(table.select(["k"] + vals), key=["k"], vals=vals)
    assert len(t.batches()[0].parts) > 1
    seen = 0
    from arrangedb.spine.data.kernels import key_starts
    for block in t.cursor(window_rows=5000):
        assert np.array_equal(block.key_bounds, key_starts(block.row_keys()))
        assert (block.counts == 1).all()
        seen += len(block)
    assert seen == n
    snap = t.snapshot().read_all()
    assert np.array_equal(snap["k"].to_numpy(), keys) and (snap["count"].to_numpy() == 1).all()
    if vals:
        assert np.array_equal(snap["v"].to_numpy(), table["v"].to_numpy())
    assert len(expanded) >= 2 * len(t.batches()[0].parts)   # cursor and snapshot


class _Source:
    """A stream of equal batches that counts what was pulled and whether it was closed."""

    def __init__(self, n, fail_after=None):
        self.n, self.fail_after = n, fail_after
        self.pulled, self.closed = 0, False
        self.batch = pa.record_batch({"k": np.arange(1000, dtype=np.int64)})

    def __iter__(self):
        try:
            for i in range(self.n):
                if i == self.fail_after:
                    raise OSError("row group 3 is corrupt")
                self.pulled += 1
                yield self.batch
        finally:
            self.closed = True


def _reading_threads():
    import threading

    return [t for t in threading.enumerate() if t.name == "arrangedb-read-ahead"]


@pytest.mark.parametrize("batches_ahead", [0, 1, 3])
def test_read_ahead_yields_every_batch_in_order_and_stays_within_its_bytes(batches_ahead):
    """The thread decodes ahead while the caller works, but only while less than
    max_bytes wait (at least one batch): no batch is decoded before there is room."""
    import time

    from arrangedb.spine.data.ingest import read_ahead

    src = _Source(12)
    size = src.batch.nbytes
    bound = max(batches_ahead, 1)
    ahead_seen = []
    got = 0
    for rb in read_ahead(iter(src), batches_ahead * size):
        assert rb is src.batch
        got += 1
        deadline = time.monotonic() + 2   # the caller at work: the thread reads on
        while src.pulled - got < bound and src.pulled < 12 and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.002)                 # and would read further, were it allowed to
        ahead_seen.append(src.pulled - got)
    assert got == 12 and src.closed
    assert max(ahead_seen) == bound            # it did read ahead, and no further
    assert not _reading_threads()


def test_read_ahead_raises_the_streams_error_after_the_batches_before_it():
    from arrangedb.spine.data.ingest import read_ahead

    src = _Source(10, fail_after=3)
    got = []
    with pytest.raises(OSError, match="row group 3 is corrupt"):
        for rb in read_ahead(iter(src), 1 << 20):
            got.append(rb)
    assert len(got) == 3 and src.closed and not _reading_threads()


def test_read_ahead_stopped_early_stops_its_thread_and_closes_the_stream():
    from arrangedb.spine.data.ingest import read_ahead

    src = _Source(1_000_000)
    it = read_ahead(iter(src), 1 << 16)
    assert next(it) is src.batch
    it.close()
    assert src.closed and not _reading_threads() and src.pulled < 100


def test_a_corrupt_parquet_file_fails_its_arrange_and_leaves_the_engine_whole(engine,
                                                                             tmp_path):
    """A Parquet file whose later row group is damaged: the error read ahead by the
    thread reaches arrange, nothing is held, and the engine's other traces still read."""
    t = _orders(20_000)
    kept = engine.arrange(t, key=["customer_id"], vals=["amount"])
    path = tmp_path / "o.parquet"
    pq.write_table(t, path, row_group_size=2000, compression="none")
    raw = bytearray(path.read_bytes())
    md = pq.ParquetFile(path).metadata
    col = md.row_group(7).column(0)
    start = col.data_page_offset
    raw[start:start + col.total_compressed_size] = b"\xff" * col.total_compressed_size
    path.write_bytes(bytes(raw))
    with pytest.raises(OSError):
        engine.arrange(str(path), key=["customer_id"], vals=["amount"])
    assert engine.budget.held == 0 and not _reading_threads()
    assert _snapshot_dict(kept) == _snapshot_dict(engine.arrange(t, key=["customer_id"],
                                                                 vals=["amount"]))


LOADING = textwrap.dedent("""
    import json, sys
    import numpy as np, pyarrow.parquet as pq
    import arrangedb

    with arrangedb.Engine(spill_dir=sys.argv[1], memory_budget="32MiB") as e:
        import pyarrow as pa
        start = e.budget.rss()
        t = pa.table({"k": np.arange(2000) % 100, "v": np.arange(2000)})
        pq.write_table(t, sys.argv[1] + "/t.parquet")
        a = e.arrange(sys.argv[1] + "/t.parquet", key=["k"], vals=["v"])
        c = e.arrange(pa.table({"k": np.arange(100), "r": np.arange(100) % 7}), key=["k"])
        a.insert(t.append_column("time", pa.array(np.ones(2000, np.uint64))),
                 time="time")
        arrangedb.group_by(arrangedb.join(a, c), by="r", aggs={"n": ("count", None)},
                           engine=e).read_all()
        arrangedb.join(a, c, since=1, upto=2).read_all()
        print(json.dumps({"grown": e.budget.rss() - start,
                          "pandas": "pandas" in sys.modules}))
""")


def test_a_jobs_first_operations_load_no_code_inside_its_measurement(tmp_path):
    """The first engine of a process loads the code its work needs (and pyarrow's
    pandas import, on its first array) before its RSS baseline: a small job's first
    arrange, insert, join and aggregation grow RSS by little, not by modules loaded."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", LOADING, str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["grown"] < 24 << 20, f"grew {r['grown'] >> 20} MiB"   # ~13; ~55 loading


def test_a_bad_batch_late_in_a_parquet_file_stops_the_reading_thread(engine, tmp_path):
    """The caller refuses a batch (a null key past the first 256k rows) while the thread
    reads ahead: arrange fails naming it, the thread is stopped, nothing stays held."""
    n = 300_000
    keys = pa.array(np.arange(n), mask=np.arange(n) == n - 1)
    path = str(tmp_path / "late_null.parquet")
    pq.write_table(pa.table({"k": keys, "v": np.arange(n)}), path)
    with pytest.raises(SchemaError, match="null"):
        engine.arrange(path, key=["k"], vals=["v"])
    assert engine.budget.held == 0 and not _reading_threads()


def test_a_nullable_boolean_val_is_arranged_and_read(tmp_path):
    """Booleans with nulls as vals: ranked with the nulls apart (a bool column takes no
    integer as its fill), consolidated, and read back as they were given."""
    t = pa.table({"k": pa.array([1, 1, 2, 2, 1], pa.int64()),
                  "b": pa.array([True, None, False, None, True])})
    with Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        trace = e.arrange(t, key=["k"], vals=["b"])
        got = trace.snapshot().read_all().to_pylist()
    assert Counter((r["k"], r["b"], r["count"]) for r in got) == Counter(
        [(1, None, 1), (1, True, 2), (2, False, 1), (2, None, 1)])
