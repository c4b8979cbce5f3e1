"""Writing parts into page files, through the codecs.

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

from arrangedb.codecs import choose_codec, encode
from arrangedb.spine.data.layout import PartLayout
from arrangedb.spine.storage.paged import PagedPart
from arrangedb.spine.storage.part import boundary_key, payload_bytes

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
