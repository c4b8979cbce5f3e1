"""dict: low-cardinality columns as a dictionary (stored once, plain) and narrow codes.

Design
------
``pyarrow.compute.dictionary_encode`` finds the distinct values in one hashed pass (numpy
integers go through it zero-copy too). Codes are the narrowest of u8/u16/u32 that indexes
the dictionary, bit-packed (1, 2 or 4 bits) for dictionaries of up to 16 entries: that is
what makes flag columns 8x+ smaller than Arrow's 4 offset bytes per row. Nulls stay a
validity bitmap, with code 0 under them. Buffers: ``[validity?, codes, *dictionary's
plain buffers]``.

Entropy coding (version 2): codes of a byte or more are compressed by zstd in blocks
when that saves at least a fifth of them. zstd's Huffman stage brings a skewed column (a
few values covering most rows) near its entropy: 17 Zipf-distributed values need 8-bit
codes, ~3.5 bits a row compressed. Bit-packed codes (dictionaries of up to 16 entries)
stay packed: they waste at most a few bits a row, and their decode is the fast path of
flag and status columns, which a decompression would slow by a fifth. The codes are
decompressed whole at decode (a small fraction of the column's decoded bytes).

Decoding gathers the dictionary by the codes: numpy ``take`` for fixed-width values, a
fixed-stride numpy gather when every string of the dictionary has the same length (flags,
status codes), Arrow's dictionary decode otherwise.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrangedb.codecs.base import (
    Codec, Encoded, arrow_meta, binary_offset_dtype, check, clamp_range, int_storage_dtype,
    is_arrow, meta_length, narrow_uint, normalize_arrow, numpy_meta, pop_validity, register,
    str_to_type, validity_of, view_as,
)
from arrangedb.codecs.parallel import both
from arrangedb.codecs.plain import decode_parts, encode_parts, plain_version
from arrangedb.codecs.zstd_blocks import compress_blocks, decompress_blocks

ENTROPY_MIN_BYTES = 4096      # below, a frame's header eats the saving
ENTROPY_MAX_RATIO = 0.8       # compressed codes kept when at most 0.8x the packed ones
ENTROPY_BLOCK = 64 << 10      # from 16 blocks (1 MiB of codes) up, two threads decompress
ENTROPY_LEVEL = 1             # random codes have no matches: Huffman does the work


def dict_applies(values) -> bool:
    if isinstance(values, np.ndarray):
        return values.ndim == 1 and values.dtype.kind in "iu"
    if not is_arrow(values):
        return False
    t = values.type
    return binary_offset_dtype(t) is not None or int_storage_dtype(t) is not None


def code_dtype(cardinality: int) -> np.dtype:
    return narrow_uint(max(cardinality - 1, 0))


def code_bits(cardinality: int) -> int:
    """Bits per code: 1, 2 or 4 bit-packed for tiny dictionaries, else 8, 16 or 32."""
    top = max(cardinality - 1, 0)
    for bits in (1, 2, 4):
        if top < 1 << bits:
            return bits
    return narrow_uint(top).itemsize * 8


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes (< 2**bits) as bytes; sub-byte widths packed low bits first."""
    if bits >= 8:
        return codes.astype(f"u{bits // 8}")
    per = 8 // bits
    lanes = np.zeros(-(-len(codes) // per) * per, np.uint8)
    lanes[: len(codes)] = codes
    # one strided pass per lane: a reduce along rows of ``per`` bytes runs per row
    # (750k 4-bit codes: 0.55 ms against 7.5)
    packed = lanes[0::per].copy()
    for lane in range(1, per):
        packed |= lanes[lane::per] << np.uint8(lane * bits)
    return packed


def gather(items: np.ndarray, buf, bits: int, n: int, start: int, stop: int) -> np.ndarray:
    """``items[codes[start:stop]]`` for ``n`` packed codes, checking every code is < k.

    Sub-byte codes go through a 256-entry table mapping one packed byte straight to the
    items of its 2, 4 or 8 codes: one gather per packed byte, no unpacked code array.
    """
    check(bits in (1, 2, 4, 8, 16, 32), f"bad code width {bits!r} bits")
    k = len(items)
    if bits >= 8:
        codes = view_as(buf, f"u{bits // 8}", n, "dict codes")[start:stop]
        check(len(codes) == 0 or int(codes.max()) < k, "dict code out of range")
        return np.take(items, codes)
    per = 8 // bits
    packed = view_as(buf, np.uint8, -(-n // per), "dict codes")
    first, last = start // per, -(-stop // per)
    window = packed[first:last]
    lanes = (np.arange(256, dtype=np.uint16)[:, None] >> np.arange(0, 8, bits)) & ((1 << bits) - 1)
    if k < 1 << bits:
        check(bool((lanes < k).all(axis=1)[window].all()), "dict code out of range")
    row = np.ascontiguousarray(np.take(items, np.minimum(lanes, k - 1)))  # (256, per)
    width = per * items.dtype.itemsize
    word = np.dtype(f"u{width}") if width in (1, 2, 4, 8) else np.dtype(f"V{width}")
    table = row.view(np.uint8).reshape(256, width).view(word).reshape(256)
    out = np.take(table, window).view(items.dtype)
    skip = start - first * per
    return out[skip:skip + stop - start]


def entropy_code(codes: np.ndarray, bits: int) -> tuple[object, dict | None]:
    """Codes of ``bits`` each, zstd-compressed with their block lists when they are a
    byte or more and that saves enough; else the codes as they are and None."""
    if bits < 8 or codes.nbytes < ENTROPY_MIN_BYTES:
        return codes, None
    comp, raw, offs = compress_blocks(codes, ENTROPY_BLOCK, ENTROPY_LEVEL)
    if len(comp) > ENTROPY_MAX_RATIO * codes.nbytes:
        return codes, None
    return comp, {"raw": raw, "comp": offs}


class Dictionary(Codec):
    name = "dict"
    version = 2       # 2: codes may be zstd-compressed (``codes_zstd``)
    versions = (1, 2)

    def encode(self, values, **options):
        if not dict_applies(values):
            return None
        if isinstance(values, np.ndarray):
            meta = numpy_meta(values)
            encoded = pc.dictionary_encode(pa.array(values))
            validity = None
        else:
            arr = normalize_arrow(values)
            meta = arrow_meta(arr)
            encoded = pc.dictionary_encode(arr)
            validity = validity_of(arr)
            meta["validity"] = validity is not None
        dictionary = encoded.dictionary
        if isinstance(values, np.ndarray):
            dictionary = dictionary.to_numpy().astype(values.dtype, copy=False)
        return self.from_codes(meta, encoded.indices, dictionary, validity)

    def encode_codes(self, arr: pa.DictionaryArray) -> Encoded | None:
        """``arr``'s values from its own codes and dictionary, not hashed again; they
        decode to the value type. None for a dictionary with a null, or of a type not
        stored here."""
        t = arr.type.value_type
        if arr.dictionary.null_count or not dict_applies(pa.array([], t)):
            return None
        arr = normalize_arrow(arr)
        validity = validity_of(arr)
        meta = dict(arrow_meta(pa.array([], t)), length=len(arr), null_count=arr.null_count,
                    validity=validity is not None)
        return self.from_codes(meta, arr.indices, arr.dictionary, validity)

    def from_codes(self, meta: dict, indices: pa.Array, dictionary, validity) -> Encoded:
        """The encoding of ``indices`` (nulls under ``validity``) into ``dictionary``."""
        if indices.null_count:
            indices = pc.fill_null(indices, 0)
        bits = code_bits(len(dictionary))
        codes, blocks = entropy_code(pack_codes(indices.to_numpy(), bits), bits)
        dmeta, dbufs = encode_parts(dictionary)
        meta.update(cardinality=len(dictionary), code_bits=bits, dict=dmeta)
        if blocks is not None:
            meta["codes_zstd"] = blocks
        buffers = ([validity] if validity is not None else []) + [codes] + dbufs
        version = 2 if blocks is not None or plain_version(dmeta) > 1 else 1
        return Encoded(self.name, version, meta, buffers)

    def decode(self, version, meta, buffers):
        return self.decode_range(version, meta, buffers, 0, None)

    def decode_range(self, version, meta, buffers, start, stop):
        n = meta_length(meta)
        numpy_out = meta["kind"] == "numpy"
        if not numpy_out and (start, stop) != (0, None):
            return super().decode_range(version, meta, buffers, start, stop)
        start, stop = clamp_range(n, start, stop)
        validity, codes_buf, dictionary = _parts(meta, buffers, n, start, stop)
        k, bits = len(dictionary), meta["code_bits"]
        if k == 0:  # only all-null (or empty) columns have an empty dictionary
            return dictionary[:0] if numpy_out else pa.nulls(n, dictionary.type)
        if numpy_out:
            return gather(dictionary, codes_buf, bits, n, start, stop)
        t = dictionary.type
        vbuf = None if validity is None else pa.py_buffer(validity)
        nulls = -1 if validity is not None else 0
        if int_storage_dtype(t) is not None:
            dvals = view_as(dictionary.buffers()[1].slice(0, k * t.bit_width // 8),
                            int_storage_dtype(t), k, "dictionary")
            values = gather(dvals, codes_buf, bits, n, 0, n)
            return pa.Array.from_buffers(t, n, [vbuf, pa.py_buffer(values)], null_count=nulls)
        fast = _equal_length_gather(t, dictionary, codes_buf, bits, vbuf, nulls, n)
        if fast is not None:
            return fast
        if bits < 8:
            return _packed_group_gather(t, dictionary, codes_buf, bits, vbuf, nulls, n)
        codes = gather(np.arange(k, dtype=code_dtype(k)), codes_buf, bits, n, 0, n)
        index = pa.Array.from_buffers(pa.from_numpy_dtype(codes.dtype), n,
                                      [vbuf, pa.py_buffer(codes)], null_count=nulls)
        return pa.DictionaryArray.from_arrays(index, dictionary, safe=False).dictionary_decode()

    def decode_dictionary(self, version, meta, buffers) -> pa.DictionaryArray | None:
        """The column as an Arrow dictionary array (int32 codes, the stored dictionary),
        its values never gathered: taking and grouping then move 4 bytes per row instead
        of each row's string. None for a numpy column (no Arrow type to wrap)."""
        if meta["kind"] == "numpy":
            return None
        n = meta_length(meta)
        validity, codes_buf, dictionary = _parts(meta, buffers, n, 0, n)
        codes = _int32_codes(codes_buf, meta, n, len(dictionary))
        index = pa.Array.from_buffers(pa.int32(), n, [
            None if validity is None else pa.py_buffer(validity), pa.py_buffer(codes)],
            null_count=-1 if validity is not None else 0)
        return pa.DictionaryArray.from_arrays(index, dictionary, safe=False)

    def take(self, version, meta, buffers, rows):
        """Values at ``rows`` from the codes at ``rows``: a lookup touching a few rows
        of a part gathers only their values, never the whole column's."""
        if meta["cardinality"] == 0:
            return super().take(version, meta, buffers, rows)
        if meta["kind"] == "numpy":   # a merged batch's times and diffs: no range decode
            _, codes, dictionary = _rows_codes(meta, buffers, rows)
            return np.take(dictionary, codes)
        return self.take_dictionary(version, meta, buffers, rows).dictionary_decode()

    def take_dictionary(self, version, meta, buffers, rows) -> pa.DictionaryArray | None:
        """The rows' codes (int32) over the stored dictionary; None for a numpy column."""
        if meta["kind"] == "numpy":
            return None
        bitmap, codes, dictionary = _rows_codes(meta, buffers, rows)
        mask = (None if bitmap is None else
                (bitmap[rows >> 3] >> (rows & 7).astype(np.uint8)) & 1 == 0)
        return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=mask),
                                              dictionary, safe=False)


def _parts(meta: dict, buffers, n: int, start: int, stop: int):
    """Validity (Arrow columns), codes buffer and dictionary of an encoding, checked
    against the metadata; an empty dictionary only under rows [start, stop) all null."""
    buffers = list(buffers)
    arrow = meta["kind"] != "numpy"
    validity = pop_validity(buffers, n) if arrow and meta["validity"] else None
    check(buffers, "missing codes")
    k = meta["cardinality"]
    check(meta["code_bits"] == code_bits(k), "code width does not fit the cardinality")
    codes_buf = buffers.pop(0)
    blocks = meta.get("codes_zstd")
    if blocks is not None:
        packed = -(-n * meta["code_bits"] // 8)
        check(isinstance(blocks, dict) and blocks.get("raw", [None])[-1] == packed,
              "compressed dict codes do not match the length")
        codes_buf = decompress_blocks(codes_buf, blocks["raw"], blocks["comp"])
    dictionary = decode_parts(meta["dict"], buffers)
    check(len(dictionary) == k, "dictionary length does not match the metadata")
    if arrow:
        check(dictionary.type == str_to_type(meta["type"]),
              "dictionary type does not match the metadata")
    else:
        check(isinstance(dictionary, np.ndarray), "numpy dict needs a numpy dictionary")
    if k == 0:
        view_as(codes_buf, np.uint8, -(-n * meta["code_bits"] // 8), "dict codes")
        check(stop == start or validity is not None and not _any_valid(validity, n),
              "codes into an empty dictionary")
    return validity, codes_buf, dictionary


def _rows_codes(meta: dict, buffers, rows: np.ndarray):
    """(validity bitmap or None, the codes at ``rows``, the dictionary): only the rows'
    codes are read, never the whole part's."""
    n = meta_length(meta)
    bitmap, codes_buf, dictionary = _parts(meta, buffers, n, 0, n)
    return bitmap, _codes_at(codes_buf, meta, n, len(dictionary), rows), dictionary


def _int32_codes(codes_buf, meta: dict, n: int, k: int) -> np.ndarray:
    """All ``n`` codes, unpacked to int32 (Arrow's dictionary index type); zeros (under
    nulls) for an empty dictionary."""
    if k == 0:
        return np.zeros(n, np.int32)
    return gather(np.arange(k, dtype=np.int32), codes_buf, meta["code_bits"], n, 0, n)


def _codes_at(codes_buf, meta: dict, n: int, k: int, rows: np.ndarray) -> np.ndarray:
    """The codes at ``rows`` (in range) as int32, read from the packed codes where they
    lie (code i of a byte of sub-byte codes sits at bit i * width, low bits first);
    zeros for an empty dictionary. Each code read is checked < k."""
    if k == 0:
        return np.zeros(len(rows), np.int32)
    bits = meta["code_bits"]
    check(bits in (1, 2, 4, 8, 16, 32), f"bad code width {bits!r} bits")
    if bits >= 8:
        codes = view_as(codes_buf, f"u{bits // 8}", n, "dict codes")[rows]
    else:
        per = 8 // bits
        packed = view_as(codes_buf, np.uint8, -(-n // per), "dict codes")
        # per and bits are powers of two: shifts and masks, not an int64 division and
        # modulo per row (half the time of a lookup's codes)
        shifts = ((rows & (per - 1)) << (bits.bit_length() - 1)).astype(np.uint8)
        codes = (packed[rows >> (per.bit_length() - 1)] >> shifts) & np.uint8((1 << bits) - 1)
    check(len(codes) == 0 or int(codes.max()) < k, "dict code out of range")
    return codes.astype(np.int32)


def _any_valid(bitmap: np.ndarray, n: int) -> bool:
    return bool(np.unpackbits(bitmap[: (n + 7) // 8], bitorder="little")[:n].any())


# Rows from which a string decode counts as large: its offsets are computed on the
# kernels' helper thread while the strings are taken into a presized buffer. Below it the
# hand-off and the estimate cost more than they save (~0.2 ms).
PARALLEL_OFFSETS_FROM = 1 << 16


def _row_lengths(lengths, packed, bits, n):
    """The lengths of the ``n`` rows' entries, checking every code (padding included) is
    < k. Entries shorter than 255 bytes gather as bytes, a packed byte mapping to its
    codes' lengths at once (255 marks a code past k): a quarter of the int32 traffic."""
    k, per = len(lengths), 8 // bits
    if int(lengths.max()) >= 255:
        return gather(lengths, packed, bits, n, 0, n)
    lanes = (np.arange(256)[:, None] >> np.arange(0, 8, bits)) & ((1 << bits) - 1)
    table = np.where(lanes < k, lengths[np.minimum(lanes, k - 1)], 255).astype(np.uint8)
    rows = table.view(f"u{per}").reshape(256)[packed].view(np.uint8)
    check(len(rows) == 0 or int(rows.max()) < 255, "dict code out of range")
    return rows[:n]


def _packed_group_gather(t, dictionary, codes_buf, bits, vbuf, nulls, n):
    """Variable-length strings with bit-packed codes: one Arrow take per packed *byte*.

    Each of the 256 byte values names a group of 8 // bits codes; a 256-entry dictionary of
    the groups' concatenated strings, taken by the packed bytes, yields the data buffer in
    2-8x fewer (per-row costly) steps. The offsets, a cumsum of gathered lengths that also
    validates every code, are computed meanwhile on the kernels' helper thread.
    (Groups of 16 bits -- a 65536-entry table -- paid for their ~5 ms table only from
    ~3M rows, which no part reaches; a table of only the k**4 combinations, words
    remapped to it, saved nothing measurable either: Arrow's take costs by its bytes.)
    """
    odt = binary_offset_dtype(t)
    k, per = len(dictionary), 8 // bits
    lengths = np.diff(np.frombuffer(dictionary.buffers()[1], odt, count=k + 1))
    lanes = (np.arange(256)[:, None] >> np.arange(0, 8, bits)) & ((1 << bits) - 1)
    parts = [dictionary.take(pa.array(np.minimum(lanes[:, j], k - 1))) for j in range(per)]
    groups = (pc.binary_join_element_wise(*parts, pa.scalar("").cast(t)) if per > 1
              else parts[0])
    packed = view_as(codes_buf, np.uint8, -(-n // per), "dict codes")
    groups = _presized(groups, packed, odt)

    def offsets_of():
        offsets = np.empty(n + 1, odt)
        offsets[0] = 0
        offsets[1:] = _row_lengths(lengths, packed, bits, n)   # validates the codes
        np.cumsum(offsets[1:], out=offsets[1:])
        return offsets

    def data_of():
        return groups.take(pa.array(packed)).buffers()[2]

    if n >= PARALLEL_OFFSETS_FROM:
        offsets, data = both(offsets_of, data_of)
    else:
        offsets, data = offsets_of(), data_of()
    return pa.Array.from_buffers(t, n, [vbuf, pa.py_buffer(offsets), data or pa.py_buffer(b"")],
                                 null_count=nulls)


# Packed bytes sampled to estimate the taken strings' total length, and the margin added.
PRESIZE_SAMPLE = 1 << 14
PRESIZE_MARGIN = 1.03


def _presized(groups: pa.Array, packed: np.ndarray, odt) -> pa.Array:
    """``groups`` with one entry appended, never taken, that makes Arrow's take reserve
    enough output bytes at once.

    Arrow's take of strings reserves the table's mean entry length times the number of
    indices and grows by reallocation past that: a copy of everything taken so far, and
    on a fresh buffer the page faults of both. The mean of a code-group table is not the
    mean of the rows (groups of codes past k, never used, are short): the appended entry
    lifts it to the rows' mean estimated from a sample, plus a margin. Arrow shrinks the
    buffer to size at the end, in place while the reserve is under twice the need.
    """
    m = len(packed)
    if m == 0 or m < PARALLEL_OFFSETS_FROM:
        return groups
    lengths = np.diff(np.frombuffer(groups.buffers()[1], odt, count=len(groups) + 1))
    sample = packed[:: max(1, m // PRESIZE_SAMPLE)]
    want = float(lengths[sample].mean()) * PRESIZE_MARGIN
    pad = int(np.ceil(want * (len(groups) + 1))) - int(lengths.sum())
    if pad <= 0:
        return groups
    return pa.concat_arrays([groups, pa.array([b"\0" * pad], groups.type)])


def _equal_length_gather(t, dictionary, codes_buf, bits, vbuf, nulls, n):
    """Strings/binaries when every dictionary entry has one length: a fixed-stride gather."""
    odt = binary_offset_dtype(t)
    k = len(dictionary)
    bufs = dictionary.buffers()
    offs = np.frombuffer(bufs[1], odt, count=k + 1)
    lengths = np.diff(offs)
    width = int(lengths[0])
    if (lengths != width).any() or n * width > np.iinfo(odt).max:
        return None
    offsets = np.arange(0, (n + 1) * width, width, dtype=odt) if width else np.zeros(n + 1, odt)
    if width == 0:
        gather(np.zeros(k, np.uint8), codes_buf, bits, n, 0, n)  # validates the codes
        data = b""
    else:
        raw = np.frombuffer(bufs[2], np.uint8, count=k * width, offset=int(offs[0]))
        item = np.dtype(f"u{width}") if width in (1, 2, 4, 8) else np.dtype(f"V{width}")
        data = gather(raw.view(item), codes_buf, bits, n, 0, n).view(np.uint8)
    return pa.Array.from_buffers(t, n, [vbuf, pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=nulls)


DICT = register(Dictionary())
