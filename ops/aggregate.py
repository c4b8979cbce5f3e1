"""Aggregation kernels over key-grouped rows with counts: one array op per function.

Rows arrive grouped by key (``bounds[g]:bounds[g+1]`` are group g's rows), each with a
``count`` that weighs it: a row with count 3 adds 3 to ``count`` and three times its
value to ``sum``. Nulls follow SQL: ``count(col)``, ``sum``, ``mean``, ``min``, ``max``
and ``count_distinct`` skip them, and an aggregate over no non-null value is null.
``count`` without a column (``None`` or ``"*"``) counts rows.

Decimal columns aggregate exactly, with DuckDB's result types: ``sum`` of a
``decimal(p, s)`` is a ``decimal(38, s)`` (an OverflowError beyond 38 digits), ``min``
and ``max`` keep the column's type, ``mean`` is a float64. Their sums run on the unscaled
integers cut into 32-bit limbs (see "exact decimal sums" below), never through floats.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from arrangedb.codecs import decimal_words, unscaled_int64
from arrangedb.ops.common import row_owner

FUNCTIONS = ("count", "sum", "min", "max", "count_distinct", "mean")


def check_aggs(aggs: dict, schema: pa.Schema | None, where: str) -> dict:
    """Validate ``{name: (function, column)}`` against the columns; a clear error if bad."""
    if not isinstance(aggs, dict) or not aggs:
        raise ValueError(f"aggs must be a non-empty dict of name -> (function, column), "
                         f"got {aggs!r}")
    names = schema.names if schema is not None else []
    out = {}
    for name, spec in aggs.items():
        if not (isinstance(spec, (tuple, list)) and len(spec) == 2):
            raise ValueError(f"aggs[{name!r}] must be (function, column), got {spec!r}")
        fn, col = spec
        if fn not in FUNCTIONS:
            raise ValueError(f"aggs[{name!r}]: unknown function {fn!r}; use one of "
                             f"{', '.join(FUNCTIONS)}")
        if col in (None, "*"):
            if fn != "count":
                raise ValueError(f"aggs[{name!r}]: {fn} needs a column")
            out[name] = (fn, None)
            continue
        if col not in names:
            raise KeyError(f"aggs[{name!r}]: no column {col!r} in {where} (columns: {names})")
        typ = schema.field(col).type
        if fn in ("sum", "mean") and not (pa.types.is_integer(typ) or pa.types.is_floating(typ)
                                          or pa.types.is_decimal(typ)):
            raise TypeError(f"aggs[{name!r}]: {fn} needs a numeric column, but {col!r} is {typ}")
        out[name] = (fn, col)
    return out


def output_field(name: str, fn: str, col: str | None, schema: pa.Schema | None) -> pa.Field:
    if fn in ("count", "count_distinct"):
        return pa.field(name, pa.int64())
    typ = schema.field(col).type
    if fn == "mean" or (fn == "sum" and pa.types.is_floating(typ)):
        return pa.field(name, pa.float64())
    if fn == "sum" and pa.types.is_decimal(typ):
        return pa.field(name, sum_type(typ))
    if fn == "sum":
        return pa.field(name, pa.int64())
    return pa.field(name, typ)


def _valid(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return arr.is_valid().to_numpy(zero_copy_only=False)


def numeric_values(arr: pa.Array) -> np.ndarray:
    """A numeric column as float64 (floats) or int64 (integers), nulls as 0."""
    target = np.float64 if pa.types.is_floating(arr.type) else np.int64
    values = arr.fill_null(0) if arr.null_count else arr
    return values.to_numpy(zero_copy_only=False).astype(target, copy=False)


def times_counts(x: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each value times its count; a value counted zero times adds nothing (not the NaN
    of inf x 0: the row is not there)."""
    out = x * counts
    if out.dtype.kind == "f" and not np.isfinite(x).all():
        out[counts == 0] = 0
    return out


