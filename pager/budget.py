"""MemoryBudget: a byte budget for one engine, checked against the process's real RSS.

What the budget covers
----------------------
Everything arrangedb allocates on behalf of one engine: builder buffers, decoded parts
and merge windows, mapped page-file regions while they are being read, and the
operators' working arrays. Components *reserve* before they allocate and *release* when
done; a reservation that does not fit asks the registered spillers to free memory (seal
buffers to page files, drop caches, ``madvise(MADV_DONTNEED)`` mapped regions) and only
raises :class:`BudgetExceeded` when that is not enough.

Reservations are the plan; RSS is the truth. psutil samples the process's RSS (which
includes the pages of mapped files in memory) on a light background timer, and reservations
read the same counter (at most once a millisecond, from a kept-open /proc/self/statm).
The contract, checked by the tests on data several times the budget::

    peak_rss - baseline_rss <= limit + RSS_ALLOWANCE

``baseline_rss`` is the RSS when the budget was created: the interpreter, numpy, pyarrow
and whatever the host process already held (a reused Spark worker included). The fixed
``RSS_ALLOWANCE`` covers what reservations cannot see: allocator slack and
fragmentation, Arrow's memory pool keeping freed blocks, kernel temporaries, and pages
of the libraries touched for the first time.

Spillers run only on the thread that reserves (never from the sampler), so a spiller
never races the structure it spills. The sampler only records the peak and raises a
pressure flag that the next reservation acts upon.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import defaultdict

import psutil

from arrangedb.pager.errors import BudgetExceeded
from arrangedb.pager.process_memory import (StatmReader, heap_free_bytes,
                                             release_freed_memory, tune_allocator)
from arrangedb.pager.sizes import format_size, parse_size

RSS_ALLOWANCE = 100 << 20
"""Fixed allowance over ``limit`` for what reservations cannot see (see module doc)."""

PROCESS_RSS_ALLOWANCE = 208 << 20
"""What a whole process holds beside its budget, as a container limit sees it: the
interpreter, numpy, pyarrow (and pandas, which pyarrow imports on its first numpy
conversion when it is installed), arrangedb's code, and the work's allowance. A fresh
process that runs one job stays within ``limit + PROCESS_RSS_ALLOWANCE`` of RSS from its
start (tests/test_process_memory.py, on data 8x the budget). The libraries' share
depends on the page cache: just installed, they sit whole in it and map ~35 MiB more as
they load (96 MiB after importing numpy and pyarrow, against 61 MiB once the cache has
let them go), which is what a fresh checkout's test run sees."""

