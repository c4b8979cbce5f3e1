"""Resident batches: a small insert stays in memory as its sorted updates, not as pages.

Design
------
An incremental insert (say a 1% delta) is read back at once -- its changes are what the
next incremental join or reduce consumes -- and is merged into a larger batch by the
spine soon after. Paging it out costs a layout, an encoding and a write now, and a
decode and an expansion at every read; for a small batch that is most of the insert's
cost. So, as an LSM tree's memtable, a run that ``Trace.insert`` sorts, of at most
``limit / 16`` bytes, is kept as one :class:`ResidentPart` holding the consolidated
updates and their key starts, exactly what a read of a paged part produces. (A larger
insert sorts into runs cut to that size -- see ``ResidentBatches.room`` -- each staying
while the share allows; the spine soon merges them into page files.)

Resident bytes are reserved from the budget, together at most a quarter of it. They
are not a cache that can be dropped: under pressure the budget's spiller writes the
oldest resident batches into page files (``page_out``), one paged part per resident
part, so a reader that walks a batch by part index sees the same rows either way.
When the spine merges a resident batch away, its reservation goes with it.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa

from arrangedb.spine.storage.batch import Batch
from arrangedb.spine.data.description import Description
from arrangedb.spine.data.layout import PartLayout, to_layout
from arrangedb.spine.storage.dictionaries import with_dictionaries
from arrangedb.spine.storage.part import Part, boundary_key, payload_bytes
from arrangedb.spine.data.updates import Updates, extent
from arrangedb.spine.storage.encode import write_part
from arrangedb.pager.sizing import (RESIDENT_BATCH_SHARE, RESIDENT_TOTAL_SHARE, RUN_SHARE,
                                    SPILL_RESIDENT_DATA)



@dataclass
class ResidentPart(Part):
    """A part held as sorted, consolidated updates and the row where each key starts."""

    updates: Updates = field(default=None, repr=False)
    starts: np.ndarray = field(default=None, repr=False)
    pins: int = field(default=0, repr=False)   # reads not yet released
    decodes = False   # a reader holds nothing beyond what the part already holds
    distinct_leaves = False   # its lookup_layout repeats a val stored at several times

    def read(self, dictionary: frozenset = frozenset()):
        """The updates; pinned until ``release()``: paging out a batch a reader holds
        would free no memory while releasing its reservation."""
        self.pins += 1
        upd = self.updates
        if dictionary and upd.vals is not None:
            upd = replace(upd, vals=with_dictionaries(upd.vals, dictionary))
        return upd, self.starts

    def release(self) -> None:
        self.pins = max(0, self.pins - 1)

    def layout(self):
        return to_layout(self.updates)

    def val_nulls(self, name: str) -> int | None:
        vals = self.updates.vals
        return vals.column(name).null_count if vals is not None else 0

    def min_diff(self) -> int:
        diffs = self.updates.diffs   # (no layout: an insert asks this of every run)
        return int(diffs.min()) if len(diffs) else 1

    def stored_layout(self, dictionary: frozenset = frozenset()) -> None:
        return None   # held as updates: ``read`` hands them over without a decode

    def lookup_layout(self, dictionary: frozenset = frozenset(), dense: bool = False
                      ) -> PartLayout:
        """The updates as a layout without compacting them: each row its own leaf (a
        val repeated at several times is then several leaves, which a lookup sums
        alike). Costs a take of the distinct keys, not ``to_layout``'s sort-aware pass."""
        upd, starts = self.read(dictionary)   # pinned until the lookup's release()
        try:
            keys = upd.keys.take(starts[:-1])
        except BaseException:
            self.release()
            raise
        if upd.vals is None:
            return PartLayout(keys, starts, None, None, upd.times, upd.diffs)
        rows = np.arange(len(upd) + 1, dtype=np.int64)
        return PartLayout(keys, starts, upd.vals, rows, upd.times, upd.diffs)


def _owned(table: pa.Table | None) -> pa.Table | None:
    """A copy of ``table`` in buffers of its own: a run may share the caller's buffers
    (an input already sorted comes through consolidate as it is; a slice pins all of
    its parent), which a batch kept in memory must neither see change nor keep alive."""
    if table is None:
        return None
    return table.take(pa.array(np.arange(table.num_rows, dtype=np.int64)))


def resident_part(run: Updates, starts: np.ndarray, copy: bool = True) -> ResidentPart:
    """``copy``: the run may share buffers with its input (see :func:`_owned`); False
    when it is known to be fresh (consolidation reordered it: a take allocates)."""
    if copy:
        run = replace(run, keys=_owned(run.keys), vals=_owned(run.vals))
    keys = run.keys
    return ResidentPart(num_updates=len(run), num_keys=len(starts) - 1,
                        first_key=boundary_key(keys, 0),
                        last_key=boundary_key(keys, keys.num_rows - 1),
                        # payload as a paged part counts it: keys once each
                        payload=payload_bytes(keys, starts[:-1]) + payload_bytes(run.vals),
                        stored=run.nbytes + starts.nbytes, updates=run, starts=starts)


