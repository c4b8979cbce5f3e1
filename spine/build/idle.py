"""Idle merging: merge work done while the engine has nothing else to do.

An ``arrange`` leaves its sorted runs as the inputs of one merge in progress, and an
insert pays only a bounded share of the merges it joins: the rest waits for fuel. As
differential dataflow's ``exert`` spends fuel when a worker is idle, one daemon thread
per engine spends it here, so that a trace left alone settles into few, large batches --
what reads and joins are fastest over -- without anyone calling ``merge_all``.

Rules of the thread:

- It works only while the engine is quiet: nothing reserved through the storage
  context by any other thread, and no reservation or release for ``QUIET_SECONDS``
  (every read, build, sort and grouping holds a reservation while it works, and a
  view's refresh counts as work throughout, so that is what "busy" means), and while
  the budget holds at most half its limit, not counting what the merges in progress
  hold between slices (their inputs' decoded parts, their output's buffer). Two heavy
  jobs at once would each stay within their reservations, but not within the one
  allowance the process has for what reservations do not count.
- It works in slices, each of the fuel the trace's exertion policy gives
  (:mod:`arrangedb.spine.build.exertion`), under the trace's write lock, taken without
  waiting (a writer goes first): an insert or a query that starts meanwhile waits at
  most one slice for the lock or shares the machine with one slice.
- A slice that fails (a full disk, a budget that does not fit) is rolled back like any
  spine change; the trace is left to its inserts' fuel until its next insert.

Which traces want work is the trace's to say (:meth:`Trace.wants_merge`); this module is
the mechanism.
"""

from __future__ import annotations

import threading
import time
import weakref

QUIET_SECONDS = 0.05


class IdleMerger:
    """The engine's idle-merge thread (started at the first trace that wants work)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self._traces: weakref.WeakSet = weakref.WeakSet()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._stop = threading.Event()   # sleeps between checks end at once on close
        self.slices = 0       # slices of merge work done
        self.failures = 0     # slices that raised (rolled back)

    def notify(self, trace) -> None:
        """``trace`` may want merge work (it was just built or written)."""
        with self._lock:
            if self._stopping:
                return
            self._traces.add(trace)
            self._idle.clear()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="arrangedb-idle-merge",
                                                daemon=True)
                self._thread.start()
        self._wake.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no trace wants merge work (or ``timeout`` seconds); whether so."""
        return self._idle.wait(timeout)

    def close(self) -> None:
        """Stop the thread, after the slice in progress."""
        with self._lock:
            self._stopping = True
            thread = self._thread
        self._stop.set()
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._idle.set()

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        self.ctx.idle_thread = threading.get_ident()
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            worked = self.slices
            while not self._stopping:
                if not self._may_work():
                    self._stop.wait(min(QUIET_SECONDS, 0.1))
                    continue
                wanting = [t for t in list(self._traces) if t.wants_merge()]
                if not wanting:
                    if self.slices != worked:
                        # the merges done freed their inputs' decoded parts and buffers:
                        # handed back now, while nothing else runs, once RSS is high
                        self._settle()
                    self._idle.set()
                    break
                for trace in wanting:
                    if self._stopping or not self._may_work():
                        break
                    self._slice(trace)

    def _may_work(self) -> bool:
        if self.ctx.busy(QUIET_SECONDS):
            return False
        budget = self.ctx.budget
        if budget is None:
            return True
        # what the merges in progress hold between slices is this thread's own work, not
        # another job's: counted, it could keep the budget past half for good (with
        # resident batches or a cache holding the rest) and no merge would ever finish
        own = sum(t.spine.merge_held_bytes() for t in list(self._traces))
        return budget.held - own <= budget.limit // 2

    def _settle(self) -> None:
        try:
            self.ctx.settle()
        except Exception:   # noqa: BLE001 - a trim that fails leaves memory as it was
            pass

    def _slice(self, trace) -> None:
        try:
            if trace.idle_merge():
                self.slices += 1
        except Exception:   # noqa: BLE001 - rolled back by the spine; the trace stays usable
            self.failures += 1
            self._traces.discard(trace)   # until its next insert asks again
