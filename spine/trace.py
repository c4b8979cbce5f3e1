"""Trace: an arrangement -- the public face of a spine of batches -- and its handles.

Design
------
A trace owns a :class:`Spine`. Writes (``arrange``'s initial load and ``insert``) build
sorted runs within the memory budget, merge them into one batch, and hand that batch to
the spine, which merges it in over later inserts, fueled. Reads (``snapshot``,
``lookup``, ``changes``, cursors) take the list of batches at the time of the call and
walk them in key order with a merged reader; batches are immutable, so a read in
progress is unaffected by later writes.

Writers and readers: a trace has one writer at a time -- ``insert``, ``exert``,
``merge_all``, ``save``, frontier moves and ``close`` hold the trace's lock, so writers
in several threads take turns -- and any number of readers, which never wait: a read
takes the spine's last committed version of the batch list and walks it, and a write
either commits a new version or, when it raises, leaves the trace exactly as it was
(its runs and half-merged outputs are dropped, their reservations released).

Handles share the trace: each holds a logical frontier (history it still needs) and
optionally a physical one (batch boundaries it still needs). The trace compacts only
to the minimum of its live handles' frontiers; closing or dropping a handle releases
its hold; a trace that lets its own history go (``_own_since``: a view's last refresh)
compacts no further than they hold either. A read at a time before the logical
frontier is refused: those times have been advanced and the answer would be wrong.
"""

from __future__ import annotations

import os
import threading
import weakref

import numpy as np
import pyarrow as pa

from arrangedb.spine import persist
from arrangedb.spine.build.exertion import default_exertion
from arrangedb.spine.build.levels import Spine
from arrangedb.spine.build.runs import RunBuilder, drop
from arrangedb.spine.data import roles
from arrangedb.spine.data.description import Description
from arrangedb.spine.data.ingest import Columns
from arrangedb.spine.handle import TraceHandle
from arrangedb.spine.read.cursor import blocks
from arrangedb.spine.read.lookup import lookup
from arrangedb.spine.storage.batch import Batch, byte_stats
from arrangedb.spine.storage.context import StorageContext

DURABLE_RESIDENT_UPDATES = 1 << 16
"""A trace tied to a checkpoint directory keeps inserts of at most this many updates in
memory; larger ones it encodes into page files as they arrive -- into the directory
itself once the trace is its writer -- as Spark's state store writes its changelog
during a batch: the next checkpoint then fsyncs and names them instead of encoding them
while it holds the write lock."""


