"""const: a column whose valid values are all one value, stored as that value.

Design
------
The value is kept as a one-element array in the plain encoding (a few bytes), the
length in the metadata, and the validity bitmap (n/8 bytes) only when some rows, but
not all, are null: a constant string, flag or float column costs ~0 bytes however long
it is. An all-null column stores nothing but its type and length. Buffers:
``[validity?, *the value's plain buffers]`` (none when all null).

Applies to numpy arrays of any numeric dtype and Arrow arrays of flat types (booleans,
fixed-width, strings and binaries); equality is by bytes (NaN payloads and -0.0 are
kept). Decoding repeats the value (``pa.repeat``, a fill in C) and puts the validity
bitmap back.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrangedb.codecs.base import (
    Codec, Encoded, arrow_meta, binary_offset_dtype, check, clamp_range, expect_buffers,
    is_arrow, meta_dtype, meta_length, normalize_arrow, numpy_meta, pop_validity, register,
    str_to_type, valid_mask, validity_of,
)
from arrangedb.codecs.plain import flat_kind, decode_parts, encode_parts


def _same_bytes(rows: np.ndarray) -> bool:
    """Whether every row of a 2-D uint8 array equals the first."""
    return len(rows) == 0 or not (rows != rows[0]).any()


def constant_value(values):
    """The index of the first valid element when every valid element equals it (-1 when
    all are null), else None. Compares bytes; vectorized."""
    n = len(values)
    if n == 0:
        return None
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or values.dtype.kind not in "iufcbmM":
            return None
        return 0 if _same_bytes(values.view(np.uint8).reshape(n, -1)) else None
    if not is_arrow(values):
        return None
    arr = normalize_arrow(values)
    kind = flat_kind(arr.type)
    if kind is None:
        return None
    if arr.null_count == n:
        return -1
    valid = valid_mask(arr)
    first = 0 if valid is None else int(np.argmax(valid))
    if kind == "bool":
        lo, hi = pc.min_max(arr).values()
        return first if lo.as_py() == hi.as_py() else None
    if kind == "fixed":
        width = arr.type.bit_width // 8
        rows = np.frombuffer(arr.buffers()[1], np.uint8, count=n * width).reshape(n, width)
        return first if _same_bytes(rows if valid is None else rows[valid]) else None
    same = pc.equal(arr, arr[first])      # nulls stay null and are skipped by all()
    return first if pc.all(same).as_py() else None


class Constant(Codec):
    name = "const"

    def encode(self, values, **options):
        first = constant_value(values)
        if first is None:
            return None
        if isinstance(values, np.ndarray):
            vmeta, vbufs = encode_parts(values[:1].copy())
            meta = numpy_meta(values)
            meta["value"] = vmeta
            return Encoded(self.name, self.version, meta, vbufs)
        arr = normalize_arrow(values)
        meta = arrow_meta(arr)
        if first < 0:     # all null: nothing to store
            meta.update(validity=False, all_null=True)
            return Encoded(self.name, self.version, meta, [])
        validity = validity_of(arr)
        vmeta, vbufs = encode_parts(arr.slice(first, 1))
        meta.update(validity=validity is not None, all_null=False, value=vmeta)
        return Encoded(self.name, self.version, meta,
                       ([validity] if validity is not None else []) + vbufs)

    def decodes_fresh(self, meta) -> bool:
        return not meta.get("validity")

    def decode(self, version, meta, buffers):
        return self.decode_range(version, meta, buffers, 0, None)

    def take(self, version, meta, buffers, rows):
        # the value repeated len(rows) times: a lookup's few rows never fill the column
        if meta["kind"] == "numpy" or not meta["validity"]:
            return self.decode_range(version, dict(meta, length=len(rows)), buffers, 0, None)
        return super().take(version, meta, buffers, rows)

    def decode_range(self, version, meta, buffers, start, stop):
        n = meta_length(meta)
        start, stop = clamp_range(n, start, stop)
        if meta["kind"] == "numpy":
            value = decode_parts(meta["value"], list(buffers))
            dt = meta_dtype(meta)
            check(isinstance(value, np.ndarray) and value.dtype == dt and len(value) == 1,
                  "const value does not match the metadata")
            return np.repeat(value, stop - start)
        check(meta["kind"] == "arrow", f"unknown kind {meta.get('kind')!r}")
        t = str_to_type(meta["type"])
        check(flat_kind(t) is not None, "type {} cannot be stored const", t)
        if meta["all_null"]:
            expect_buffers(buffers, 0)
            return pa.nulls(stop - start, t)
        buffers = list(buffers)
        bitmap = pop_validity(buffers, n) if meta["validity"] else None
        value = decode_parts(meta["value"], buffers)
        check(value.type == t and len(value) == 1 and value.null_count == 0,
              "const value does not match the metadata")
        if bitmap is None:
            return pa.repeat(value[0], stop - start)
        filled = pa.repeat(value[0], n)
        bufs = filled.buffers()
        if binary_offset_dtype(t) is not None:
            # offsets of the repeated value under every row, as Arrow lays them out; the
            # validity bitmap alone marks the nulls
            out = pa.Array.from_buffers(t, n, [pa.py_buffer(bitmap)] + bufs[1:], null_count=-1)
        else:
            out = pa.Array.from_buffers(t, n, [pa.py_buffer(bitmap), bufs[1]], null_count=-1)
        return out.slice(start, stop - start) if (start, stop) != (0, n) else out


CONST = register(Constant())
