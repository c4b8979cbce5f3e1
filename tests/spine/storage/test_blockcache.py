"""The block cache: hits skip decompression, budget accounting and eviction, lookups."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from arrangedb import Engine
from arrangedb.codecs import CodecError, encode
from arrangedb.pager import MemoryBudget
from arrangedb.spine.storage import blockcache, paged
from arrangedb.spine.storage.blockcache import BlockCache


def _block(n: int, fill: int = 1) -> np.ndarray:
    return np.full(n, fill, np.uint8)


def test_hits_skip_the_load_and_bytes_are_reserved():
    with MemoryBudget("1MiB", sample_interval=0) as budget:
        cache = BlockCache(budget, capacity=10_000)
        loads = []
        get = lambda key: cache.get(key, lambda: loads.append(key) or _block(1000, key))  # noqa: E731
        assert get(1)[0] == 1 and get(2)[0] == 2 and get(1)[0] == 1
        assert loads == [1, 2]
        assert (cache.hits, cache.misses, cache.bytes) == (1, 2, 2000)
        assert budget.held == 2000
        assert not get(1).flags.writeable      # cached bytes cannot be changed under a reader
        cache.close()
        assert budget.held == 0 and len(cache) == 0


def test_capacity_is_never_exceeded_and_lru_goes_first():
    with MemoryBudget("1MiB", sample_interval=0) as budget:
        cache = BlockCache(budget, capacity=3000)
        for key in (1, 2, 3):
            cache.get(key, lambda: _block(1000))
        cache.get(1, lambda: pytest.fail("1 is cached"))  # 1 is now the most recent
        cache.get(4, lambda: _block(1000))               # evicts 2, the least recent
        assert cache.bytes == 3000 == budget.held
        assert set(k for k in (1, 2, 3, 4) if k in cache._blocks) == {1, 3, 4}
        big = cache.get(5, lambda: _block(5000))          # over capacity: served, not kept
        assert len(big) == 5000 and 5 not in cache._blocks and cache.bytes == 3000
        cache.close()


def test_budget_pressure_evicts_and_releases():
    with MemoryBudget(100_000, sample_interval=0) as budget:
        cache = BlockCache(budget)                        # limit / 16 = 6250 bytes
        assert cache.capacity == 100_000 // 16
        for key in range(6):
            cache.get(key, lambda: _block(1000))
        assert budget.held == 6000
        budget.reserve(96_000, "work")                    # needs 2000 bytes of the cache back
        assert cache.bytes <= 4000 and budget.held == 96_000 + cache.bytes
        assert cache.evictions >= 2 and 0 not in cache._blocks and 5 in cache._blocks
        budget.release(96_000, "work")
        cache.close()
        assert budget.held == 0
        assert budget.spill(1000) == 0                     # the spiller is gone with the cache


class _FakePageFile:
    """Regions as page files hand them over, without checksums: a corrupt frame reaches
    the decoder."""

    class _Info:
        def __init__(self, checksum):
            self.checksum = checksum

    def __init__(self, enc, prefix="p0/times"):
        self.path = "/fake/batch.pg"
        self.data = {f"{prefix}.{i}": np.frombuffer(bytes(memoryview(b).cast("B")) if not
                                                    isinstance(b, np.ndarray) else b.tobytes(),
                                                    np.uint8).copy()
                     for i, b in enumerate(enc.buffers)}
        self.regions = {name: self._Info(i) for i, name in enumerate(self.data)}
        self.group = {"regions": list(self.data), "codec": enc.codec, "version": enc.version,
                      "meta": enc.meta, "nbuffers": len(enc.buffers)}

    def buffer(self, name):
        return memoryview(self.data[name])


def test_corrupt_block_is_a_clear_error():
    enc = encode(np.arange(20_000, dtype=np.int64), "zstd", block_bytes=8192)
    pf = _FakePageFile(enc)
    comp = enc.meta["blocks"][0]["comp"]
    pf.data["p0/times.0"][comp[2] + 8:comp[3] - 4] ^= 0x5A
    with MemoryBudget("64MiB", sample_interval=0) as budget:
        cache = BlockCache(budget)
        with pytest.raises(CodecError, match=r"p0/times\.0.*zstd block 2\b"):
            paged.decode_column(pf, pf.group, cache)
        with pytest.raises(CodecError, match=r"zstd block 2\b"):
            paged.take_column(pf, pf.group, np.array([3000]), cache)
        # rows away from the bad block still read, through the blocks that hold them
        assert paged.take_column(pf, pf.group, np.array([5, 19_999]), cache).tolist() == \
            [5, 19_999]
        cache.close()


def _orders(n, seed=0):
    rng = np.random.default_rng(seed)
    return pa.table({
        "customer_id": rng.integers(0, n // 4, n),
        "amount": rng.integers(1, 1000, n),
        "price": np.round(rng.uniform(1, 1000, n), 2),
        "note": pa.array(rng.choice(np.array(["a", "bb", "ccc", "dddd"]), n)),
        "t": rng.integers(0, 1_000_000, n).astype(np.uint64),   # many stored times
    })


def _count_decompressions(monkeypatch):
    calls = []
    real = blockcache._decompress

    def spy(pagefile, region, blocks, i):
        calls.append((region, i))
        return real(pagefile, region, blocks, i)
    monkeypatch.setattr(blockcache, "_decompress", spy)
    return calls


def _sorted_rows(t: pa.Table):
    return sorted(map(tuple, (r.values() for r in t.to_pylist())))


def test_lookups_hit_the_cache_and_read_only_touched_blocks(tmp_path, monkeypatch):
    data = _orders(200_000)
    with Engine(spill_dir=tmp_path, memory_budget="1GiB", codec="zstd") as engine:
        trace = engine.arrange(data, key=["customer_id"], vals=["amount", "price", "note"],
                               time="t")
        trace.merge_all()
        calls = _count_decompressions(monkeypatch)
        keys = pa.table({"customer_id": np.array([7, 12_345, 49_000])})
        first = trace.lookup(keys)
        touched = {r for r, _ in calls}
        per_region = {r: sum(1 for x, _ in calls if x == r) for r in touched}
        times = [r for r in per_region if "/times." in r]
        assert times and all(per_region[r] <= 3 * len(keys) for r in times)
        batch = trace.batches()[0]
        blocks_of = {g["regions"][0]: len(g["meta"]["blocks"][0]["raw"]) - 1
                     for p in batch.parts for g in p.columns["times"]}
        assert sum(per_region[r] for r in times) < sum(blocks_of[r] for r in times)
        calls.clear()
        hits = engine.stats()["block_cache_hits"]
        again = trace.lookup(keys)
        assert calls == []                                 # every block came from the cache
        assert engine.stats()["block_cache_hits"] > hits
        assert engine.stats()["block_cache_bytes"] > 0
        assert again.equals(first)
        # without the cache (and without zstd), the same answers
        for b in trace.batches():
            for p in b.parts:
                p.cache = None
        uncached = trace.lookup(keys)
        assert uncached.equals(first)
        many = pa.table({"customer_id": np.arange(0, 50_000, 7)})
        cached_many = trace.lookup(many)
        cache = engine.ctx.block_cache
    assert cache.bytes == 0 and len(cache) == 0            # dropped when the engine closed
    with Engine(spill_dir=tmp_path, memory_budget="1GiB", codec="plain") as engine:
        plain = engine.arrange(data, key=["customer_id"], vals=["amount", "price", "note"],
                               time="t")
        assert _sorted_rows(plain.lookup(keys)) == _sorted_rows(first)
        assert _sorted_rows(plain.lookup(many)) == _sorted_rows(cached_many)
        assert len(first) > 0


KiB = 1 << 10


def test_kept_columns_serve_the_next_query_read_only_within_their_sizes():
    with MemoryBudget("64MiB", sample_interval=0) as budget:
        cache = BlockCache(budget, capacity=8 * 128 * KiB)   # columns up to 128 KiB kept
        decodes = []

        def decode(n):
            return lambda: decodes.append(n) or np.arange(n // 8, dtype=np.int64)
        key = lambda name, coded=False: ("f", name, 1, "decoded", coded)   # noqa: E731
        first = cache.kept(key("r"), decode(96 * KiB))
        again = cache.kept(key("r"), decode(96 * KiB))
        assert decodes == [96 * KiB] and cache.hits == 1 and np.array_equal(again, first)
        assert again is cache.kept(key("r"), pytest.fail)
        assert not again.flags.writeable                  # a reader cannot change it
        with pytest.raises(ValueError):
            again[0] = 1
        cache.kept(key("big"), decode(256 * KiB))         # past 1/8 of the cache
        cache.kept(key("tiny"), decode(8 * KiB))          # under KEPT_FROM: decodes fast
        assert len(cache) == 1 and budget.held == 96 * KiB
        arrow = pa.array(["x", None, "yz"] * 7_000).dictionary_encode()   # 84 KiB of codes
        cache.kept(key("a", True), lambda: arrow)
        assert cache.kept(key("a", True), pytest.fail).equals(arrow)
        nested = pa.array([[i] for i in range(10_000)])
        assert cache.kept(key("n"), lambda: nested) is nested
        assert len(cache) == 2                            # a nested column is not copied
        cache.close()
        assert budget.held == 0


def test_a_scan_larger_than_the_cache_keeps_what_it_kept_first():
    """Twelve columns read over and over through a cache holding eight: the first eight
    stay and serve every pass; the others are never copied in to evict them (under LRU
    every read would miss)."""
    with MemoryBudget("64MiB", sample_interval=0) as budget:
        cache = BlockCache(budget, capacity=8 * 64 * KiB)   # eight columns of 64 KiB
        column = lambda: np.zeros(8 * KiB, np.int64)         # noqa: E731
        key = lambda i: ("f", f"r{i}", 1, "decoded", False)   # noqa: E731
        for _ in range(5):
            for i in range(12):
                cache.kept(key(i), column)
        assert (cache.hits, cache.evictions, len(cache)) == (32, 0, 8)
        # a column read more often than the kept ones (five times each) takes a place
        for _ in range(6):
            cache.kept(key(99), column)
        assert cache.evictions == 1 and len(cache) == 8
        assert cache.kept(key(99), pytest.fail) is not None
        cache.close()


def test_a_file_gone_takes_its_columns_and_counts_with_it(tmp_path):
    """Once a batch is merged away, its kept columns leave the cache (and give back their
    reservation), and its read counts no longer refuse the new batch's columns."""
    from arrangedb import group_by, join

    rng = np.random.default_rng(2)
    keys = 40_000
    with Engine(spill_dir=tmp_path, memory_budget="256MiB") as engine:
        o = engine.arrange(pa.table({"c": rng.integers(0, keys, 400_000),
                                     "o": np.arange(400_000)}), key=["c"], vals=["o"])
        c = engine.arrange(pa.table({"c": np.arange(keys),
                                     "seg": rng.choice(["A", "B"], keys)}), key=["c"])
        engine.wait_merged()
        cache = engine.ctx.block_cache
        for _ in range(5):
            group_by(join(o, c), by="seg", aggs={"n": ("count", None)}).read_all()
        old = {b.pagefile.path for b in o.batches()}
        assert any(k[0] in old for k in cache._blocks)
        o.insert(pa.table({"c": [1, 2], "o": [-1, -2]}))
        o.merge_all()
        import gc
        gc.collect()
        engine.stats()                                   # a lookup purges what is gone
        assert not any(k[0] in old for k in cache._blocks)
        assert not any(k[0] in old for k in cache._reads)
        assert cache.bytes == sum(b.nbytes for b in cache._blocks.values())
        group_by(join(o, c), by="seg", aggs={"n": ("count", None)}).read_all()
        new = {b.pagefile.path for b in o.batches()}
        assert any(k[0] in new for k in cache._blocks)   # the merged batch's columns go in


