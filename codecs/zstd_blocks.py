"""zstd: each plain buffer compressed in independent fixed-size blocks.

Design
------
The plain encoding's buffers are cut into blocks of ``block_bytes`` raw bytes (128 KiB by
default; a multiple of the item size for numpy input, so elements never straddle blocks)
and each block is one zstd frame. The metadata lists every buffer's raw and compressed
block boundaries, so ``decode_range`` on numpy input decompresses only the blocks covering
the requested elements. zstd contexts are not thread-safe: each thread gets its own.

A caller that keeps decompressed blocks (the spine's block cache) decodes through
``decode_from_blocks`` and ``take_from_blocks``: it supplies ``fetch(buffer, block)``, the
raw bytes of one block, and the codec assembles the column or gathers rows from them,
fetching only the blocks that hold the rows asked for.
"""

from __future__ import annotations

import bisect
import threading

import numpy as np
import pyarrow as pa
import zstandard

from arrangedb.codecs.base import (
    Codec, CodecError, Encoded, as_u8, binary_offset_dtype, check, clamp_range, expect_buffers,
    meta_dtype, meta_length, register, str_to_type,
)
from arrangedb.codecs import parallel
from arrangedb.codecs.plain import decode_parts, encode_parts, plain_version

DEFAULT_BLOCK_BYTES = 128 << 10
DEFAULT_LEVEL = 3
PARALLEL_BLOCKS = 16  # from 16 blocks (2 MiB) up, two threads take a half each

_local = threading.local()


def compressor(level: int = DEFAULT_LEVEL) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    cctx = cache.get(level)
    if cctx is None:
        cctx = cache[level] = zstandard.ZstdCompressor(level=level)
    return cctx


def decompressor() -> zstandard.ZstdDecompressor:
    dctx = getattr(_local, "decompressor", None)
    if dctx is None:
        dctx = _local.decompressor = zstandard.ZstdDecompressor()
    return dctx


def compress_blocks(buf, block: int, level: int) -> tuple[bytes, list, list]:
    """(compressed bytes, raw block offsets, compressed block offsets) of one buffer."""
    raw = memoryview(as_u8(buf))
    raw_offsets = list(range(0, len(raw), block)) + [len(raw)]
    bounds = list(zip(raw_offsets, raw_offsets[1:]))

    def run(part):
        cctx = compressor(level)   # one per thread: contexts are not thread-safe
        return [cctx.compress(raw[a:b]) for a, b in part]

    if len(bounds) >= PARALLEL_BLOCKS:   # zstd releases the GIL: two halves at once
        mid = len(bounds) // 2
        first, second = parallel.both(lambda: run(bounds[:mid]), lambda: run(bounds[mid:]))
        frames = first + second
    else:
        frames = run(bounds)
    comp_offsets = [0]
    for f in frames:
        comp_offsets.append(comp_offsets[-1] + len(f))
    return b"".join(frames), raw_offsets, comp_offsets


def decompress_block(comp: np.ndarray, i: int, raw_size: int, out: np.ndarray | None = None,
                     dctx: zstandard.ZstdDecompressor | None = None) -> np.ndarray:
    """Frame ``i`` (the compressed bytes ``comp``) decompressed into ``out`` (or a new array).

    ``stream_reader(...).readinto`` writes straight into the caller's memory: no
    intermediate ``bytes`` per block and no second copy. A frame must declare exactly
    ``raw_size`` bytes (zstd then checks its output against the declaration) and yield
    them all; anything else is a CodecError naming the block.
    """
    if out is None:
        out = np.empty(raw_size, np.uint8)
    try:
        declared = zstandard.frame_content_size(comp)
        check(declared == raw_size, f"zstd block {i} declares {declared} bytes, "
                                    f"expected {raw_size}")
        reader = (dctx or decompressor()).stream_reader(comp)
        view, got = memoryview(out), 0
        while got < raw_size:
            n = reader.readinto(view[got:])
            if not n:
                break
            got += n
    except zstandard.ZstdError as exc:
        raise CodecError(f"zstd block {i} is corrupt ({exc})") from exc
    check(got == raw_size, f"zstd block {i} has {got} bytes, expected {raw_size}")
    return out


