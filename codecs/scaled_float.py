"""scaled_float: floats that are decimals of a few digits (prices, amounts) as scaled integers.

Design
------
A float64 column whose every value ``x`` comes back bit for bit from
``m = rint(x * 10**p)`` as ``m / 10**p`` (for one ``p`` in 0..MAX_DIGITS) is stored as the
integers ``m``, frame-of-reference encoded (:mod:`arrangedb.codecs.frame`): an amount
with two decimals below 5e7 takes 4 bytes instead of 8 (zstd gets such floats to ~4.4),
and decodes with one conversion and one division at ~3.5 GB/s, twice zstd's speed.
Encoding runs at about zstd's speed (0.3-0.5 GB/s here), mostly the exactness check.
Decoding is exact because the encoder checks exactly the division the decoder does.
NaN, infinities and -0.0 never pass that check, so columns holding them are not
applicable (``plain`` or ``zstd`` take them). Arrow float64 arrays keep their nulls as a
validity bitmap; the integer under a null is 0.

Page files written before Arrow decimals got their own codec (``arrow_decimal``) name
this one ``decimal``: that name still decodes, and no longer encodes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from arrangedb.codecs.base import (
    Codec, CodecError, Encoded, arrow_meta, check, clamp_range, is_arrow, meta_dtype, meta_length,
    narrow_uint, normalize_arrow, numpy_meta, pop_validity, register, str_to_type, valid_mask,
    validity_of,
)
from arrangedb.codecs.frame import FOR, decode_as_float, int_segment_sums, take_as_float

MAX_DIGITS = 6
_EXACT = float(1 << 53)      # |m| below this: int64 <-> float64 is exact


def _back(m: np.ndarray, digits: int) -> np.ndarray:
    """The decoder's computation; the encoder checks its own output through it."""
    return m / np.float64(10.0 ** digits)


def _scaled(x: np.ndarray, digits: int) -> np.ndarray | None:
    """``x`` times ``10**digits`` as int64 when every value comes back bit for bit
    through ``digits`` decimals, else None."""
    if len(x) == 0:
        return np.zeros(0, np.int64)
    hi = float(np.abs(x).max())       # NaN and inf: not finite, never exact
    if not np.isfinite(hi) or hi * 10.0 ** digits >= _EXACT:
        return None
    m = np.rint(x * np.float64(10.0 ** digits)).astype(np.int64)   # -0.0 becomes 0 here
    return m if np.array_equal(_back(m, digits).view(np.int64), x.view(np.int64)) else None


def _exact(x: np.ndarray, digits: int) -> bool:
    """Does every value of ``x`` come back bit for bit through ``digits`` decimals?"""
    return _scaled(x, digits) is not None


