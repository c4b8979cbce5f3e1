"""BlockCache: decompressed zstd blocks kept between reads, and the columns a query
decodes (:class:`KeptColumns`), charged to the memory budget.

Design
------
A least-recently-used map from a block's identity -- (page file path, region, region
checksum, block index) -- to its decompressed bytes. The checksum makes the key name the
content: a path reused by a later page file cannot serve stale bytes. Each cached block
reserves its bytes from the engine's :class:`arrangedb.pager.MemoryBudget`; a spiller that
runs before any other (priority -1: a cache is the cheapest thing to give up) drops
blocks least recently used first, so the budget can always take the memory back.

A query's read of a part (``Part.summed_layout(keep=True)``: an aggregation straight
off the stored layout) keeps the columns it decodes under (page file, region, checksum,
form), so that the next query over the same arrangement -- a dimension read by every
join into it -- skips the decoding, the mapping and the page release: dim_dim's warm
query (7.5M orders counted per customer's segment) 8.3 -> 4.6 ms. Only columns from
``KEPT_FROM`` up to ``1/KEPT_SHARE`` of the capacity are kept, and once the cache is
full a column goes in only if it is read more often than those it would evict
(TinyLFU's admission): a query reading more than the cache holds keeps what it kept
first rather than cycling every column through it. A batch's end drops what the cache
holds of its page file (:meth:`BlockCache.forget`). The columns of a read larger than
the cache (a scan: ``spine.read.cursor``) give way to those of a read that fits, however
often they were read: a view's build over a fact table would otherwise fill the cache
with columns read once, which the counts then held against the view's own. A scan
repeated still keeps what it kept first (the join bench's warm query over 4M
customers: 0.053 s, against 0.060-0.067 s keeping none). Nothing is kept of a batch a
merge in progress is to replace (an arrange's runs, read right after it). A lookup
gathers from a kept column when there is one (:meth:`BlockCache.held`): a maintained
view's refresh looks up the rows the last query read (two_hop's 244k customers: 15 ->
4.5 ms). Merges and scans decode as before, keeping nothing.

Invariants
----------
- ``bytes`` (the sum of the cached blocks' sizes) is what the cache holds reserved, and
  never exceeds ``capacity`` (a share of the budget, limit/16 by default).
- Cached blocks are read-only and handed out as they are: callers copy what they keep
  (``codecs.zstd_blocks.decode_from_blocks``/``take_from_blocks`` do), so dropping a block
  frees its memory. Kept columns are read-only too (numpy arrays flagged so, Arrow
  arrays are): a reader that wrote into one would fail, never change the next read.
- A block that does not fit (larger than the capacity, or refused by the budget) is
  returned uncached: the cache never makes a read fail.
- A column kept is a copy (small buffers in bytes, large ones in an anonymous mapping
  of their own), never the array its reader holds.
- ``close()`` drops every block, gives its reservation back and unregisters the spiller.
"""

from __future__ import annotations

import mmap
import threading
from collections import OrderedDict, deque

import numpy as np
import pyarrow as pa

from arrangedb.codecs import CodecError, zstd_blocks
from arrangedb.codecs.base import lookup
from arrangedb.pager import BudgetExceeded
from arrangedb.pager.sizing import BLOCK_CACHE_SHARE, SPILL_CACHES

WHAT = "block cache"
KEPT_SHARE = 8   # a decoded column is kept when it takes at most this share of the cache
KEPT_FROM = 64 << 10   # and at least this much: smaller ones decode in microseconds
FREQUENCY_KEYS = 4096   # columns whose reads are counted before the counts halve
OWN_PAGES_FROM = 256 << 10   # a kept buffer this large gets a mapping of its own
_POPULATED = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)