class Trace:
    """An arrangement: updates indexed by key, read as snapshots, lookups, changes and
    cursors, written by ``insert``, made durable by ``checkpoint`` (module docstring)."""

    history_hint = ""   # what a read refused for compacted times adds (a view's says more)

    def __init__(self, ctx: StorageContext, key_schema: pa.Schema, val_schema: pa.Schema | None,
                 columns: Columns, name: str | None = None):
        self.ctx = ctx
        self.key_schema = key_schema
        self.val_schema = val_schema
        self.columns = columns
        self.name = name
        self.spine = Spine(ctx)
        self.runs = RunBuilder(ctx, key_schema, val_schema, columns)
        self._handles: list[weakref.ref] = []
        self._closed = False
        self._write_lock = threading.RLock()   # one writer at a time (module docstring)
        self._keys_cache: tuple | None = None   # (batches, distinct keys) for stats()
        self._checkpoint: persist.CheckpointState | None = None
        self.exertion = default_exertion   # idle-time merge policy (build/exertion.py)
        self._upper = 0   # every time held is before it; inserts go at or after it
        self._own_since: int | None = None   # the trace's own logical frontier, if any
        self._views: weakref.WeakSet = weakref.WeakSet()   # views reading this trace

    # -- schema ------------------------------------------------------------------------
    @property
    def key_names(self) -> list[str]:
        return self.key_schema.names

    @property
    def val_names(self) -> list[str]:
        return self.val_schema.names if self.val_schema is not None else []

    def upper(self) -> int:
        """The upper frontier: every update held has a time before it, and inserts go at
        it or later (an insert without a time column goes at it)."""
        return self._upper

    def advance_upper(self, time: int) -> None:
        """Move the upper frontier to ``time`` (never back): later inserts go at it or
        after. A view does this to the inputs it has read through ``time - 1``."""
        if int(time) > self._upper:   # else no writer (or merge slice) to wait for
            with self._write_lock:
                self._upper = max(self._upper, int(time))

    def add_view(self, view) -> None:
        """Count ``view`` among this trace's readers (``stats()["views"]``)."""
        self._views.add(view)

    def restore_upper(self) -> None:
        """Set the upper frontier from the batches held (after a load)."""
        self._upper = max((b.description.upper for b in self.batches()), default=0)

    @property
    def since(self) -> int:
        """The logical compaction frontier: reads at times before it are refused."""
        return self.spine.since

    def __repr__(self) -> str:
        return (f"Trace({self.name or ''} key={self.key_names} vals={self.val_names}, "
                f"{len(self.spine.batches())} batches)")

    # -- writing -----------------------------------------------------------------------
    def insert(self, data, time: str | None = None, diff: str | None = None) -> None:
        """Add updates. ``time``/``diff`` name their columns; by default the columns the
        input's schema marks as its time and weight (a join's ``count``, a change
        stream's ``time`` and ``diff``), else those named at arrange when the input has
        them; False: none (every update at the upper frontier, diff +1). Times before
        the upper frontier are refused (``ValueError``); nothing of the input is kept."""
        with self._write_lock:
            self._check_open()
            self.update_frontiers()   # handles dropped without close() let go here
            state = self._checkpoint
            writer = state is not None and state.lock is not None
            runs = self.runs.build(
                data, time, diff, resident=True,
                max_resident=DURABLE_RESIDENT_UPDATES if state is not None else None,
                new_writer=state.stage_writer if writer else None, lower=self._upper)
            self.add_runs(runs)
        self.notify_idle()

    def notify_idle(self) -> None:
        """Tell the engine's idle merger that this trace may have merge work."""
        if self.ctx.idle is not None and self.spine.has_work():
            self.ctx.idle.notify(self)

    def add_runs(self, runs: list[Batch]) -> None:
        """Hand runs of one input to the spine, as one time interval from the upper
        frontier through their last time; if that fails, they are dropped (the spine
        and the frontier are as they were)."""
        try:
            upper = self._tile(runs)
            self.spine.insert_runs(runs)
        except BaseException:
            drop(runs)
            raise
        self._upper = upper

    def _tile(self, runs: list[Batch]) -> int:
        """Give the runs of one input the description [upper, their last time + 1), so
        that batches tile time (adjacent, never overlapping), as differential dataflow's
        do; returns the new upper."""
        times = [r.description for r in runs if len(r)]
        if not times:
            return self._upper
        lowest = min(d.lower for d in times)
        if lowest < self._upper:
            raise ValueError(f"updates at time {lowest} are before the trace's upper "
                             f"frontier {self._upper}")
        upper = max(d.upper for d in times)
        for r in runs:
            r.description = Description(self._upper, upper, r.description.since)
        return upper

    def appender(self, resident: bool = False) -> "Appender":
        """A chunked loader (:class:`Appender`); ``resident``: runs as an insert's."""
        self._check_open()
        return Appender(self, resident)

    def exert(self, fuel: int) -> None:
        """Spend ``fuel`` units of extra merge work (e.g. while idle)."""
        with self._write_lock:
            self._check_open()
            self.spine.exert(int(fuel))

    def wants_merge(self) -> bool:
        """Whether the exertion policy asks for merge work in idle time. A trace tied to
        a checkpoint directory waits while it holds batches the directory does not:
        merging one in would make the next checkpoint write the merge's output instead
        of the batch alone (later merges reference the files they replace:
        ``persist.inherit``)."""
        if self._closed or self._idle_fuel() is None:
            return False
        return self._checkpoint is None or all(
            b.checkpointed is not None for b in self.batches())

    def _idle_fuel(self) -> int | None:
        if not self.spine.has_work():
            return None
        return self.exertion(self.spine.level_states())

    def idle_merge(self) -> bool:
        """One slice of the merge work the exertion policy asks for, if no writer holds
        the trace (a writer goes first); whether any was done."""
        if not self._write_lock.acquire(blocking=False):
            return False
        try:
            fuel = None if self._closed else self._idle_fuel()
            if fuel:
                self.spine.exert(int(fuel), self.exertion)
            return bool(fuel)
        finally:
            self._write_lock.release()

    def merge_all(self) -> None:
        """Finish every merge: leaves one batch (handy before many reads)."""
        with self._write_lock, self.ctx.settling():
            self._check_open()
            self.spine.merge_all()

    # -- handles and compaction --------------------------------------------------------
    def batches(self) -> tuple[Batch, ...]:
        """The batches of the last committed write, oldest first (what a read walks)."""
        return self.spine.batches()

    def handle(self, holds_only: bool = False) -> "TraceHandle":
        """A shared reader handle, holding the trace's history from its frontier on."""
        self._check_open()
        h = TraceHandle(self, holds_only)
        self._handles.append(weakref.ref(h))
        return h

    def _live_handles(self) -> list["TraceHandle"]:
        live = [r() for r in self._handles]
        live = [h for h in live if h is not None and not h.closed]
        self._handles = [weakref.ref(h) for h in live]
        return live

    def update_frontiers(self) -> None:
        with self._write_lock:
            live = self._live_handles()
            wanted = [h.logical for h in live if not h.holds_only] + (
                [] if self._own_since is None else [self._own_since])
            if wanted:   # holds (a view's on its input) only keep history
                logical = min(wanted + [h.logical for h in live if h.holds_only])
                if logical > self.spine.since:
                    self.spine.set_since(logical)
            physical = [h.physical for h in live if h.physical is not None]
            physical = min(physical) if physical else None
            if physical != self.spine.physical:
                self.spine.set_physical(physical)

    # -- reading -----------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")

    def check_read_time(self, at: int | None) -> None:
        self._check_open()
        if at is not None and at < 0:
            raise ValueError(f"at={at}: times are unsigned")
        if at is not None and at < self.spine.since:
            raise ValueError(f"at={at} is before the trace's logical compaction frontier "
                             f"{self.spine.since}: those times have been compacted away"
                             f"{self.history_hint}")

    def output_schema(self, *extra: pa.Field) -> pa.Schema:
        """Keys, vals and ``extra`` (made with :mod:`arrangedb.spine.data.roles`), marked as
        made by this trace's engine."""
        fields = list(self.key_schema)
        if self.val_schema is not None:
            fields += list(self.val_schema)
        return roles.with_engine(pa.schema(fields + list(extra)), self.ctx.engine_id)

    def snapshot(self, at: int | None = None) -> pa.RecordBatchReader:
        """Key, vals and ``count`` (sum of diffs with time <= at; zeros dropped), key order."""
        self.check_read_time(at)
        schema = self.output_schema(roles.weight_field("count"))

        def gen():
            for b in blocks(self, at=at):
                yield b.record_batch(schema, b.counts)
        return pa.RecordBatchReader.from_batches(schema, gen())

    def changes(self, since: int, upto: int | None = None) -> pa.RecordBatchReader:
        """Consolidated updates with ``since <= time < upto``: key, vals, time, diff. They
        start from the state at ``since - 1``, which must not be before the frontier."""
        self._check_open()
        for name, value in (("since", since), ("upto", upto)):
            if value is not None and (not isinstance(value, (int, np.integer)) or value < 0):
                raise ValueError(f"{name}={value!r}: times are non-negative ints")
        frontier = self.spine.since
        if frontier and (since and since <= frontier or upto is not None and upto <= frontier):
            raise ValueError(f"changes({since}, {upto}) reaches before the logical compaction "
                             f"frontier {frontier}: those times have been compacted away"
                             f"{self.history_hint}")
        schema = self.output_schema(roles.time_field("time"), roles.weight_field("diff"))

        def gen():
            for b in blocks(self, changes=(since, upto)):
                yield b.record_batch(schema, b.times, b.counts)
        return pa.RecordBatchReader.from_batches(schema, gen())

    def cursor(self, at: int | None = None, changes=None, window_rows: int | None = None):
        """Blocks of consecutive keys (see :mod:`arrangedb.spine.read.cursor`)."""
        return blocks(self, at=at, changes=changes, window_rows=window_rows)

    def lookup(self, keys, at: int | None = None, read_dictionary=None,
               consolidate: bool = True) -> pa.Table:
        """Rows for a batch of keys: query_index, key, vals, count (sorted once, walked in
        order). ``read_dictionary``: val columns returned as dictionary arrays;
        ``consolidate=False``: rows as stored (see :mod:`arrangedb.spine.read.lookup`)."""
        return lookup(self, keys, at, read_dictionary, consolidate)

    def checkpoint(self, path=None, retain: int = 10) -> int:
        """Make the trace durable in the directory ``path`` (created when missing) as its
        next version; returns the version number (1 for a new directory). Only batches the
        directory does not hold yet are written. ``path=None``: the directory the trace
        was loaded from or last checkpointed to. Keeps the newest ``retain`` versions.
        The trace holds the directory's writer role until it is closed; see
        :mod:`arrangedb.spine.persist` for the guarantees."""
        with self._write_lock:
            self._check_open()
            version = persist.checkpoint(self, path, retain)
        self.notify_idle()   # what waited for the directory to hold it may merge now
        return version

    def save(self, path) -> None:
        """Write this trace to a new directory for ``Engine.load``: a first checkpoint
        (``FileExistsError`` if ``path`` holds one), not keeping the writer role."""
        with self._write_lock:
            self._check_open()
            path = os.fspath(path)
            if persist.is_checkpoint_dir(path):
                raise FileExistsError(f"{path!r} already holds a saved trace")
            persist.checkpoint(self, path, release_writer=True)

    # -- accounting --------------------------------------------------------------------
    def stats(self) -> dict:
        batches = self.spine.batches()
        updates = sum(len(b) for b in batches)
        budget = self.ctx.budget
        return {
            "updates": updates,
            "keys": self._distinct_keys(batches),
            "keys_exact": True,
            "batches": len(batches),
            "parts": sum(len(b.parts) for b in batches),
            "bytes_in_memory": sum(b.bytes_in_memory for b in batches),
            "bytes_on_disk": sum(b.bytes_on_disk for b in batches),
            **byte_stats(batches, updates),
            "peak_rss_bytes": budget.peak_rss if budget is not None else 0,
            "since": self.spine.since,
            "upper": self._upper,
            "handles": sum(not h.holds_only for h in self._live_handles()),
            "views": len(self._views),
            "merges_in_progress": sum(1 for lvl in self.spine.levels
                                      if lvl is not None and lvl.merging),
        }

    def _distinct_keys(self, batches: list[Batch]) -> int:
        """Keys with a nonzero count at the latest time (those ``snapshot()`` shows). One
        batch whose updates share one time is consolidated: every key it stores counts.
        Otherwise a read of the trace counts them, once per version of the batch list."""
        if len(batches) == 1 and batches[0].description.upper - \
                batches[0].description.lower <= 1:
            return batches[0].num_keys
        cached = self._keys_cache   # weak: a count must not keep merged-away files alive
        if cached is not None and len(cached[0]) == len(batches) and \
                all(ref() is b for ref, b in zip(cached[0], batches)):
            return cached[1]
        n = 0
        for b in blocks(self):
            n += int(np.count_nonzero(np.diff(b.key_bounds)))
        self._keys_cache = (tuple(weakref.ref(b) for b in batches), n)
        return n

    def close(self) -> None:
        with self._write_lock:
            if not self._closed:
                self._closed = True
                try:
                    self.spine.close()
                finally:
                    if self._checkpoint is not None:
                        self._checkpoint.close()   # the writer role, the lease