def test_a_warm_aggregation_reuses_its_decoded_columns_and_stays_right(tmp_path):
    """The second run of a join's aggregate decodes nothing kept; after an insert and a
    merge (new page files) the answers follow the data, as without the cache."""
    from arrangedb import group_by, join

    rng = np.random.default_rng(5)
    n, keys = 1_000_000, 60_000   # columns past KEPT_FROM
    orders = pa.table({"c": rng.integers(0, keys, n), "o": np.arange(n)})
    segment = pa.array(rng.choice(["A", "B", "C"], keys))
    customers = pa.table({"c": np.arange(keys), "seg": segment})
    aggs = {"n": ("count", None)}

    def want(o):
        return dict(zip(*pa.table({"c": o["c"]}).join(customers, "c").group_by("seg")
                        .aggregate([("c", "count")]).to_pydict().values()))

    def got(plan):
        return dict(zip(*plan.read_all().select(["seg", "n"]).to_pydict().values()))

    with Engine(spill_dir=tmp_path, memory_budget="256MiB") as engine:
        o = engine.arrange(orders, key=["c"], vals=["o"])
        c = engine.arrange(customers, key=["c"], vals=["seg"])
        engine.wait_merged()
        assert got(group_by(join(o, c), by="seg", aggs=aggs)) == want(orders)
        hits = engine.stats()["block_cache_hits"]
        assert got(group_by(join(o, c), by="seg", aggs=aggs)) == want(orders)
        assert engine.stats()["block_cache_hits"] > hits
        more = pa.table({"c": rng.integers(0, keys, 1000), "o": np.arange(n, n + 1000)})
        o.insert(more)
        o.merge_all()
        both = pa.concat_tables([orders, more])
        assert got(group_by(join(o, c), by="seg", aggs=aggs)) == want(both)
        assert got(group_by(join(o, c), by="seg", aggs=aggs)) == want(both)


