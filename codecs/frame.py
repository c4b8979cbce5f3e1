"""for: frame of reference for integer columns -- a base plus narrow unsigned residuals.

Design
------
``values - min`` is computed in the unsigned type of the input's width (wrapping), which is
exact because the true difference lies in ``[0, 2**bits)``; it is then narrowed to the
smallest of u8/u16/u32/u64 that holds ``max - min`` (no bytes at all when every value is
equal). Sorted input without nulls whose values need more than a byte may instead
store its first value and the narrow deltas (``delta`` form), whichever is smaller, or,
when every delta is the same (dense ids), its first value and that step alone
(``stride`` form, decoded by ``arange``). Arrow integer-like types (ints, dates,
times, timestamps, durations) keep their nulls as a validity bitmap; the residual under a
null is 0.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from arrangedb.codecs.base import (
    Codec, Encoded, arrow_meta, check, clamp_range, expect_buffers, int_storage_dtype,
    is_arrow, meta_dtype, meta_length, narrow_uint, normalize_arrow, numpy_meta, pop_validity,
    register, str_to_type, valid_mask, validity_of, view_as,
)


def int_values(values):
    """(numpy integer values, valid mask or None, meta) of an applicable input, else None."""
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or values.dtype.kind not in "iu":
            return None
        return values, None, numpy_meta(values)
    if not is_arrow(values):
        return None
    dt = int_storage_dtype(values.type)
    if dt is None:
        return None
    arr = normalize_arrow(values)
    n = len(arr)
    data = arr.buffers()[1]
    raw = np.frombuffer(data, dt, count=n) if n else np.empty(0, dt)
    meta = arrow_meta(arr)
    return raw, valid_mask(arr), meta, arr


def _unsigned(dt: np.dtype) -> np.dtype:
    return np.dtype(f"u{dt.itemsize}")


def for_plan(vals: np.ndarray, valid) -> dict:
    """Sizes and parameters of the FOR and delta forms (shared with ``choose_codec``)."""
    n = len(vals)
    live = vals if valid is None else vals[valid]
    if len(live) == 0:
        return {"form": "for", "base": 0, "width": 0, "span": 0, "nbytes": 0}
    lo, hi = int(live.min()), int(live.max())
    width = narrow_uint(hi - lo).itemsize if hi != lo else 0
    plan = {"form": "for", "base": lo, "width": width, "span": hi - lo, "nbytes": n * width}
    if valid is None and n > 2 and width > 1 and not (vals[1:] < vals[:-1]).any():
        u = _unsigned(vals.dtype)
        deltas = np.diff(vals.view(u))
        step = int(deltas[0])
        if int(deltas.max()) == step == int(deltas.min()):   # dense ids: no bytes at all
            return {"form": "stride", "base": int(vals[0]), "step": step, "width": 0,
                    "nbytes": 0}
        dwidth = narrow_uint(int(deltas.max())).itemsize
        if (n - 1) * dwidth < plan["nbytes"]:
            plan = {"form": "delta", "base": int(vals[0]), "width": dwidth,
                    "nbytes": (n - 1) * dwidth, "deltas": deltas}
    return plan


class FrameOfReference(Codec):
    name = "for"

    def encode(self, values, **options):
        got = int_values(values)
        if got is None:
            return None
        vals, valid, meta = got[:3]
        plan = for_plan(vals, valid)
        meta.update(form=plan["form"], base=plan["base"], width=plan["width"])
        if plan["form"] == "for":
            meta["span"] = plan["span"]   # the largest residual (for segment sums)
        if plan["form"] == "stride":
            meta["step"] = plan["step"]
        buffers = []
        if is_arrow(values):
            bitmap = validity_of(got[3])
            meta["validity"] = bitmap is not None
            if bitmap is not None:
                buffers.append(bitmap)
        u = _unsigned(vals.dtype)
        if plan["form"] == "delta":
            buffers.append(plan["deltas"].astype(f"u{plan['width']}"))
        elif plan["width"]:
            resid = vals.view(u) - u.type(plan["base"] % 2 ** (8 * u.itemsize))
            if valid is not None:
                resid[~valid] = 0
            buffers.append(resid.astype(f"u{plan['width']}", copy=False))
        return Encoded(self.name, self.version, meta, buffers)

    def decode(self, version, meta, buffers):
        return self.decode_range(version, meta, buffers, 0, None)

    def decodes_fresh(self, meta) -> bool:
        # values are computed (widened, summed, multiplied); an Arrow validity bitmap is
        # handed over as it is stored
        return meta.get("kind") == "numpy" or not meta.get("validity")

    def segment_sums(self, version, meta, buffers, starts):
        return int_segment_sums(meta, buffers, starts)

    def take(self, version, meta, buffers, rows):
        # residuals are gathered at the rows and strides computed there: a lookup's rows
        # of a part cost their own number, not a decode of the column
        if meta["kind"] == "numpy":
            dt = meta_dtype(meta)
            check(dt.kind in "iu", "for cannot decode dtype {}", dt)
            vals = _take_values(dt, meta, buffers, rows)
            return super().take(version, meta, buffers, rows) if vals is None else vals
        check(meta["kind"] == "arrow", f"unknown kind {meta.get('kind')!r}")
        t = str_to_type(meta["type"])
        dt = int_storage_dtype(t)
        check(dt is not None, "for cannot decode type {}", t)
        vals = None if meta["validity"] else _take_values(dt, meta, buffers, rows)
        if vals is None:   # nulls (a bitmap to gather) or deltas: decode, then take
            return super().take(version, meta, buffers, rows)
        return pa.Array.from_buffers(t, len(rows), [None, pa.py_buffer(vals)], null_count=0)

    def decode_range(self, version, meta, buffers, start, stop):
        n = meta_length(meta)
        if meta["kind"] == "numpy":
            start, stop = clamp_range(n, start, stop)
            dt = meta_dtype(meta)
            check(dt.kind in "iu", "for cannot decode dtype {}", dt)
            return _decode_values(dt, meta, buffers, n, start, stop)
        check(meta["kind"] == "arrow", f"unknown kind {meta.get('kind')!r}")
        if (start, stop) != (0, None):  # Arrow slices keep the bitmap: decode, slice zero-copy
            return super().decode_range(version, meta, buffers, start, stop)
        t = str_to_type(meta["type"])
        dt = int_storage_dtype(t)
        check(dt is not None, "for cannot decode type {}", t)
        buffers = list(buffers)
        validity = pa.py_buffer(pop_validity(buffers, n)) if meta["validity"] else None
        vals = _decode_values(dt, meta, buffers, n, 0, n)
        return pa.Array.from_buffers(t, n, [validity, pa.py_buffer(vals)],
                                     null_count=-1 if validity is not None else 0)


def int_segment_sums(meta, buffers, starts: np.ndarray) -> np.ndarray | None:
    """Per-segment int64 sums of a frame-of-reference encoding without nulls: the narrow
    residuals summed straight from their buffer (no int64 or float64 copy decoded
    first), plus base times each segment's length; None for other forms, nulls or
    8-byte residuals."""
    if meta.get("form") != "for" or meta.get("validity") or meta.get("width") not in (0, 1, 2, 4):
        return None
    dt = meta_dtype(meta) if meta["kind"] == "numpy" else int_storage_dtype(
        str_to_type(meta["type"]))
    check(dt is not None and dt.kind in "iu", "for sums integers only")
    bits = 8 * dt.itemsize
    base = meta["base"] % 2 ** bits
    if dt.kind == "i" and base >= 2 ** (bits - 1):
        base -= 2 ** bits
    base = np.uint64(base % 2 ** 64).view(np.int64)   # int64 arithmetic wraps, as the sum would
    n = meta_length(meta)
    if not len(starts):
        return np.zeros(0, np.int64)
    edges = np.empty(len(starts) + 1, np.int64)
    edges[:-1] = starts
    edges[-1] = n
    lengths = edges[1:] - edges[:-1]
    if meta["width"] == 0:
        expect_buffers(buffers, 0)
        return lengths * base
    expect_buffers(buffers, 1)
    resid = view_as(buffers[0], f"u{meta['width']}", n, "for residuals")
    # A running sum and one difference per segment: reduceat pays ~20 ns per segment,
    # three times this when segments are short (a key's few rows). The running sum wraps,
    # and the differences with it: int64 gives each sum modulo 2**64, as adding the
    # values would; uint32 (a third faster) gives it exactly when no segment's residuals
    # can reach 2**32, which the largest residual (``span``, recorded since) tells.
    span = meta.get("span")
    narrow = isinstance(span, int) and int(lengths.max()) * span < 1 << 32
    acc = np.uint32 if narrow else np.int64
    running = np.empty(n + 1, acc)
    running[0] = 0
    np.cumsum(resid, dtype=acc, out=running[1:])
    at_edges = running[edges]
    sums = at_edges[1:] - at_edges[:-1]
    if narrow:
        sums = sums.astype(np.int64)
    sums += lengths * base
    return sums


def decode_as_float(meta, buffers, start, stop) -> np.ndarray | None:
    """Elements [start, stop) of a frame-of-reference int64 encoding as float64, in one
    conversion from the narrow residuals (no int64 copy), when that is exact: residuals
    of at most 4 bytes and a base whose sum with any of them stays below 2**53 -- every
    value is then an integer float64 holds exactly, and so is each addition. Else None.
    """
    return _as_float(meta, buffers, slice(start, stop))


def take_as_float(meta, buffers, rows: np.ndarray) -> np.ndarray | None:
    """:func:`decode_as_float` at ``rows``: the narrow residuals gathered and converted
    in one step, when that is exact; else None."""
    return _as_float(meta, buffers, rows)


def _as_float(meta, buffers, at) -> np.ndarray | None:
    """The residuals at ``at`` (a slice or rows) plus the base, as float64, if exact."""
    if meta.get("form") != "for" or meta.get("width") not in (1, 2, 4):
        return None
    width = meta["width"]
    base = int(np.uint64(meta["base"] % 2 ** 64).view(np.int64))
    if not -(1 << 53) < base < (1 << 53) - (1 << (8 * width)):
        return None
    expect_buffers(buffers, 1)
    residuals = view_as(buffers[0], f"u{width}", meta_length(meta), "for residuals")[at]
    # widened and offset in one pass (the same float64 sum as converting, then adding)
    return np.add(residuals, np.float64(base), dtype=np.float64) if base else \
        residuals.astype(np.float64)


def _take_values(dt, meta, buffers, rows: np.ndarray) -> np.ndarray | None:
    """The values at ``rows`` of the ``for`` and ``stride`` forms; None for ``delta``
    (a running sum: the prefix must be decoded)."""
    if meta["form"] == "delta":
        return None
    return _values_at(dt, meta, buffers, meta_length(meta), rows)


def _values_at(dt, meta, buffers, n, at) -> np.ndarray:
    """The ``for`` or ``stride`` form's values at ``at``: a slice (with bounds) or rows."""
    u = _unsigned(dt)
    width = meta["width"]
    check(width in (0, 1, 2, 4, 8) and width <= dt.itemsize, f"bad width {width!r}")
    base = u.type(meta["base"] % 2 ** (8 * u.itemsize))
    sliced = isinstance(at, slice)
    if meta["form"] == "for":
        if width == 0:
            expect_buffers(buffers, 0)
            return np.full(at.stop - at.start if sliced else len(at), base, dtype=u).view(dt)
        expect_buffers(buffers, 1)
        out = view_as(buffers[0], f"u{width}", n, "for residuals")[at].astype(u)
        out += base
        return out.view(dt)
    if meta["form"] == "stride":   # base, base + step, ...: sorted input, constant gaps
        expect_buffers(buffers, 0)
        step = meta["step"]
        check(type(step) is int and 0 <= step < 2 ** (8 * u.itemsize), f"bad step {step!r}")
        check(width == 0 and not meta.get("validity"), "stride form with residuals or nulls")
        out = np.arange(at.start, at.stop, dtype=u) if sliced else at.astype(u)
        out *= u.type(step)
        out += base
        return out.view(dt)
    check(meta["form"] == "delta", f"unknown for form {meta['form']!r}")
    return None


def _decode_values(dt, meta, buffers, n, start, stop) -> np.ndarray:
    if meta["form"] != "delta":
        return _values_at(dt, meta, buffers, n, slice(start, stop))
    u = _unsigned(dt)
    width = meta["width"]
    check(width in (0, 1, 2, 4, 8) and width <= dt.itemsize, f"bad width {width!r}")
    base = u.type(meta["base"] % 2 ** (8 * u.itemsize))
    expect_buffers(buffers, 1)
    deltas = view_as(buffers[0], f"u{width}", max(n - 1, 0), "for deltas")
    out = np.empty(stop, dtype=u)
    if stop:
        out[0] = base
        np.cumsum(deltas[: stop - 1], dtype=u, out=out[1:])
        out[1:] += base
    return out[start:].view(dt)


FOR = register(FrameOfReference())