class Appender:
    """Fills a trace from chunks as one input: each chunk is sorted into runs as it comes,
    and the runs enter the spine together at ``finish`` (merged down only to the read
    fan-in). One ``insert`` per chunk would instead introduce each chunk as a batch and
    pay the spine's merge fuel every time -- work a trace that is filled once and then
    read never needs."""

    def __init__(self, trace: Trace, resident: bool = False):
        self.trace = trace
        self.resident = resident and trace._checkpoint is None
        self.runs: list[Batch] = []

    def add(self, data, time: str | None = None, diff: str | None = None) -> None:
        self.trace._check_open()
        self.runs += self.trace.runs.build(data, time, diff, merge=False,
                                           resident=self.resident, lower=self.trace.upper())

    def finish(self) -> None:
        """Hand the runs to the trace. If this fails, the trace is as it was and the
        appender keeps its runs: ``finish`` may be called again, or ``abort``."""
        t = self.trace
        with t._write_lock, t.ctx.settling():
            t._check_open()
            runs = t.runs.merge_down(self.runs)
            upper = t._tile(runs)
            t.spine.insert_runs(runs)   # on failure: runs stay ours; made outputs are garbage
            t._upper = upper
            self.runs = []
        t.notify_idle()

    def abort(self) -> None:
        """Drop the runs sorted so far (their page files go now, not at collection)."""
        runs, self.runs = self.runs, []
        for r in runs:
            r.drop()