def check_blocks(comp: np.ndarray, raw_offsets, comp_offsets) -> int:
    """The number of blocks of one compressed buffer, after checking its block lists."""
    nblocks = len(raw_offsets) - 1
    check(nblocks >= 0 and len(comp_offsets) == nblocks + 1, "zstd block lists differ in length")
    check(raw_offsets[0] == 0 and comp_offsets[0] == 0 and comp_offsets[-1] == comp.nbytes,
          f"zstd blocks do not span the buffer ({comp.nbytes} bytes)")
    for bounds in (raw_offsets, comp_offsets):
        check(not (np.diff(np.asarray(bounds, np.int64)) < 0).any(),
              "zstd block offsets are not monotone")
    return nblocks


def decompress_blocks(buf, raw_offsets, comp_offsets, first: int = 0, last: int | None = None):
    """Blocks [first, last) of one compressed buffer, decompressed into one uint8 array."""
    comp = as_u8(buf)
    nblocks = check_blocks(comp, raw_offsets, comp_offsets)
    last = nblocks if last is None else last
    base = raw_offsets[first] if nblocks else 0
    out = np.empty((raw_offsets[last] - base) if nblocks else 0, dtype=np.uint8)

    def run(lo: int, hi: int) -> None:
        dctx = decompressor()
        for i in range(lo, hi):
            r0, r1 = raw_offsets[i], raw_offsets[i + 1]
            decompress_block(comp[comp_offsets[i]:comp_offsets[i + 1]], i, r1 - r0,
                             out[r0 - base:r1 - base], dctx)

    if last - first >= PARALLEL_BLOCKS:  # zstd releases the GIL: two halves at once
        mid = (first + last) // 2
        parallel.both(lambda: run(first, mid), lambda: run(mid, last))
    else:
        run(first, last)
    return out


def block_lists(meta: dict) -> list[tuple[list, list]]:
    """(raw offsets, compressed offsets) of each buffer, checked to be well formed."""
    out = []
    for m in meta["blocks"]:
        raw, comp = m["raw"], m["comp"]
        check(len(raw) >= 1 and len(comp) == len(raw) and raw[0] == 0 and comp[0] == 0,
              "zstd block lists are malformed")
        for bounds in (raw, comp):
            check(not (np.diff(np.asarray(bounds, np.int64)) < 0).any(),
                  "zstd block offsets are not monotone")
        out.append((raw, comp))
    return out


def _fetched(fetch, b: int, i: int, size: int) -> np.ndarray:
    block = as_u8(fetch(b, i))
    check(block.nbytes == size, f"zstd block {i} has {block.nbytes} bytes, expected {size}")
    return block


def decode_from_blocks(meta: dict, fetch):
    """The whole column, from ``fetch(buffer, block)`` (decompressed uint8 blocks).

    The blocks are copied into fresh buffers, so the result shares no memory with them:
    a caller may drop a block while the column lives on.
    """
    raws = []
    for b, (raw, _) in enumerate(block_lists(meta)):
        out = np.empty(raw[-1], np.uint8)
        for i in range(len(raw) - 1):
            out[raw[i]:raw[i + 1]] = _fetched(fetch, b, i, raw[i + 1] - raw[i])
        raws.append(out)
    return decode_parts(meta["plain"], raws)


