"""Merger: merges batches a bit at a time (``work(fuel)``), compacting as it goes.

Design
------
A merger owns a :class:`MergedReader` over its input batches and a :class:`Builder`
for the output. ``work(fuel)`` runs merge steps -- each a key range holding all of its
keys' updates from every input -- consolidating each step with times advanced to the
merge's ``since`` (logical compaction), until the fuel (counted in input updates) is
spent. No caller ever pays for a whole merge at once; a step may overshoot the fuel by
at most one window.

A step that raises (a full disk, a reservation that does not fit) abandons the merge:
its half-written output and its reservations go at once, ``failed`` is set, and the
inputs -- never modified -- stay with whoever holds them (the spine starts a new merger).

Invariants
----------
- The output holds exactly the consolidated sum of the inputs with times advanced to
  ``since``: every accumulation at times ``>= since`` is unchanged.
- Inputs stay readable until the merge is done; the output is visible only then.
"""

from __future__ import annotations

from arrangedb.spine.storage.batch import Batch
from arrangedb.spine.build.builder import Builder
from arrangedb.spine.storage.context import StorageContext
from arrangedb.spine.data.description import Description
from arrangedb.spine.data.kernels import consolidate
from arrangedb.spine.read.reader import MergedReader, step_updates


class Merger:
    def __init__(self, batches: list[Batch], since: int, ctx: StorageContext,
                 whole: bool = False):
        """``whole``: the output is read on its own (a spine's merge, not a merge down to
        a read's fan-in), so it may be cut into larger parts."""
        self.inputs = batches
        self.since = since
        self.ctx = ctx
        first = batches[0]
        self._result: Batch | None = None
        self.failed = False
        self.remaining = self._total = sum(len(b) for b in batches)
        self._owed = 0   # fuel inserts gave (:meth:`pay`): work this merge must have done
        part_bytes = ctx.whole_part_bytes(sum(b.payload_bytes for b in batches)) if whole else None
        self._builder = Builder(ctx, first.key_schema, first.val_schema, part_bytes=part_bytes)
        self._reader = MergedReader(batches, ctx)
        self._steps = iter(self._reader)

    @property
    def done(self) -> bool:
        return self._result is not None

    def held_bytes(self) -> int:
        """What the merge in progress holds on the budget between steps: its inputs'
        decoded parts and its output's buffer."""
        return self._reader.held_bytes() + self._builder.reserved

    def pay(self, fuel: int) -> None:
        """Fuel an insert gives: the merge must then have done ``fuel`` more units of
        work than inserts asked of it before. Work done ahead -- idle slices, steps
        longer than the fuel asked -- counts, so an insert pays only what the merge is
        behind (an insert while the idle merger keeps up pays nothing)."""
        self._owed += fuel
        due = self._owed - (self._total - self.remaining)
        if due > 0:
            self.work(due)

    def work(self, fuel: int) -> int:
        """Spend up to ``fuel`` units (input updates); return what is left (may be < 0)."""
        if self.failed:
            raise RuntimeError("this merge failed and was abandoned; start a new one")
        try:
            return self._work(fuel)
        except BaseException:
            self.failed = True
            self.abort()
            raise

    def _work(self, fuel: int) -> int:
        while fuel > 0 and self._result is None:
            step = next(self._steps, None)
            if step is None:
                desc = Description.covering([b.description for b in self.inputs], self.since)
                self._result = self._builder.done(self.since, desc.lower, desc.upper)
                break
            upd = step_updates(step)
            n = len(upd)
            runs = sum(1 for _, u, _ in step if len(u))   # the sort's strategy depends on it
            self._builder.push(consolidate(upd, self.since, presorted_runs=runs))
            fuel -= n
            self.remaining -= n
        return fuel

    def finish(self) -> Batch:
        while not self.done:
            self.work(1 << 62)
        return self._result

    def abort(self) -> None:
        """Stop an unfinished merge: its readers' decoded parts, its builder's buffer and
        half-written file go now (a trace closed mid-merge kept them reserved)."""
        if self._result is None:
            try:
                self._steps.close()
            finally:
                self._builder.abort()

    def result(self) -> Batch:
        assert self._result is not None, "merge not done"
        return self._result
