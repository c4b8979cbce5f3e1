"""Runs: sorting input into batches within the memory budget.

An input (a table, a stream of batches, a Parquet file) is buffered until sorting what
is buffered would hold the run's share of the budget (:func:`sort_cost`), then sorted,
consolidated and written as one batch -- a *run* -- or kept in memory as a resident
batch when the engine admits it. Runs beyond the read fan-in are merged down, the oldest
first, so that a reader can walk them all at once within the budget.
"""

from __future__ import annotations

import itertools

import pyarrow as pa

from arrangedb.codecs import parallel
from arrangedb.spine.build.builder import Builder
from arrangedb.spine.build.chain import Chain, KeyOrder, split_last_key
from arrangedb.spine.build.merger import Merger
from arrangedb.spine.data import roles
from arrangedb.spine.data.ingest import (Columns, coded_table_columns, is_file_input,
                                         known_rows, open_batches, read_ahead, to_updates)
from arrangedb.spine.data.kernels import consolidate, key_starts, keys_in_order
from arrangedb.spine.data.parquet import coded_columns
from arrangedb.spine.data.updates import Updates
from arrangedb.spine.storage.batch import Batch
from arrangedb.spine.storage.context import StorageContext
from arrangedb.pager.sizing import PLAN_BATCH_ROW_BYTES, READ_AHEAD_SHARE, RUN_SHARE

_MERGE_FAN_IN = 8    # runs merged into one file at a time (one decoded part each)
# What sorting a run holds per row beside its input and its sorted copy, at its peak:
# key and val codes, the packed prefix, the packed values with the row index, the
# order, distinct-row starts, allocator slack. Measured: 40M (int64, float64) rows in
# runs of 3.9M peaked at ~89 bytes a row over a 16-byte input.
_SORT_BYTES_PER_ROW = 72
_STARTS_BYTES_PER_ROW = 8   # a resident run's key starts: an int64 per key and one more
# An input of known size that is several runs anyway sorts into at least half the read
# fan-in of runs while each run's sort still holds this much: smaller runs sort in cache
# and touch less fresh memory. 10M (int64, float64) rows from Parquet at 512 MiB: 4 runs
# of 2.6M arranged in 0.87-0.92 s (peak RSS +322 MiB), 8 of 1.25M in 0.69-0.74 s (+211
# MiB); a join reading them took 0.12-0.16 s instead of 0.07.
_SPREAD_RUN_BYTES = 96 << 20
# A file read in key order is sealed batch by batch once this much is buffered (runs
# that chain: one batch all the same), so that its encoding runs beside the reading:
# a file of tiny row groups is not sealed a thousand rows at a time.
_EARLY_SEAL_BYTES = 2 << 20


def sort_cost(input_bytes: int, rows: int) -> int:
    """Memory a run's sort holds at once: its input, the sort's arrays and the sorted
    copy of the input (at most as large as the input)."""
    return 2 * input_bytes + _SORT_BYTES_PER_ROW * rows


