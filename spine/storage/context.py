"""StorageContext: what the spine needs from the engine -- budget, spill directory, sizes.

Builders and merges ask the context for a page writer and reserve memory through it;
sizes derive from the budget (:mod:`arrangedb.pager.sizing`) so that a small budget gets
small parts and windows. Page files are opened and mapped by the storage modules
(:mod:`.paged`, :mod:`.resident`) and by checkpoints (:mod:`arrangedb.spine.persist`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

from arrangedb.pager import PageWriter
from arrangedb.pager.mapped_regions import MappedRegions
from arrangedb.spine.storage.blockcache import BlockCache
from arrangedb.spine.storage.resident import ResidentBatches
from arrangedb.pager.sizing import (LARGE_PART_FACTOR, LARGE_PART_MIN_PARTS, LARGE_PARTS_READ,
                                    READERS_SHARE)


@dataclass
class StorageContext:
    budget: object | None = None  # arrangedb.pager.MemoryBudget
    spill: object | None = None   # arrangedb.pager.SpillDirectory; None keeps parts in memory
    codec: str = "auto"
    part_bytes: int = 4 << 20     # target decoded size of a part
    large_part_bytes: int | None = None  # parts of a batch read on its own (None: part_bytes)
    window_rows: int = 1 << 16    # rows each source contributes to one merge step
    run_bytes: int | None = None  # what sorting one run may hold (None: half the budget)
    read_fan_in: int = 8          # runs a read walks at once (more are merged down first)
    block_cache: object | None = None  # arrangedb.spine.storage.blockcache.BlockCache; None: no cache
    resident: object | None = None     # arrangedb.spine.storage.resident.ResidentBatches; None: all paged
    engine_id: int | None = None       # the engine whose budget this is (streams name it)
    idle: object | None = None         # arrangedb.spine.build.idle.IdleMerger; None: no thread
    idle_thread: int | None = None     # its thread's ident: its reservations are not activity
    last_activity: float = 0.0         # monotonic time of others' last reservation or release
    active: int = 0                    # builds and reads going on in other threads
    _active_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def for_budget(cls, budget, spill, codec: str = "auto") -> "StorageContext":
        limit = budget.limit if budget is not None else 1 << 30
        window = min(max(limit // (64 * 32), 4096), 1 << 18)
        # A merged step is four windows of rows, whatever the number of sources; a bag
        # read hands each run's slice of it on its own, so more runs are read at once
        # (fewer merged down) only while each slice keeps 16k rows: 8 runs, 16 from
        # 128 MiB. Merging down costs more than thinner slices: at 128 MiB, 10M orders
        # sort into 17 runs; merged down to 8 they were arranged and joined in 1.42-1.45
        # s, to 16 in 1.01-1.10 s.
        fan_in = max(8, min(16, 16 * window // (1 << 16)))
        # A reader holds one decoded part per source (about twice the part's stored
        # size): fan_in x 2 x part = a quarter of the budget.
        part = min(max(limit // (READERS_SHARE * 2 * fan_in), 256 << 10), 16 << 20)
        large = max(part, min(LARGE_PART_FACTOR * part,
                              limit // (READERS_SHARE * 2 * LARGE_PARTS_READ)))
        cache = None
        if budget is not None:
            cache = BlockCache(budget)
        ctx = cls(budget=budget, spill=spill, codec=codec, part_bytes=part,
                  large_part_bytes=large, window_rows=window, read_fan_in=fan_in,
                  block_cache=cache)
        if budget is not None and spill is not None:
            ctx.resident = ResidentBatches(ctx, budget)
        return ctx

    def whole_part_bytes(self, payload_bytes: int) -> int:
        """Part size for a batch of about ``payload_bytes`` that is read on its own (a
        spine merge's output, an arrange's only run): the base size, growing to
        ``large_part_bytes`` once the batch spans many parts."""
        grown = payload_bytes // LARGE_PART_MIN_PARTS
        return min(max(grown, self.part_bytes), self.large_part_bytes or self.part_bytes)

    def close(self) -> None:
        """Drop what the context holds on the budget's behalf (block cache, spiller)."""
        if self.block_cache is not None:
            self.block_cache.close()
        if self.resident is not None:
            self.resident.close()

    def settle(self, free_before: int = 0) -> None:
        """After a big step (an arrange, a merge): give back what is freed but still
        resident -- pages mapped beside released regions, and the allocators' free
        blocks once RSS is high (:meth:`MemoryBudget.trim_if_high`) -- so that RSS,
        which the budget watches, shows what is really held. ``free_before``: what the
        allocators held freed when the step began (:meth:`heap_free`); only what the
        step freed counts toward a trim (what earlier work left freed is the next
        steps' to reuse; a reservation that finds RSS over the limit hands it back)."""
        if self.budget is None:
            return
        self.budget.trim_if_high(free_before=free_before)
        MappedRegions.of(self.budget).sweep()

    def heap_free(self) -> int:
        """What the allocators hold freed now: a step's ``free_before`` (:meth:`settle`)."""
        return self.budget.heap_free() if self.budget is not None else 0

    @contextlib.contextmanager
    def settling(self):
        """Settle once the step in the block has succeeded, counting what it freed."""
        free_before = self.heap_free()
        yield
        self.settle(free_before)

    def reserve(self, nbytes: int, what: str) -> None:
        if self.budget is not None and nbytes > 0:
            self.budget.reserve(nbytes, what)
        self._touch()

    def release(self, nbytes: int) -> None:
        if self.budget is not None and nbytes > 0:
            self.budget.release(nbytes)
        self._touch()

    def _touch(self) -> None:
        """A reservation or a release by anyone but the idle merger: work going on."""
        if self.idle_thread != threading.get_ident():
            self.last_activity = time.monotonic()

    @contextlib.contextmanager
    def working(self):
        """Around a build or a read: the engine is busy while one goes on (a sort or a
        grouping may compute for seconds between reservations), and idle merging waits."""
        if self.idle_thread == threading.get_ident():
            yield
            return
        with self._active_lock:
            self.active += 1
        try:
            yield
        finally:
            with self._active_lock:
                self.active -= 1
                self.last_activity = time.monotonic()

    def busy(self, quiet: float) -> bool:
        """Whether other work is going on, or went on within ``quiet`` seconds (a
        reservation or a release counts as work)."""
        return self.active > 0 or time.monotonic() - self.last_activity < quiet

    def new_writer(self, hint: str = "batch"):
        return PageWriter(self.spill, name_hint=hint)