class ResidentBatches:
    """The engine's resident batches: admission, reservations and paging out."""

    def __init__(self, ctx, budget):
        self.ctx = ctx
        self.budget = budget
        self.batch_cap = budget.limit // RESIDENT_BATCH_SHARE
        self.total_cap = budget.limit // RESIDENT_TOTAL_SHARE
        self.bytes = 0
        self.paged_out = 0
        self.spill_error: OSError | None = None   # the last page-out that failed
        self._held: dict[int, tuple[weakref.ref, int]] = {}   # id(batch) -> (ref, bytes)
        self._lock = threading.RLock()
        self._token = budget.add_spiller(self.spill, priority=SPILL_RESIDENT_DATA)

    def admits(self, nbytes: int) -> bool:
        """Whether a run of ``nbytes`` may stay resident: small, within the resident
        share, leaving at least half the budget free, and fitting beside what RSS
        already shows (else reserving it would only page out an older one)."""
        b = self.budget
        return (0 < nbytes <= self.batch_cap and self.bytes + nbytes <= self.total_cap
                and b.held + nbytes <= b.limit // RUN_SHARE and self._fits_rss(nbytes))

    def room(self) -> int:
        """Bytes the next run may hold and still be admitted (RSS aside): what a
        resident-sized run is cut to, so that an insert of a few times the batch share
        stays in memory as several runs instead of being paged out as one. 0 when less
        than a quarter of the batch share is left: runs cut smaller only multiply."""
        b = self.budget
        # admission counts the run's own input too, still reserved then: half of what
        # is left under half the budget
        room = min(self.batch_cap, self.total_cap - self.bytes, (b.limit // RUN_SHARE - b.held) // 2)
        return room if room >= self.batch_cap // 4 else 0

    def holds(self, batch: Batch) -> bool:
        """Whether ``batch`` is one of the resident batches (not paged out)."""
        with self._lock:
            return id(batch) in self._held

    def _fits_rss(self, nbytes: int) -> bool:
        """RSS leaves room for ``nbytes`` more -- after handing freed memory back if it
        does not at first (a sort just freed its arrays, which the allocators keep)."""
        b = self.budget
        if b.rss(fast=True) - b.baseline_rss + nbytes <= b.limit:
            return True
        return b.trim_if_high() and b.rss(fast=True) - b.baseline_rss + nbytes <= b.limit

    def make(self, run: Updates, starts: np.ndarray, key_schema, val_schema,
             copy: bool = True) -> Batch:
        """A batch of one resident part; the caller has checked :meth:`admits`."""
        part = resident_part(run, starts, copy)
        lo, hi = extent(run.times)
        batch = Batch([part], Description(lo, hi + 1, 0), key_schema, val_schema)
        nbytes = part.stored
        self.budget.reserve(nbytes, "resident batches")
        with self._lock:
            self.bytes += nbytes
            self._held[id(batch)] = (weakref.ref(batch), nbytes)
        batch.on_drop(lambda key=id(batch): self._forget(key))
        weakref.finalize(batch, self._forget, id(batch))
        return batch

    def _forget(self, key: int) -> int:
        with self._lock:
            entry = self._held.pop(key, None)
            if entry is None:
                return 0
            self.bytes -= entry[1]
        self.budget.release(entry[1], "resident batches")
        return entry[1]

    def page_out(self, batch: Batch) -> int:
        """Write a resident batch's parts into a page file; returns the bytes released."""
        with self._lock:
            if id(batch) not in self._held:
                return 0
        if any(p.pins for p in batch.parts):
            return 0   # a reader holds its arrays: writing them out would free nothing
        writer = self.ctx.new_writer("resident")
        try:
            parts = [write_part(writer, i, p.layout(), self.ctx.codec,
                                (batch.key_schema, batch.val_schema))
                     for i, p in enumerate(batch.parts)]
            pagefile = writer.finish(budget=self.budget)
        except BaseException:
            writer.abort()
            raise
        for p in parts:
            p.pagefile = pagefile
            p.cache = self.ctx.block_cache
        batch.attach(parts, pagefile)
        self.paged_out += 1
        return self._forget(id(batch))

    def _batches(self) -> list[Batch]:
        """Live resident batches, oldest first."""
        with self._lock:
            refs = [ref for ref, _ in self._held.values()]
        return [b for b in (r() for r in refs) if b is not None]

    def spill(self, wanted: int) -> int:
        """Page out the oldest resident batches until ``wanted`` bytes are released.

        Runs inside some other ``reserve``: a write that fails here (a full or vanished
        spill directory) must not fail that caller with an unrelated error. It stops
        paging; the error is kept in ``spill_error`` and the caller's reservation fails
        (BudgetExceeded) only if it still does not fit."""
        freed = 0
        for batch in self._batches():
            if freed >= wanted:
                break
            try:
                freed += self.page_out(batch)
            except OSError as e:   # SpillError, PageFileError and ENOSPC are OSErrors
                self.spill_error = e
                break
        return freed

    def close(self) -> None:
        self.budget.remove_spiller(self._token)