def grouped_sum(x: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """``x`` summed per group of ``bounds``. Integers by prefix sums differenced at the
    bounds (exact: int64 wraps alike on both sides); floats group by group, since a
    prefix sum carries one group's NaN or inf into every later group, and its rounding
    grows with the prefix."""
    if len(bounds) <= 1:
        return np.zeros(0, dtype=x.dtype)
    if x.dtype.kind == "f":
        out = np.zeros(len(bounds) - 1, x.dtype)
        full = np.diff(bounds) > 0   # (reduceat would give an empty group a value)
        if full.any():   # each non-empty group runs to the next one's start
            out[full] = np.add.reduceat(x[:int(bounds[-1])],
                                        np.asarray(bounds[:-1], np.int64)[full])
        return out
    csum = np.concatenate([np.zeros(1, dtype=x.dtype), np.cumsum(x)])
    return csum[bounds[1:]] - csum[bounds[:-1]]


def _extreme(arr: pa.Array, group: np.ndarray, keep: np.ndarray, n: int, fn: str) -> pa.Array:
    """Per-group min/max over the kept rows, through Arrow's grouped kernels (any type)."""
    sel = np.flatnonzero(keep)
    t = pa.table({"g": pa.array(group[sel]),
                  "v": arr.take(pa.array(sel, pa.int64())).view(as_comparable(arr.type))})
    r = t.group_by("g").aggregate([("v", fn)])
    out_idx = r.column("g").to_numpy()
    # scatter into n slots; groups with no kept row stay null
    slot = np.full(n, -1, dtype=np.int64)
    slot[out_idx] = np.arange(len(out_idx))
    vals = r.column(f"v_{fn}").combine_chunks().view(arr.type)
    mask = slot < 0
    return vals.take(pa.array(np.where(mask, 0, slot), mask=mask)) if len(vals) else \
        pa.nulls(n, arr.type)


def as_comparable(t: pa.DataType) -> pa.DataType:
    """The type Arrow's grouped min and max take for ``t``: decimal32/64 (which they do
    not take) as their unscaled integers, which order alike (a view, both ways)."""
    if pa.types.is_decimal(t) and t.byte_width <= 8:
        return pa.int32() if t.byte_width == 4 else pa.int64()
    return t


def aggregate(bounds: np.ndarray, vals: pa.Table | None, counts: np.ndarray,
              aggs: dict, schema: pa.Schema | None) -> list[pa.Array]:
    """One array per aggregate, one element per group of ``bounds``."""
    n = len(bounds) - 1
    group = row_owner(bounds)
    counts = counts.astype(np.int64, copy=False)
    positive = counts > 0
    out = []
    for name, (fn, col) in aggs.items():
        field = output_field(name, fn, col, schema)
        if col is None:
            out.append(pa.array(grouped_sum(counts, bounds), pa.int64()))
            continue
        arr = vals.column(col)
        arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
        valid = _valid(arr)
        nonnull = grouped_sum(counts * valid, bounds)
        if fn == "count":
            out.append(pa.array(nonnull, pa.int64()))
        elif fn in ("sum", "mean") and pa.types.is_decimal(arr.type):
            ones = (counts[0] == 1 and (counts == 1).all()) if len(counts) else True
            sums = [grouped_sum(limb, bounds)
                    for limb in decimal_limbs(arr, None if ones else counts)]
            has = grouped_sum(valid.astype(np.int64), bounds) > 0
            if fn == "sum":
                out.append(limbs_to_decimal(sums, field.type, null=~has))
            else:
                has &= nonnull != 0
                out.append(pa.array(limbs_mean(sums, nonnull, arr.type.scale), pa.float64(),
                                    mask=~has))
        elif fn in ("sum", "mean"):
            total = grouped_sum(times_counts(numeric_values(arr), counts), bounds)
            has = grouped_sum(valid.astype(np.int64), bounds) > 0
            if fn == "mean":
                with np.errstate(divide="ignore", invalid="ignore"):
                    total = total / np.where(nonnull == 0, 1, nonnull)
                has &= nonnull != 0
            out.append(pa.array(total, field.type, mask=~has))
        elif fn in ("min", "max"):
            out.append(_extreme(arr, group, positive & valid, n, fn))
        else:  # count_distinct: distinct (group, value) pairs among rows that are present
            sel = np.flatnonzero(positive & valid)
            t = pa.table({"g": pa.array(group[sel]), "v": arr.take(pa.array(sel, pa.int64()))})
            pairs = t.group_by(["g", "v"]).aggregate([]).column("g").to_numpy()
            out.append(pa.array(np.bincount(pairs, minlength=n).astype(np.int64), pa.int64()))
    return out


# -- exact decimal sums ------------------------------------------------------------------
#
# A decimal column's sum is the sum of its unscaled integers. They are cut into 32-bit
# limbs held as int64 (value = sum of limb[i] << 32 i, the lower limbs unsigned, the top
# one signed): limbs stay below 2**34 even times a weight, so their sums over up to 2**28
# rows are exact in int64 whatever the values, and every summing kernel of the engine --
# cumulative sums, reduceat, bincount (exact below 2**53, which it checks), Arrow's hash
# sums -- applies to them unchanged. One carry pass then puts each sum's limbs back
# together as the words of a decimal128 (decimal256 for decimal256 columns).

LIMB_SEP = "#"          # a partial's limb columns: "<partial>#0", "<partial>#1", ...
_LOW = np.int64(0xFFFFFFFF)
_U32 = np.uint64(32)


def sum_type(t: pa.DataType) -> pa.DataType:
    """The type of a decimal column's sum, as DuckDB gives it: the widest decimal of the
    column's scale (decimal128(38, s); decimal256(76, s) for a decimal256)."""
    return pa.decimal256(76, t.scale) if t.byte_width > 16 else pa.decimal128(38, t.scale)


def int_limbs(x: np.ndarray) -> list[np.ndarray]:
    """int64 integers as two limbs: the low 32 bits (unsigned) and the high (signed)."""
    x = np.asarray(x, np.int64)
    return [x & _LOW, x >> 32]


def decimal_limbs(arr: pa.Array, weights: np.ndarray | None = None) -> list[np.ndarray]:
    """The unscaled integers of a decimal column, nulls as 0, times ``weights`` (int64)
    if given, as limbs: two for columns whose integers fit in int64, two per 64-bit word
    otherwise."""
    valid = None if arr.null_count == 0 else arr.is_valid().to_numpy(zero_copy_only=False)
    ints = unscaled_int64(arr, valid)   # chunk by chunk
    if ints is not None:
        if valid is not None:
            ints[~valid] = 0    # a new array: another value lay under the nulls
        limbs = int_limbs(ints)
    else:
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        words = decimal_words(arr)
        limbs = []
        for i in range(words.shape[1]):
            w = words[:, i]
            high = (w >> 32 if i == words.shape[1] - 1      # the top word is signed
                    else (w.view(np.uint64) >> _U32).view(np.int64))
            limbs += [w & _LOW, high]
        if valid is not None:
            for limb in limbs:
                limb[~valid] = 0
    return limbs if weights is None else weigh_limbs(limbs, weights)


def carried(limbs: list[np.ndarray], spare: int = 0) -> list[np.ndarray]:
    """The same values with every limb but the top one in [0, 2**32) (new arrays), and
    ``spare`` more limbs on top, so that the top one is small again."""
    out = [np.array(limb, np.int64) for limb in limbs]
    out += [np.zeros_like(out[0]) for _ in range(spare)]
    for i in range(len(out) - 1):
        out[i + 1] += out[i] >> 32
        out[i] &= _LOW
    return out


def weigh_limbs(limbs: list[np.ndarray], weights) -> list[np.ndarray]:
    """Carried limbs (the top one within 32 bits) times int64 ``weights`` (an array, or
    one int), exactly: two more limbs, each below 2**34. The magnitude of a weight is
    cut into two unsigned 32-bit halves; each limb times each half is exact in 64 bits
    and is cut again into the two limbs it reaches."""
    w = np.asarray(weights, np.int64)
    negative = w < 0
    magnitude = np.abs(w).view(np.uint64)      # |-2**63| is 2**63 as uint64
    halves = [magnitude & np.uint64(0xFFFFFFFF), magnitude >> _U32]
    n = len(limbs[0])
    out = [np.zeros(n, np.int64) for _ in range(len(limbs) + 2)]
    for i, limb in enumerate(limbs):
        top = i == len(limbs) - 1
        for j, half in enumerate(halves):
            if top:   # signed, within 32 bits: the product is within 64
                p = limb * half.view(np.int64)
                low, high = p & _LOW, p >> 32
            else:
                p = limb.view(np.uint64) * half
                low = (p & np.uint64(0xFFFFFFFF)).view(np.int64)
                high = (p >> _U32).view(np.int64)
            out[i + j] += low
            out[i + j + 1] += high
    if negative.any():
        for limb in out:
            np.negative(limb, out=limb, where=np.broadcast_to(negative, limb.shape))
    return out


def _words(limbs: list[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, k) little-endian 64-bit words of carried limbs, and which values fit them."""
    need = 2 * k
    limbs = limbs + [np.zeros_like(limbs[0])] * max(0, need + 1 - len(limbs))
    limbs = carried(limbs)
    n = len(limbs[0])
    sign = limbs[need - 1] >> 31              # the top bit of the words, 0 or 1
    fits = limbs[-1] == -sign
    for limb in limbs[need:-1]:
        fits &= limb == sign * _LOW
    words = np.empty((n, k), np.int64)
    for j in range(k):
        words[:, j] = ((limbs[2 * j + 1].view(np.uint64) << _U32)
                       | limbs[2 * j].view(np.uint64)).view(np.int64)
    return words, fits


def _below(words: np.ndarray, bound: int) -> np.ndarray:
    """Which values of (n, k) words (the last signed) are below the integer ``bound``."""
    k = words.shape[1]
    less = np.zeros(len(words), bool)
    equal = np.ones(len(words), bool)
    for j in reversed(range(k)):
        b = (bound >> (64 * j)) & (2 ** 64 - 1)
        if j == k - 1:
            w, b = words[:, j], np.int64(b - 2 ** 64 if b >= 2 ** 63 else b)
        else:
            w, b = words[:, j].view(np.uint64), np.uint64(b)
        less |= equal & (w < b)
        equal &= w == b
    return less


def limbs_to_decimal(sums: list[np.ndarray], t: pa.DataType,
                     null: np.ndarray | None = None) -> pa.Array:
    """Limb sums as a decimal array of type ``t`` (null where ``null``); OverflowError
    when a sum has more digits than ``t`` holds."""
    n = len(sums[0])
    words, fits = _words(list(sums), t.byte_width // 8)
    top = 10 ** t.precision
    if not (fits.all() and _below(words, top).all() and not _below(words, 1 - top).any()):
        raise OverflowError(f"a sum of decimals does not fit {t}")
    validity = None
    if null is not None and null.any():
        validity = pa.py_buffer(np.packbits(~null, bitorder="little"))
    return pa.Array.from_buffers(t, n, [validity, pa.py_buffer(words.reshape(-1))],
                                 null_count=-1 if validity is not None else 0)


def limbs_mean(sums: list[np.ndarray], counts: np.ndarray, scale: int) -> np.ndarray:
    """float64 means of limb sums of unscaled integers over ``counts`` values, as DuckDB
    computes them: the sum as a float64 (rounded once: it is put together as a long
    double, exact below 2**64), divided by ``10**scale``, then by the count. Zero counts
    give NaN or infinities (mask them)."""
    total = np.zeros(len(sums[0]), np.longdouble)
    for limb in reversed(carried(list(sums))):
        total *= np.longdouble(2 ** 32)
        total += limb
    mean = total.astype(np.float64)
    mean /= np.float64(10.0 ** scale)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean /= np.asarray(counts, np.float64)
    return mean


def decimal_mean(sums: pa.Array, counts: np.ndarray, scale: int) -> np.ndarray:
    """float64 means of decimal sums (an Arrow decimal array, nulls as 0) over
    ``counts`` values of a column of ``scale`` (see :func:`limbs_mean`)."""
    return limbs_mean(decimal_limbs(sums), counts, scale)


def decimal_quotient(sums: pa.Array, counts: np.ndarray, t: pa.DataType) -> pa.Array:
    """``sums / counts`` -- decimal sums over int64 counts > 0 -- as decimals of type
    ``t`` (of a scale no smaller than the sums'), exactly: the quotient rounded half away
    from zero (Java's HALF_UP, as Spark's AVG of decimals). Null where a sum is null or
    its count is not positive.

    The magnitude of each sum, scaled up, is divided limb by limb from the top (a
    remainder below the count, times 2**32, plus a limb fits 64 bits while counts are
    below 2**32; larger counts, never met in practice, divide as Python integers)."""
    counts = np.asarray(counts, np.int64)
    null = (counts <= 0) | ~sums.is_valid().to_numpy(zero_copy_only=False)
    limbs = carried(decimal_limbs(sums), spare=1)
    negative = limbs[-1] < 0
    limbs = carried([np.where(negative, -x, x) for x in limbs], spare=1)   # magnitudes
    shift = t.scale - sums.type.scale
    while shift > 0:
        step = min(shift, 18)
        limbs = carried(weigh_limbs(limbs, 10 ** step), spare=1)
        shift -= step
    n = np.where(null, 1, counts).view(np.uint64)
    small = n < np.uint64(1 << 32)
    d = np.where(small, n, np.uint64(1))
    rest = np.zeros(len(n), np.uint64)
    quotient = []
    for limb in reversed(limbs):
        cur = (rest << _U32) | limb.view(np.uint64)
        q = cur // d
        rest = cur - q * d
        quotient.append(q.view(np.int64))
    quotient.reverse()
    quotient[0] = quotient[0] + (rest * np.uint64(2) >= d)      # half away from zero
    for i in np.flatnonzero(~small):
        total = sum(int(x[i]) << (32 * j) for j, x in enumerate(limbs))
        q, r = divmod(total, int(n[i]))
        q += 2 * r >= int(n[i])
        for j in range(len(quotient)):
            quotient[j][i] = (q >> (32 * j)) & 0xFFFFFFFF
    quotient = [np.where(negative, -x, x) for x in quotient]
    return limbs_to_decimal(quotient, t, null=null)


def fold_limbs(table: pa.Table, types: dict) -> pa.Table:
    """Each set of limb columns ``p#0, p#1, ...`` of ``table`` (summed by any kernel) as
    one decimal column ``p`` of type ``types[p]``, where its first limb column was."""
    names = table.column_names
    if not any(LIMB_SEP in c for c in names):
        return table
    columns, out_names = [], []
    for c in names:
        base, sep, i = c.rpartition(LIMB_SEP)
        if not sep:
            columns.append(table.column(c))
            out_names.append(c)
        elif i == "0":
            limbs = [_numpy(table.column(f"{base}{LIMB_SEP}{j}"))
                     for j in range(sum(d.rpartition(LIMB_SEP)[0] == base for d in names))]
            columns.append(limbs_to_decimal(limbs, types[base]))
            out_names.append(base)
    return pa.Table.from_arrays(columns, names=out_names)


def _numpy(col) -> np.ndarray:
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return col.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