def take_from_blocks(meta: dict, fetch, rows: np.ndarray):
    """Elements at ``rows`` (any order), fetching only the blocks that hold them.

    Applies to numpy columns and Arrow fixed-width columns without nulls (one buffer of
    items); returns None for other layouts, which the caller decodes whole. An element may
    straddle two blocks (Arrow blocks are not cut at item boundaries): both are fetched and
    laid side by side, so every element's bytes stay contiguous.
    """
    pmeta = meta["plain"]
    n = meta_length(pmeta)
    if pmeta.get("kind") == "numpy":
        dt = meta_dtype(pmeta)
        make = None
    elif (pmeta.get("kind") == "arrow" and pmeta.get("layout") == "flat"
          and not pmeta.get("validity")):
        t = str_to_type(pmeta["type"])
        if pa.types.is_boolean(t) or binary_offset_dtype(t) is not None:
            return None
        dt = np.dtype(f"V{t.bit_width // 8}")
        make = t
    else:
        return None
    (raw, _), = block_lists(meta)
    item = dt.itemsize
    check(raw[-1] == n * item, "zstd raw size does not match the length")
    rows = np.asarray(rows, np.int64)
    check(len(rows) == 0 or (int(rows.min()) >= 0 and int(rows.max()) < n),
          "row index out of range")
    if len(rows) == 0 or n == 0:
        out = np.empty(0, dt)
    else:
        bounds = np.asarray(raw, np.int64)
        byte = rows * item
        first, last = _blocks_of(bounds, byte, item)
        needed = _distinct_sorted(first, last, len(bounds))
        sizes = np.diff(bounds)[needed]
        starts = np.zeros(len(needed), np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        compact = np.empty(int(sizes.sum()), np.uint8)
        for j, i in enumerate(needed.tolist()):
            compact[starts[j]:starts[j] + sizes[j]] = _fetched(fetch, 0, i, int(sizes[j]))
        start_of = np.zeros(len(bounds), np.int64)   # each needed block's place in compact
        start_of[needed] = starts
        at = byte - bounds[first] + start_of[first]
        # every item's bytes, wherever they start: a stride-1 view over the compact bytes
        items = np.ndarray(buffer=compact, dtype=dt, shape=(len(compact) - item + 1,),
                           strides=(1,))
        out = items[at]
    if make is None:
        return out
    return pa.Array.from_buffers(make, len(out), [None, pa.py_buffer(out.view(np.uint8))],
                                 null_count=0)


class ZstdBlocks(Codec):
    name = "zstd"
    version = 2       # 2: the plain buffers may be in the ``stride`` layout
    versions = (1, 2)

    def encode(self, values, block_bytes: int = DEFAULT_BLOCK_BYTES, level: int = DEFAULT_LEVEL,
               **options):
        pmeta, pbufs = encode_parts(values)
        block = max(int(block_bytes), 1)
        if pmeta["kind"] == "numpy":
            item = np.dtype(pmeta["dtype"]).itemsize
            block = max(item, block // item * item)
        buffers, blocks = [], []
        for buf in pbufs:
            comp, raw_offsets, comp_offsets = compress_blocks(buf, block, level)
            buffers.append(comp)
            blocks.append({"raw": raw_offsets, "comp": comp_offsets})
        meta = {"plain": pmeta, "level": level, "block_bytes": block, "blocks": blocks}
        return Encoded(self.name, plain_version(pmeta), meta, buffers)

    def decode(self, version, meta, buffers):
        blocks = meta["blocks"]
        expect_buffers(buffers, len(blocks))
        raw = [decompress_blocks(b, m["raw"], m["comp"]) for b, m in zip(buffers, blocks)]
        return decode_parts(meta["plain"], raw)

    def decode_range(self, version, meta, buffers, start, stop):
        pmeta = meta["plain"]
        if pmeta.get("kind") != "numpy":
            return super().decode_range(version, meta, buffers, start, stop)
        dt = meta_dtype(pmeta)
        n = meta_length(pmeta)
        start, stop = clamp_range(n, start, stop)
        expect_buffers(buffers, 1)
        (blocks,) = meta["blocks"]
        raw_offsets = blocks["raw"]
        check(raw_offsets[-1] == n * dt.itemsize, "zstd raw size does not match the length")
        if start == stop:
            return np.empty(0, dt)
        lo, hi = start * dt.itemsize, stop * dt.itemsize
        first = bisect.bisect_right(raw_offsets, lo) - 1
        last = bisect.bisect_left(raw_offsets, hi)
        out = decompress_blocks(buffers[0], raw_offsets, blocks["comp"], first, last)
        skip = lo - raw_offsets[first]
        return out[skip:skip + hi - lo].view(dt)


ZSTD = register(ZstdBlocks())


def _blocks_of(bounds: np.ndarray, byte: np.ndarray, item: int):
    """The blocks (of raw ``bounds``) holding the first and the last byte of each item
    starting at ``byte``. Blocks are written of one size (the last one no longer): a
    division finds them; other bounds are searched."""
    size = int(bounds[1] - bounds[0]) if len(bounds) > 1 else 0
    if size > 0 and np.array_equal(bounds[:-1], np.arange(len(bounds) - 1) * size) \
            and bounds[-1] - bounds[-2] <= size:
        first = byte // size
        return first, first if size % item == 0 else (byte + item - 1) // size
    return (np.searchsorted(bounds, byte, side="right") - 1,
            np.searchsorted(bounds, byte + item - 1, side="right") - 1)


def _distinct_sorted(a: np.ndarray, b: np.ndarray, size: int) -> np.ndarray:
    """The distinct values of two arrays of block indices below ``size``, sorted: a mask
    over the blocks (np.union1d hashes or sorts every row index)."""
    seen = np.zeros(size, dtype=bool)
    seen[a] = True
    seen[b] = True
    return np.flatnonzero(seen)
