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
its hold. A read at a time before the logical frontier is refused: those times have
been advanced and the answer would be wrong.
"""

from __future__ import annotations

import os
import threading
import weakref

import numpy as np
import pyarrow as pa

from arrangedb.spine import persist

from arrangedb.spine.data import roles
from arrangedb.spine.storage.batch import Batch
from arrangedb.spine.build.builder import Builder
from arrangedb.spine.storage.context import StorageContext
from arrangedb.spine.read.cursor import blocks
from arrangedb.spine.data.ingest import (Columns, SchemaError, is_file_input, open_batches,
                                   read_ahead, to_updates)
from arrangedb.spine.data.kernels import accumulate, consolidate, key_starts
from arrangedb.spine.data.layout import ranges, select_keys
from arrangedb.spine.build.merger import Merger
from arrangedb.spine.data.order import codes, sort_order
from arrangedb.spine.storage.dictionaries import dictionary_schema
from arrangedb.spine.read.reader import seek_parts
from arrangedb.spine.build.levels import Spine
from arrangedb.spine.data.updates import Updates

_MERGE_FAN_IN = 8    # runs merged into one file at a time (one decoded part each)
# What sorting a run holds per row beside its input and its sorted copy, at its peak:
# key and val codes, the packed prefix, the packed values with the row index, the
# order, distinct-row starts, allocator slack. Measured: 40M (int64, float64) rows in
# runs of 3.9M peaked at ~89 bytes a row over a 16-byte input.
_SORT_BYTES_PER_ROW = 72
_READ_AHEAD_SHARE = 16      # a Parquet input's batches decoded ahead: run_bytes / 16
_STARTS_BYTES_PER_ROW = 8   # a resident run's key starts: an int64 per key and one more


def _sort_cost(input_bytes: int, rows: int) -> int:
    """Memory a run's sort holds at once: its input, the sort's arrays and the sorted
    copy of the input (at most as large as the input)."""
    return 2 * input_bytes + _SORT_BYTES_PER_ROW * rows


def _pieces(stream, max_cost: int):
    """The stream's non-empty batches, sliced so that sorting none of them alone would
    hold more than ``max_cost`` (:func:`_sort_cost`, counting the 16 bytes of time and
    diff a row may gain as updates): a run must not have to take a whole oversized
    batch, whose sort would outgrow the budget."""
    for rb in stream:
        n = rb.num_rows
        if n == 0:
            continue
        cost = _sort_cost(rb.nbytes + 16 * n, n)
        if cost <= max_cost:
            yield rb
            continue
        rows = max(1, n * max_cost // cost)
        for lo in range(0, n, rows):
            yield rb.slice(lo, rows)


class Trace:
    """An arrangement: updates indexed by key, read as snapshots, lookups, changes and
    cursors, written by ``insert``, made durable by ``checkpoint`` (module docstring)."""

    def __init__(self, ctx: StorageContext, key_schema: pa.Schema, val_schema: pa.Schema | None,
                 columns: Columns, name: str | None = None):
        self.ctx = ctx
        self.key_schema = key_schema
        self.val_schema = val_schema
        self.columns = columns
        self.name = name
        self.spine = Spine(ctx)
        self._handles: list[weakref.ref] = []
        self._closed = False
        self._write_lock = threading.RLock()   # one writer at a time (module docstring)
        self._keys_cache: tuple | None = None   # (batches, distinct keys) for stats()
        self._checkpoint: persist.CheckpointState | None = None

    # -- schema ------------------------------------------------------------------------
    @property
    def key_names(self) -> list[str]:
        return self.key_schema.names

    @property
    def val_names(self) -> list[str]:
        return self.val_schema.names if self.val_schema is not None else []

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
        them; False: none (time 0, diff +1)."""
        with self._write_lock:
            self._check_open()
            self._update_frontiers()   # handles dropped without close() let go here
            runs = self._build(data, time, diff, resident=True)
            self._add_runs(runs)

    def _add_runs(self, runs: list[Batch]) -> None:
        """Hand runs of one input to the spine; if that fails, they are dropped (the
        spine is as it was)."""
        try:
            self.spine.insert_runs(runs)
        except BaseException:
            _drop(runs)
            raise

    def appender(self) -> "Appender":
        """A loader for data that arrives in chunks (see :class:`Appender`)."""
        self._check_open()
        return Appender(self)

    def _build(self, data, time: str | None, diff: str | None, merge: bool = True,
               resident: bool = False) -> list[Batch]:
        """Sorted runs within the budget, at most ``ctx.read_fan_in`` of them (merged down
        when there are more, unless ``merge`` is False); the spine is untouched.
        ``resident``: runs may stay in memory while the engine admits them
        (:mod:`arrangedb.spine.storage.resident`)."""
        schema, stream = open_batches(data)
        time = roles.resolve_role(schema, time, roles.TIME, self.columns.time)
        diff = roles.resolve_role(schema, diff, roles.WEIGHT, self.columns.diff)
        Columns.resolve(schema, self.key_names, self.val_names, time or False,
                        diff or False)   # fail early
        cols = Columns(self.key_names, self.val_names or None, time, diff)
        ahead = 0
        if is_file_input(data):   # decode only the columns it needs, while runs sort
            schema, stream = open_batches(data, columns=cols.needed())
            ahead = max(1, self._run_bytes() // _READ_AHEAD_SHARE)
            self.ctx.reserve(ahead, "read-ahead")
            stream = read_ahead(stream, ahead)
        run_bytes = self._run_bytes()   # beside what reading ahead holds
        store = self.ctx.resident if resident else None
        room = store.room() if store is not None else 0
        runs: list[Batch] = []
        buffered: list[Updates] = []
        size = rows = 0

        def seal():
            """Sort what is buffered into a run; its reservation passes to _seal_run."""
            nonlocal buffered, size, rows, run_bytes, room
            reserved, size, rows = size, 0, 0
            runs.append(self._seal_run(buffered, reserved, resident))
            buffered = []
            run_bytes = self._run_bytes()
            # runs cut to the resident room while they are kept: once one is paged out,
            # small runs would only mean more merging
            room = store.room() if store is not None and store.holds(runs[-1]) else 0

        def excess(nbytes: int, n: int) -> float:
            """How far a run of ``n`` updates in ``nbytes`` is past its sort's share, or
            past the resident room (as stored: updates and key starts); <= 0 within."""
            over = _sort_cost(nbytes, n) - run_bytes
            if room:
                over = max(over, nbytes + _STARTS_BYTES_PER_ROW * (n + 1) - room)
            return over

        def fitting(upd: Updates) -> int:
            """How many of ``upd``'s rows the buffered run still has room for (fewer
            than all: it is called when all would not fit)."""
            per_row = upd.nbytes / len(upd)
            k = (run_bytes - _sort_cost(size, rows)) / (2 * per_row + _SORT_BYTES_PER_ROW)
            if room:
                k = min(k, (room - size - _STARTS_BYTES_PER_ROW * (rows + 1))
                        / (per_row + _STARTS_BYTES_PER_ROW))
            k = int(max(0, min(k, len(upd) - 1)))
            while k and excess(size + upd.slice(0, k).nbytes, rows + k) > 0:
                # a slice's bytes are not k average rows (bitmaps, uneven strings)
                k -= max(1, k // 256)
            return k

        def buffer(upd: Updates) -> None:
            nonlocal size, rows
            self.ctx.reserve(upd.nbytes, "ingest buffer")
            buffered.append(upd)
            size += upd.nbytes
            rows += len(upd)

        try:
            piece = run_bytes // 4 if not room else min(run_bytes, _sort_cost(room, 0)) // 4
            for rb in _pieces(stream, max(piece, 1)):
                upd = to_updates(rb, cols, self.key_schema, self.val_schema)
                if buffered and excess(size + upd.nbytes, rows + len(upd)) > 0:
                    # the run takes the rows that fit its share, the rest starts the
                    # next: runs cut at input batches were 10% short, and 40M rows
                    # at 512 MiB sorted into 17 runs, one past the read fan-in
                    k = fitting(upd)
                    if k:
                        buffer(upd.slice(0, k))
                        upd = upd.slice(k, len(upd))
                    seal()
                buffer(upd)
                if excess(size, rows) >= 0:   # full
                    seal()
            if buffered:
                seal()
            if merge:
                runs[:] = self._merge_down(runs)
        except BaseException:
            _drop(runs)   # a failed build leaves nothing behind
            raise
        finally:
            self.ctx.release(size)
            if ahead:
                try:
                    stream.close()   # stops and joins the reading thread
                finally:
                    self.ctx.release(ahead)
        self.ctx.settle()   # sorting left big freed blocks with the allocators
        return runs

    def _run_bytes(self) -> int:
        """What the next run's sort may hold (:func:`_sort_cost`): half the budget, less
        when other holders leave less than that free, never less than a part. Fewer,
        longer runs mean less merging down to the read fan-in: at 512 MiB, 40M rows of
        (int64, float64) sort into 16 runs, all read as they are (fan-in 16)."""
        if self.ctx.run_bytes:
            return self.ctx.run_bytes
        budget = self.ctx.budget
        if budget is None:
            return 512 << 20
        return max(self.ctx.part_bytes, min(budget.limit // 2, budget.limit - budget.held))

    def _seal_run(self, buffered: list[Updates], reserved: int, resident: bool = False
                  ) -> Batch:
        """Sort and write one run; gives back the reservation of its input. A
        ``resident`` run is kept in memory instead when the engine admits it.

        Sorting holds a few copies of the run at once (the concatenated input, codes,
        orders, the sorted copy): they are reserved too (:func:`_sort_cost`), so the
        budget sees them instead of leaving them to the allowance.
        """
        try:
            rows = sum(len(u) for u in buffered)
            temporaries = _sort_cost(reserved, rows) - reserved
            self.ctx.reserve(temporaries, "sorting a run")
            try:
                joined = Updates.concat(buffered)
                run = consolidate(joined)
                # input already in order comes back as it is: its buffers are the caller's
                shared = run.keys is joined.keys
                del joined
                buffered.clear()
            finally:
                # the sort's arrays are gone; the builder reserves the sorted copy, and
                # the input's reservation covers its encoding temporaries until done
                self.ctx.release(temporaries)
            store = self.ctx.resident
            if resident and store is not None and len(run):
                starts = key_starts(run.keys)
                if store.admits(run.nbytes + starts.nbytes):
                    return store.make(run, starts, self.key_schema, self.val_schema,
                                      copy=shared)
            builder = Builder(self.ctx, self.key_schema, self.val_schema)
            try:
                builder.push(run)
                return builder.done()
            except BaseException:
                builder.abort()   # its reservation and half-written file go now
                raise
        finally:
            self.ctx.release(reserved)

    def _merge_down(self, runs: list[Batch]) -> list[Batch]:
        """Merge the oldest runs (up to ``_MERGE_FAN_IN`` at a time) until at most
        ``ctx.read_fan_in`` remain: few enough for a reader to walk them all at once
        within the budget, one decoded part each (see ``StorageContext.for_budget``).
        If a merge fails, the outputs made so far are dropped and ``runs`` are left to
        the caller as they were."""
        runs = [r for r in runs if len(r)]
        fan_in = self.ctx.read_fan_in
        made: list[Batch] = []
        try:
            while len(runs) > fan_in:
                take = min(_MERGE_FAN_IN, len(runs) - fan_in + 1)
                made.append(Merger(runs[:take], 0, self.ctx).finish())
                runs = runs[take:] + [made[-1]]
        except BaseException:
            _drop(made)
            raise
        return runs

    def exert(self, fuel: int) -> None:
        """Spend ``fuel`` units of extra merge work (e.g. while idle)."""
        with self._write_lock:
            self._check_open()
            self.spine.exert(int(fuel))

    def merge_all(self) -> None:
        """Finish every merge: leaves one batch (handy before many reads)."""
        with self._write_lock:
            self._check_open()
            self.spine.merge_all()
            self.ctx.settle()

    # -- handles and compaction --------------------------------------------------------
    def handle(self) -> "TraceHandle":
        """A shared reader handle, holding the trace's history from its current frontier."""
        self._check_open()
        h = TraceHandle(self)
        self._handles.append(weakref.ref(h))
        return h

    def _live_handles(self) -> list["TraceHandle"]:
        live = [r() for r in self._handles]
        live = [h for h in live if h is not None and not h.closed]
        self._handles = [weakref.ref(h) for h in live]
        return live

    def _update_frontiers(self) -> None:
        with self._write_lock:
            live = self._live_handles()
            if live:
                logical = min(h.logical for h in live)
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

    def _check_read_time(self, at: int | None) -> None:
        self._check_open()
        if at is not None and at < 0:
            raise ValueError(f"at={at}: times are unsigned")
        if at is not None and at < self.spine.since:
            raise ValueError(f"at={at} is before the trace's logical compaction frontier "
                             f"{self.spine.since}: those times have been compacted away")

    def _output_schema(self, *extra: pa.Field) -> pa.Schema:
        """Keys, vals and ``extra`` (made with :mod:`arrangedb.spine.data.roles`), marked as
        made by this trace's engine."""
        fields = list(self.key_schema)
        if self.val_schema is not None:
            fields += list(self.val_schema)
        return roles.with_engine(pa.schema(fields + list(extra)), self.ctx.engine_id)

    def snapshot(self, at: int | None = None) -> pa.RecordBatchReader:
        """Key, vals and ``count`` (sum of diffs with time <= at; zeros dropped), key order."""
        self._check_read_time(at)
        schema = self._output_schema(roles.weight_field("count"))

        def gen():
            for b in blocks(self, at=at):
                yield _record_batch(schema, b.row_keys(), b.vals, [b.counts])
        return pa.RecordBatchReader.from_batches(schema, gen())

    def changes(self, since: int, upto: int | None = None) -> pa.RecordBatchReader:
        """Consolidated updates with ``since <= time < upto``: key, vals, time, diff."""
        self._check_open()
        frontier = self.spine.since
        if frontier and (since and since < frontier or upto is not None and upto <= frontier):
            raise ValueError(f"changes({since}, {upto}) reaches before the logical compaction "
                             f"frontier {frontier}: those times have been compacted away")
        schema = self._output_schema(roles.time_field("time"), roles.weight_field("diff"))

        def gen():
            for b in blocks(self, changes=(since, upto)):
                yield _record_batch(schema, b.row_keys(), b.vals, [b.times, b.counts])
        return pa.RecordBatchReader.from_batches(schema, gen())

    def cursor(self, at: int | None = None, changes=None, window_rows: int | None = None):
        """Blocks of consecutive keys (see :mod:`arrangedb.spine.read.cursor`)."""
        return blocks(self, at=at, changes=changes, window_rows=window_rows)

    def lookup(self, keys, at: int | None = None, read_dictionary=None) -> pa.Table:
        """Rows for a batch of keys: query_index, key, vals, count (sorted once, walked in
        order). ``read_dictionary``: val columns to return as dictionary arrays (int32
        codes), taken as codes from the parts that store them dictionary-coded."""
        self._check_read_time(at)
        queries = _key_table(keys, self.key_schema)
        dictionary = frozenset(read_dictionary or ())
        unknown = sorted(dictionary - set(self.val_names))
        if unknown:
            raise KeyError(f"read_dictionary: {unknown} are not val columns of this trace "
                           f"(vals: {self.val_names})")
        schema = dictionary_schema(self._output_schema(roles.weight_field("count")),
                                   dictionary)
        schema = pa.schema([pa.field("query_index", pa.int64())] + list(schema))
        n = queries.num_rows
        if n == 0:
            return schema.empty_table()
        qc = codes([queries], self.key_names)[0]
        distinct_sorted = bool((qc[1:] > qc[:-1]).all())   # a join's keys: nothing to sort
        order = np.arange(n) if distinct_sorted else sort_order(qc)
        sorted_q = queries if distinct_sorted else queries.take(order)
        sq = qc[order]
        first = np.ones(n, dtype=bool)
        first[1:] = sq[1:] != sq[:-1]
        uniq_pos = np.flatnonzero(first)            # positions (in sorted order) of distinct keys
        uq = sorted_q if distinct_sorted else sorted_q.take(uniq_pos)  # distinct, sorted
        found: list[Updates] = []
        found_u: list[np.ndarray] = []
        sources = 0
        for batch in self.spine.batches():
            if at is None or batch.description.lower <= max(at, self.since):
                before = len(found)
                self._lookup_batch(batch, uq, found, found_u, dictionary)
                sources += len(found) > before
        if not found:
            return schema.empty_table()
        upd = Updates.concat(found)
        u = np.concatenate(found_u)
        t = upd.times
        if sources == 1 and len(t) and t[0] == t[-1] and (at is None or t[0] <= at) \
                and bool(np.all(t == t[0])):
            # one batch at one time: consolidated, in query order, a count per (key, val)
            u_rows, vals, counts = u, upd.vals, upd.diffs
        else:
            # accumulate per (distinct query, val): the distinct query index acts as the key
            acc_keys = pa.table({"__u": u})
            k_u, vals, counts = accumulate(Updates(acc_keys, upd.vals, upd.times, upd.diffs), at)
            u_rows = k_u.column(0).to_numpy()
        if distinct_sorted:     # each query is its own distinct key: rows are in query order
            return _record_table(schema, u_rows, uq.take(u_rows), vals, counts)
        # expand to every query row (duplicates included), ordered by query_index
        group_of_sorted = np.cumsum(first) - 1       # distinct index of each sorted query
        lo = np.searchsorted(u_rows, np.arange(len(uniq_pos)), side="left")
        hi = np.searchsorted(u_rows, np.arange(len(uniq_pos)), side="right")
        q_index = order                              # sorted position -> original row
        per_query = (hi - lo)[group_of_sorted]
        by_query = np.empty(n, dtype=np.int64)       # original row order: the inverse
        by_query[q_index] = np.arange(n)              # permutation, no sort needed
        reps = per_query[by_query]
        starts = lo[group_of_sorted][by_query]
        rows = ranges(starts, reps)
        qi = np.repeat(np.arange(n), reps)           # q_index is a permutation of 0..n-1
        key_rows = uq.take(u_rows[rows])
        out_vals = vals.take(rows) if vals is not None else None
        return _record_table(schema, qi, key_rows, out_vals, counts[rows])

    def _lookup_batch(self, batch: Batch, uq: pa.Table, found: list, found_u: list,
                      dictionary: frozenset = frozenset()) -> None:
        part_of = seek_parts(batch, uq)    # non-decreasing: the queries are sorted
        edges = np.searchsorted(part_of, np.arange(len(batch.parts) + 1), side="left")
        for p in np.flatnonzero(np.diff(edges)):
            lo, hi = int(edges[p]), int(edges[p + 1])
            qsel = np.arange(lo, hi)
            part = batch.parts[p]
            first = part.dense_first_key()
            layout = part.lookup_layout(dictionary, dense=first is not None)
            try:
                qk = uq.slice(lo, hi - lo)
                if first is not None:   # key i is first + i: no keys to read or search
                    pos, hit = _dense_positions(first, part.num_keys, qk.column(0))
                else:
                    pkeys = layout.keys
                    pc_, qc_ = codes([pkeys, qk.rename_columns(pkeys.column_names)],
                                     self.key_names)
                    pos, hit = _positions(pc_, qc_)
                if not hit.any():
                    continue
                upd, owner = select_keys(layout, pos)
                found.append(upd)
                found_u.append(qsel[hit][owner])
            finally:
                part.release()

    def checkpoint(self, path=None, retain: int = 10) -> int:
        """Make the trace durable in the directory ``path`` (created when missing) as its
        next version; returns the version number (1 for a new directory). Only batches the
        directory does not hold yet are written. ``path=None``: the directory the trace
        was loaded from or last checkpointed to. Keeps the newest ``retain`` versions.
        The trace holds the directory's writer role until it is closed; see
        :mod:`arrangedb.spine.persist` for the guarantees."""
        with self._write_lock:
            self._check_open()
            return persist.checkpoint(self, path, retain)

    def save(self, path) -> None:
        """Write this trace to a new directory for ``Engine.load``: a first checkpoint
        (``FileExistsError`` if ``path`` already holds one), without keeping the writer
        role."""
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
        payload = sum(b.payload_bytes for b in batches)
        stored = sum(b.stored_bytes for b in batches)
        budget = self.ctx.budget
        return {
            "updates": updates,
            "keys": self._distinct_keys(batches),
            "keys_exact": True,
            "batches": len(batches),
            "parts": sum(len(b.parts) for b in batches),
            "bytes_in_memory": sum(b.bytes_in_memory for b in batches),
            "bytes_on_disk": sum(b.bytes_on_disk for b in batches),
            "payload_bytes": payload,
            "stored_bytes": stored,
            "overhead_bytes_per_update": (stored - payload) / updates if updates else 0.0,
            "peak_rss_bytes": budget.peak_rss if budget is not None else 0,
            "since": self.spine.since,
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
    read never needs.
    """

    def __init__(self, trace: Trace):
        self.trace = trace
        self.runs: list[Batch] = []

    def add(self, data, time: str | None = None, diff: str | None = None) -> None:
        t = self.trace
        t._check_open()
        self.runs += t._build(data, time, diff, merge=False)

    def finish(self) -> None:
        """Hand the runs to the trace. If this fails, the trace is as it was and the
        appender keeps its runs: ``finish`` may be called again, or ``abort``."""
        t = self.trace
        with t._write_lock:
            t._check_open()
            runs = t._merge_down(self.runs)
            t.spine.insert_runs(runs)   # on failure: runs stay ours; made outputs are garbage
            self.runs = []
            t.ctx.settle()

    def abort(self) -> None:
        """Drop the runs sorted so far (their page files go now, not at collection)."""
        runs, self.runs = self.runs, []
        for r in runs:
            r.drop()


class TraceHandle:
    """A shared reader's hold on a trace's history (logical) and batch boundaries (physical)."""

    def __init__(self, trace: Trace):
        self._trace = trace
        self.logical = trace.since
        self.physical: int | None = None
        self.closed = False

    @property
    def trace(self) -> Trace:
        return self._trace

    def set_logical_compaction(self, frontier: int) -> None:
        """Allow the trace to forget history before ``frontier`` (never moves backwards)."""
        if frontier < self.logical:
            raise ValueError(f"logical compaction frontier cannot move back from "
                             f"{self.logical} to {frontier}")
        self.logical = int(frontier)
        self._trace._update_frontiers()

    def set_physical_compaction(self, frontier: int) -> None:
        """Allow the trace to merge away batch boundaries before ``frontier``."""
        if self.physical is not None and frontier < self.physical:
            raise ValueError(f"physical compaction frontier cannot move back from "
                             f"{self.physical} to {frontier}")
        self.physical = int(frontier)
        self._trace._update_frontiers()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._trace._update_frontiers()

    def __enter__(self) -> "TraceHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        # The trace lets go of this handle's frontiers at its next write: a collection
        # may run in any thread, even inside a write, where changing the spine is unsafe.
        self.closed = True

    # reads go through the shared trace
    def snapshot(self, at=None):
        return self._trace.snapshot(at)

    def lookup(self, keys, at=None):
        return self._trace.lookup(keys, at)

    def changes(self, since, upto=None):
        return self._trace.changes(since, upto)


def _drop(batches: list[Batch]) -> None:
    """Drop batches nothing else holds: their page files and reservations go now."""
    for b in batches:
        try:
            b.drop()
        except OSError:
            pass   # an unlink the disk refuses: the file is garbage to the spill directory


def _key_table(keys, key_schema: pa.Schema) -> pa.Table:
    if isinstance(keys, pa.RecordBatch):
        keys = pa.Table.from_batches([keys])
    if not isinstance(keys, pa.Table):
        raise SchemaError(f"lookup keys must be a pyarrow Table or RecordBatch, "
                          f"not {type(keys).__name__}")
    cols = []
    for f in key_schema:
        if f.name not in keys.column_names:
            raise SchemaError(f"lookup keys lack key column {f.name!r} "
                              f"(columns: {', '.join(keys.column_names)})")
        col = keys.column(f.name).combine_chunks()
        if col.null_count:
            raise SchemaError(f"lookup key column {f.name!r} holds nulls")
        if col.type != f.type:
            try:
                col = col.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise SchemaError(f"lookup key column {f.name!r} has type {col.type}, "
                                  f"the trace's is {f.type}") from e
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=key_schema)


def _positions(sorted_codes: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where the queries' codes are among a part's distinct, sorted key codes: the
    positions of those found, and which were found.

    Consecutive integer codes (dense ids, the common surrogate key) need no search: a
    key's position is its distance from the first (5x faster than a binary search of
    380k queries in 4M keys)."""
    n = len(sorted_codes)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(len(queries), dtype=bool)
    if sorted_codes.ndim == 1 and sorted_codes.dtype.kind in "iu":
        lo, hi = sorted_codes[0], sorted_codes[-1]
        if int(hi) - int(lo) == n - 1:
            hit = (queries >= lo) & (queries <= hi)
            return (queries[hit] - lo).astype(np.int64), hit
    pos = np.searchsorted(sorted_codes, queries)
    hit = (pos < n) & (sorted_codes[np.minimum(pos, n - 1)] == queries)
    return pos[hit], hit


def _dense_positions(first: int, n: int, queries) -> tuple[np.ndarray, np.ndarray]:
    """Positions of integer queries among the keys first, first + 1, ..., first + n - 1,
    and which were found."""
    q = queries.to_numpy() if not isinstance(queries, pa.ChunkedArray) \
        else queries.combine_chunks().to_numpy()
    # uint64 queries beyond int64 wrap to negatives: below an unsigned first key, missed
    q = q.astype(np.int64, copy=False)
    hit = (q >= first) & (q <= first + n - 1)
    return q[hit] - np.int64(first), hit


def _record_batch(schema: pa.Schema, keys: pa.Table, vals: pa.Table | None,
                  extra: list[np.ndarray]) -> pa.RecordBatch:
    arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in keys.columns]
    if vals is not None:
        arrays += [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
                   for c in vals.columns]
    arrays += [pa.array(e) for e in extra]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _record_table(schema, qi, keys, vals, counts) -> pa.Table:
    arrays = [pa.array(qi)] + list(keys.columns)
    if vals is not None:
        arrays += list(vals.columns)
    arrays.append(pa.array(counts))
    return pa.Table.from_arrays(arrays, schema=schema)
