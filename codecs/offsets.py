"""offsets: monotone non-negative integer lists (bounds of keys and vals) in few bytes.

Forms, tried in order:

- ``const``: every value equal -> the value and the length in the metadata, no bytes.
- ``stride``: ``start + step * arange(n)`` -> three ints in the metadata, no bytes.
- ``runs``: few runs of equal deltas (the singleton-compressed ``0, 1, 1, ..., 1``) ->
  the first value and (delta, count) pairs in the metadata, no bytes.
- ``narrow``: u32 when the last value fits (0.5x of u64 input), else the input's width;
  decoded zero-copy when the width equals the input's.
- ``split`` (version 2): u32 until the first value >= 2**32, u64 from there on -- the
  seeds' "u32 until it must be u64": a list crossing 2**32 near its end pays 8 bytes
  only for the entries past the crossing, not for all of them.

The output dtype always equals the input's. Encodings in the forms of version 1 are
written as version 1 (any reader of that version decodes them); ``split`` is version 2.
"""

from __future__ import annotations

import numpy as np

from arrangedb.codecs.base import (
    Codec, Encoded, check, clamp_range, expect_buffers, meta_dtype, meta_length, numpy_meta,
    register, view_as,
)

MAX_META_RUNS = 32
_U32_TOP = 2**32


def is_offsets(values) -> bool:
    """A numpy integer array, non-decreasing and non-negative."""
    if not isinstance(values, np.ndarray) or values.ndim != 1 or values.dtype.kind not in "iu":
        return False
    if len(values) == 0:
        return True
    if values[0] < 0:
        return False
    return len(values) < 2 or not bool((values[1:] < values[:-1]).any())


