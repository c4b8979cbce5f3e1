"""Maintained views: a plan's output kept as an arrangement, brought up to date from its
inputs' changes.

``engine.view(plan)`` arranges the plan's output -- by its group columns (``group_by``),
its key (``join``, ``reduce``, ``distinct``, ``top_k``, ``threshold``), or all columns --
into a :class:`View`, which is a trace: it is read, joined, reduced, viewed again and
checkpointed like any other. Before a view answers a read it refreshes: the inputs'
uppers are advanced to the latest of them (their times are one timeline, as in
differential dataflow, so no input may later receive updates at a time the view has
read through), and the output's changes at each input time since the view's own upper
are inserted at that time. Reads of the view at any time it keeps (see History) are
exact.

How a change is computed, by the plan's shape:

``per key``
    An operator over traces whose output is keyed by their key (a join of two traces,
    ``reduce``, ``threshold``): the keys the inputs' changes
    touch are looked up in the inputs (a batched, sorted lookup), the same operator runs
    over just those keys' rows, and the view's old rows of those keys are retracted and
    the new ones inserted -- what differential dataflow's ``reduce`` does. Cost follows
    the touched keys' groups, not the inputs' size. The changes are read a piece of
    whole keys at a time, in key order, and the touched keys go up to 32,768 a step,
    fewer when their groups are large (an operator buffer's worth of rows a step).
``stored aggregates``
    ``reduce`` with counts, and sums, means, minimums and maximums of numbers, and
    counts of distinct values: most keys' new rows come from their stored rows, the
    accumulators kept beside them and the changes alone
    (:mod:`arrangedb.ops.view_reduce`, :mod:`arrangedb.ops.view_state`); the rest take
    the per-key path.
``stored top k``
    ``top_k``: a key whose retractions stay behind its stored first k (or whose stored
    rows are its whole group) takes its new first k from them and its changes
    (:mod:`arrangedb.ops.view_top_k`); the rest are counted from their rows looked up.
``changed rows``
    ``distinct``: only the rows the changes name can enter or leave; their counts
    before and after come from their keys' rows looked up
    (:mod:`arrangedb.ops.view_distinct`).
``linear``
    ``group_by(join(A, B), by, aggs)`` with a count and any sums: the join's changes
    (dA x B + A' x dB, the incremental join) are grouped and added to the groups' stored
    aggregates; a group whose count reaches zero is retracted.
``whole``
    Any other plan: it runs again and the difference from the view's contents is
    inserted (both streamed into the view's runs). Correct for every plan; as costly as
    the plan; exact at the latest time of each refresh (earlier times of one refresh
    fold onto it). ``stats()["refresh_kind"]`` says which a view uses.

History: a view keeps its last refresh's changes and the state before them by default,
every time with ``history="all"`` (:mod:`arrangedb.ops.view_history`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from arrangedb.ops import plan as _plan
from arrangedb.ops.common import keys_within_bytes, names
from arrangedb.ops.planner import params
from arrangedb.ops.reduce import reduce_of_keys
from arrangedb.ops.view_delta import (DIFF, VIEW_TIME, as_retractions, at_time,
                                      at_time_table, change_chunks, change_times,
                                      changed_only, delta_schema, key_steps, plain_field,
                                      queries_rows, step_bounds, touched_keys)
from arrangedb.ops.view_history import checked_history, hint, own_since
from arrangedb.ops.view_linear import apply_linear, summed_nulls
from arrangedb.ops.view_kind import checked_aggs, default_key, kind_of, traces_of
from arrangedb.ops.view_reduce import stored_delta
from arrangedb.ops.view_distinct import distinct_change
from arrangedb.ops.view_state import ReduceState, buildable, needs_state
from arrangedb.ops.view_top_k import recomputed_top_k, stored_top_k
from arrangedb.spine import Columns, Trace, roles

KEYS_PER_STEP = 1 << 15   # touched keys looked up and recomputed at once, at most


class View(Trace):
    """A trace holding a plan's output, kept up to date (module docstring). Made by
    :func:`maintain` (``engine.view``); the constructor is :class:`Trace`'s, so that a
    checkpointed view loads as one."""

    plan = None          # until bound: a view loaded from a checkpoint, not yet resumed
    inputs: tuple = ()
    _refreshing = False
    state = None         # a reduce view's accumulators (ops/view_state.py), if it keeps any
    _holds: tuple | list = ()   # a handle on each input (bind)
    history = "last"     # what it keeps of its past (view_history.HISTORIES)

    @classmethod
    def made(cls, engine, plan, key=None, name=None) -> "View":
        """The view of ``plan``: the plan runs once, its output arranged at the inputs'
        latest time."""
        schema, weight = plan.schema, roles.role_column(plan.schema, roles.WEIGHT)
        key = default_key(plan._node) if key is None else (
            [key] if isinstance(key, str) else list(key))
        names = [f.name for f in schema if f.name != weight]
        missing = [k for k in key if k not in names]
        if missing:
            raise ValueError(f"view key column(s) {missing} are not among the plan's output "
                             f"columns {names}")
        vals = [n for n in names if n not in key]
        key_schema = pa.schema([plain_field(schema.field(k)) for k in key])
        val_schema = pa.schema([plain_field(schema.field(v)) for v in vals]) if vals else None
        view = cls(engine.ctx, key_schema, val_schema, Columns(key, vals or None, None, weight),
                   name)
        view.bind(plan)
        upper = max(t.upper() for t in view.inputs)
        for t in view.inputs:
            t.advance_upper(upper)
        reader = plan.to_reader()
        if upper > 0:   # the output accumulated through upper - 1, at upper - 1
            view.add_runs(view.runs.build(at_time(reader, upper - 1), VIEW_TIME,
                                          weight or False))
        else:
            view.add_runs(view.runs.build(reader, False, weight or False))
        Trace.advance_upper(view, max(upper, 1))
        view._hold_history()
        view.build_state()
        view.notify_idle()
        return view

    @classmethod
    def resumed(cls, engine, plan, path, version=None) -> "View":
        """The view of ``plan`` checkpointed at ``path``, bound to the plan's (loaded)
        inputs: it goes on from its stored upper frontier, applying what the inputs
        received since at its next read."""
        view = engine.load(path, version, make_trace=cls)
        schema = plan.schema
        weight = roles.role_column(schema, roles.WEIGHT)
        written = [plain_field(f) for f in schema if f.name != weight]
        stored = list(view.key_schema) + list(view.val_schema or [])
        if sorted(map(str, written)) != sorted(map(str, stored)):
            view.close()
            raise ValueError(f"the view stored at {str(path)!r} holds columns "
                             f"{[str(f) for f in stored]}, not the plan's "
                             f"{[str(f) for f in written]}: it is the view of another plan")
        view.columns = Columns(view.key_names, view.val_names or None, None, weight)
        view.bind(plan)
        if view.upper() > max(t.upper() for t in view.inputs):
            for t in view.inputs:   # the inputs' versions are older than the view's
                t.advance_upper(view.upper())
        if buildable(view.inputs[0], view.upper()):   # else after the next refresh
            view.build_state()
        return view

    def bind(self, plan) -> None:
        """Tie this view to ``plan``: its inputs, how its changes are computed."""
        node = plan._node
        if node.one_shot:
            raise ValueError("a view needs a plan over traces: this one reads a one-shot "
                             "stream, which cannot be read again for its changes")
        self.plan = plan
        self.weight = roles.role_column(plan.schema, roles.WEIGHT)
        self.inputs = traces_of(node)
        if not self.inputs:
            raise ValueError("a view needs a plan that reads at least one trace")
        self.kind = kind_of(node, self.key_names)
        if self.kind == "linear" and summed_nulls(node):
            self.kind = "whole"   # a group of nulls alone sums to null: not from changes
        self._refreshing = False
        self.state = None
        self.refreshes = 0
        self.keys_from_state = self.keys_recomputed = 0
        for t in self.inputs:
            t.add_view(self)
        # the inputs keep the history the view has yet to read: a reader's handle, as a
        # differential dataflow operator holds the traces it reads
        self._holds = [t.handle(holds_only=True) for t in self.inputs]
        self._hold_history()

    def _hold_history(self) -> None:
        # through upper - 1: compaction to a frontier moves earlier times onto it, and
        # none of the times read already may move to one the view has yet to read
        for h in self._holds:
            h.release_through(self._upper - 1)

    # -- refreshing ---------------------------------------------------------------------
    def refresh(self) -> int:
        """Apply the inputs' changes since the view's upper; returns the new upper."""
        with self._write_lock:
            self._check_open()
            if self._refreshing or self.plan is None:
                return self._upper
            self._refreshing = True
            try:
                for t in self.inputs:   # a view read as an input is brought up to date
                    if isinstance(t, View):
                        t.refresh()
                target = max(t.upper() for t in self.inputs)
                if target > self._upper:
                    self._own_since = own_since(self.history, self._upper, self._own_since)
                    self.update_frontiers()   # what came before this refresh may fold
                    # what the refresh freed, handed back once RSS is high
                    with self.ctx.settling():
                        for t in self.inputs:
                            t.advance_upper(target)
                        with self.ctx.working():   # a refresh is work: idle merging waits
                            try:
                                self._apply(self._upper, target)
                            except BaseException:   # the state may be ahead of the view
                                self._drop_state()
                                raise
                        Trace.advance_upper(self, target)
                        self._hold_history()
                        if self.state is None:
                            self.build_state()
                    self.refreshes += 1
            finally:
                self._refreshing = False
        self.notify_idle()
        return self._upper

    @property
    def history_hint(self) -> str:
        return hint(self.history)

    def advance_upper(self, time: int) -> None:
        """Move the upper frontier to ``time``: the view is brought up to date first, and
        its inputs are advanced with it (one timeline), so that none of them accepts an
        update at a time the view has been read through."""
        self.refresh()
        with self._write_lock:
            for t in self.inputs:
                t.advance_upper(time)
            super().advance_upper(time)

    def _apply(self, lower: int, upper: int) -> None:
        if self.kind == "linear":
            if apply_linear(self, lower, upper):
                return
            self.kind = "whole"   # for good: a group of nulls alone sums to null
        if self.kind == "whole":   # exact at upper - 1; earlier times fold onto it
            self._insert_whole(upper - 1)
            return
        # time by time (a later time's change reads the view's rows of the one before),
        # and within a time, the changes a piece of whole keys at a time
        step = keys_within_bytes(KEYS_PER_STEP, list(self.inputs) + [self])
        schema = delta_schema(self)
        for t in change_times(list(self.inputs), lower, upper):
            def deltas(t=t):
                for chunk in change_chunks(list(self.inputs), t):
                    for delta in self._deltas(chunk, t, step):
                        if delta is not None and delta.num_rows:
                            yield from at_time_table(delta.cast(schema), t).to_batches()
                        # a step's freed temporaries handed back once RSS passes the
                        # budget: a join view's refresh at 32 MiB after a 4x insert
                        # peaked 136-144 MiB over its baseline without, 126-131 with
                        self.ctx.budget.trim_if_high(share=1.0)
            # one stream of a time's steps: sorted into runs as large as the budget lets
            self._append(schema, deltas(), resident=True)

    def _append(self, schema: pa.Schema, batches, resident: bool) -> None:
        """Insert a stream of delta batches (``schema`` and ``__view_time``) through one
        appender: its runs enter the view together, or none does."""
        out = self.appender(resident=resident)
        try:
            out.add(pa.RecordBatchReader.from_batches(
                schema.append(pa.field(VIEW_TIME, pa.uint64())), batches),
                time=VIEW_TIME, diff=DIFF)
            out.finish()
        except BaseException:
            out.abort()
            raise

    def _deltas(self, changes: list[pa.Table], time: int, keys_per_step: int):
        """The view's change at ``time`` from its inputs' ``changes`` at that time, in
        pieces of about ``keys_per_step`` touched keys."""
        p = params(self.plan._node)
        if self.kind == "changed rows":   # distinct: rows whose count crosses zero
            for step in key_steps(changes[0], self.key_names, keys_per_step):
                yield distinct_change(self, self.inputs[0], *step, time)
            return
        if self.kind == "stored top k":   # most keys from their stored first k
            top = (p["k"], names(p["by"]), p["descending"])
            for step in key_steps(changes[0], self.key_names, keys_per_step):
                kept, slow, kept_keys = stored_top_k(self, *top, *step)
                self.keys_from_state += kept_keys
                self.keys_recomputed += slow.num_rows
                yield kept
                if slow.num_rows:   # the others from their rows looked up
                    yield recomputed_top_k(self, *top, self.inputs[0], slow, time)
            return
        stored = None   # the touched keys' rows in the view, when already looked up
        if self.kind == "stored aggregates":   # most keys from their stored rows
            kept, keys, kept_keys, stored = stored_delta(self, checked_aggs(p), changes[0],
                                                         self.state, time)
            self.keys_from_state += kept_keys
            yield kept
        else:
            keys = touched_keys(changes, self.inputs)
        self.keys_recomputed += keys.num_rows
        for lo, hi in step_bounds(keys.num_rows, keys_per_step):
            yield self._per_key_delta(keys.slice(lo, hi - lo), time,
                                      queries_rows(stored, lo, hi - lo))

    def build_state(self) -> None:
        """Build the accumulators a reduce view of means or distinct counts keeps beside
        its rows (:mod:`arrangedb.ops.view_state`), from its input at its upper - 1."""
        p = params(self.plan._node)
        if self.kind == "stored aggregates" and needs_state(aggs := checked_aggs(p)):
            self.state = ReduceState.built(p["trace"], aggs, max(self._upper - 1, 0))

    def _drop_state(self) -> None:
        if self.state is not None:
            self.state.close()
            self.state = None

    def close(self) -> None:
        self._drop_state()
        for h in self._holds:
            h.close()
        super().close()

    def insert_delta(self, delta: pa.Table | None, time: int) -> None:
        """Insert rows with a ``__view_diff`` column, at ``time``."""
        if delta is None or delta.num_rows == 0:
            return
        self.insert(at_time_table(delta, time), time=VIEW_TIME, diff=DIFF)

    def stored_rows(self, keys: pa.Table) -> pa.Table:
        """The view's rows of ``keys`` as stored, without refreshing first."""
        return Trace.lookup(self, keys)

    def _new_rows(self, table: pa.Table) -> pa.Table:
        cols = self.key_names + self.val_names
        diff = table.column(self.weight) if self.weight else pa.array(
            np.ones(table.num_rows, np.int64))
        return table.select(cols).append_column(DIFF, diff.cast(pa.int64()))

    def _per_key_delta(self, keys: pa.Table, time: int, old: pa.Table | None = None
                       ) -> pa.Table:
        """The view's change at ``time`` for ``keys``: their old rows (``old``, the
        view's rows of them if already looked up) retracted, the operator's output over
        just their rows inserted."""
        node = self.plan._node
        if node.op == "reduce":   # the keys' groups reduced straight from the lookup
            p = params(node)
            new = reduce_of_keys(p["trace"], keys.rename_columns(p["trace"].key_names),
                                 p["aggs"], time).rename_columns(
                                     self.key_names + self.val_names)
            return self._replacing(keys, new, old)
        subs = {}
        try:
            for t in self.inputs:   # each input's rows of the touched keys, at ``time``
                rows = t.lookup(keys.rename_columns(t.key_names), at=time)
                sub = Trace(self.ctx, t.key_schema, t.val_schema,
                            Columns(t.key_names, t.val_names or None, None, "count"))
                sub.add_runs(sub.runs.build(rows.drop_columns(["query_index"]), False,
                                            "count"))
                subs[id(t)] = sub
            swap = lambda a: subs.get(id(a), a)
            new = node.fn(*map(swap, node.args),
                          **{k: swap(v) for k, v in node.kwargs.items()}).read_all()
        finally:
            for sub in subs.values():
                sub.close()
        return self._replacing(keys, new, old)

    def _replacing(self, keys: pa.Table, new: pa.Table, old: pa.Table | None = None
                   ) -> pa.Table:
        """The change that replaces the view's rows of ``keys`` (``old``, if already
        looked up) by ``new``."""
        if old is None:
            old = self.stored_rows(keys.rename_columns(self.key_names))
        old, new = changed_only(as_retractions(old, self.key_names + self.val_names),
                                self._new_rows(new).cast(delta_schema(self)),
                                self.key_names + self.val_names)
        return pa.concat_tables([old, new])

    def _insert_whole(self, time: int) -> None:
        """Run the plan again and insert at ``time`` its rows less the view's: both are
        streamed into the view's runs, which consolidate them (nothing held whole)."""
        cols = self.key_names + self.val_names
        schema = delta_schema(self)

        def rows():
            for b in self.plan.to_reader():
                new = self._new_rows(pa.Table.from_batches([b]))
                yield from at_time_table(new.cast(schema), time).to_batches()
            for b in Trace.snapshot(self):
                old = as_retractions(pa.Table.from_batches([b]), cols)
                yield from at_time_table(old.cast(schema), time).to_batches()
        self._append(schema, rows(), resident=False)   # as large as the plan's output

    # -- reads refresh first ----------------------------------------------------------
    def check_read_time(self, at):
        if not self._refreshing:
            self.refresh()
        super().check_read_time(at)

    def changes(self, since, upto=None):
        self.refresh()
        return super().changes(since, upto)

    def lookup(self, keys, at=None, read_dictionary=None, consolidate=True):
        self.refresh()
        return super().lookup(keys, at, read_dictionary, consolidate)

    def stats(self) -> dict:
        s = super().stats()
        uppers = [t.upper() for t in self.inputs]
        s.update(input_uppers=uppers, lag=max(uppers) - self._upper, history=self.history,
                 refresh_kind=self.kind, refreshes=self.refreshes,
                 keys_from_state=self.keys_from_state, keys_recomputed=self.keys_recomputed,
                 state_updates=self.state.updates() if self.state is not None else 0)
        return s


def maintain(plan, engine, key=None, name=None, path=None, history: str = "last") -> View:
    """``engine.view(plan)``: see :class:`View`. ``path``: resume the view checkpointed
    there instead of running the plan."""
    history = checked_history(history)
    view = (View.resumed(engine, plan, path) if path is not None
            else View.made(engine, plan, key, name))
    view.history = history
    return view


_plan.use_maintainer(maintain)
