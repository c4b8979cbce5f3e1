"""The automatic codec choice, from cheap looks at the data.

Rules (in order):

- fewer than 64 elements: ``plain`` (metadata would outweigh any saving);
- numpy unsigned, starting at 0, non-decreasing: ``offsets``;
- integer-like: ``for`` when it narrows the width at least 2x, ``dict`` when a sample of
  ~4096 suggests few distinct values and an exact count confirms <= n/8 and <= 65536;
  the smaller estimate wins;
- strings/binaries: ``const`` when every valid value is one (or all are null), ``dict``
  on the same test, else ``zstd`` when a sample compresses >= 1.5x, else ``plain``
  (which drops the offsets of equal-length values);
- booleans: ``const`` when every valid value is one, else ``plain``;
- float64 whose values are exact decimals of <= 6 digits (amounts, prices):
  ``scaled_float`` when the scaled integers fit in 4 bytes or fewer; other floats:
  ``zstd`` or ``plain`` on the same sample test;
- Arrow decimals: ``arrow_decimal`` (their unscaled integers).

Everything is vectorized: full passes are numpy/Arrow kernels (min/max, a monotonicity
test, a hashed distinct count), and the compressibility test compresses ~32 KiB.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrangedb.codecs.base import binary_offset_dtype, int_storage_dtype, is_arrow
from arrangedb.codecs.constant import constant_value
from arrangedb.codecs.dictionary import code_bits
from arrangedb.codecs.frame import for_plan, int_values
from arrangedb.codecs.plain import encode_parts
from arrangedb.codecs.scaled_float import scaled_float_width
from arrangedb.codecs.zstd_blocks import compressor

TINY = 64
SAMPLE = 4096
MAX_DICT = 65536
MIN_ZSTD_RATIO = 1.5
_RUNS = 8


# sorted pseudo-random fractions in [0, 1), drawn once: a sample's positions are these
# scaled to its length (a generator per call cost ~0.15 ms, each part's choice paying it)
_SAMPLE_AT = np.sort(np.random.default_rng(SAMPLE).random(SAMPLE))


def sample_indices(n: int, k: int = SAMPLE) -> np.ndarray:
    """~k sorted pseudo-random positions (deterministic per length)."""
    if n <= k:
        return np.arange(n)
    if k == SAMPLE:
        return (_SAMPLE_AT * n).astype(np.int64)
    rng = np.random.default_rng(n)
    return np.sort(rng.integers(0, n, k))


def _distinct(sample: np.ndarray) -> int:
    """Distinct values of a small array, by a sort: numpy's hashing ``unique`` took
    ~0.5 ms for 4096 integers, a sort and a comparison ~0.1 ms."""
    if len(sample) < 2:
        return len(sample)
    s = np.sort(sample)
    return 1 + int(np.count_nonzero(s[1:] != s[:-1]))


def _contiguous_sample(values, k: int = SAMPLE):
    """A few contiguous runs spread over the array (locality kept for compression)."""
    n = len(values)
    if n <= k:
        return [values]
    run = k // _RUNS
    starts = np.linspace(0, n - run, _RUNS).astype(np.int64)
    if isinstance(values, np.ndarray):
        return [values[s:s + run] for s in starts]
    return [values.slice(int(s), run) for s in starts]


def compresses(values) -> bool:
    """Does a sample of ``values`` compress >= 1.5x with zstd level 3?"""
    parts = _contiguous_sample(values)
    if isinstance(values, np.ndarray):
        raw = np.concatenate(parts).tobytes()
    else:
        _, bufs = encode_parts(pa.concat_arrays(parts))
        raw = b"".join(memoryview(b).cast("B").tobytes() if not isinstance(b, np.ndarray)
                       else b.tobytes() for b in bufs)
    if not raw:
        return False
    return len(raw) >= MIN_ZSTD_RATIO * len(compressor().compress(raw))


def _few_distinct(sample_distinct: int, sample_size: int) -> bool:
    return sample_distinct <= max(sample_size // 8, 1)


def dict_fits(cardinality: int, n: int) -> bool:
    """Whether ``n`` values of ``cardinality`` distinct ones are few enough for ``dict``:
    at most an eighth of the values, and at most ``MAX_DICT``."""
    return cardinality <= n // 8 and cardinality <= MAX_DICT


def _dict_size(n: int, cardinality: int, itemsize: int) -> int | None:
    """Estimated dict bytes, or None when the column is not low-cardinality."""
    if not dict_fits(cardinality, n):
        return None
    return -(-n * code_bits(cardinality) // 8) + cardinality * itemsize


def _choose_int(vals: np.ndarray, valid, numpy_input: bool) -> str:
    n = len(vals)
    if (numpy_input and vals.dtype.kind == "u" and vals[0] == 0
            and not (np.diff(vals[sample_indices(n)].astype(np.int64)) < 0).any()
            and not (vals[1:] < vals[:-1]).any()):
        return "offsets"
    live = vals if valid is None else vals[valid]
    if len(live) == 0:
        return "for"
    itemsize = vals.dtype.itemsize
    plan = for_plan(vals, valid)
    best, best_size = "plain", n * itemsize
    if plan["nbytes"] * 2 <= n * itemsize:
        best, best_size = "for", plan["nbytes"]
    sample = live[sample_indices(len(live))]
    if _few_distinct(_distinct(sample), len(sample)):
        exact = pc.count_distinct(pa.array(live)).as_py()
        size = _dict_size(n, exact, itemsize)
        if size is not None and size < best_size:
            best, best_size = "dict", size
    if best == "plain" and compresses(vals):
        return "zstd"
    return best


def _choose_binary(arr: pa.Array) -> str:
    n = len(arr)
    if arr.null_count == n:
        return "const"
    sample = arr.take(pa.array(sample_indices(n)))
    live = len(sample) - sample.null_count
    if live and _few_distinct(pc.count_distinct(sample).as_py(), live):
        exact = pc.count_distinct(arr).as_py()
        if exact <= 1:
            return "const"
        if dict_fits(exact, n):
            return "dict"
    return "zstd" if compresses(arr) else "plain"


def choose_codec(values) -> str:
    """The codec ``encode(values, "auto")`` uses for ``values``."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    n = len(values)
    if n < TINY:
        return "plain"
    if isinstance(values, np.ndarray):
        kind = values.dtype.kind
        if values.ndim != 1:
            return "plain"
        if kind in "iu":
            return _choose_int(values, None, True)
        if kind == "f":
            return _choose_float(values)
        return "plain"
    if not is_arrow(values):
        return "plain"
    t = values.type
    if binary_offset_dtype(t) is not None:
        return _choose_binary(values)
    if int_storage_dtype(t) is not None:
        vals, valid = int_values(values)[:2]
        return _choose_int(vals, valid, False)
    if pa.types.is_floating(t) and values.null_count < n:
        return _choose_float(values)
    if pa.types.is_decimal(t):
        return "arrow_decimal"
    if pa.types.is_boolean(t) and constant_value(values) is not None:
        return "const"
    return "plain"


def _choose_float(values) -> str:
    """``scaled_float`` for amounts and prices (exact scaled integers) when it halves
    them at least -- ten times faster than zstd both ways; else zstd if it compresses."""
    width = scaled_float_width(values)
    if width is not None and width <= 4:     # at most half of a float64
        return "scaled_float"
    return "zstd" if compresses(values) else "plain"
