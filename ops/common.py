"""What the operators share: output batching, row/key index arithmetic, validation."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from arrangedb.pager import OPERATOR_BUFFER_MIN_BYTES, OPERATOR_BUFFER_SHARE
from arrangedb.spine import payload_per_update, ranges, run_index


DEFAULT_BATCH_ROWS = 1 << 16


def names(by) -> list[str]:
    """A column name or a list of them, as a list."""
    return [by] if isinstance(by, str) else list(by)


def columns_of(table: pa.Table | None) -> list[pa.Array]:
    """The table's columns as arrays (a lone chunk as it is: combining one costs ~30 us)."""
    if table is None:
        return []
    return [(c.chunk(0) if c.num_chunks == 1 else c.combine_chunks())
            if isinstance(c, pa.ChunkedArray) else c for c in table.columns]


def row_owner(bounds: np.ndarray) -> np.ndarray:
    """For rows grouped by ``bounds`` (len g+1), the group index of every row."""
    return run_index(np.diff(bounds))


def output_chunks(sizes: np.ndarray, batch_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Cut a virtual concatenation of groups (group g has ``sizes[g]`` rows) into chunks of
    at most ``batch_rows`` rows; yields (group of each row, position within its group).

    Lets a cross product or an expansion far larger than memory come out in bounded
    batches: only one chunk's index arrays ever exist.
    """
    sizes = sizes.astype(np.int64, copy=False)
    ends = np.cumsum(sizes)
    total = int(ends[-1]) if len(ends) else 0
    starts = ends - sizes
    for lo in range(0, total, batch_rows):
        hi = min(total, lo + batch_rows)
        g0 = int(np.searchsorted(ends, lo, side="right"))
        g1 = int(np.searchsorted(ends, hi - 1, side="right")) + 1
        # rows lo..hi fall in groups g0..g1-1
        sub = np.minimum(ends[g0:g1], hi) - np.maximum(starts[g0:g1], lo)
        group = run_index(sub)
        group += g0
        first = np.maximum(starts[g0:g1], lo) - starts[g0:g1]
        pos = ranges(first, sub)
        yield group, pos


MIN_KEYS_PER_STEP = 256   # a lookup of fewer keys costs its visit of every part


def check_batch_rows(batch_rows: int) -> int:
    if not isinstance(batch_rows, (int, np.integer)) or batch_rows <= 0:
        raise ValueError(f"batch_rows must be a positive int, got {batch_rows!r}")
    return int(batch_rows)


def operator_buffer_bytes(trace) -> int | None:
    """What one operator buffer over ``trace`` may hold under its engine's budget (a
    share of it, :mod:`arrangedb.pager.sizing`); None without a budget."""
    budget = getattr(trace.ctx, "budget", None)
    if budget is None:
        return None
    return max(OPERATOR_BUFFER_MIN_BYTES, budget.limit // OPERATOR_BUFFER_SHARE)


def rows_within_bytes(batch_rows: int, traces) -> int:
    """``batch_rows``, fewer when output rows as wide as a row of each trace (its stored
    data, a time and a diff) would make a batch larger than an operator buffer: rows of
    long strings come in fewer rows a batch, not in larger batches (64k joined rows of
    2 KiB strings were 127 MiB under a 64 MiB budget)."""
    cap = operator_buffer_bytes(traces[0])
    if cap is None:
        return batch_rows
    width = 16 + sum(payload_per_update(t.batches()) for t in traces)
    return max(1, min(batch_rows, int(cap // width)))


def keys_within_bytes(keys_per_step: int, traces) -> int:
    """``keys_per_step``, fewer when the rows of that many keys in each of ``traces`` (a
    key's rows: the trace's updates over the keys of its largest batch, each its stored
    data and two 8-byte columns) would outgrow an operator buffer: steps over keys of
    large groups take fewer keys, not more memory."""
    cap = operator_buffer_bytes(traces[0])
    per_key = 0.0
    for t in traces:
        batches = t.batches()
        keys = max((b.num_keys for b in batches), default=0)
        if keys:
            per_key += sum(len(b) for b in batches) / keys * (16 + payload_per_update(batches))
    if cap is None or not per_key:
        return keys_per_step
    return min(keys_per_step, max(MIN_KEYS_PER_STEP, int(cap // per_key)))


def check_time(name: str, value) -> None:
    if value is not None and (not isinstance(value, (int, np.integer)) or value < 0):
        raise ValueError(f"{name}={value!r}: times are non-negative ints")