class MemoryBudget:
    """A byte budget with reservations, spillers and an RSS sampler."""

    def __init__(self, limit="1GiB", sample_interval: float = 0.05):
        self.limit = parse_size(limit)
        if self.limit <= 0:
            raise ValueError(f"memory budget must be positive, got {limit!r}")
        tune_allocator()
        self.held = 0
        self.peak_held = 0
        self._held_by: dict[str, int] = defaultdict(int)
        self._process = psutil.Process()
        self._read_rss = StatmReader(self._process)
        self.baseline_rss = self._process.memory_info().rss
        self.peak_rss = self.baseline_rss
        self._last_rss, self._last_sample_time = self.baseline_rss, 0.0
        self.spill_requests = 0
        self.bytes_freed = 0
        self._spillers: dict[int, tuple[int, object]] = {}
        self._tokens = itertools.count()
        self._lock = threading.RLock()
        self._spilling = False
        self._pressure = False
        # RSS that the last answer to pressure left over the limit (what the allocators
        # and the interpreter keep, beyond any spiller's reach): pressure is answered
        # again once RSS grows a step past it, not at every reservation
        self._unrelieved_rss = 0
        self._pressure_step = max(1 << 20, min(self.limit // 16, 16 << 20))
        self._closed = False
        self._stop = threading.Event()
        self._sampler = None
        if sample_interval and sample_interval > 0:
            self._sampler = threading.Thread(
                target=self._sample_loop, args=(sample_interval,),
                name="arrangedb-rss-sampler", daemon=True)
            self._sampler.start()

    # -- reservations --------------------------------------------------------------------
    def reserve(self, nbytes: int, what: str = "unnamed") -> None:
        """Hold ``nbytes`` more; spill if needed; BudgetExceeded if it still does not fit."""
        nbytes = int(nbytes)
        if nbytes <= 0:
            return
        rss = self._sample_at_reservation()
        with self._lock:
            over = self.held + nbytes - self.limit
            if self._pressure and self._over_by_rss(rss):
                over = max(over, rss - self.baseline_rss - self.limit)
            if over <= 0:   # fits, nothing to spill: the common case, one lock
                self.held += nbytes
                self._held_by[what] += nbytes
                self.peak_held = max(self.peak_held, self.held)
                return
        self._pressure = False
        reserved_over = self.held + nbytes - self.limit
        if over > reserved_over:
            # over by RSS, not by reservations: hand back what the allocators keep
            # first -- it costs no data -- and spill only what that leaves
            release_freed_memory()
            over = max(reserved_over, self.sample(fast=True) - self.baseline_rss - self.limit)
        if over > 0:
            self.spill(over)
        if over > reserved_over:
            self._left_over(self.sample(fast=True))
        with self._lock:
            if self.held + nbytes > self.limit:
                raise BudgetExceeded(
                    f"memory budget {format_size(self.limit)} exceeded: asked "
                    f"{format_size(nbytes)} for {what} while {format_size(self.held)} is held "
                    f"({self._describe_held()}) and spilling freed no more; raise "
                    f"memory_budget or lower the working set (fewer keys per batch, "
                    f"smaller partitions)")
            self.held += nbytes
            self._held_by[what] += nbytes
            self.peak_held = max(self.peak_held, self.held)

    def release(self, nbytes: int, what: str | None = None) -> None:
        nbytes = int(nbytes)
        if nbytes <= 0:
            return
        with self._lock:
            self.held = max(0, self.held - nbytes)
            mine = self._held_by.get(what, 0)
            if mine >= nbytes:   # the common case: a holder gives back (part of) its own
                if mine > nbytes:
                    self._held_by[what] = mine - nbytes
                else:
                    del self._held_by[what]
                return
            # Untagged releases (or more than ``what`` holds) come off the other entries, so
            # the per-name figures in BudgetExceeded messages keep adding up to ``held``.
            order = ([what] if what in self._held_by else []) + [
                w for w in list(self._held_by) if w != what]
            for w in order:
                if nbytes <= 0:
                    break
                take = min(nbytes, self._held_by[w])
                nbytes -= take
                if self._held_by[w] - take > 0:
                    self._held_by[w] -= take
                else:
                    del self._held_by[w]

    @contextlib.contextmanager
    def reservation(self, nbytes: int, what: str = "unnamed"):
        self.reserve(nbytes, what)
        try:
            yield
        finally:
            self.release(nbytes, what)

    def _describe_held(self) -> str:
        parts = sorted(self._held_by.items(), key=lambda kv: -kv[1])[:5]
        return ", ".join(f"{w}: {format_size(b)}" for w, b in parts if b > 0) or "nothing named"

    # -- spillers --------------------------------------------------------------------------
    def add_spiller(self, fn, priority: int = 0) -> int:
        """Register ``fn(nbytes_wanted) -> bytes freed``; lower priority runs first."""
        token = next(self._tokens)
        with self._lock:
            self._spillers[token] = (priority, fn)
        return token

    def remove_spiller(self, token: int) -> None:
        with self._lock:
            self._spillers.pop(token, None)

    def spill(self, wanted: int) -> int:
        """Ask spillers, cheapest first, to free ``wanted`` bytes; return what they freed."""
        if self._spilling:   # a spiller reserving while it spills must not recurse
            return 0
        self._spilling = True
        freed = 0
        try:
            self.spill_requests += 1
            with self._lock:
                spillers = sorted(self._spillers.values(), key=lambda pf: pf[0])
            for _, fn in spillers:
                if freed >= wanted:
                    break
                freed += int(fn(wanted - freed) or 0)
            if freed >= self.limit // 8:
                # worth a malloc_trim (milliseconds) only when much was freed: most calls
                # release mapped pages, which are not heap
                release_freed_memory()
        finally:
            self._spilling = False
        self.bytes_freed += freed
        return freed

    # -- RSS -------------------------------------------------------------------------------
    def rss(self, fast: bool = False) -> int:
        try:
            return self._read_rss() if fast else self._process.memory_info().rss
        except (psutil.Error, OSError):
            return self.peak_rss

    def sample(self, fast: bool = False) -> int:
        """RSS now; keeps the peak and raises the pressure flag when over the limit."""
        rss = self.rss(fast)
        if rss > self.peak_rss:
            self.peak_rss = rss
        if rss - self.baseline_rss > self.limit:
            self._pressure = True
        else:
            self._unrelieved_rss = 0
        return rss

    def _over_by_rss(self, rss: int) -> bool:
        """Whether RSS is over the limit and a step past what the last answer left."""
        return (rss - self.baseline_rss > self.limit
                and rss >= self._unrelieved_rss + self._pressure_step)

    def _left_over(self, rss: int) -> None:
        """Note the RSS an answer to pressure left (over the limit: the next answer waits
        for a step past it)."""
        self._unrelieved_rss = rss if rss - self.baseline_rss > self.limit else 0

    def _sample_at_reservation(self) -> int:
        """RSS for a reservation: read afresh at most every millisecond.

        Even the kept-open statm read costs ~2 us, a few percent of mapping a 1 MiB
        region; within a millisecond the last reading (and the background sampler) is
        as good.
        """
        now = time.monotonic()
        if now - self._last_sample_time >= 0.001:
            self._last_sample_time = now
            self._last_rss = self.sample(fast=True)
        return self._last_rss

    def trim_if_high(self, share: float = 0.5, free_before: int = 0) -> bool:
        """Hand freed memory back to the OS (:func:`release_freed_memory`) only when RSS
        over the baseline passes ``share`` of the limit, and malloc holds at least a
        sixteenth of the limit freed (when it says: :func:`heap_free_bytes`) beyond
        ``free_before`` (what it held freed when the caller's work began,
        :meth:`heap_free`: memory left freed by earlier work is not this work's to hand
        back, and a trim of it makes the steps that reuse it fault it in afresh). A trim
        costs milliseconds, and memory handed back is faulted in again by the next
        allocations: after every routine step (a small insert, a short group_by) that is
        pure cost while RSS is low, or is high with pages the engine maps and holds (a
        600k-row insert after a query of a 30M-row trace at 512 MiB: 13 ms without the
        trim before it, 28-32 ms with)."""
        if self.rss(fast=True) - self.baseline_rss <= int(self.limit * share):
            return False
        free = heap_free_bytes()
        if free is not None and free - free_before < self.limit // 16:
            return False
        release_freed_memory()
        return True

    @staticmethod
    def heap_free() -> int:
        """What malloc holds freed now (0 where it does not say): the ``free_before`` of
        :meth:`trim_if_high` for work about to begin."""
        return heap_free_bytes() or 0

    def relieve(self) -> int:
        """At a safe point (between steps of a loop): spill if RSS went over the limit."""
        rss = self.sample()
        if self._pressure and self._over_by_rss(rss):
            self._pressure = False
            freed = self.spill(rss - self.baseline_rss - self.limit)
            self._left_over(self.sample(fast=True))
            return freed
        return 0

    def _sample_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.sample()

    def reset_peak(self) -> None:
        """Start a new measurement window (a reused Spark worker's next task)."""
        self.baseline_rss = self.rss()
        self.peak_rss = self.baseline_rss
        self.peak_held = self.held

    def stats(self) -> dict:
        return {
            "limit_bytes": self.limit,
            "held_bytes": self.held,
            "peak_held_bytes": self.peak_held,
            "rss_bytes": self.rss(),
            "baseline_rss_bytes": self.baseline_rss,
            "peak_rss_bytes": self.peak_rss,
            "peak_rss_over_baseline_bytes": self.peak_rss - self.baseline_rss,
            "rss_allowance_bytes": RSS_ALLOWANCE,
            "spill_requests": self.spill_requests,
            "bytes_freed_by_spillers": self.bytes_freed,
        }

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._sampler is not None and self._sampler is not threading.current_thread():
            self._sampler.join(timeout=1.0)
        self.sample()
        self._read_rss.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return (f"MemoryBudget(limit={format_size(self.limit)}, held={format_size(self.held)}, "
                f"peak_rss={format_size(self.peak_rss)})")
