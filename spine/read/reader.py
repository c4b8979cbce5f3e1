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

from arrangedb.spine.storage.batch import Batch, payload_per_update
from arrangedb.spine.storage.context import StorageContext
from arrangedb.spine.data.kernels import count_through, smallest_last_key
from arrangedb.spine.data.updates import Updates
from arrangedb.spine.data.codes import codes


class BatchReader:
    """Walks one batch part by part. A window that would run past the current part's
    end continues into the next parts (parts hold disjoint key ranges), so windows are
    never cut short by where parts happen to end; only the rows of a window that spans
    parts are copied into one run. The parts held are those the unread window touches.
    """

    def __init__(self, batch: Batch, ctx: StorageContext, start_part: int = 0,
                 dictionary: frozenset = frozenset()):
        self.batch = batch
        self.ctx = ctx
        self.dictionary = dictionary   # val columns read as dictionary arrays
        self._next = start_part        # the next part to decode
        # decoded parts in use, oldest first: (updates, key starts, the part, reserved) --
        # the part read, which a resident batch paged out meanwhile no longer lists
        self._held: list[tuple[Updates, np.ndarray, object, int]] = []
        self._pos = 0                  # rows of the oldest held part already taken
        self._started = False          # nothing is decoded before the first read: a merge
                                       # waiting for fuel holds no part

    @property
    def exhausted(self) -> bool:
        self._start()
        return not self._held

    def held_bytes(self) -> int:
        """What the decoded parts in use hold on the budget."""
        return sum(h[3] for h in self._held)

    def _start(self) -> None:
        if not self._started:
            self._started = True
            self._load()

    def _load(self) -> bool:
        """Decode the next non-empty part (False when there is none)."""
        parts = self.batch.parts
        while self._next < len(parts) and parts[self._next].num_updates == 0:
            self._next += 1
        if self._next >= len(parts):
            return False
        i, self._next = self._next, self._next + 1
        part = parts[i]
        upd, starts = part.read(self.dictionary)
        # a resident part is reserved already, but for vals it re-coded as dictionaries
        nbytes = (upd.nbytes if part.decodes else
                  upd.vals.nbytes if self.dictionary and upd.vals is not None else 0)
        try:
            self.ctx.reserve(nbytes, "decoded part")
        except BaseException:
            part.release()
            raise
        self._held.append((upd, starts, part, nbytes))
        return True

    def _drop_oldest(self) -> None:
        _, _, part, nbytes = self._held.pop(0)
        part.release()
        self.ctx.release(nbytes)
        self._pos = 0

    def window(self, rows: int) -> Updates:
        """The next ~``rows`` rows, ending at a key boundary (a part's end is one).
        Dictionary columns are not joined across parts (each part has its own
        dictionary): such a window ends with its part."""
        self._start()
        while (sum(len(h[0]) for h in self._held) - self._pos < rows and not self.dictionary
               and self._load()):
            pass
        pieces, need, lo = [], rows, self._pos
        for upd, ks, _, _ in self._held:
            if len(upd) - lo >= need:
                i = int(np.searchsorted(ks, lo + need, side="left"))
                pieces.append(upd.slice(lo, int(ks[min(i, len(ks) - 1)])))
                break
            pieces.append(upd.slice(lo, len(upd)))
            need -= len(upd) - lo
            lo = 0
        return pieces[0] if len(pieces) == 1 else Updates.concat(pieces)

    def take(self, n: int) -> tuple[Updates, np.ndarray | None]:
        """The next ``n`` rows, and where their keys start (plus the end) when the rows
        end at a key boundary -- as windows and bounds cut them -- else None."""
        self._start()
        pieces, starts, taken = [], [], 0
        while taken < n:
            upd, ks, _, _ = self._held[0]
            lo = self._pos
            hi = min(len(upd), lo + n - taken)
            pieces.append(upd.slice(lo, hi))
            i, j = np.searchsorted(ks, [lo, hi])
            whole = j < len(ks) and ks[i] == lo and ks[j] == hi
            starts.append(ks[i:j + 1] - lo + taken if whole else None)
            taken += hi - lo
            self._pos = hi
            if self._pos >= len(upd):
                self._drop_oldest()
                if not self._held:
                    self._load()
        if len(pieces) == 1:
            return pieces[0], starts[0]
        if any(s is None for s in starts):
            return Updates.concat(pieces), None
        # each piece's starts end where the next piece's begin: keep that position once
        return Updates.concat(pieces), np.concatenate([s[:-1] for s in starts[:-1]]
                                                      + [starts[-1]])

    def close(self) -> None:
        while self._held:
            self._drop_oldest()


