"""Spark's hash partitioning, reproduced over Arrow data with numpy.

``df.repartition(n, k1, k2, ...)`` sends a row to partition
``pmod(hash(k1, k2, ...), n)``, where ``hash`` is Spark's ``Murmur3Hash`` expression:
Murmur3 x86 32-bit with seed 42, chained over the key columns (each column is hashed
with the previous column's hash as its seed; a null leaves the seed unchanged).
:func:`partition_ids` computes that partition number for every row of an Arrow table or
record batch, so rows routed in Python land in the partition Spark's own ``repartition``
puts equal keys in, without passing through the JVM. :func:`spark_hash` is Spark SQL's
``hash(k1, k2, ...)``.

How each key type is hashed (as Spark does):

- int8, int16, int32, date32 (days): ``hashInt`` of the value.
- int64, timestamp (microseconds since the epoch; s and ms are scaled up, ns floored
  down): ``hashLong``.
- bool: ``hashInt`` of 1 or 0.
- float32: ``hashInt`` of the float's bits; float64: ``hashLong`` of the double's bits.
  -0.0 hashes as 0.0 and every NaN as Java's canonical NaN.
- decimal128 with precision <= 18: ``hashLong`` of the unscaled value; larger
  precisions: ``hashUnsafeBytes`` of the unscaled value's minimal big-endian two's
  complement bytes (Java's ``BigInteger.toByteArray``).
- string, large_string, string_view (UTF-8 bytes), binary, large_binary, binary_view:
  ``hashUnsafeBytes``. Spark's ``hashUnsafeBytes`` is not standard Murmur3 on the tail:
  after the 4-byte blocks, each remaining byte is mixed on its own, as a sign-extended
  int, like a block.
- null type: leaves the seed unchanged. Dictionary arrays hash as their values.

Every type is hashed over whole arrays at once. Variable-length values are hashed in
lockstep by block index: a Python loop runs once per 4-byte block of the longest value,
each step over all the values that have that block.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

SEED = 42

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)
_N = np.uint32(0xE6546B64)
_F1 = np.uint32(0x85EBCA6B)
_F2 = np.uint32(0xC2B2AE35)
_FIVE = np.uint32(5)

_FLOAT_NAN_BITS = np.uint32(0x7FC00000)              # Float.floatToIntBits(NaN)
_DOUBLE_NAN_BITS = np.uint64(0x7FF8000000000000)     # Double.doubleToLongBits(NaN)


# -- Murmur3_x86_32, over uint32 arrays (numpy integer arrays wrap on overflow) --------

def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k1: np.ndarray) -> np.ndarray:
    return _rotl(k1 * _C1, 15) * _C2


def _mix_h1(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    return _rotl(h1 ^ k1, 13) * _FIVE + _N


def _fmix(h1: np.ndarray, length) -> np.ndarray:
    h1 = h1 ^ length
    h1 ^= h1 >> np.uint32(16)
    h1 *= _F1
    h1 ^= h1 >> np.uint32(13)
    h1 *= _F2
    h1 ^= h1 >> np.uint32(16)
    return h1


def _hash_int(values: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """``Murmur3_x86_32.hashInt`` of each int32 value (any int dtype, sign-extended)."""
    v = values.astype(np.int32, copy=False).view(np.uint32)
    return _fmix(_mix_h1(seeds, _mix_k1(v)), np.uint32(4))


def _hash_long(values: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """``Murmur3_x86_32.hashLong`` of each int64 value: low word, then high word."""
    v = np.ascontiguousarray(values.astype(np.int64, copy=False)).view(np.uint32)
    low, high = v[0::2], v[1::2]
    if not np.little_endian:   # pragma: no cover
        low, high = high, low
    h1 = _mix_h1(seeds, _mix_k1(low))
    h1 = _mix_h1(h1, _mix_k1(high))
    return _fmix(h1, np.uint32(8))


def _hash_bytes(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                seeds: np.ndarray) -> np.ndarray:
    """``Murmur3_x86_32.hashUnsafeBytes`` of ``data[starts[i] : starts[i] + lengths[i]]``.

    Blocks are read as little-endian ints (what ``Platform.getInt`` reads on the
    platforms Spark runs on). Rows are ordered by their number of blocks, longest first,
    so at block index ``b`` the rows that still have a block are a prefix.
    """
    n = starts.size
    h = seeds.copy()
    if n == 0:
        return h
    starts = starts.astype(np.int64, copy=False)
    lengths = lengths.astype(np.int64, copy=False)
    nblocks = lengths >> 2
    max_blocks = int(nblocks.max())
    if max_blocks:
        # every unaligned 4-byte window of data, without a copy: words[i] = data[i:i+4]
        words = np.ndarray(shape=(data.size - 3,), dtype="<u4", buffer=data,
                           offset=0, strides=(1,))
        words.flags.writeable = False
        order = np.argsort(-nblocks, kind="stable")
        # active[b]: how many rows have a block at index b
        active = n - np.cumsum(np.bincount(nblocks, minlength=max_blocks + 1))[:-1]
        hs = h[order]
        pos = starts[order]
        for b in range(max_blocks):
            m = int(active[b])
            k1 = words[pos[:m]]
            hs[:m] = _mix_h1(hs[:m], _mix_k1(k1))
            pos[:m] += 4
        h[order] = hs
    tails = lengths & 3
    tail_start = starts + (nblocks << 2)
    for t in range(3):
        rows = np.flatnonzero(tails > t)
        if rows.size == 0:
            break
        byte = data[tail_start[rows] + t].view(np.int8).astype(np.int32).view(np.uint32)
        h[rows] = _mix_h1(h[rows], _mix_k1(byte))
    return _fmix(h, lengths.astype(np.uint32))


# -- reading Arrow arrays ---------------------------------------------------------------

def _fixed(arr: pa.Array, dtype, width: int = 1) -> np.ndarray:
    """The values buffer of a fixed-width array (values under nulls are arbitrary);
    ``width`` values a row come back as a 2-D array."""
    n = len(arr)
    buf = arr.buffers()[1]
    if n == 0 or buf is None:
        return np.zeros(n if width == 1 else (n, width), dtype)
    v = np.frombuffer(buf, dtype=dtype)[arr.offset * width: (arr.offset + n) * width]
    return v if width == 1 else v.reshape(n, width)


def _bools(arr: pa.Array) -> np.ndarray:
    buf = arr.buffers()[1]
    if buf is None or len(arr) == 0:
        return np.zeros(len(arr), np.uint8)
    bits = np.unpackbits(np.frombuffer(buf, np.uint8), bitorder="little")
    return bits[arr.offset: arr.offset + len(arr)]


def _varbinary(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(data, starts, lengths) of a string or binary array, from its Arrow buffers."""
    off_type = np.int64 if (pa.types.is_large_string(arr.type)
                            or pa.types.is_large_binary(arr.type)) else np.int32
    _, obuf, dbuf = arr.buffers()
    if len(arr) == 0 or obuf is None:
        z = np.zeros(len(arr), np.int64)
        return np.zeros(0, np.uint8), z, z
    offsets = np.frombuffer(obuf, off_type)[arr.offset: arr.offset + len(arr) + 1]
    offsets = offsets.astype(np.int64)
    data = np.zeros(0, np.uint8) if dbuf is None else np.frombuffer(dbuf, np.uint8)
    return data, offsets[:-1], np.diff(offsets)


