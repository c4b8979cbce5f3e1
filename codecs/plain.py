"""plain: the array's own bytes, decoded zero-copy over the given buffers.

Design
------
numpy arrays are stored as their raw bytes. Arrow arrays of flat types (booleans,
fixed-width, string/binary and their large variants) are stored as their buffers, trimmed
to the array's length and with the offset normalized to 0: ``[validity?] + data buffers``.
Other Arrow types (nested, dictionary, views, null) go through a one-batch IPC stream.

Strings and binaries whose values all have one length ``w`` (hashes, fixed-size ids,
codes) are stored ``stride`` (version 2): the data buffer alone, the offsets computed
at decode (``arange(n + 1) * w``, or ``w`` times the running count of valid rows when
null slots are empty). Other strings keep Arrow's offsets.
The other codecs reuse ``encode_parts``/``decode_parts`` for their dictionaries and the
``zstd`` codec compresses exactly these buffers.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from arrangedb.codecs.base import (
    Codec, Encoded, as_u8, arrow_meta, binary_offset_dtype, check, clamp_range, expect_buffers,
    is_arrow, meta_dtype, meta_length, normalize_arrow, numpy_meta, pop_validity, register,
    str_to_type, valid_mask, validity_of, view_as,
)


def flat_kind(t: pa.DataType):
    """'bool', 'fixed', 'binary' or None (stored through IPC)."""
    if pa.types.is_boolean(t):
        return "bool"
    if binary_offset_dtype(t) is not None:
        return "binary"
    if pa.types.is_dictionary(t) or isinstance(t, pa.ExtensionType) or pa.types.is_null(t):
        return None
    if t.num_fields:
        return None
    try:
        bw = t.bit_width
    except ValueError:
        return None
    return "fixed" if bw % 8 == 0 and bw > 0 else None


def encode_parts(values) -> tuple[dict, list]:
    """(meta, buffers) of the plain encoding of a numpy or Arrow array."""
    if isinstance(values, np.ndarray):
        check(values.ndim == 1, f"expected a 1-D array, got {values.ndim} dimensions")
        check(values.dtype.kind not in "OV", "cannot store numpy dtype {}", values.dtype)
        return numpy_meta(values), [np.ascontiguousarray(values)]
    check(is_arrow(values), f"cannot encode {type(values).__name__}")
    arr = normalize_arrow(values)
    meta = arrow_meta(arr)
    n = len(arr)
    kind = flat_kind(arr.type)
    if kind is None:
        return _encode_ipc(arr, meta)
    validity = validity_of(arr)
    meta["layout"] = "flat"
    meta["validity"] = validity is not None
    bufs = arr.buffers()
    out = [validity] if validity is not None else []
    if kind == "bool":
        out.append(_trim(bufs[1], (n + 7) // 8))
    elif kind == "fixed":
        out.append(_trim(bufs[1], n * arr.type.bit_width // 8))
    else:
        odt = binary_offset_dtype(arr.type)
        offsets = (np.frombuffer(bufs[1], odt, count=n + 1) if bufs[1] is not None and n
                   else np.zeros(1, odt))
        if offsets[0] != 0:  # offset-0 array over shared data: rebuild it compactly
            rebuilt = pa.concat_arrays([arr])
            if np.frombuffer(rebuilt.buffers()[1], odt, count=1)[0] != 0:
                return _encode_ipc(arr, meta)
            return encode_parts(rebuilt)
        width = _common_width(offsets, arr, validity)
        if width is not None:
            meta.update(layout="stride", width=width[0], nulls_empty=width[1])
            out.append(_trim(bufs[2], int(offsets[-1])))
            return meta, out
        out.append(offsets if n == 0 else bufs[1].slice(0, (n + 1) * odt.itemsize))
        out.append(_trim(bufs[2], int(offsets[-1])))
    return meta, out


def _common_width(offsets: np.ndarray, arr: pa.Array, validity) -> tuple[int, bool] | None:
    """(w, nulls_empty) when every value is ``w`` bytes long -- null slots too, or null
    slots all empty (``nulls_empty``) -- else None. Empty arrays have width 0."""
    n = len(arr)
    if n == 0:
        return 0, False
    lengths = np.diff(offsets)
    if validity is None:
        w = int(lengths[0])
        return (w, False) if not (lengths != w).any() else None
    valid = valid_mask(arr)
    live = lengths[valid]
    w = int(live[0]) if len(live) else 0
    if (live != w).any():
        return None
    if not lengths[~valid].any():
        return w, True
    return (w, False) if not (lengths[~valid] != w).any() else None


def plain_version(meta: dict) -> int:
    """The version of the plain codec an encoding with this metadata needs."""
    return 2 if meta.get("layout") == "stride" else 1


def _trim(buf, nbytes: int):
    if buf is None:
        check(nbytes == 0, "missing buffer")
        return b""
    return buf.slice(0, nbytes) if buf.size != nbytes else buf


def _encode_ipc(arr: pa.Array, meta: dict) -> tuple[dict, list]:
    meta["layout"] = "ipc"
    batch = pa.record_batch([arr], names=["v"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return meta, [sink.getvalue()]


def decode_parts(meta: dict, buffers: list):
    """The array of a plain (meta, buffers) pair, zero-copy over ``buffers``."""
    n = meta_length(meta)
    if meta["kind"] == "numpy":
        expect_buffers(buffers, 1)
        return view_as(buffers[0], meta_dtype(meta), n, "plain data")
    check(meta["kind"] == "arrow", f"unknown kind {meta.get('kind')!r}")
    t = str_to_type(meta["type"])
    if meta["layout"] == "ipc":
        return _decode_ipc(t, n, buffers)
    if meta["layout"] == "stride":
        return _decode_stride(t, n, meta, buffers)
    check(meta["layout"] == "flat", f"unknown layout {meta.get('layout')!r}")
    kind = flat_kind(t)
    check(kind is not None, "type {} cannot have a flat layout", t)
    has_validity = bool(meta["validity"])
    expect_buffers(buffers, has_validity + (2 if kind == "binary" else 1))
    bufs = [as_u8(b) for b in buffers]
    validity = pa.py_buffer(pop_validity(bufs, n)) if has_validity else None
    if kind == "bool":
        check(bufs[0].nbytes >= (n + 7) // 8, "boolean data is short")
        data = [pa.py_buffer(bufs[0])]
    elif kind == "fixed":
        check(bufs[0].nbytes == n * t.bit_width // 8, "fixed-width data has the wrong size")
        data = [pa.py_buffer(bufs[0])]
    else:
        odt = binary_offset_dtype(t)
        offsets = view_as(bufs[0], odt, n + 1, "offsets")
        check(offsets[0] == 0 and offsets[-1] == bufs[1].nbytes,
              "offsets do not span the data buffer")
        check(n == 0 or not (offsets[1:] < offsets[:-1]).any(), "offsets are not monotone")
        data = [pa.py_buffer(bufs[0]), pa.py_buffer(bufs[1])]
    return pa.Array.from_buffers(t, n, [validity] + data,
                                 null_count=-1 if has_validity else 0)


def _decode_stride(t: pa.DataType, n: int, meta: dict, buffers: list):
    """Strings of one length: offsets computed, data as stored (zero-copy)."""
    odt = binary_offset_dtype(t)
    check(odt is not None, "type {} cannot have a stride layout", t)
    w, has_validity = meta["width"], bool(meta["validity"])
    check(type(w) is int and w >= 0, f"bad stride width {w!r}")
    expect_buffers(buffers, has_validity + 1)
    bufs = [as_u8(b) for b in buffers]
    bitmap = pop_validity(bufs, n) if has_validity else None
    data = bufs[0]
    check(n * w <= np.iinfo(odt).max, "stride strings overflow their offsets")
    if has_validity and meta["nulls_empty"]:
        valid = np.unpackbits(bitmap[: (n + 7) // 8], bitorder="little")[:n]
        offsets = np.zeros(n + 1, odt)
        np.cumsum(valid, dtype=odt, out=offsets[1:])
        offsets *= odt.type(w)
    else:
        offsets = np.arange(0, (n + 1) * w, w, dtype=odt) if w else np.zeros(n + 1, odt)
    check(int(offsets[-1]) == data.nbytes, "stride data has the wrong size")
    validity = pa.py_buffer(bitmap) if has_validity else None
    return pa.Array.from_buffers(t, n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=-1 if has_validity else 0)


def _decode_ipc(t: pa.DataType, n: int, buffers: list):
    expect_buffers(buffers, 1)
    reader = pa.ipc.open_stream(pa.py_buffer(as_u8(buffers[0])))
    chunks = [b.column(0) for b in reader]
    check(reader.schema.field(0).type == t, "IPC type does not match the metadata")
    arr = pa.concat_arrays(chunks) if len(chunks) != 1 else chunks[0]
    check(len(arr) == n, f"IPC length {len(arr)} != {n}")
    arr.validate(full=True)
    return arr


class Plain(Codec):
    """The array's bytes as they are; the fallback of every other codec."""

    name = "plain"
    version = 2
    versions = (1, 2)

    def encode(self, values, **options):
        meta, buffers = encode_parts(values)
        return Encoded(self.name, plain_version(meta), meta, buffers)

    def decode(self, version, meta, buffers):
        return decode_parts(meta, buffers)

    def decode_range(self, version, meta, buffers, start, stop):
        if meta.get("kind") == "numpy":
            n = meta_length(meta)
            start, stop = clamp_range(n, start, stop)
            return decode_parts(meta, buffers)[start:stop]
        return super().decode_range(version, meta, buffers, start, stop)


PLAIN = register(Plain())