def _kept(trace) -> list:
    """The kept columns of ``trace``'s page files."""
    paths = {p.pagefile.path for b in trace.batches() for p in b.parts}
    return [k for k in trace.ctx.block_cache._blocks if k[3] == "decoded" and k[0] in paths]


def _per_segment(engine, fact: pa.Table):
    """sum(x) per segment of fact joined with a dimension of its keys, as a plan."""
    from arrangedb import group_by, join

    keys = fact.column("k")
    dim = pa.table({"k": keys, "seg": pa.array(np.array(["a", "b"])[np.arange(len(keys)) % 2])})
    f = engine.arrange(fact, key=["k"], vals=["x"])
    d = engine.arrange(dim, key=["k"], vals=["seg"])
    engine.wait_merged()
    return f, group_by(join(f, d), by="seg", aggs={"s": ("sum", "x")})


def test_a_scans_columns_give_way_to_a_read_that_fits(tmp_path):
    """An aggregation over more than the cache holds (a view's build over a fact table)
    fills the cache with its columns, read twice; one over a dimension that fits, read
    once, still gets its columns in: a scan's give way, whatever their counts."""
    rng = np.random.default_rng(8)
    with Engine(spill_dir=tmp_path, memory_budget="256MiB") as engine:   # a 16 MiB cache
        # each part's columns (131072 rows) small enough to keep, 1.5M rows not
        traces = []
        for n in (1_500_000, 60_000):
            fact = pa.table({"k": np.arange(n), "x": rng.uniform(0, 1, n)})
            traces.append(_per_segment(engine, fact) + (fact,))
        (big, scan, big_rows), (small, fits, small_rows) = traces
        for _ in range(2):
            got = scan.read_all().column("s").to_numpy().sum()
            assert got == pytest.approx(big_rows.column("x").to_numpy().sum())
        assert _kept(big)
        got = fits.read_all().column("s").to_numpy().sum()
        assert got == pytest.approx(small_rows.column("x").to_numpy().sum())
        assert _kept(small)


