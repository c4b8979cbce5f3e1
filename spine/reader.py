"""Readers: walking batches in key order, a window at a time, never splitting a key.

Design
------
A ``BatchReader`` walks one batch part by part, holding at most one decoded part. A
``MergedReader`` walks several batches at once: each step looks at the next window
(about ``window_rows`` rows, extended to a key boundary) of every source, takes the
smallest of the windows' last keys as the bound, and cuts every source through that
bound. A step therefore holds, for every key it touches, *all* of that key's updates
from every source, and steps cover increasing, disjoint key ranges. This is the one
loop behind merges, snapshots, cursors, changes and joins.

Sources may carry a tag (the join reads two traces' batches through one reader and
tells their rows apart by tag).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from arrangedb.spine.batch import Batch
from arrangedb.spine.context import StorageContext
from arrangedb.spine.kernels import count_through, smallest_last_key
from arrangedb.spine.updates import Updates


class BatchReader:
    def __init__(self, batch: Batch, ctx: StorageContext, start_part: int = 0,
                 dictionary: frozenset = frozenset()):
        self.batch = batch
        self.ctx = ctx
        self.dictionary = dictionary   # val columns read as dictionary arrays
        self._part_index = start_part - 1
        self._updates: Updates | None = None
        self._key_starts: np.ndarray | None = None
        self._pos = 0
        self._reserved = 0
        self._advance()

    @property
    def exhausted(self) -> bool:
        return self._updates is None

    def _advance(self) -> None:
        self._drop_current()
        while True:
            self._part_index += 1
            if self._part_index >= len(self.batch.parts):
                self._updates = None
                return
            part = self.batch.parts[self._part_index]
            if part.num_updates == 0:
                continue
            upd, starts = part.read(self.dictionary)
            self._reserved = upd.nbytes
            self.ctx.reserve(self._reserved, "decoded part")
            self._updates, self._key_starts, self._pos = upd, starts, 0
            return

    def _drop_current(self) -> None:
        if self._updates is not None:
            self.batch.parts[self._part_index].release()
        self.ctx.release(self._reserved)
        self._reserved = 0
        self._updates = None

    def window(self, rows: int) -> Updates:
        """The next ~``rows`` rows from the current part, ending at a key boundary."""
        upd = self._updates
        want = self._pos + rows
        i = int(np.searchsorted(self._key_starts, want, side="left"))
        end = int(self._key_starts[min(i, len(self._key_starts) - 1)])
        return upd.slice(self._pos, end)

    def take(self, n: int) -> tuple[Updates, np.ndarray | None]:
        """The next ``n`` rows, and where their keys start (plus the end) when the rows
        end at a key boundary -- as windows and bounds cut them -- else None."""
        lo, hi = self._pos, self._pos + n
        out = self._updates.slice(lo, hi)
        ks = self._key_starts
        i, j = np.searchsorted(ks, [lo, hi])
        starts = ks[i:j + 1] - lo if j < len(ks) and ks[i] == lo and ks[j] == hi else None
        self._pos = hi
        if self._pos >= len(self._updates):
            self._advance()
        return out, starts

    def close(self) -> None:
        self._drop_current()


class MergedReader:
    """Steps of all sources' updates over increasing, disjoint key ranges."""

    def __init__(self, batches: list[Batch], ctx: StorageContext, tags: list[int] | None = None,
                 window_rows: int | None = None, dictionary: dict | None = None):
        """``dictionary``: per tag, the val columns to read as dictionary arrays."""
        self.ctx = ctx
        self.window_rows = window_rows or ctx.window_rows
        tags = tags if tags is not None else [0] * len(batches)
        dictionary = dictionary or {}
        self._sources = [(BatchReader(b, ctx, dictionary=dictionary.get(t, frozenset())), t)
                         for b, t in zip(batches, tags) if len(b)]
        # a step holds a window of every source and its kernels several copies of the
        # step: keep the step's total, not each source's share, proportional to the
        # budget, so a wide merge costs no more memory than a narrow one
        self.window_rows = max(1024, self.window_rows * 4 // max(4, len(self._sources)))

    def __iter__(self) -> Iterator[list[tuple[int, Updates, np.ndarray | None]]]:
        try:
            while True:
                live = [(r, t) for r, t in self._sources if not r.exhausted]
                if not live:
                    return
                windows = [r.window(self.window_rows) for r, _ in live]
                j = smallest_last_key([w.keys for w in windows])
                bound = windows[j].keys.slice(windows[j].keys.num_rows - 1, 1)
                step = []
                for (r, tag), w in zip(live, windows):
                    n = len(w) if r is live[j][0] else count_through(w.keys, bound)
                    if n:
                        step.append((tag, *r.take(n)))
                yield step
        finally:
            self.close()

    def close(self) -> None:
        for r, _ in self._sources:
            r.close()


def step_updates(step: list[tuple[int, Updates, np.ndarray | None]], tag: int | None = None
                 ) -> Updates | None:
    """Concatenate one step's slices (of one tag, or all); None when there are none."""
    parts = [u for t, u, _ in step if tag is None or t == tag]
    if not parts:
        return None
    return Updates.concat(parts)


def seek_parts(batch: Batch, keys: pa.Table) -> np.ndarray:
    """For each (sorted) query key, the index of the part that may hold it (-1: before all)."""
    from arrangedb.spine.order import codes

    if not batch.parts:
        return np.full(keys.num_rows, -1)
    firsts = pa.concat_tables([p.first_key for p in batch.parts])
    names = keys.column_names
    qc, fc = codes([keys, firsts.rename_columns(names)], names)
    return np.searchsorted(fc, qc, side="right") - 1