def pieces(stream, max_cost: int):
    """The stream's non-empty batches, sliced so that sorting none of them alone would
    hold more than ``max_cost`` (:func:`sort_cost`, counting the 16 bytes of time and
    diff a row may gain as updates): a run must not have to take a whole oversized
    batch, whose sort would outgrow the budget."""
    for rb in stream:
        n = rb.num_rows
        if n == 0:
            continue
        cost = sort_cost(rb.nbytes + 16 * n, n)
        rows = n if cost <= max_cost else max(1, n * max_cost // cost)
        for lo in range(0, n, rows):
            yield rb.slice(lo, rows) if rows < n else rb


def drop(batches: list[Batch]) -> None:
    """Drop batches nothing else holds: their page files and reservations go now."""
    for b in batches:
        try:
            b.drop()
        except OSError:
            pass   # an unlink the disk refuses: the file is garbage to the spill directory


def _written(builder: Builder, run: Updates) -> Batch:
    try:
        builder.push(run)
        return builder.done()
    except BaseException:
        builder.abort()   # its reservation and half-written file go now
        raise


class RunBuilder:
    """Sorts inputs of one trace's schema into runs; the spine is never touched."""

    def __init__(self, ctx: StorageContext, key_schema: pa.Schema,
                 val_schema: pa.Schema | None, columns: Columns):
        self.ctx, self.key_schema, self.val_schema = ctx, key_schema, val_schema
        self.columns = columns

    @property
    def val_names(self) -> list[str]:
        return self.val_schema.names if self.val_schema is not None else []

    def build(self, data, time: str | None, diff: str | None, merge: bool = True,
              resident: bool = False, max_resident: int | None = None,
              new_writer=None, lower: int = 0) -> list[Batch]:
        """Sorted runs within the budget, at most ``ctx.read_fan_in`` of them (merged down
        when there are more, unless ``merge`` is False); the spine is untouched.
        ``resident``: runs of at most ``max_resident`` updates (any, when None) may stay
        in memory while the engine admits them (:mod:`arrangedb.spine.storage.resident`).
        ``new_writer``: makes the page writer of each run written (default: a spill
        file); merges down still spill. ``lower``: the time of input without a time
        column, and the earliest time accepted (earlier ones raise ``ValueError`` and
        nothing is kept)."""
        # what malloc holds freed before, for the settling a large build ends with; a
        # small table's build never settles, and asking walks malloc's free lists
        # (~0.15 ms of a 150k-row insert's 3 ms)
        free_before = 0 if self._small(data) else self.ctx.heap_free()
        with self.ctx.working():   # idle merging waits for the sorts
            return self._build(data, time, diff, merge, resident, max_resident, new_writer,
                               lower, free_before)

    def _small(self, data) -> bool:
        """Whether ``data`` is a table or batch whose build is one run whose sort stays
        under the cost at which a build settles (:meth:`_settle_cost`)."""
        if not isinstance(data, (pa.Table, pa.RecordBatch)):
            return False
        cost = sort_cost(data.nbytes + 16 * data.num_rows, data.num_rows)
        return cost < min(self.run_bytes(), self._settle_cost())

    def _build(self, data, time, diff, merge, resident, max_resident, new_writer, lower,
               free_before: int) -> list[Batch]:
        schema, stream = open_batches(   # a plan's batches as large as runs take
            data, batch_rows=max(1 << 16, self.run_bytes() // PLAN_BATCH_ROW_BYTES))
        time = roles.resolve_role(schema, time, roles.TIME, self.columns.time)
        diff = roles.resolve_role(schema, diff, roles.WEIGHT, self.columns.diff)
        Columns.resolve(schema, self.key_schema.names, self.val_names, time or False,
                        diff or False)   # fail early
        cols = Columns(self.key_schema.names, self.val_names or None, time, diff)
        ahead, coded = 0, frozenset()
        if is_file_input(data):   # decode only the columns it needs, while runs sort
            coded = frozenset(coded_columns(data, self.val_names))
            schema, stream = open_batches(data, columns=cols.needed(), coded=sorted(coded))
            ahead = max(1, self.run_bytes() // READ_AHEAD_SHARE)
            self.ctx.reserve(ahead, "read-ahead")
            stream = read_ahead(stream, ahead)
        else:   # a table's dictionary columns, as a file's coded ones
            coded = frozenset(coded_table_columns(data, self.val_names))
        run_bytes = self.run_bytes()   # beside what reading ahead holds
        cap = None   # what a run's sort may hold, spread by the input's known size
        total_rows = known_rows(data)
        store = self.ctx.resident if resident else None
        room = store.room() if store is not None else 0
        runs: list[Batch] = []
        buffered: list[Updates] = []
        size = rows = peak = 0   # peak: the largest sort's cost
        to_merge = 0   # the leading runs an input of known size will have merged down
        oversized: list[Batch] = []   # those written with a merge's larger parts
        # runs in key order go on into one batch (chain); resident ones stay apart
        chain = None if resident else Chain(self.ctx.whole_part_bytes)
        early = KeyOrder() if ahead and chain is not None else None

        def seal(alone: bool = False, last: bool = False):
            """Sort what is buffered into a run; its reservation passes to seal. The
            rows of its last key are held back for the next run unless it is the
            ``last``: an input in key order is cut between keys, so its runs chain."""
            nonlocal buffered, size, rows, run_bytes, room
            run = buffered
            tail = [] if last or chain is None else split_last_key(run)
            held = sum(t.nbytes for t in tail)   # stays reserved, as the next run's start
            reserved, buffered = size - held, tail
            size, rows = held, sum(len(t) for t in tail)
            merged = len(runs) + (chain is not None and chain.open) < to_merge and not alone
            # a file's reader decodes the next run meanwhile: sorting on the second core
            # too would run three threads on two (fact_dim's cold query 1.57-1.58 s
            # instead of 1.64-1.65, dim_dim's 0.27-0.28 s instead of 0.28-0.29)
            with parallel.alone(ahead and not last):
                done = self.seal(run, reserved, resident, max_resident, new_writer, alone,
                                 self.merged_part_bytes() if merged else None, chain)
            runs.extend(done)
            kept = store is not None and bool(done) and store.holds(done[-1])
            if chain is None and merged and not kept:
                oversized.extend(done)   # a resident run was kept whole, not written
            run_bytes = self.run_bytes() if cap is None else min(cap, self.run_bytes())
            # runs cut to the resident room while they are kept: once one is paged out,
            # small runs would only mean more merging
            room = store.room() if kept else 0

        def excess(nbytes: int, n: int) -> float:
            """How far a run of ``n`` updates in ``nbytes`` is past its sort's share, or
            past the resident room (as stored: updates and key starts); <= 0 within."""
            over = sort_cost(nbytes, n) - run_bytes
            if room:
                over = max(over, nbytes + _STARTS_BYTES_PER_ROW * (n + 1) - room)
            return over

        def fitting(upd: Updates) -> int:
            """How many of ``upd``'s rows the buffered run still has room for (fewer
            than all: it is called when all would not fit)."""
            per_row = upd.nbytes / len(upd)
            k = (run_bytes - sort_cost(size, rows)) / (2 * per_row + _SORT_BYTES_PER_ROW)
            if room:
                k = min(k, (room - size - _STARTS_BYTES_PER_ROW * (rows + 1))
                        / (per_row + _STARTS_BYTES_PER_ROW))
            k = int(max(0, min(k, len(upd) - 1)))
            while k and excess(size + upd.slice(0, k).nbytes, rows + k) > 0:
                # a slice's bytes are not k average rows (bitmaps, uneven strings)
                k -= max(1, k // 256)
            return k

        def buffer(upd: Updates) -> None:
            nonlocal size, rows, peak
            self.ctx.reserve(upd.nbytes, "ingest buffer")
            buffered.append(upd)
            size += upd.nbytes
            rows += len(upd)
            peak = max(peak, sort_cost(size, rows))

        try:
            batches = stream
            if total_rows:   # its first batch tells the size of a row
                first = next(stream, None)
                if first is not None and first.num_rows:
                    row_bytes = first.nbytes / first.num_rows
                    cap = self.spread(total_rows, row_bytes, run_bytes)
                    if chain is not None:
                        chain.expected = int(total_rows * row_bytes)
                    run_bytes = min(cap, run_bytes)
                    if merge:
                        to_merge = self.merged_ahead(total_rows, row_bytes, run_bytes)
                batches = itertools.chain([first] if first is not None else [], stream)
            for rb in pieces(batches, max(run_bytes, 1)):   # cut below, where runs end
                run_bytes = min(run_bytes, self.run_bytes(size))   # as a plan read holds more
                upd = to_updates(rb, cols, self.key_schema, self.val_schema, lower,
                                 coded=coded)
                if lower and cols.time and len(upd) and int(upd.times.min()) < lower:
                    raise ValueError(
                        f"the input's time column {cols.time!r} holds time "
                        f"{int(upd.times.min())}, before the trace's upper frontier {lower}: "
                        "a trace accepts updates at its upper or later (earlier times may "
                        "have been read already); nothing of this input was added")
                # input in key order while a file's reader decodes the next batches:
                # sealed as it comes, it chains on into one batch, each piece encoded
                # beside the reading instead of a run's worth at a time after it
                in_order = early is not None and early.see(upd)
                while len(upd) > 1 and excess(size + upd.nbytes, rows + len(upd)) > 0:
                    # the run takes the rows that fit its share and the resident room,
                    # the rest starts the next: runs cut at input batches were 10% short
                    k = fitting(upd)
                    if k:
                        buffer(upd.slice(0, k))
                        upd = upd.slice(k, len(upd))
                    elif not buffered:
                        break   # not a row more fits an empty run: the batch goes alone
                    held = rows
                    seal()
                    if not k and rows >= held:
                        break   # the run kept all it held (one key's rows, for the chain)
                buffer(upd)
                if excess(size, rows) >= 0 or (in_order and size >= _EARLY_SEAL_BYTES):
                    seal()
            if buffered:
                seal(alone=not runs and not (chain is not None and chain.open), last=True)
            if chain is not None:
                closed = chain.close()
                if closed is not None:
                    runs.append(closed)
                oversized.extend(chain.large)
            if merge:
                runs[:] = self.merge_down(runs, oversized)
        except BaseException:
            if chain is not None:
                chain.abort()
            drop(runs)   # a failed build leaves nothing behind
            raise
        finally:
            self.ctx.release(size)
            if ahead:
                try:
                    stream.close()   # stops and joins the reading thread
                finally:
                    self.ctx.release(ahead)
        if len(runs) > 1 or peak >= self._settle_cost():
            # sorting left big freed blocks with the allocators; a small run's sort
            # (a view's step, a small insert) leaves little, and a trim costs milliseconds
            # -- and faults the next step's blocks in afresh
            self.ctx.settle(free_before)
        return runs

    def _settle_cost(self) -> int:
        """The sort cost from which a build hands freed memory back when it ends: a
        quarter of the budget. A 600k-row insert at 512 MiB (~70 MB of sort) trimmed
        for ~12 ms, and its change query then faulted its blocks in afresh."""
        budget = self.ctx.budget
        return self.ctx.part_bytes if budget is None else budget.limit // 4

    def merged_ahead(self, rows: int, row_bytes: float, run_bytes: int) -> int:
        """How many leading runs of an input of ``rows`` rows of about ``row_bytes``,
        sorted in runs of ``run_bytes``, :meth:`merge_down` will merge: at least the
        runs past the read fan-in, less one for a misjudged row size."""
        per_run = max(1, int(run_bytes // (2 * row_bytes + _SORT_BYTES_PER_ROW)))
        return max(0, -(-rows // per_run) - self.ctx.read_fan_in - 1)

    def merged_part_bytes(self) -> int:
        """The part size of a run that is to be merged down. A merge reads
        ``_MERGE_FAN_IN`` runs at once where a reader walks ``read_fan_in``, one decoded
        part of each, so such a run's parts can be that much larger in the same memory,
        and each part costs ~1 ms to write and read besides its rows: at 128 MiB, 40M
        rows sort into 63 runs, 54 of them merged; with 2 MiB parts instead of 1, the
        orders and customers were arranged and joined in 5.9-6.1 s instead of 6.4-6.8."""
        return self.ctx.part_bytes * max(1, self.ctx.read_fan_in // _MERGE_FAN_IN)

    def spread(self, rows: int, row_bytes: float, run_bytes: int) -> int:
        """What a run's sort may hold for an input of ``rows`` rows of about
        ``row_bytes`` that sorts in runs of ``run_bytes``: enough for half the read
        fan-in of runs (the last half full, as runs are cut a little short of their
        share), never under ``_SPREAD_RUN_BYTES``. An input that one run holds stays one
        run: an insert cut in two is two batches for every read to walk (an 800k-row
        delta in two halves took a view's refresh over the 40M orders from 0.075 s to
        0.105 s)."""
        whole = sort_cost(int(rows * row_bytes), rows)
        if whole <= run_bytes:
            return run_bytes
        runs = max(1, self.ctx.read_fan_in // 2)
        return max(_SPREAD_RUN_BYTES, 2 * whole // (2 * runs - 1) + 1)

    def run_bytes(self, own: int = 0) -> int:
        """What the next run's sort may hold (:func:`sort_cost`): half the budget, less
        when others leave less free (3/4 of it: they may grow while it sorts; ``own``:
        the run's own buffer), never less than a part. Fewer, longer runs mean less
        merging down: 40M (int64, float64) rows at 512 MiB sort into 16 runs, all read."""
        if self.ctx.run_bytes:
            return self.ctx.run_bytes
        budget = self.ctx.budget
        if budget is None:
            return 512 << 20
        return max(self.ctx.part_bytes,
                   min(budget.limit // RUN_SHARE, (budget.limit - budget.held + own) * 3 // 4))

    def seal(self, buffered: list[Updates], reserved: int, resident: bool = False,
             max_resident: int | None = None, new_writer=None, alone: bool = False,
             part_bytes: int | None = None, chain: Chain | None = None) -> list[Batch]:
        """Sort and write one run; gives back the reservation of its input. A
        ``resident`` run of at most ``max_resident`` updates is kept in memory instead
        when the engine admits it. A run built ``alone`` (the input's only one) is read
        on its own, and is cut into parts as a merge's output is; ``part_bytes`` sizes
        the parts of a run that is to be merged down (:meth:`merged_part_bytes`).
        ``chain``: a run that follows the chain's open batch in key order is written on
        into it; another one closes it and opens the next, left open when its input
        came in key order. Returns the batches completed, in order.

        Sorting holds a few copies of the run at once (the concatenated input, codes,
        orders, the sorted copy): they are reserved too (:func:`sort_cost`), so the
        budget sees them instead of leaving them to the allowance.
        """
        try:
            rows = sum(len(u) for u in buffered)
            temporaries = sort_cost(reserved, rows) - reserved
            self.ctx.reserve(temporaries, "sorting a run")
            try:
                joined = Updates.concat(buffered).contiguous()
                buffered.clear()   # one copy of the input at a time
                ordered = chain is not None and keys_in_order(joined.keys)
                run = consolidate(joined)
                # input already in order comes back as it is: its buffers are the caller's
                shared = run.keys is joined.keys
                del joined
            finally:
                # the sort's arrays are gone; the builder reserves the sorted copy, and
                # the input's reservation covers its encoding temporaries until done
                self.ctx.release(temporaries)
            store = self.ctx.resident
            if (resident and store is not None and len(run)
                    and (max_resident is None or len(run) <= max_resident)):
                run = run.with_plain_vals()   # read as it is kept: codes decoded
                starts = key_starts(run.keys)
                if store.admits(run.nbytes + starts.nbytes):
                    return [store.make(run, starts, self.key_schema, self.val_schema,
                                       copy=shared)]
            if chain is not None and (chain.follows(run) or (chain.open and not len(run))):
                chain.push(run)   # (a run that consolidated away leaves the batch open)
                return []
            done = [chain.close()] if chain is not None and chain.open else []
            if alone:
                part_bytes = self.ctx.whole_part_bytes(run.nbytes)
            builder = Builder(self.ctx, self.key_schema, self.val_schema, new_writer,
                              part_bytes)
            if chain is None:
                return [_written(builder, run)]
            try:
                chain.start(builder, run, large=part_bytes is not None and not alone,
                            ordered=ordered)
                if not ordered:   # keys in any order: the next run overlaps this one
                    done.append(chain.close())
            except BaseException:
                drop(done)
                raise
            return done
        finally:
            self.ctx.release(reserved)

    def merge_down(self, runs: list[Batch], oversized: list[Batch] = ()) -> list[Batch]:
        """Merge the oldest runs (up to ``_MERGE_FAN_IN`` at a time) until at most
        ``ctx.read_fan_in`` remain: few enough for a reader to walk them all at once
        within the budget, one decoded part each (see ``StorageContext.for_budget``).
        The ``oversized`` runs (the oldest), with parts too large for that walk, are
        merged whatever the count. If a merge fails, the outputs made so far are
        dropped and ``runs`` are left to the caller as they were."""
        big = {id(r) for r in oversized}
        runs = [r for r in runs if len(r)]
        fan_in = self.ctx.read_fan_in
        made: list[Batch] = []
        try:
            while len(runs) > fan_in or (len(runs) > 1 and any(id(r) in big for r in runs)):
                take = max(2, min(_MERGE_FAN_IN, len(runs) - fan_in + 1))
                made.append(Merger(runs[:take], 0, self.ctx).finish())
                runs = runs[take:] + [made[-1]]
        except BaseException:
            drop(made)
            raise
        return runs
