"""Spine: a log-structured sequence of batches with fueled, geometric merging.

Design
------
As differential dataflow's ``spine_fueled``: level ``i`` holds at most one batch (of
about ``2^i`` updates) or one merge in progress of two batches. A batch of ``n``
updates enters at level ``ceil(log2 n)``; before it does, every merge in progress gets
``(8 << level) * effort`` units of fuel (4 for the new records, 4 for those rolled up
from below), and the levels below are rolled up into it. When a batch lands on a level
that holds one, the two start merging; when it lands on a level already merging, that
merge is finished first and its result moves up. ``exert`` spends fuel while idle and,
with no merge in progress, starts one -- without it, retracted data would hold memory
forever once inserts stop.

Physical compaction: batches whose upper is beyond the physical frontier wait in
``pending`` and are not merged, so that readers who asked for those batch boundaries
keep them. Logical compaction: every merge advances times to the logical frontier
(``since``) that held when it started.

Mathematics
-----------
Level ``i`` holds at most ``2^(i+1)`` updates, so a trace of ``n`` updates holds
``O(log n)`` batches; each update is rewritten ``O(log n)`` times overall, and an
insert of ``n`` updates pays ``O(n)`` merge work.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arrangedb.spine.batch import Batch
from arrangedb.spine.context import StorageContext
from arrangedb.spine.merger import Merger


def level_of(n: int) -> int:
    return max(n - 1, 0).bit_length()


@dataclass
class Level:
    batches: list[Batch]
    merger: Merger | None = None

    @property
    def merging(self) -> bool:
        return self.merger is not None


@dataclass
class Spine:
    ctx: StorageContext
    effort: int = 1
    since: int = 0                      # logical compaction frontier
    physical: int | None = None         # physical compaction frontier (None: unbounded)
    levels: list[Level | None] = field(default_factory=list)
    pending: list[Batch] = field(default_factory=list)

    # -- reading -------------------------------------------------------------------
    def batches(self) -> list[Batch]:
        """Every batch a reader must see: settled, being merged (inputs), and pending."""
        out = []
        for lvl in self.levels:
            if lvl is not None:
                out.extend(lvl.batches)
        return out + list(self.pending)

    # -- writing -------------------------------------------------------------------
    def insert(self, batch: Batch) -> None:
        if len(batch) == 0:
            return
        self.pending.append(batch)
        self._consider_pending()

    def insert_runs(self, runs: list[Batch]) -> None:
        """Insert sorted runs of one input as a merge in progress, not as a merged batch.

        The runs land together on the level their total size calls for, as the inputs of
        one k-way merge that later inserts (or ``exert``) fuel like any other. Readers
        see a merge's inputs, so a trace arranged and then read at once is read through
        one k-way pass over its runs: the merged batch is written only if the trace
        lives on long enough to pay for it.
        """
        runs = [r for r in runs if len(r)]
        if len(runs) <= 1 or self.physical is not None:
            for r in runs:
                self.insert(r)
            return
        index = level_of(sum(len(r) for r in runs))
        self._apply_fuel((8 << index) * self.effort)
        self._roll_up(index)
        while len(self.levels) <= index:
            self.levels.append(None)
        lvl = self.levels[index]
        if lvl is not None and lvl.merging:
            self.levels[index] = None
            self._promote(lvl.merger.finish(), lvl.batches, index)
            lvl = self.levels[index]
        inputs = (lvl.batches if lvl is not None else []) + runs
        self.levels[index] = Level(inputs, Merger(inputs, self.since, self.ctx))

    def set_physical(self, frontier: int | None) -> None:
        self.physical = frontier
        self._consider_pending()

    def _consider_pending(self) -> None:
        while self.pending and (self.physical is None or
                                self.pending[0].description.upper <= self.physical):
            self._introduce(self.pending.pop(0))

    def _introduce(self, batch: Batch) -> None:
        index = level_of(len(batch))
        self._apply_fuel((8 << index) * self.effort)
        self._roll_up(index)
        self._insert_at(batch, index)

    def _roll_up(self, index: int) -> None:
        """Merge everything below ``index`` into one batch placed at ``index``."""
        below = []
        for i in range(min(index, len(self.levels))):
            lvl = self.levels[i]
            if lvl is not None:
                below.append(lvl.merger.finish() if lvl.merging else lvl.batches[0])
                self.levels[i] = None
        if not below:
            return
        merged = below[0] if len(below) == 1 else Merger(below, self.since, self.ctx).finish()
        self._drop_inputs(below if len(below) > 1 else [])
        if len(merged):
            self._insert_at(merged, index)

    def _insert_at(self, batch: Batch, index: int) -> None:
        while len(self.levels) <= index:
            self.levels.append(None)
        lvl = self.levels[index]
        if lvl is None:
            self.levels[index] = Level([batch])
        elif not lvl.merging:
            pair = [lvl.batches[0], batch]
            self.levels[index] = Level(pair, Merger(pair, self.since, self.ctx))
        else:
            self.levels[index] = Level([batch])
            self._promote(lvl.merger.finish(), lvl.batches, index)

    def _promote(self, result: Batch, inputs: list[Batch], index: int) -> None:
        self._drop_inputs(inputs)
        if len(result):
            self._insert_at(result, index + 1)

    def _apply_fuel(self, fuel: int) -> None:
        for i in range(len(self.levels)):
            lvl = self.levels[i]
            if lvl is not None and lvl.merging:
                lvl.merger.work(fuel)
                if lvl.merger.done:
                    self.levels[i] = None
                    self._promote(lvl.merger.result(), lvl.batches, i)

    def exert(self, fuel: int) -> None:
        """Spend ``fuel`` units of merge work, starting a merge if none is in progress."""
        if not any(lvl is not None and lvl.merging for lvl in self.levels):
            occupied = [i for i, lvl in enumerate(self.levels) if lvl is not None]
            if len(occupied) >= 2:
                lo, hi = occupied[0], occupied[1]
                batch = self.levels[lo].batches[0]
                self.levels[lo] = None
                self._insert_at(batch, hi)
            elif len(occupied) == 1:
                i = occupied[0]
                batch = self.levels[i].batches[0]
                if batch.description.since < self.since:
                    # a lone batch behind the frontier: merge it with nothing to compact it
                    self.levels[i] = Level([batch], Merger([batch], self.since, self.ctx))
        self._apply_fuel(fuel)

    def merge_all(self) -> None:
        """Finish every merge and leave at most one settled batch (pending ones aside)."""
        while True:
            occupied = [i for i, lvl in enumerate(self.levels) if lvl is not None]
            if not occupied:
                return
            if len(occupied) == 1 and not self.levels[occupied[0]].merging:
                return
            self.exert(1 << 62)

    def _drop_inputs(self, inputs: list[Batch]) -> None:
        """Merged-away inputs: their page files go when the last reader lets go of them.

        Nothing to do here: a batch deletes its page file when it is garbage, and readers
        in progress hold their own references to the batches they walk.
        """

    def close(self) -> None:
        try:
            for lvl in self.levels:
                if lvl is not None and lvl.merging:
                    lvl.merger.abort()
        finally:
            for b in self.batches():
                b.drop()
            self.levels, self.pending = [], []