def _decimal_bytes(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(data, starts, lengths) of ``BigInteger.toByteArray`` of each unscaled value."""
    le = _fixed(arr, np.uint8, 16)
    be = np.ascontiguousarray(le[:, ::-1])                 # big-endian, 16 bytes a row
    n = be.shape[0]
    sign = np.where(be[:, 0] >= 0x80, np.uint8(0xFF), np.uint8(0))
    # a leading byte is redundant when it is all sign bits and so is the next byte's top bit
    redundant = (be[:, :-1] == sign[:, None]) & ((be[:, 1:] >> 7) == (sign[:, None] & 1))
    drop = np.cumprod(redundant, axis=1, dtype=np.uint8).sum(axis=1, dtype=np.int64)
    starts = np.arange(n, dtype=np.int64) * 16 + drop
    return be.reshape(-1), starts, 16 - drop


_INTS = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32,
         pa.date32(): np.int32}


def _hash_array(arr: pa.Array, seeds: np.ndarray, name: str) -> np.ndarray:
    """One key column's Murmur3 hash, each row seeded by ``seeds`` (uint32)."""
    t = arr.type
    if pa.types.is_dictionary(t):
        return _hash_array(arr.dictionary_decode(), seeds, name)
    if pa.types.is_null(t):
        return seeds.copy()
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        plain = pa.large_string() if pa.types.is_string_view(t) else pa.large_binary()
        arr = arr.cast(plain)
        t = arr.type

    if t in _INTS:
        h = _hash_int(_fixed(arr, _INTS[t]), seeds)
    elif pa.types.is_int64(t):
        h = _hash_long(_fixed(arr, np.int64), seeds)
    elif pa.types.is_timestamp(t):
        v = _fixed(arr, np.int64)
        if t.unit == "s":
            v = v * 1_000_000
        elif t.unit == "ms":
            v = v * 1_000
        elif t.unit == "ns":
            v = v // 1_000
        h = _hash_long(v, seeds)
    elif pa.types.is_boolean(t):
        h = _hash_int(_bools(arr), seeds)
    elif pa.types.is_float32(t):
        v = _fixed(arr, np.float32)
        bits = np.where(v == 0, np.float32(0), v).view(np.uint32)
        h = _hash_int(np.where(np.isnan(v), _FLOAT_NAN_BITS, bits).view(np.int32), seeds)
    elif pa.types.is_float64(t):
        v = _fixed(arr, np.float64)
        bits = np.where(v == 0, 0.0, v).view(np.uint64)
        h = _hash_long(np.where(np.isnan(v), _DOUBLE_NAN_BITS, bits).view(np.int64), seeds)
    elif pa.types.is_decimal128(t):
        if t.precision <= 18:
            h = _hash_long(np.ascontiguousarray(_fixed(arr, np.int64, 2)[:, 0]), seeds)
        else:
            h = _hash_bytes(*_decimal_bytes(arr), seeds)
    elif (pa.types.is_string(t) or pa.types.is_large_string(t)
          or pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        h = _hash_bytes(*_varbinary(arr), seeds)
    else:
        raise TypeError(f"cannot hash key column {name!r} of type {t} as Spark does")

    if arr.null_count:
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        h = np.where(valid, h, seeds)
    return h


def _columns(table_or_batch, keys) -> list[tuple[str, list[pa.Array]]]:
    if isinstance(keys, str):
        keys = [keys]
    if not keys:
        raise ValueError("hash partitioning needs at least one key column")
    out = []
    for k in keys:
        col = table_or_batch.column(k)
        chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
        out.append((k, chunks))
    return out


def spark_hash(table_or_batch: pa.Table | pa.RecordBatch, keys: list[str]) -> np.ndarray:
    """Spark SQL's ``hash(k1, k2, ...)`` (``Murmur3Hash``, seed 42) of every row, as int32.

    Raises TypeError naming the column for a key type Spark's hash is not reproduced for.
    """
    n = table_or_batch.num_rows
    h = np.full(n, SEED, np.uint32)
    for name, chunks in _columns(table_or_batch, keys):
        start = 0
        for chunk in chunks:
            stop = start + len(chunk)
            h[start:stop] = _hash_array(chunk, h[start:stop], name)
            start = stop
    return h.view(np.int32)


def partition_ids(table_or_batch: pa.Table | pa.RecordBatch, keys: list[str],
                  n: int) -> np.ndarray:
    """The partition ``df.repartition(n, *keys)`` puts each row in: ``pmod(hash, n)``.

    int32, one per row. Equal keys get equal numbers, and the numbers are Spark's own.
    """
    n = int(n)
    if n < 1:
        raise ValueError(f"the number of partitions must be positive, not {n}")
    h = spark_hash(table_or_batch, keys).astype(np.int64)
    return np.mod(h, n).astype(np.int32)
