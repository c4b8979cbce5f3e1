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
    """Walks one batch part by part. A window that would run past the current part's
    end continues into the next part (parts hold disjoint key ranges), so windows are
    never cut short by where parts happen to end: the rows still held are the current
    part's tail and the next part."""

    def __init__(self, batch: Batch, ctx: StorageContext, start_part: int = 0,
                 dictionary: frozenset = frozenset()):
        self.batch = batch
        self.ctx = ctx
        self.dictionary = dictionary   # val columns read as dictionary arrays
        self._part_index = start_part - 1
        self._updates: Updates | None = None
        self._key_starts: np.ndarray | None = None
        self._pos = 0
        # parts whose rows are in use: (part index, bytes reserved, where its rows end
        # in the rows held)
        self._held: list[tuple[int, int, int]] = []
        self._advance()

    @property
    def exhausted(self) -> bool:
        return self._updates is None

    def _next_part(self) -> int | None:
        i = self._part_index + 1
        while i < len(self.batch.parts) and self.batch.parts[i].num_updates == 0:
            i += 1
        return i if i < len(self.batch.parts) else None

    def _read(self, i: int, offset: int = 0) -> tuple[Updates, np.ndarray]:
        upd, starts = self.batch.parts[i].read(self.dictionary)
        self.ctx.reserve(upd.nbytes, "decoded part")
        self._held.append((i, upd.nbytes, offset + len(upd)))
        self._part_index = i
        return upd, starts

    def _advance(self) -> None:
        self._drop_current()
        i = self._next_part()
        if i is None:
            self._part_index = len(self.batch.parts)
            return
        self._updates, self._key_starts = self._read(i)
        self._pos = 0

    def _extend(self) -> bool:
        """The current part's unread tail followed by the next part, as one run of rows
        (False when there is none). Dictionary columns are not joined up: each part
        has its own dictionary."""
        i = self._next_part()
        if i is None or self.dictionary:
            return False
        lo, n = self._pos, len(self._updates)
        tail = self._updates.slice(lo, n)
        ks = self._key_starts
        tail_starts = ks[int(np.searchsorted(ks, lo)):-1] - lo
        done = [h for h in self._held if h[2] <= lo]   # read through: let them go
        self._held = [(j, b, end - lo) for j, b, end in self._held if end > lo]
        self._release(done)
        upd, starts = self._read(i, n - lo)
        self._updates = Updates.concat([tail, upd])
        self._key_starts = np.concatenate([tail_starts, starts + (n - lo)])
        self._pos = 0
        return True

    def _release(self, held: list[tuple[int, int, int]]) -> None:
        for i, nbytes, _ in held:
            self.batch.parts[i].release()
            self.ctx.release(nbytes)

    def _drop_current(self) -> None:
        held, self._held = self._held, []
        self._release(held)
        self._updates = None

    def window(self, rows: int) -> Updates:
        """The next ~``rows`` rows, ending at a key boundary."""
        while len(self._updates) - self._pos < rows and self._extend():
            pass
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
        # Each source's window is its share of the step, so that every window spans
        # about the same keys: with equal windows the densest source's window ends
        # first and cuts every step short (a step over an 8M-row batch and a 1M-row run
        # took ~32k of the run's rows and ~4k of the batch's). The shares start by size
        # and then follow the rows each source gave the last step: all of them were cut
        # at one key, so those counts are the sources' densities over the same keys (a
        # dimension's run of dense ids is far denser than a fact table's).
        self._step_rows = self.window_rows * len(self._sources)
        self._windows = self._shares([len(r.batch) for r, _ in self._sources])

    def _shares(self, rows: list[int]) -> list[int]:
        total = max(sum(rows), 1)
        return [max(1024, self._step_rows * n // total) for n in rows]

    def __iter__(self) -> Iterator[list[tuple[int, Updates, np.ndarray | None]]]:
        try:
            while True:
                live = [i for i, (r, _) in enumerate(self._sources) if not r.exhausted]
                if not live:
                    return
                windows = [self._sources[i][0].window(self._windows[i]) for i in live]
                j = smallest_last_key([w.keys for w in windows])
                bound = windows[j].keys.slice(windows[j].keys.num_rows - 1, 1)
                step, taken = [], [0] * len(self._sources)
                for k, (i, w) in enumerate(zip(live, windows)):
                    r, tag = self._sources[i]
                    n = len(w) if k == j else count_through(w.keys, bound)
                    taken[i] = n
                    if n:
                        step.append((tag, *r.take(n)))
                if sum(taken):
                    self._windows = self._shares(taken)
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