class Offsets(Codec):
    name = "offsets"
    version = 2
    versions = (1, 2)

    def encode(self, values, **options):
        if not is_offsets(values):
            return None
        meta = numpy_meta(values)
        n = len(values)
        if n == 0 or values[0] == values[-1]:
            meta.update(form="const", value=int(values[0]) if n else 0)
            return Encoded(self.name, 1, meta, [])
        deltas = np.diff(values)
        cuts = np.flatnonzero(deltas[1:] != deltas[:-1]) + 1
        if len(cuts) == 0:
            meta.update(form="stride", start=int(values[0]), step=int(deltas[0]))
            return Encoded(self.name, 1, meta, [])
        if len(cuts) < MAX_META_RUNS:
            starts = np.concatenate([[0], cuts])
            counts = np.diff(np.concatenate([starts, [n - 1]]))
            meta.update(form="runs", first=int(values[0]),
                        deltas=[int(d) for d in deltas[starts]],
                        counts=[int(c) for c in counts])
            return Encoded(self.name, 1, meta, [])
        width = values.dtype.itemsize
        if width > 4 and int(values[-1]) < _U32_TOP:
            width = 4
        elif width > 4:
            # monotone: every value before the first one >= 2**32 fits in u32
            cut = int(np.searchsorted(values, values.dtype.type(_U32_TOP)))
            if cut:
                meta.update(form="split", cut=cut)
                return Encoded(self.name, 2, meta, [values[:cut].astype(np.uint32),
                                                    np.ascontiguousarray(values[cut:])])
        meta.update(form="narrow", width=width)
        stored = values if width == values.dtype.itemsize else values.astype(np.uint32)
        return Encoded(self.name, 1, meta, [np.ascontiguousarray(stored)])

    def decode(self, version, meta, buffers):
        n = meta_length(meta)
        return self.decode_range(version, meta, buffers, 0, n)

    def take(self, version, meta, buffers, rows):
        # strides and constants are computed at the rows, narrow offsets gathered from
        # their buffer: no decode of the whole list (a lookup's few keys of a part)
        check(meta["kind"] == "numpy", "offsets encode numpy arrays only")
        dt = meta_dtype(meta)
        check(dt.kind in "iu", "offsets of dtype {}", dt)
        form = meta["form"]
        if form == "stride":
            expect_buffers(buffers, 0)
            return _take_stride(dt, meta["start"], meta["step"], rows)
        if form == "const":
            expect_buffers(buffers, 0)
            return np.full(len(rows), meta["value"], dtype=dt)
        if form == "narrow":
            expect_buffers(buffers, 1)
            width = meta["width"]
            check(width in (1, 2, 4, 8), f"bad width {width!r}")
            stored_dt = dt if width == dt.itemsize else np.dtype(f"u{width}")
            stored = view_as(buffers[0], stored_dt, meta_length(meta), "offsets")[rows]
            return stored if stored_dt == dt else stored.astype(dt)
        if form == "split":
            head, tail, cut = _split_parts(version, meta, buffers, dt)
            out = np.empty(len(rows), dt)
            low = rows < cut
            out[low] = head[rows[low]]
            out[~low] = tail[rows[~low] - cut]
            return out
        return super().take(version, meta, buffers, rows)

    def decode_range(self, version, meta, buffers, start, stop):
        check(meta["kind"] == "numpy", "offsets encode numpy arrays only")
        dt = meta_dtype(meta)
        check(dt.kind in "iu", "offsets of dtype {}", dt)
        n = meta_length(meta)
        start, stop = clamp_range(n, start, stop)
        form = meta["form"]
        if form == "narrow":
            expect_buffers(buffers, 1)
            width = meta["width"]
            check(width in (1, 2, 4, 8), f"bad width {width!r}")
            stored_dt = dt if width == dt.itemsize else np.dtype(f"u{width}")
            stored = view_as(buffers[0], stored_dt, n, "offsets")[start:stop]
            return stored if stored_dt == dt else stored.astype(dt)
        if form == "split":
            head, tail, cut = _split_parts(version, meta, buffers, dt)
            out = np.empty(stop - start, dt)
            mid = min(max(cut, start), stop) - start     # where the tail begins in out
            out[:mid] = head[start:start + mid]
            out[mid:] = tail[max(start - cut, 0):max(stop - cut, 0)]
            return out
        expect_buffers(buffers, 0)
        if form == "const":
            return np.full(stop - start, meta["value"], dtype=dt)
        if form == "stride":
            return _stride(dt, meta["start"], meta["step"], start, stop)
        check(form == "runs", f"unknown offsets form {form!r}")
        deltas = np.array(meta["deltas"], dtype=dt)
        counts = np.array(meta["counts"], dtype=np.int64)
        check(len(deltas) == len(counts) and (counts >= 0).all()
              and int(counts.sum()) == max(n - 1, 0), "offsets runs do not add up")
        out = np.empty(n, dtype=dt)
        if n:
            out[0] = meta["first"]
            np.cumsum(np.repeat(deltas, counts), dtype=dt, out=out[1:])
            out[1:] += out[0]
        return out[start:stop]


def _split_parts(version, meta, buffers, dt: np.dtype):
    """The u32 head, the u64 tail and the cut of a ``split`` encoding, checked."""
    check(version >= 2, "offsets form 'split' needs version 2")
    check(dt.itemsize == 8, "split offsets of dtype {}", dt)
    expect_buffers(buffers, 2)
    n, cut = meta_length(meta), meta["cut"]
    check(type(cut) is int and 0 < cut <= n, f"bad split cut {cut!r}")
    return (view_as(buffers[0], np.uint32, cut, "offsets head"),
            view_as(buffers[1], dt, n - cut, "offsets tail"), cut)


def _take_stride(dt: np.dtype, first: int, step: int, rows: np.ndarray) -> np.ndarray:
    out = rows.astype(dt)
    out *= dt.type(step)
    out += dt.type(first)
    return out


def _stride(dt: np.dtype, first: int, step: int, start: int, stop: int) -> np.ndarray:
    if stop <= start:
        return np.empty(0, dt)
    lo = first + step * start
    hi = first + step * stop
    info = np.iinfo(dt)
    if step > 0 and info.min <= lo and hi <= min(info.max, 2**63 - 1):
        return np.arange(lo, hi, step, dtype=dt)
    out = np.arange(stop - start, dtype=dt)
    out *= dt.type(step)
    out += dt.type(lo)
    return out


OFFSETS = register(Offsets())
