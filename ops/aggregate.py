"""Aggregation kernels over key-grouped rows with counts: one array op per function.

Rows arrive grouped by key (``bounds[g]:bounds[g+1]`` are group g's rows), each with a
``count`` that weighs it: a row with count 3 adds 3 to ``count`` and three times its
value to ``sum``. Nulls follow SQL: ``count(col)``, ``sum``, ``mean``, ``min``, ``max``
and ``count_distinct`` skip them, and an aggregate over no non-null value is null.
``count`` without a column (``None`` or ``"*"``) counts rows.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

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
        if fn in ("sum", "mean") and not (pa.types.is_integer(typ) or pa.types.is_floating(typ)):
            raise TypeError(f"aggs[{name!r}]: {fn} needs a numeric column, but {col!r} is {typ}")
        out[name] = (fn, col)
    return out


def output_field(name: str, fn: str, col: str | None, schema: pa.Schema | None) -> pa.Field:
    if fn in ("count", "count_distinct"):
        return pa.field(name, pa.int64())
    typ = schema.field(col).type
    if fn == "mean" or (fn == "sum" and pa.types.is_floating(typ)):
        return pa.field(name, pa.float64())
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


def grouped_sum(x: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    if len(bounds) <= 1:
        return np.zeros(0, dtype=x.dtype)
    csum = np.concatenate([np.zeros(1, dtype=x.dtype), np.cumsum(x)])
    return csum[bounds[1:]] - csum[bounds[:-1]]


def _extreme(arr: pa.Array, group: np.ndarray, keep: np.ndarray, n: int, fn: str) -> pa.Array:
    """Per-group min/max over the kept rows, through Arrow's grouped kernels (any type)."""
    sel = np.flatnonzero(keep)
    t = pa.table({"g": pa.array(group[sel]), "v": arr.take(pa.array(sel, pa.int64()))})
    r = t.group_by("g").aggregate([("v", fn)])
    out_idx = r.column("g").to_numpy()
    # scatter into n slots; groups with no kept row stay null
    slot = np.full(n, -1, dtype=np.int64)
    slot[out_idx] = np.arange(len(out_idx))
    vals = r.column(f"v_{fn}").combine_chunks()
    mask = slot < 0
    return vals.take(pa.array(np.where(mask, 0, slot), mask=mask)) if len(vals) else \
        pa.nulls(n, arr.type)


def aggregate(bounds: np.ndarray, vals: pa.Table | None, counts: np.ndarray,
              aggs: dict, schema: pa.Schema | None) -> list[pa.Array]:
    """One array per aggregate, one element per group of ``bounds``."""
    n = len(bounds) - 1
    group = np.repeat(np.arange(n, dtype=np.int64), np.diff(bounds))
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
        elif fn in ("sum", "mean"):
            total = grouped_sum(numeric_values(arr) * valid * counts, bounds)
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
