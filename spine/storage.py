"""Writing parts into page files and reading them back, through the codecs.

Design
------
Each column of a part (every key and val column, the two bounds lists, times, diffs) is
encoded by :mod:`arrangedb.codecs` -- chosen automatically per column unless the engine
says otherwise -- and each buffer of the encoding becomes one region of the batch's page
file. The codec, its version and its metadata travel in the region directory, so a page
file alone is enough to decode it (``arrangedb inspect`` reads them too).

Invariants
----------
- Every encoded column has at least one region (an empty one when the codec needs no
  bytes, as for stride-encoded offsets), so the directory always records its codec.
- The bounds lists use the ``offsets`` codec: u32 while they fit, u64 beyond, stride and
  singleton runs in O(1).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from arrangedb.codecs import (CodecError, choose_codec, decode, decode_dictionary, decodes_fresh,
                              encode, segment_sums, take, take_dictionary, zstd_blocks)
from arrangedb.codecs.base import lookup
from arrangedb.spine.layout import PartLayout
from arrangedb.spine.part import PagedPart, boundary_key, payload_bytes

_NUMERIC_CODEC = {"key_bounds": "offsets", "val_bounds": "offsets"}


def _encode_group(writer, prefix: str, values, codec: str,
                  choices: dict | None = None) -> tuple[dict, int]:
    if codec == "auto" and choices is not None:
        # one choice per column and builder: parts of one batch look alike, and choosing
        # (sampling, counting distinct values) costs as much as encoding a small part
        column = prefix.split("/", 1)[1]
        if column not in choices:
            choices[column] = choose_codec(values)
        codec = choices[column]
        enc = encode(values, codec)
        if enc.codec != codec:
            # this part breaks the column's pattern (a NaN among decimals, a value out of
            # a frame): choose again for it rather than store it plain
            enc = encode(values, "auto")
    else:
        enc = encode(values, codec)
    names, stored = [], 0
    buffers = list(enc.buffers) or [b""]
    for i, buf in enumerate(buffers):
        name = f"{prefix}.{i}"
        writer.add_region(name, buf, codec=enc.codec, codec_version=enc.version,
                          meta={"column": prefix, "buffer": i, "nbuffers": len(enc.buffers),
                                "codec_meta": enc.meta} if i == 0 else
                          {"column": prefix, "buffer": i})
        names.append(name)
        stored += memoryview(buf).nbytes
    group = {"regions": names, "codec": enc.codec, "version": enc.version, "meta": enc.meta,
             "nbuffers": len(enc.buffers)}
    return group, stored


def write_part(writer, index: int, layout: PartLayout, codec: str, schemas,
               choices: dict | None = None) -> PagedPart:
    """Encode ``layout`` into regions ``p<index>/...`` of ``writer``; return the part."""
    columns, stored = {}, 0
    for fname in ("keys", "vals"):
        table = getattr(layout, fname)
        if table is None:
            continue
        groups = []
        for col_name, col in zip(table.column_names, table.columns):
            arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
            g, s = _encode_group(writer, f"p{index}/{fname}/{col_name}", arr, codec, choices)
            groups.append(g)
            stored += s
        columns[fname] = groups
    for fname in ("key_bounds", "val_bounds", "times", "diffs"):
        arr = getattr(layout, fname)
        if arr is None:
            continue
        c = _NUMERIC_CODEC.get(fname, codec)
        g, s = _encode_group(writer, f"p{index}/{fname}", np.ascontiguousarray(arr), c, choices)
        columns[fname] = [g]
        stored += s
    n = layout.num_updates
    return PagedPart(
        num_updates=n, num_keys=layout.keys.num_rows,
        first_key=boundary_key(layout.keys, 0),
        last_key=boundary_key(layout.keys, layout.keys.num_rows - 1),
        payload=payload_bytes(layout.keys) + payload_bytes(layout.vals), stored=stored,
        pagefile=None, columns=columns, schemas=schemas,
    )


def decode_column(pagefile, group: dict, cache=None, dictionary: bool = False):
    """Decode one column of a part, copying its bytes out of the mapping first.

    Decoded arrays may be views of the bytes they were decoded from. Were those the
    mapping itself, every consumer of a view (a merge's builder, a user holding a
    snapshot batch) would fault mapped pages back in after the reader released them,
    out of the budget's sight. One copy per read keeps the mapped pages' lifetime to
    the read itself: the reader releases them right after decoding. Encodings whose
    decode computes every output (for, scaled_float, arrow_decimal) need no copy.

    zstd columns with a ``cache`` (:class:`BlockCache`) decode from cached blocks,
    decompressing (straight out of the mapping: that is the copy) only the missing ones.

    ``dictionary=True``: a dict-coded Arrow column comes back as a dictionary array (its
    codes and stored dictionary, values not gathered); other columns decode as usual.
    """
    if cache is not None and group["codec"] == "zstd":
        return _through_cache(pagefile, group, cache, zstd_blocks.decode_from_blocks)
    buffers = _mapped(pagefile, group)
    if not decodes_fresh(group["codec"], group["meta"]):
        buffers = [b.copy() for b in buffers]
    if dictionary:
        out = decode_dictionary(group["codec"], group["version"], group["meta"], buffers)
        if out is not None:
            return out
    return decode(group["codec"], group["version"], group["meta"], buffers)


def column_segment_sums(pagefile, group: dict, starts: np.ndarray) -> np.ndarray | None:
    """Per-segment sums of one column of a part, summed on its encoding straight from the
    mapping (the sums are new arrays: nothing to copy out first); None when the codec
    cannot sum without decoding (see ``codecs.segment_sums``)."""
    return segment_sums(group["codec"], group["version"], group["meta"],
                        _mapped(pagefile, group), starts)


def take_column(pagefile, group: dict, rows: np.ndarray, cache=None,
                dictionary: bool = False):
    """Elements ``rows`` of one column of a part (a numpy array or an Arrow array).

    zstd columns of items (numpy, Arrow fixed-width without nulls) with a ``cache``
    decompress only the blocks holding ``rows``; a dictionary column gathers only the
    rows' codes and strings (only their codes, as a dictionary array, with
    ``dictionary=True``); other columns decode whole and take.
    """
    if cache is not None and group["codec"] == "zstd":
        out = _through_cache(pagefile, group, cache,
                             lambda meta, fetch: zstd_blocks.take_from_blocks(meta, fetch, rows))
        if out is not None:
            return out
        column = decode_column(pagefile, group, cache)   # whole, from the cached blocks
        return column.take(pa.array(rows)) if isinstance(column, pa.Array) else column[rows]
    # a take gathers into new arrays: no copy out of the mapping needed first
    buffers = _mapped(pagefile, group)
    if dictionary:
        out = take_dictionary(group["codec"], group["version"], group["meta"], buffers, rows)
        if out is not None:
            return out
    return take(group["codec"], group["version"], group["meta"], buffers, rows)


def _mapped(pagefile, group: dict) -> list[np.ndarray]:
    """The column's buffers as views of the mapping."""
    return [np.frombuffer(pagefile.buffer(r), dtype=np.uint8)
            for r in group["regions"][: group["nbuffers"]]]


def _through_cache(pagefile, group: dict, cache, read):
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
