"""arrow_decimal: Arrow decimal columns (decimal32/64/128/256) as their unscaled integers.

Design
------
A decimal is an integer (its unscaled value) and a scale the type carries. When every
valid unscaled value fits in int64 -- always for a precision of at most 18, so for every
money column of TPC-H, ``decimal(15,2)`` -- the column is stored as those int64 integers,
frame-of-reference encoded (:mod:`arrangedb.codecs.frame`): amounts spanning less than 4e7
with two decimals take 4 bytes a value instead of Arrow's 16 (``ints`` form). Others keep
their 16- or 32-byte values as they are (``wide`` form). Nulls are a validity bitmap; the
integer under a null is another value of the column, so that it never widens the frame.

Decoding widens the integers back to the type's little-endian two's complement words
(the high words are the sign of the low one) and returns exactly the Arrow type encoded,
precision and scale included. Segment sums are the unscaled integers' sums (int64, exact:
declined when a sum could leave int64), which a reader scales itself.

``decimal_words`` and ``unscaled_int64`` are the views of a decimal array the sort codes
(:mod:`arrangedb.spine.data.codes`) and the exact aggregates (:mod:`arrangedb.ops.aggregate`)
work on as well.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from arrangedb.codecs.base import (
    Codec, Encoded, arrow_meta, check, clamp_range, expect_buffers, is_arrow, meta_dtype,
    meta_length, normalize_arrow, pop_validity, register, str_to_type, valid_mask,
    validity_of, view_as,
)
from arrangedb.codecs.frame import FOR, int_segment_sums


def decimal_words(arr: pa.Array) -> np.ndarray:
    """The unscaled integers of a decimal array as rows of little-endian 64-bit words, the
    last one signed: ``(n, 1)`` for decimal32/64 (widened to int64), ``(n, 2)`` for
    decimal128, ``(n, 4)`` for decimal256. A view of the array's buffer except for
    decimal32; the words under nulls are whatever the buffer holds."""
    width = arr.type.byte_width
    n, off = len(arr), arr.offset
    if n == 0:
        return np.zeros((0, max(width // 8, 1)), np.int64)
    if width <= 8:
        raw = np.frombuffer(arr.buffers()[1], f"i{width}", count=off + n)[off:]
        return raw.astype(np.int64, copy=False).reshape(n, 1)
    k = width // 8
    raw = np.frombuffer(arr.buffers()[1], np.int64, count=(off + n) * k)[off * k:]
    return raw.reshape(n, k)


def unscaled_int64(arr, valid: np.ndarray | None = None,
                   out: np.ndarray | None = None) -> np.ndarray | None:
    """The unscaled integers of a decimal array (or chunked array) as a new int64 array
    (or written into ``out``), or None when a valid one does not fit in int64. ``valid``:
    the array's validity mask, if known (None: computed); under nulls lies another value
    of the array (0 if none is valid). Chunks are read in place, never concatenated."""
    if out is None:
        out = np.empty(len(arr), np.int64)
    if isinstance(arr, pa.ChunkedArray):
        at = 0
        for chunk in arr.chunks:
            part = slice(at, at + len(chunk))
            mask = None if valid is None else valid[part]
            if unscaled_int64(chunk, mask, out[part]) is None:
                return None
            at += len(chunk)
        return out
    words = decimal_words(arr)
    np.copyto(out, words[:, 0])          # the low words, contiguous
    if valid is None and arr.null_count:
        valid = valid_mask(normalize_arrow(arr))
    if words.shape[1] > 1 and not _fits(words, out, valid):
        return None
    if valid is not None and len(out):
        first = int(np.argmax(valid))
        out[~valid] = out[first] if valid[first] else 0
    return out


def _fits(words: np.ndarray, low: np.ndarray, valid: np.ndarray | None) -> bool:
    """Whether every valid row's high words are the sign of its low word. Two bitwise
    reductions first: high words all 0 fit when no low word is negative (and all -1
    when every one is), which is every column of amounts; row by row only if not."""
    if len(low) == 0:
        return True
    if words.shape[1] == 2:
        high = words[:, 1]
        if not np.bitwise_or.reduce(high) and np.bitwise_or.reduce(low) >= 0:
            return True
        if np.bitwise_and.reduce(high) == -1 and np.bitwise_and.reduce(low) < 0:
            return True
    sign = low >> 63
    fits = np.equal(words[:, 1], sign)
    for i in range(2, words.shape[1]):
        fits &= words[:, i] == sign
    if valid is not None:
        fits |= ~valid
    return bool(fits.all())


def _widen(ints: np.ndarray, width: int) -> np.ndarray:
    """int64 unscaled integers as the little-endian words of a ``width``-byte decimal."""
    if width == 4:
        narrow = ints.astype(np.int32)
        check(np.array_equal(narrow, ints), "decimal32 integers out of range")
        return narrow
    if width == 8:
        return ints
    out = np.empty((len(ints), width // 8), np.int64)
    out[:, 0] = ints
    np.right_shift(ints, 63, out=out[:, 1])    # the high words: the low one's sign
    if width == 32:
        out[:, 2:] = out[:, 1:2]
    return out.reshape(-1)


class ArrowDecimal(Codec):
    name = "arrow_decimal"

    def encode(self, values, **options):
        if not is_arrow(values) or not pa.types.is_decimal(values.type):
            return None
        # a slice (a part of a sorted run) is read in place; only a bitmap needs offset 0
        arr = normalize_arrow(values) if values.null_count else values
        meta = arrow_meta(arr)
        bitmap = validity_of(arr)
        meta["validity"] = bitmap is not None
        buffers = [bitmap] if bitmap is not None else []
        ints = unscaled_int64(arr, valid_mask(arr))
        if ints is None:
            width = arr.type.byte_width
            meta["form"] = "wide"
            buffers.append(arr.buffers()[1].slice(arr.offset * width, len(arr) * width))
        else:
            enc = FOR.encode(ints)
            meta.update(form="ints", ints=enc.meta)
            buffers += enc.buffers
        return Encoded(self.name, self.version, meta, buffers)

    def decode(self, version, meta, buffers):
        return self.decode_range(version, meta, buffers, 0, None)

    def decodes_fresh(self, meta) -> bool:
        # the words are computed from the integers; a validity bitmap or wide values
        # are handed over as they are stored
        return meta.get("form") == "ints" and not meta.get("validity")

    def segment_sums(self, version, meta, buffers, starts):
        # exact while no sum can leave int64: n values below (|base| + 2**(8 width)) each
        ints = meta.get("ints") or {}
        if meta.get("validity") or meta.get("form") != "ints" or ints.get("form") != "for" \
                or ints.get("width") not in (0, 1, 2, 4):
            return None
        check(meta_dtype(ints) == np.int64, "arrow_decimal ints")
        base = int(np.uint64(ints["base"] % 2 ** 64).view(np.int64))
        if meta_length(ints) * (abs(base) + 2 ** (8 * ints["width"])) >= 1 << 63:
            return None
        return int_segment_sums(ints, buffers, starts)

    def decode_range(self, version, meta, buffers, start, stop):
        n = meta_length(meta)
        check(meta["kind"] == "arrow", f"unknown kind {meta.get('kind')!r}")
        if meta["validity"] and (start, stop) != (0, None):   # slices keep the bitmap
            return super().decode_range(version, meta, buffers, start, stop)
        t = str_to_type(meta["type"])
        check(pa.types.is_decimal(t), "arrow_decimal cannot decode type {}", t)
        width = t.byte_width
        start, stop = clamp_range(n, start, stop)
        buffers = list(buffers)
        validity = pa.py_buffer(pop_validity(buffers, n)) if meta["validity"] else None
        if meta["form"] == "wide":
            expect_buffers(buffers, 1)
            data = view_as(buffers[0], np.uint8, n * width, "decimal values")
            data = data[start * width: stop * width]
        else:
            check(meta["form"] == "ints", f"unknown arrow_decimal form {meta['form']!r}")
            ints_meta = meta["ints"]
            check(isinstance(ints_meta, dict) and meta_dtype(ints_meta) == np.int64
                  and meta_length(ints_meta) == n, "arrow_decimal ints")
            ints = FOR.decode_range(FOR.version, ints_meta, buffers, start, stop)
            data = _widen(ints, width)
        return pa.Array.from_buffers(t, stop - start, [validity, pa.py_buffer(data)],
                                     null_count=-1 if validity is not None else 0)


ARROW_DECIMAL = register(ArrowDecimal())