class BlockCache:
    def __init__(self, budget, capacity: int | None = None):
        self.budget = budget
        self.capacity = int(capacity if capacity is not None
                            else budget.limit // BLOCK_CACHE_SHARE)
        self._blocks: OrderedDict = OrderedDict()   # key -> read-only uint8 array
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0
        self._reads: dict = {}   # kept column -> how often read (see _admits)
        self._scanned: set = set()   # kept columns a scan read: they give way
        self._gone: deque = deque()   # page files forgotten, purged at the next lookup
        self._lock = threading.RLock()
        self._closed = False
        self._token = budget.add_spiller(self.spill, priority=SPILL_CACHES)

    def get(self, key, load):
        """The block under ``key``; on a miss ``load()`` makes it and it is kept if it fits."""
        block = self._cached(key)
        if block is not None:
            return block
        block = load()
        block.flags.writeable = False
        self._put(key, block)
        return block

    def kept(self, key, decode, scan: bool = False):
        """The decoded column under ``key``; on a miss ``decode()`` makes it, and a copy
        is kept if it is small enough (``KEPT_SHARE``) and :meth:`_admits` it. The
        reader that decoded it uses the decoded array itself, as it would without the
        cache: the heap then holds and frees what it always did (see
        :func:`_in_own_pages`)."""
        with self._lock:
            column = self._cached(key)
            if column is not None:
                self._count(key)
                return column
        column = decode()
        if not KEPT_FROM <= column.nbytes <= self.capacity // KEPT_SHARE:
            return column   # too small to be worth an entry, or too large to keep
        with self._lock:
            self._count(key)
        if self._admits(key, column.nbytes, scan):
            copy = _in_own_pages(column)
            if copy is not None:
                self._put(key, copy, scan)
        return column

    def held(self, key):
        """The kept column under ``key``, or None: a lookup's gather from it (a lookup
        asks of every column it reads: no answer is not counted a miss)."""
        return self._cached(key, miss=False)

    def forget(self, path: str) -> None:
        """Page file ``path`` is gone (its batch was merged away or dropped): what is
        cached of it, and its read counts, go at the next lookup. Kept, its columns
        would hold their places -- and their counts refuse newer columns -- until
        evicted. (Called from a batch's finalizer, which may run inside any of this
        cache's methods: it only notes the path.)"""
        self._gone.append(path)

    def _purge(self) -> None:
        """Drop the entries and counts of the page files forgotten (under the lock)."""
        paths = set()
        while self._gone:
            paths.add(self._gone.popleft())
        if not paths:
            return
        gone = [k for k in self._blocks if k[0] in paths]
        freed = sum(self._blocks.pop(k).nbytes for k in gone)
        self._scanned.difference_update(gone)
        if freed:
            self.bytes -= freed
            self.budget.release(freed, WHAT)
        self._reads = {k: n for k, n in self._reads.items() if k[0] not in paths}

    def _cached(self, key, miss: bool = True):
        """The entry under ``key``, made the most recent (a hit), or None (a ``miss``)."""
        with self._lock:
            self._purge()
            entry = self._blocks.get(key)
            if entry is None:
                self.misses += miss
                return None
            self._blocks.move_to_end(key)
            self.hits += 1
            return entry

    def _count(self, key) -> None:
        """One more read of ``key``: counts that halve once they cover ``FREQUENCY_KEYS``
        columns, so that what was read often long ago gives way (TinyLFU's aging)."""
        self._reads[key] = self._reads.get(key, 0) + 1
        if len(self._reads) > FREQUENCY_KEYS:
            self._reads = {k: n // 2 for k, n in self._reads.items() if n > 1}

    def _admits(self, key, size: int, scan: bool = False) -> bool:
        """Whether a column of ``size`` bytes read under ``key`` goes in: when it fits
        in the room left, or when it is read more often than every column it would
        evict (TinyLFU's admission), a scan's columns giving way to another read's
        whatever their counts. A scan of more columns than the cache holds then keeps
        the ones it kept first instead of copying each in and evicting it again
        (fact_dim's warm query: 0.09 -> 0.23 s under LRU)."""
        with self._lock:
            wanted = self.bytes + size - self.capacity
            if wanted <= 0:
                return True
            mine = self._reads.get(key, 0)
            for victim, block in self._blocks.items():   # least recently used first
                gives_way = victim in self._scanned and not scan
                if not gives_way and self._reads.get(victim, 0) >= mine:
                    return False
                wanted -= block.nbytes
                if wanted <= 0:
                    return True
            return False

    def _put(self, key, block, scan: bool = False) -> None:
        size = block.nbytes
        with self._lock:
            if self._closed or size > self.capacity or key in self._blocks:
                return
            self._evict(self.bytes + size - self.capacity)
            try:
                # may run the spillers, this cache's own among them (the lock is reentrant)
                self.budget.reserve(size, WHAT)
            except BudgetExceeded:
                return
            self._blocks[key] = block
            self.bytes += size
            if scan:
                self._scanned.add(key)

    def _evict(self, wanted: int) -> int:
        freed = 0
        while self._blocks and freed < wanted:
            key, block = self._blocks.popitem(last=False)
            self._scanned.discard(key)
            freed += block.nbytes
            self.evictions += 1
        if freed:
            self.bytes -= freed
            self.budget.release(freed, WHAT)
        return freed

    def spill(self, wanted: int) -> int:
        """The budget's spiller: drop the forgotten files' entries, then least recently
        used ones until ``wanted`` is freed."""
        with self._lock:
            before = self.bytes
            self._purge()
            purged = before - self.bytes
            return purged + self._evict(wanted - purged)

    def stats(self) -> dict:
        with self._lock:
            self._purge()
        return {"block_cache_hits": self.hits, "block_cache_misses": self.misses,
                "block_cache_bytes": self.bytes, "block_cache_evictions": self.evictions,
                "block_cache_capacity": self.capacity}

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._evict(self.bytes + 1)
            self.budget.remove_spiller(self._token)

    def __len__(self) -> int:
        return len(self._blocks)


def _in_own_pages(column):
    """A read-only copy of a decoded column in pages of its own (an anonymous mapping,
    unmapped once the column is dropped), or None for a layout it does not copy (nested
    Arrow types). Kept in the heap -- or in Arrow's pool -- a column would hold pages
    that later work reuses once freed: dim_dim's incremental step after a warm query
    then faulted 8-12 MB in afresh (7 -> 10-11 ms)."""
    if isinstance(column, np.ndarray):
        raw = np.ascontiguousarray(column).reshape(-1).view(np.uint8)
        out = np.frombuffer(_pages(raw), column.dtype, column.size).reshape(column.shape)
        out.flags.writeable = False
        return out
    if isinstance(column, pa.DictionaryArray):
        indices, dictionary = _in_own_pages(column.indices), _in_own_pages(column.dictionary)
        if indices is None or dictionary is None:
            return None
        return pa.DictionaryArray.from_arrays(indices, dictionary)
    if column.type.num_fields:
        return None
    buffers = [None if b is None else pa.py_buffer(_pages(b)) for b in column.buffers()]
    return pa.Array.from_buffers(column.type, len(column), buffers, column.null_count,
                                 column.offset)


def _pages(data):
    """``data``'s bytes copied into a new anonymous mapping; a small buffer, which
    holds no page of its own, into a bytes object (a mapping each would spend the
    process's map count, ``vm.max_map_count``)."""
    view = memoryview(data)
    if view.nbytes < OWN_PAGES_FROM:
        return bytearray(view)
    # populated at the mapping: the kernel fills the pages in one pass, not a fault
    # each as the copy touches them (1.5 MiB: 0.49 ms against 0.82 here)
    pages = mmap.mmap(-1, view.nbytes, flags=_POPULATED)
    pages[:] = view
    return pages


class KeptColumns:
    """Marks a read whose decoded columns are kept in ``cache`` (see the module notes)."""

    def __init__(self, cache: BlockCache, scan: bool = False):
        self.cache, self.scan = cache, scan

    def column(self, pagefile, group: dict, dictionary: bool, decode):
        return self.cache.kept(kept_key(pagefile, group, dictionary), decode, self.scan)


def kept_key(pagefile, group: dict, dictionary: bool) -> tuple:
    """What a decoded column of a part is kept under: its page file, first region and
    that region's checksum, and its form (``dictionary``: as codes)."""
    region = group["regions"][0]
    return pagefile.path, region, pagefile.regions[region].checksum, "decoded", dictionary


def through_cache(pagefile, group: dict, cache, read):
    """``read(meta, fetch)`` with ``fetch(buffer, block)`` served by the block cache."""
    version = group["version"]
    lookup("zstd", version)
    meta = group["meta"]
    regions = group["regions"][: group["nbuffers"]]

    def fetch(b: int, i: int) -> np.ndarray:
        region = regions[b]
        key = (pagefile.path, region, pagefile.regions[region].checksum, i)
        return cache.get(key, lambda: _decompress(pagefile, region, meta["blocks"][b], i))

    try:
        return read(meta, fetch)
    except CodecError as exc:
        raise CodecError(f"codec 'zstd' version {version}, {pagefile.path}: {exc}") from exc
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CodecError(f"codec 'zstd' version {version}, {pagefile.path}: corrupt "
                         f"encoding ({type(exc).__name__}: {exc})") from exc


def _decompress(pagefile, region: str, blocks: dict, i: int) -> np.ndarray:
    comp = np.frombuffer(pagefile.buffer(region), np.uint8)
    raw, offs = blocks["raw"], blocks["comp"]
    if offs[-1] != comp.nbytes:
        raise CodecError(f"region {region!r}: zstd blocks do not span its {comp.nbytes} bytes")
    try:
        return zstd_blocks.decompress_block(comp[offs[i]:offs[i + 1]], i, raw[i + 1] - raw[i])
    except CodecError as exc:
        raise CodecError(f"region {region!r}: {exc}") from exc