def test_a_lookup_gathers_from_a_kept_column(tmp_path, monkeypatch):
    """Once a query kept a zstd column, a lookup into it decompresses nothing and
    returns what the data holds."""
    rng = np.random.default_rng(9)
    n = 60_000
    fact = pa.table({"k": np.arange(n), "x": rng.integers(0, 1 << 20, n) * 1.1})   # zstd
    with Engine(spill_dir=tmp_path, memory_budget="64MiB") as engine:
        trace, plan = _per_segment(engine, fact)
        plan.read_all()
        assert _kept(trace)
        calls = _count_decompressions(monkeypatch)
        asked = pa.table({"k": rng.permutation(n)[:5000]})
        got = trace.lookup(asked)
        assert calls == []
        order = np.argsort(got.column("query_index").to_numpy())
        want = fact.column("x").take(asked.column("k")).to_numpy()
        assert np.array_equal(got.column("x").to_numpy()[order], want)


def test_batches_a_merge_is_to_replace_keep_nothing(tmp_path):
    """Right after an arrange of several runs, whose merge is under way, a query keeps
    no column of them; once merged, the merged batch's columns are kept."""
    from arrangedb import group_by, join

    rng = np.random.default_rng(12)
    n, keys = 400_000, 60_000
    orders = pa.table({"c": rng.integers(0, keys, n), "o": np.arange(n)})
    customers = pa.table({"c": np.arange(keys), "seg": pa.array(rng.choice(["A", "B"], keys))})
    with Engine(spill_dir=tmp_path, memory_budget="64MiB", idle_merge=False) as engine:
        o = engine.arrange(orders, key=["c"], vals=["o"])
        c = engine.arrange(customers, key=["c"], vals=["seg"])
        assert len(o.batches()) > 1 and o.spine.merging_batches()
        plan = group_by(join(o, c), by="seg", aggs={"n": ("count", None)})
        assert plan.read_all().column("n").to_numpy().sum() == n
        assert not _kept(o)
        o.merge_all()
        assert plan.read_all().column("n").to_numpy().sum() == n
        assert _kept(o)
