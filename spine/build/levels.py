"""Spine: a log-structured sequence of batches with fueled, geometric merging.

Design
------
As differential dataflow's ``spine_fueled``: level ``i`` holds at most one batch (of
about ``2^i`` updates) or one merge in progress of two batches. A batch of ``n``
updates enters at level ``ceil(log2 n)``; before it does, every merge in progress gets
``(8 << level) * effort`` units of fuel (4 for the new records, 4 for those rolled up
from below), and the levels below are rolled up into it. When a batch lands on a level
that holds one, the two start merging; when it lands on a level already merging, that
merge is finished first and its result moves up. A merge that fuel finishes puts its
result on the level its size calls for, down through vacant levels: retractions cancel
in merges, and a view's state merged with each change keeps its size (differential
dataflow's spine draws a large layer down the same way). ``exert`` spends fuel while
idle and, with no merge in progress, starts one -- without it, retracted data would
hold memory forever once inserts stop.

Failure atomicity and readers: every change (``insert``, ``insert_runs``, ``exert``,
``merge_all``, frontier moves) runs as a transaction over a copy of the level list.
Readers never see it in progress: :meth:`batches` returns the batches of the last
committed version, which a commit replaces in one assignment. A change that raises
(a full disk in a merge, a budget that does not fit) restores the levels it started
from: no input batch is dropped, a merge that failed is abandoned -- its output file
and reservations go -- and is started afresh by the next fuel. Batches are immutable,
so the version restored is exactly the one readers saw.

Physical compaction: batches whose upper is beyond the physical frontier wait in
``pending`` and are not merged, so that readers who asked for those batch boundaries
keep them. Logical compaction: every merge advances times to the logical frontier
(``since``) that held when it started.

Mathematics
-----------
Level ``i`` holds at most ``2^(i+1)`` updates, so a trace of ``n`` updates holds
``O(log n)`` batches; each update is rewritten ``O(log n)`` times overall, and an
insert of ``n`` updates pays ``O(n)`` merge work. With an idle merger the merges far
above an insert's level get an eighth of that fuel and the rest from idle time
(:meth:`Spine._pay_for`); the bound on batches holds all the same, since a merge still
in progress when a batch lands on its level is finished then.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from arrangedb.spine.storage.batch import Batch
from arrangedb.spine.storage.context import StorageContext
from arrangedb.spine.build.exertion import LevelState
from arrangedb.spine.build.merger import Merger
from arrangedb.spine.persist import inherit


def level_of(n: int) -> int:
    return max(n - 1, 0).bit_length()


@dataclass
class Level:
    """One batch, or the inputs of one merge (started lazily by :meth:`Spine._merger`,
    and again after a failed attempt was abandoned)."""

    batches: list[Batch]
    since: int = 0
    compact: bool = False       # a lone batch merged with nothing, to compact it
    merger: Merger | None = None

    @property
    def merging(self) -> bool:
        return len(self.batches) > 1 or self.compact


@dataclass
class Spine:
    ctx: StorageContext
    effort: int = 1
    since: int = 0                      # logical compaction frontier
    physical: int | None = None         # physical compaction frontier (None: unbounded)
    levels: list[Level | None] = field(default_factory=list)
    pending: list[Batch] = field(default_factory=list)
    _published: tuple = ()              # the batches of the last committed version
    version: int = 0                    # committed changes so far (readers key caches on it)
    retracting_inserts: int = 0         # inserted batches with a negative diff (numbered)
    _depth: int = 0                     # transactions open (nested calls join the outer)

    # -- reading -------------------------------------------------------------------
    def batches(self) -> list[Batch]:
        """Every batch a reader must see -- settled, being merged (inputs), pending --
        as of the last committed change."""
        return list(self._published)

    def _current(self) -> tuple:
        out = []
        for lvl in self.levels:
            if lvl is not None:
                out.extend(lvl.batches)
        return tuple(out + self.pending)

    @contextlib.contextmanager
    def _transaction(self):
        """Apply a change completely, or not at all (see the module's Design)."""
        if self._depth:
            yield
            return
        saved = list(self.levels), list(self.pending), self.since, self.physical
        self._depth += 1
        try:
            yield
        except BaseException:
            self.levels, self.pending, self.since, self.physical = saved
            for lvl in self.levels:   # a merge that failed starts afresh next time
                if lvl is not None and lvl.merger is not None and lvl.merger.failed:
                    lvl.merger = None
            raise
        finally:
            self._depth -= 1
        self._published = self._current()
        self.version += 1

    def _merger(self, lvl: Level) -> Merger:
        if lvl.merger is None:
            lvl.merger = Merger(lvl.batches, lvl.since, self.ctx, whole=True)
        return lvl.merger

    def _merged(self, lvl: Level) -> Batch:
        """The level's merge, finished (a level of one batch is that batch)."""
        if not lvl.merging:
            return lvl.batches[0]
        result = self._merger(lvl).finish()
        inherit(result, lvl.batches)
        return result

    # -- writing -------------------------------------------------------------------
    def insert(self, batch: Batch) -> None:
        if len(batch) == 0:
            return
        with self._transaction():
            self._number_retractions([batch])
            self.pending.append(batch)
            self._consider_pending()

    def insert_runs(self, runs: list[Batch]) -> None:
        with self._transaction():
            self._number_retractions(runs)
            self._insert_runs(runs)

    def _number_retractions(self, batches: list[Batch]) -> None:
        """Number the inserted batches that retract something: a reader that found every
        row counting at least zero knows it still holds while no batch numbered later
        came in (merges and inserts without retractions keep it), and can check the
        batches numbered later alone while they are unmerged (``read/signs.py``)."""
        for b in batches:
            if len(b) and b.retraction_seq is None and not b.nonnegative():
                self.retracting_inserts += 1
                b.retraction_seq = self.retracting_inserts

    def _insert_runs(self, runs: list[Batch]) -> None:
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
        self._pay_for(index)
        self._roll_up(index)
        while len(self.levels) <= index:
            self.levels.append(None)
        lvl = self.levels[index]
        if lvl is not None and lvl.merging:
            self.levels[index] = None
            self._promote(self._merged(lvl), lvl.batches, index)
            lvl = self.levels[index]
        inputs = (lvl.batches if lvl is not None else []) + runs
        self.levels[index] = Level(inputs, self.since)

    def set_since(self, frontier: int) -> None:
        """Advance the logical compaction frontier (merges started from now use it)."""
        with self._transaction():
            self.since = max(self.since, frontier)

    def set_physical(self, frontier: int | None) -> None:
        with self._transaction():
            self.physical = frontier
            self._consider_pending()

    def _consider_pending(self) -> None:
        while self.pending and (self.physical is None or
                                self.pending[0].description.upper <= self.physical):
            self._introduce(self.pending.pop(0))

    def _introduce(self, batch: Batch) -> None:
        index = level_of(len(batch))
        self._pay_for(index)
        self._roll_up(index)
        self._insert_at(batch, index)

    def _roll_up(self, index: int) -> None:
        """Merge everything below ``index`` into one batch placed at ``index``."""
        below = []
        for i in range(min(index, len(self.levels))):
            lvl = self.levels[i]
            if lvl is not None:
                below.append(self._merged(lvl))
                self.levels[i] = None
        if not below:
            return
        if len(below) == 1:
            merged = below[0]
        else:
            merged = Merger(below, self.since, self.ctx, whole=True).finish()
            inherit(merged, below)
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
            self.levels[index] = Level([lvl.batches[0], batch], self.since)
        else:
            self.levels[index] = Level([batch])
            self._promote(self._merged(lvl), lvl.batches, index)

    def _promote(self, result: Batch, inputs: list[Batch], index: int,
                 settle: bool = False) -> None:
        """Put a merge's result on the level above its inputs' (``settle``: lower, down
        to the level its size calls for, through levels left vacant)."""
        self._drop_inputs(inputs)
        if len(result):
            at = index + 1
            if settle:
                while at > level_of(len(result)) and self.levels[at - 1] is None:
                    at -= 1
            self._insert_at(result, at)

    def _pay_for(self, index: int) -> None:
        """The fuel a batch landing on level ``index`` pays: ``(8 << index) * effort``
        to every merge in progress, as differential dataflow's spine does. With an idle
        merger (``ctx.idle``), merges more than a level above get an eighth of that --
        about the batch's own size -- and the rest of their work from idle time: an
        insert costs in proportion to itself, not to the merge of the runs a large
        arrange left, and those merges still move with every insert (a merge still
        unfinished when a batch lands on its level is finished then). Work a merge did
        ahead (idle slices) counts towards what inserts give it (``Merger.pay``)."""
        fuel = (8 << index) * self.effort
        if self.ctx.idle is None:
            self._apply_fuel(fuel)
            return
        self._apply_fuel(fuel, upto=index + 1)
        self._apply_fuel(fuel // 8, start=index + 2)

    def _apply_fuel(self, fuel: int, upto: int | None = None, start: int = 0,
                    ahead: bool = False) -> None:
        """``fuel`` to every merge in progress on levels ``start`` to ``upto``: as an
        insert's payment (work done ahead counts towards it), or ``ahead`` of time."""
        top = len(self.levels) if upto is None else min(upto + 1, len(self.levels))
        for i in range(start, top):
            lvl = self.levels[i]
            if lvl is not None and lvl.merging:
                merger = self._merger(lvl)
                if ahead:
                    merger.work(fuel)
                else:
                    merger.pay(fuel)
                if merger.done:
                    self.levels[i] = None
                    self._promote(self._merged(lvl), lvl.batches, i, settle=True)

    def exert(self, fuel: int, policy=None) -> None:
        """Spend ``fuel`` units of merge work, starting a merge if none is in progress
        (and ``policy``, an exertion policy, still asks for work)."""
        with self._transaction():
            self._exert(fuel, policy)

    def _exert(self, fuel: int, policy=None) -> None:
        """Spend ``fuel`` on merges in progress, starting the next one whenever none is
        left -- the two lowest batches, or a lone batch behind the logical frontier
        (merged with nothing, to compact it) -- until the fuel or the work runs out, or
        ``policy`` asks for no more."""
        while fuel > 0:
            if not self._merging() and (
                    (policy is not None and not policy(self.level_states()))
                    or not self._start_merge()):
                return
            before = self._work_left()
            self._apply_fuel(fuel, ahead=True)
            fuel -= max(before - self._work_left(), 1)

    def merge_held_bytes(self) -> int:
        """What the merges in progress hold on the budget between steps."""
        mergers = [lvl.merger for lvl in list(self.levels) if lvl is not None]
        return sum(m.held_bytes() for m in mergers if m is not None)

    def merging_batches(self) -> set[int]:
        """The ids of the batches a merge in progress is to replace."""
        return {id(b) for lvl in list(self.levels) if lvl is not None and lvl.merging
                for b in lvl.batches}

    def _merging(self) -> bool:
        return any(lvl is not None and lvl.merging for lvl in self.levels)

    def _work_left(self) -> int:
        return sum(self._merger(lvl).remaining for lvl in self.levels
                   if lvl is not None and lvl.merging)

    def _start_merge(self) -> bool:
        occupied = [i for i, lvl in enumerate(self.levels) if lvl is not None]
        if len(occupied) >= 2:
            lo, hi = occupied[0], occupied[1]
            batch = self.levels[lo].batches[0]
            self.levels[lo] = None
            self._insert_at(batch, hi)
            return True
        if len(occupied) == 1:
            i = occupied[0]
            batch = self.levels[i].batches[0]
            if batch.description.since < self.since:
                self.levels[i] = Level([batch], self.since, compact=True)
                return True
        return False

    def has_work(self) -> bool:
        """Whether ``exert`` would do anything: a merge in progress, two batches to
        merge, or a lone batch behind the logical compaction frontier."""
        occupied = [lvl for lvl in self.levels if lvl is not None]
        if len(occupied) > 1 or any(lvl.merging for lvl in occupied):
            return True
        return bool(occupied) and occupied[0].batches[0].description.since < self.since

    def level_states(self) -> list[LevelState]:
        """The occupied levels, lowest first, for an exertion policy."""
        return [LevelState(i, len(lvl.batches), sum(len(b) for b in lvl.batches),
                           lvl.merging,
                           any(b.description.since < self.since for b in lvl.batches))
                for i, lvl in enumerate(self.levels) if lvl is not None]

    def merge_all(self) -> None:
        """Finish every merge and leave at most one settled batch (pending ones aside)."""
        with self._transaction():
            while True:
                occupied = [i for i, lvl in enumerate(self.levels) if lvl is not None]
                if not occupied:
                    return
                if len(occupied) == 1 and not self.levels[occupied[0]].merging:
                    return
                self._exert(1 << 62)

    def _drop_inputs(self, inputs: list[Batch]) -> None:
        """Merged-away inputs: their page files go when the last reader lets go of them.

        Nothing to do here: a batch deletes its page file when it is garbage, and readers
        in progress hold their own references to the batches they walk.
        """

    def close(self) -> None:
        try:
            for lvl in self.levels:
                if lvl is not None and lvl.merger is not None:
                    lvl.merger.abort()
        finally:
            for b in self._current():
                b.drop()
            self.levels, self.pending, self._published = [], [], ()
