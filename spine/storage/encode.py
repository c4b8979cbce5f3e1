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
- A part of several vals per key at one time also stores each key's sums of its numeric
  vals (:mod:`.keysums`), beside its columns.
- A part of integer keys dense enough in their range also stores their rank index
  (:mod:`.keyrank`), for lookups.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from arrangedb.codecs import Encoded, choose_codec, encode, encode_codes, segment_sums
from arrangedb.codecs.choose import TINY, dict_fits
from arrangedb.spine.data.layout import PartLayout, leaf_totals
from arrangedb.spine.data.updates import all_equal
from arrangedb.spine.storage.keyrank import rank_index
from arrangedb.spine.storage.keysums import (KEY_SUMS_FROM, leaf_counts, usual_count,
                                              weigh, weighable)
from arrangedb.spine.storage.paged import PagedPart
from arrangedb.spine.storage.part import boundary_key, payload_bytes

_NUMERIC_CODEC = {"key_bounds": "offsets", "val_bounds": "offsets"}


def _encode_group(writer, prefix: str, values, codec: str,
                  choices: dict | None = None) -> tuple[dict, int, Encoded]:
    enc = _coded(values, codec)
    if enc is None:
        if isinstance(values, pa.DictionaryArray):
            values = values.dictionary_decode()
        enc = _encoded(prefix, values, codec, choices)
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
    return group, stored, enc


def _encoded(prefix: str, values, codec: str, choices: dict | None) -> Encoded:
    if codec != "auto" or choices is None:
        return encode(values, codec)
    # one choice per column and builder: parts of one batch look alike, and choosing
    # (sampling, counting distinct values) costs as much as encoding a small part
    column = prefix.split("/", 1)[1]
    if column not in choices:
        choices[column] = choose_codec(values)
    enc = encode(values, choices[column])
    if enc.codec != choices[column]:
        # this part breaks the column's pattern (a NaN among decimals, a value out of a
        # frame): choose again for it rather than store it plain
        enc = encode(values, "auto")
    return enc


def _coded(values, codec: str) -> Encoded | None:
    """A dictionary column (strings kept as codes from the input) stored from its own
    codes where ``auto`` would store its values so (``choose.dict_fits``)."""
    if not isinstance(values, pa.DictionaryArray) or codec not in ("auto", "dict"):
        return None
    if codec == "auto" and (len(values) < TINY
                            or not dict_fits(len(values.dictionary), len(values))):
        return None
    return encode_codes(values)


class _KeySums:
    """The key sums a part being written stores (:mod:`.keysums`): plain under one
    stored (time, diff), else weighed by each leaf's count once all its updates are in
    (under several times, what a reader at or after the part's last time sees)."""

    def __init__(self, layout: PartLayout, weights: tuple | None):
        self.key_bounds = layout.key_bounds
        self.starts = np.asarray(layout.key_bounds[:-1], np.int64)
        self.weights = weights   # None, or (leaf counts, the usual count, the odd leaves)

    @classmethod
    def of(cls, layout: PartLayout) -> "_KeySums | None":
        """None when the part stores none."""
        if layout.vals is None \
                or layout.keys.num_rows * KEY_SUMS_FROM > int(layout.key_bounds[-1]):
            return None
        if len(layout.times) == 1:
            return cls(layout, None)
        counts = (leaf_counts(layout.val_bounds, layout.diffs) if all_equal(layout.times)
                  else leaf_totals(layout.val_bounds, layout.times, layout.diffs))
        usual = None if counts is None else usual_count(counts)
        return None if usual is None else cls(layout, (counts, *usual))

    def of_column(self, values: pa.Array, enc: Encoded) -> np.ndarray | None:
        """The key sums of one val column as encoded; None when its codec cannot sum
        (or a decimal column under several counts: its sums stay exact as limbs)."""
        t = values.type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)):
            return None
        if self.weights is not None and not weighable(t):
            return None
        buffers = [np.frombuffer(memoryview(b), np.uint8) for b in enc.buffers]
        got = segment_sums(enc.codec, enc.version, enc.meta, buffers, self.starts)
        if got is None or self.weights is None:
            return got
        counts, unit, odd = self.weights
        return weigh(got, self.key_bounds, counts, unit, odd,
                     lambda rows: values.take(pa.array(rows)).to_numpy())


def write_part(writer, index: int, layout: PartLayout, codec: str, schemas,
               choices: dict | None = None) -> PagedPart:
    """Encode ``layout`` into regions ``p<index>/...`` of ``writer``; return the part."""
    columns, stored = {}, 0
    key_sums = _KeySums.of(layout)
    for fname in ("keys", "vals"):
        table = getattr(layout, fname)
        if table is None:
            continue
        groups = []
        for col_name, col in zip(table.column_names, table.columns):
            arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
            g, s, enc = _encode_group(writer, f"p{index}/{fname}/{col_name}", arr, codec,
                                      choices)
            g["nulls"] = arr.null_count   # known without a decode (Part.val_nulls)
            groups.append(g)
            stored += s
            sums = key_sums.of_column(arr, enc) if key_sums and fname == "vals" else None
            if sums is not None:   # written now: the column's encoding is not kept
                g, s, _ = _encode_group(writer, f"p{index}/key_sums/{col_name}", sums,
                                        codec, choices)
                g["field"] = col_name
                columns.setdefault("key_sums", []).append(g)
                stored += s
        columns[fname] = groups
    rank = rank_index(layout.keys)
    if rank is not None:   # integer keys dense enough: lookups find them without decoding
        columns["key_rank"] = []
        for name, arr in zip(("words", "ranks"), rank):
            g, s, _ = _encode_group(writer, f"p{index}/key_rank/{name}", arr, "plain")
            columns["key_rank"].append(g)
            stored += s
    for fname in ("key_bounds", "val_bounds", "times", "diffs"):
        arr = getattr(layout, fname)
        if arr is None:
            continue
        c = _NUMERIC_CODEC.get(fname, codec)
        g, s, _ = _encode_group(writer, f"p{index}/{fname}", np.ascontiguousarray(arr), c,
                                choices)
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
