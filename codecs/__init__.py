"""codecs: pure encodings of arrays into buffers and back.

``encode(values, codec="auto", **options)`` returns an ``Encoded`` (codec, version, meta,
buffers); ``decode(codec, version, meta, buffers)`` returns the array -- numpy in, numpy
out with the same dtype; Arrow in, the same Arrow type out, nulls included.
``decode_range`` returns elements [start, stop) and decompresses or widens only what they
need where the codec allows it; ``segment_sums`` sums runs of values without decoding
them, where it can. A codec that does not apply to the input (``offsets`` on
strings, ``for`` on floats...) falls back to ``plain``; ``Encoded.codec`` says which was
used. Every failure to decode is a ``CodecError``.

Codecs: ``plain``, ``const``, ``offsets``, ``dict``, ``for``, ``scaled_float``,
``arrow_decimal``, ``zstd``; ``auto`` is ``choose_codec``. ``decimal``, the old name of ``scaled_float``,
still decodes.
"""

from __future__ import annotations

import binascii
import struct

import numpy as np
import pyarrow as pa
import zstandard

from arrangedb.codecs.base import REGISTRY, CodecError, Encoded, lookup
from arrangedb.codecs.plain import PLAIN
# imported to register their codecs
from arrangedb.codecs import (arrow_decimal, constant, dictionary, frame,  # noqa: F401
                              offsets, scaled_float, zstd_blocks)
from arrangedb.codecs.arrow_decimal import decimal_words, unscaled_int64
from arrangedb.codecs.choose import choose_codec
from arrangedb.codecs.parallel import set_threads

CODECS = REGISTRY

__all__ = ["CODECS", "CodecError", "Encoded", "choose_codec", "decimal_words", "decode",
           "decode_dictionary", "set_threads", "unscaled_int64",
           "decode_range", "decodes_fresh", "encode", "encode_codes", "encoded_length",
           "segment_sums", "take",
           "take_dictionary"]

_DECODE_ERRORS = (ValueError, TypeError, KeyError, IndexError, OverflowError, AttributeError,
                  struct.error, binascii.Error, pa.ArrowException, zstandard.ZstdError)


def _normalize_input(values):
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    if isinstance(values, (np.ndarray, pa.Array)):
        return values
    raise CodecError(f"cannot encode {type(values).__name__}: expected a numpy or Arrow array")


def encode(values, codec: str = "auto", **options) -> Encoded:
    """Encode a 1-D numpy array or Arrow array; ``options`` go to the codec (``block_bytes``,
    ``level`` for zstd) and are ignored by codecs without them."""
    values = _normalize_input(values)
    if isinstance(values, np.ndarray) and values.ndim != 1:
        raise CodecError(f"expected a 1-D array, got shape {values.shape}")
    name = choose_codec(values) if codec == "auto" else codec
    chosen = lookup(name)
    enc = chosen.encode(values, **options)
    return enc if enc is not None else PLAIN.encode(values)


def encode_codes(values: pa.DictionaryArray) -> Encoded | None:
    """A dictionary array's values encoded by ``dict`` from its own codes and dictionary:
    decoded, they are its values (the value type), as if ``encode`` had been given them,
    without hashing them again. None when the codec does not take them (see
    ``Dictionary.encode_codes``): decode the array and ``encode`` its values instead."""
    return dictionary.DICT.encode_codes(values)


def decode(codec: str, version: int, meta: dict, buffers):
    """The array of an encoding; CodecError when it cannot be decoded."""
    return decode_range(codec, version, meta, buffers, 0, None)


class _reading:
    """Every failure of a decode as a CodecError naming the codec (corrupt bytes raise
    all sorts of numpy/Arrow errors). A class, not a generator: it wraps every column a
    read decodes, where a generator's context manager costs a few microseconds more."""

    __slots__ = ("codec", "version")

    def __init__(self, codec: str, version: int, meta):
        self.codec, self.version = codec, version
        if not isinstance(meta, dict):
            raise CodecError(f"codec {codec!r} version {version}: metadata must be a dict, "
                             f"got {type(meta).__name__}")

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if kind is None:
            return False
        if issubclass(kind, CodecError):
            raise CodecError(f"codec {self.codec!r} version {self.version}: {exc}") from exc
        if issubclass(kind, _DECODE_ERRORS):
            raise CodecError(f"codec {self.codec!r} version {self.version}: corrupt encoding "
                             f"({kind.__name__}: {exc})") from exc
        return False


