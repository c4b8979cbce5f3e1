"""What every codec shares: the ``Encoded`` result, ``CodecError``, the registry, helpers.

Design
------
A codec is an object with a ``name``, the ``versions`` it can decode, the ``version`` it
writes, and three functions: ``encode(values, **options)`` (``None`` when the codec does not
apply to ``values``, so the caller falls back to ``plain``), ``decode(version, meta,
buffers)`` and ``decode_range(version, meta, buffers, start, stop)``. Metadata is a
JSON-serializable dict; buffers are bytes-like objects. Arrow types travel in the metadata
as a one-field IPC schema in base64, which parses back exactly (timezones, units and all).
"""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa


class CodecError(ValueError):
    """An encoding that cannot be decoded: unknown codec or version, short or corrupt buffers."""


@dataclass
class Encoded:
    """One encoded column: decode it with ``decode(codec, version, meta, buffers)``."""

    codec: str
    version: int
    meta: dict
    buffers: list = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Bytes of all buffers (what the encoding costs on disk, metadata aside)."""
        return sum(buffer_nbytes(b) for b in self.buffers)


class Codec:
    """Base of the codecs: subclasses set ``name`` and implement encode and decode."""

    name = "?"
    version = 1
    versions = (1,)

    def encode(self, values, **options):  # pragma: no cover - interface
        raise NotImplementedError

    def decode(self, version, meta, buffers):  # pragma: no cover - interface
        raise NotImplementedError

    def decodes_fresh(self, meta) -> bool:
        """Whether a decode of this encoding only ever returns new arrays, never views
        of the buffers it reads (a reader of mapped pages need not copy them first)."""
        return False

    def segment_sums(self, version, meta, buffers, starts: np.ndarray):
        """Sums of the values over segments, from the encoding itself (see
        ``codecs.segment_sums``); None, the default, when the codec does not know how."""
        return None

    def decode_range(self, version, meta, buffers, start, stop):
        """Elements [start, stop): by default a full decode and a slice."""
        return slice_values(self.decode(version, meta, buffers), start, stop)

    def take(self, version, meta, buffers, rows: np.ndarray):
        """Elements at ``rows`` (int64, in range): by default a full decode and a take."""
        values = self.decode(version, meta, buffers)
        return values.take(pa.array(rows)) if isinstance(values, pa.Array) else values[rows]


REGISTRY: dict[str, Codec] = {}


def register(codec: Codec) -> Codec:
    REGISTRY[codec.name] = codec
    return codec


def lookup(name, version=None) -> Codec:
    """The codec called ``name``; CodecError naming codec and version when unknown."""
    codec = REGISTRY.get(name) if isinstance(name, str) else None
    if codec is None:
        raise CodecError(f"unknown codec {name!r} (version {version!r}); "
                         f"known codecs: {', '.join(sorted(REGISTRY))}")
    if version is not None and (isinstance(version, bool) or version not in codec.versions):
        raise CodecError(f"codec {name!r} version {version!r} is not supported "
                         f"(supported versions: {', '.join(map(str, codec.versions))})")
    return codec


# -- inputs ------------------------------------------------------------------------------

def is_arrow(values) -> bool:
    return isinstance(values, pa.Array)


def normalize_arrow(arr: pa.Array) -> pa.Array:
    """``arr`` with offset 0 (a copy only for slices), so its buffers start at element 0."""
    if arr.offset != 0:
        arr = pa.concat_arrays([arr])
    return arr


def binary_offset_dtype(t: pa.DataType):
    """numpy dtype of the offsets of a string/binary type, or None for other types."""
    if pa.types.is_string(t) or pa.types.is_binary(t):
        return np.dtype(np.int32)
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return np.dtype(np.int64)
    return None


def int_storage_dtype(t: pa.DataType):
    """numpy dtype holding an integer-like Arrow type (ints, dates, times, timestamps...)."""
    if pa.types.is_integer(t):
        return np.dtype(t.to_pandas_dtype())
    if (pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_time(t)
            or pa.types.is_duration(t)):
        return np.dtype(f"i{t.bit_width // 8}")
    return None


def validity_of(arr: pa.Array):
    """The trimmed validity bitmap of an offset-0 array, or None when it has no nulls."""
    if arr.null_count == 0:
        return None
    return arr.buffers()[0].slice(0, (len(arr) + 7) // 8)


def valid_mask(arr: pa.Array):
    """Boolean numpy mask of the valid slots of an offset-0 array (None: all valid)."""
    bitmap = validity_of(arr)
    if bitmap is None:
        return None
    bits = np.unpackbits(np.frombuffer(bitmap, np.uint8), bitorder="little")
    return bits[: len(arr)].astype(bool)


# -- buffers -----------------------------------------------------------------------------

def buffer_nbytes(buf) -> int:
    if isinstance(buf, np.ndarray):
        return buf.nbytes
    if isinstance(buf, pa.Buffer):
        return buf.size
    return memoryview(buf).nbytes


def as_u8(buf) -> np.ndarray:
    """A read-only-or-not uint8 view of a bytes-like object, without copying."""
    if isinstance(buf, np.ndarray):
        if buf.dtype == np.uint8 and buf.ndim == 1:
            return buf
        if not buf.flags.c_contiguous:
            raise CodecError("buffer is not contiguous")
        return buf.reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(buf, dtype=np.uint8)
    except (TypeError, ValueError) as exc:
        if isinstance(buf, memoryview):
            return np.frombuffer(buf.cast("B"), dtype=np.uint8)
        raise CodecError(f"not a bytes-like buffer: {type(buf).__name__}") from exc


def view_as(buf, dtype, count: int, what: str = "buffer") -> np.ndarray:
    """``count`` items of ``dtype`` over exactly the bytes of ``buf`` (CodecError if short)."""
    u8 = as_u8(buf)
    dtype = np.dtype(dtype)
    need = count * dtype.itemsize
    if u8.nbytes != need:
        raise CodecError(f"{what}: expected {need} bytes, got {u8.nbytes}")
    return u8.view(dtype) if need else np.empty(0, dtype)


def pop_validity(buffers: list, n: int) -> np.ndarray:
    """The validity bitmap heading ``buffers`` (removed from the list), checked to cover
    ``n`` rows."""
    check(buffers, "missing validity bitmap")
    bitmap = as_u8(buffers.pop(0))
    check(bitmap.nbytes >= (n + 7) // 8, "validity bitmap is short")
    return bitmap


def expect_buffers(buffers, count: int):
    if len(buffers) != count:
        raise CodecError(f"expected {count} buffers, got {len(buffers)}")


def check(cond, message: str, *args):
    """CodecError(``message``) unless ``cond``; ``args`` are formatted into the message
    only then (a numpy dtype's str costs microseconds on every decode otherwise)."""
    if not cond:
        raise CodecError(message.format(*args) if args else message)


def slice_values(values, start, stop):
    n = len(values)
    start, stop, _ = slice(start, stop).indices(n)
    stop = max(stop, start)
    if isinstance(values, np.ndarray):
        return values[start:stop]
    return values.slice(start, stop - start)


def clamp_range(n: int, start, stop) -> tuple[int, int]:
    start, stop, _ = slice(start, stop).indices(n)
    return start, max(stop, start)


def narrow_uint(max_value: int) -> np.dtype:
    """The narrowest unsigned dtype holding ``max_value`` (u1 for 0)."""
    for dt in (np.uint8, np.uint16, np.uint32, np.uint64):
        if max_value <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise CodecError(f"value {max_value} does not fit 64 bits")


# -- Arrow types in metadata ---------------------------------------------------------------

def type_to_str(t: pa.DataType) -> str:
    schema = pa.schema([pa.field("v", t)])
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


@functools.lru_cache(maxsize=512)
def str_to_type(s: str) -> pa.DataType:
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(s, validate=True)))
    except Exception as exc:  # noqa: BLE001 - any parse failure is a corrupt meta
        raise CodecError(f"cannot parse the Arrow type in the metadata: {exc}") from exc
    check(len(schema) == 1, "the Arrow type in the metadata is not a one-field schema")
    return schema.field(0).type


def arrow_meta(arr: pa.Array) -> dict:
    return {"kind": "arrow", "type": type_to_str(arr.type), "type_str": str(arr.type),
            "length": len(arr), "null_count": arr.null_count}


def numpy_meta(values: np.ndarray) -> dict:
    return {"kind": "numpy", "dtype": values.dtype.str, "length": int(values.shape[0])}


def meta_length(meta) -> int:
    n = meta["length"]
    check(type(n) is int and n >= 0, "bad length {!r}", n)
    return n


def meta_dtype(meta) -> np.dtype:
    dt = np.dtype(meta["dtype"])
    check(dt.kind not in "OV" and dt.itemsize > 0, "unsupported dtype {!r}", meta["dtype"])
    return dt