def _fewest_digits(x: np.ndarray) -> tuple[int, np.ndarray] | None:
    """(the fewest digits that give ``x`` back exactly, ``x`` scaled by them), else None.
    A strided sample of 1024 values rules out most non-decimal columns (and finds the
    digits) before the whole column is checked."""
    sample = x[:: max(1, len(x) // 1024)]
    first = next((d for d in range(MAX_DIGITS + 1) if _exact(sample, d)), None)
    if first is None:
        return None
    for d in range(first, MAX_DIGITS + 1):
        m = _scaled(x, d)
        if m is not None:
            return d, m
    return None


def decimal_digits(values) -> int | None:
    """The fewest digits that give a float64 column (numpy, or Arrow: its valid values)
    back exactly, else None."""
    got = _floats(values)
    if got is None:
        return None
    found = _fewest_digits(got[0] if got[1] is None else got[0][got[1]])
    return None if found is None else found[0]


def _floats(values):
    """(float64 values, valid mask or None) of an applicable input, else None."""
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or values.dtype != np.float64:
            return None
        return values, None
    if not is_arrow(values) or values.type != pa.float64():
        return None
    arr = normalize_arrow(values)
    n = len(arr)
    data = np.frombuffer(arr.buffers()[1], np.float64, count=n) if n else np.empty(0)
    return data, valid_mask(arr)


class ScaledFloat(Codec):
    name = "scaled_float"

    def encode(self, values, digits: int | None = None, **options):
        got = _floats(values)
        if got is None:
            return None
        x, valid = got
        live = x if valid is None else x[valid]
        if digits is None:
            found = _fewest_digits(live)
        elif isinstance(digits, int) and 0 <= digits <= MAX_DIGITS:
            scaled = _scaled(live, digits)
            found = None if scaled is None else (digits, scaled)
        else:
            found = None
        if found is None:
            return None
        digits, m = found   # the exactness check's integers are the ones stored
        if valid is not None:   # zeros under the nulls
            m = np.zeros(len(x), np.int64)
            m[valid] = found[1]
        ints = FOR.encode(m)
        buffers = []
        if is_arrow(values):
            meta = arrow_meta(normalize_arrow(values))
            bitmap = validity_of(normalize_arrow(values))
            meta["validity"] = bitmap is not None
            if bitmap is not None:
                buffers.append(bitmap)
        else:
            meta = numpy_meta(x)
        meta.update(digits=digits, ints=ints.meta)
        return Encoded(self.name, self.version, meta, buffers + ints.buffers)

    def decode(self, version, meta, buffers):
        return self.decode_range(version, meta, buffers, 0, None)

    def decodes_fresh(self, meta) -> bool:
        # floats are computed from the integers; an Arrow validity bitmap is handed over
        return meta.get("kind") == "numpy" or not meta.get("validity")

    def segment_sums(self, version, meta, buffers, starts):
        # exact on the scaled integers while no sum can leave int64: n values below
        # (|base| + 2**(8 width)) each
        ints = meta["ints"]
        if meta.get("validity") or ints.get("form") != "for" \
                or ints.get("width") not in (0, 1, 2, 4):
            return None
        digits = meta["digits"]
        check(isinstance(digits, int) and 0 <= digits <= MAX_DIGITS,
              f"bad decimal digits {digits!r}")
        check(meta_dtype(ints) == np.int64, "scaled_float ints")
        base = int(np.uint64(ints["base"] % 2 ** 64).view(np.int64))
        if meta_length(ints) * (abs(base) + 2 ** (8 * ints["width"])) >= 1 << 63:
            return None
        sums = int_segment_sums(ints, buffers, starts)
        return None if sums is None else _back(sums, digits)

    def take(self, version, meta, buffers, rows):
        # the scaled integers gathered at the rows and divided: no decode of the column
        digits = meta["digits"]
        check(isinstance(digits, int) and 0 <= digits <= MAX_DIGITS,
              f"bad decimal digits {digits!r}")
        if meta["kind"] == "arrow" and meta["validity"]:
            return super().take(version, meta, buffers, rows)
        ints_meta = meta["ints"]
        check(meta_dtype(ints_meta) == np.int64, "scaled_float ints")
        floats = take_as_float(ints_meta, buffers, rows)
        if floats is None:
            ints = FOR.take(FOR.version, ints_meta, buffers, rows)
            check(ints.dtype == np.int64 and len(ints) == len(rows), "scaled_float ints")
            floats = _back(ints, digits)
        else:
            floats /= np.float64(10.0 ** digits)
        if meta["kind"] == "numpy":
            check(meta_dtype(meta) == np.float64, "scaled_float decodes float64 only")
            return floats
        check(meta["kind"] == "arrow", f"unknown kind {meta.get('kind')!r}")
        check(str_to_type(meta["type"]) == pa.float64(), "scaled_float decodes float64 only")
        return pa.Array.from_buffers(pa.float64(), len(rows), [None, pa.py_buffer(floats)],
                                     null_count=0)

    def decode_range(self, version, meta, buffers, start, stop):
        n = meta_length(meta)
        digits = meta["digits"]
        check(isinstance(digits, int) and 0 <= digits <= MAX_DIGITS,
              f"bad decimal digits {digits!r}")
        if meta["kind"] == "numpy":
            check(meta_dtype(meta) == np.float64, "scaled_float decodes float64 only")
            start, stop = clamp_range(n, start, stop)
            return _decode_floats(meta, buffers, start, stop, digits)
        check(meta["kind"] == "arrow", f"unknown kind {meta.get('kind')!r}")
        if (start, stop) != (0, None):
            return super().decode_range(version, meta, buffers, start, stop)
        check(str_to_type(meta["type"]) == pa.float64(), "scaled_float decodes float64 only")
        buffers = list(buffers)
        validity = pa.py_buffer(pop_validity(buffers, n)) if meta["validity"] else None
        floats = _decode_floats(meta, buffers, 0, n, digits)
        return pa.Array.from_buffers(pa.float64(), n, [validity, pa.py_buffer(floats)],
                                     null_count=-1 if validity is not None else 0)


def _decode_floats(meta, buffers, start, stop, digits) -> np.ndarray:
    """The floats of rows [start, stop): the scaled integers divided as the encoder
    checked. Narrow frame residuals convert straight to float64 (exact, see
    ``decode_as_float``) and are divided in place: one pass instead of widening to
    int64, adding the base and converting (4x faster on 2.5M values)."""
    ints_meta = meta["ints"]
    floats = decode_as_float(ints_meta, buffers, start, stop)
    if floats is None:
        ints = FOR.decode_range(FOR.version, ints_meta, buffers, start, stop)
        check(ints.dtype == np.int64 and len(ints) == stop - start, "scaled_float ints")
        return _back(ints, digits)
    check(meta_dtype(ints_meta) == np.int64, "scaled_float ints")
    floats /= np.float64(10.0 ** digits)
    return floats


SCALED_FLOAT = register(ScaledFloat())


class _OldName(ScaledFloat):
    """``scaled_float`` under the name it had until Arrow decimals got a codec of their
    own: page files written before name their regions' codec ``decimal``. Decodes only."""

    name = "decimal"

    def encode(self, values, **options):
        raise CodecError("codec 'decimal' is read-only: floats of few decimals are "
                         "written as 'scaled_float', Arrow decimals as 'arrow_decimal'")


register(_OldName())


def scaled_float_width(values) -> int | None:
    """Bytes per value ``scaled_float`` stores for ``values``, or None when it does not apply
    (for ``choose_codec``)."""
    digits = decimal_digits(values)
    if digits is None:
        return None
    x, valid = _floats(values)
    live = x if valid is None else x[valid]
    if len(live) == 0:
        return 0
    scale = 10.0 ** digits
    lo, hi = np.rint(live.min() * scale), np.rint(live.max() * scale)
    return narrow_uint(int(hi - lo)).itemsize if hi != lo else 0