def decode_dictionary(codec: str, version: int, meta: dict, buffers):
    """A dictionary-coded Arrow column as a ``pa.DictionaryArray`` (int32 indices), its
    values not gathered; None when the encoding is not one (decode it instead)."""
    chosen = lookup(codec, version)
    if not hasattr(chosen, "decode_dictionary"):
        return None
    with _reading(codec, version, meta):
        return chosen.decode_dictionary(version, meta, list(buffers))


def take_dictionary(codec: str, version: int, meta: dict, buffers, rows):
    """Elements at ``rows`` of a dictionary-coded Arrow column as a ``pa.DictionaryArray``
    (int32 codes over the stored dictionary); None when the encoding is not one."""
    chosen = lookup(codec, version)
    if not hasattr(chosen, "take_dictionary"):
        return None
    with _reading(codec, version, meta):
        return chosen.take_dictionary(version, meta, list(buffers), _rows(rows, meta))


def take(codec: str, version: int, meta: dict, buffers, rows):
    """Elements at ``rows`` of an encoding, decoding no more than the codec must."""
    chosen = lookup(codec, version)
    with _reading(codec, version, meta):
        return chosen.take(version, meta, list(buffers), _rows(rows, meta))


def decodes_fresh(codec: str, meta: dict) -> bool:
    """Whether decoding this encoding returns only new arrays, never views of its buffers
    (False for an unknown codec: its decode will say what is wrong)."""
    found = REGISTRY.get(codec) if isinstance(codec, str) else None
    return found is not None and isinstance(meta, dict) and found.decodes_fresh(meta)


def segment_sums(codec: str, version: int, meta: dict, buffers, starts) -> np.ndarray | None:
    """Per segment ``[starts[i], starts[i + 1])`` (the last one to the end), the sum of
    the encoded values, computed on the encoding without decoding it; None when the
    codec cannot (decode and sum instead). ``starts`` strictly increasing from 0.

    Integers sum as int64 (wrapping, as a sum of the decoded values would); Arrow
    decimals as their unscaled integers (int64, declined when a sum could leave it);
    decimal floats (``scaled_float``) exactly on their scaled integers, one division per
    segment -- the correctly rounded sum, which may differ from adding the floats one
    by one in the last bits. Columns with nulls are declined.
    """
    chosen = lookup(codec, version)
    starts = np.asarray(starts, np.int64)
    n = encoded_length(meta)
    if n is None or (len(starts) and (starts[0] != 0 or starts[-1] >= n
                                      or (starts[1:] <= starts[:-1]).any())):
        raise CodecError(f"segment starts must rise strictly from 0 within {n} elements")
    with _reading(codec, version, meta):
        return chosen.segment_sums(version, meta, list(buffers), starts)


def encoded_length(meta: dict) -> int | None:
    """Elements of an encoding, from its metadata alone (None if it does not say)."""
    return meta.get("length", (meta.get("plain") or {}).get("length"))   # zstd wraps plain


def _rows(rows, meta: dict) -> np.ndarray:
    """``rows`` as int64, checked against the encoding's length."""
    rows = np.asarray(rows, np.int64)
    n = encoded_length(meta)
    if len(rows) and (rows.min() < 0 or (n is not None and rows.max() >= n)):
        raise CodecError(f"rows out of range for {n} elements")
    return rows


def decode_range(codec: str, version: int, meta: dict, buffers, start: int = 0,
                 stop: int | None = None):
    """Elements [start, stop) of an encoding (slice semantics for out-of-range bounds)."""
    chosen = lookup(codec, version)
    with _reading(codec, version, meta):
        buffers = list(buffers)
        if start == 0 and stop is None:
            return chosen.decode(version, meta, buffers)
        return chosen.decode_range(version, meta, buffers, start, stop)