# The row a budget's window (``ctx.window_rows``) is sized for: an int64 key and val, a
# time and a diff. A window of wider rows takes fewer of them, so that a step holds the
# bytes the budget planned for: 400-byte strings merged under 64 MiB in steps of 131k
# rows each peaked at 381 MiB over the baseline.
NOMINAL_ROW_BYTES = 32


def _width_scale(batches: list[Batch]) -> float:
    """The nominal row's width over the batches' mean row width (data, time, diff), at
    most 1: what a window of rows sized for nominal rows is scaled by."""
    return min(1.0, NOMINAL_ROW_BYTES / (16 + payload_per_update(batches)))


class MergedReader:
    """Steps of all sources' updates over increasing, disjoint key ranges."""

    def __init__(self, batches: list[Batch], ctx: StorageContext, tags: list[int] | None = None,
                 window_rows: int | None = None, dictionary: dict | None = None):
        """``dictionary``: per tag, the val columns to read as dictionary arrays."""
        self.ctx = ctx
        scale = _width_scale(batches)
        self.window_rows = window_rows or max(16, int(ctx.window_rows * scale))
        tags = tags if tags is not None else [0] * len(batches)
        dictionary = dictionary or {}
        self._sources = [(BatchReader(b, ctx, dictionary=dictionary.get(t, frozenset())), t)
                         for b, t in zip(batches, tags) if len(b)]
        # a step holds a window of every source and its kernels several copies of the
        # step: keep the step's total, not each source's share, proportional to the
        # budget, so a wide merge costs no more memory than a narrow one
        # (at least 1024 nominal rows' bytes a source)
        self._least = max(16, int(1024 * scale))
        self.window_rows = max(self._least,
                               self.window_rows * 4 // max(4, len(self._sources)))
        # Each source's window is its share of the step, so that every window spans
        # about the same keys: with equal windows the densest source's window ends
        # first and cuts every step short (a step over an 8M-row batch and a 1M-row run
        # took ~32k of the run's rows and ~4k of the batch's). The shares start by size
        # and then follow the rows each source gave the last step: all of them were cut
        # at one key, so those counts are the sources' densities over the same keys (a
        # dimension's run of dense ids is far denser than a fact table's).
        self._step_rows = self.window_rows * len(self._sources)
        self._windows = self._shares([len(r.batch) for r, _ in self._sources])

    def held_bytes(self) -> int:
        """What the sources' decoded parts hold on the budget."""
        return sum(r.held_bytes() for r, _ in self._sources)

    def _shares(self, rows: list[int]) -> list[int]:
        total = max(sum(rows), 1)
        return [max(self._least, self._step_rows * n // total) for n in rows]

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


def part_edges(batch: Batch, keys: pa.Table) -> np.ndarray:
    """For sorted query keys: where each part's queries begin, and the end (part ``p``
    may hold queries ``[edges[p], edges[p + 1])``; those before ``edges[0]`` precede
    every part). Each part's first key is searched among the queries, not each query
    among the parts: a few searches instead of one per query."""
    if not batch.parts:
        return np.full(1, keys.num_rows, np.int64)
    firsts = batch.first_keys()
    names = keys.column_names
    qc, fc = codes([keys, firsts.rename_columns(names)], names)
    return np.append(np.searchsorted(qc, fc, side="left"), len(qc)).astype(np.int64)
