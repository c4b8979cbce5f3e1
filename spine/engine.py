"""Engine: one memory budget, one spill directory, and the traces arranged under them.

Design
------
The engine is what a user (or a Spark task) mounts: it creates the budget
(:class:`arrangedb.pager.MemoryBudget`) and a private spill directory, derives part and
window sizes from the budget, and arranges data into traces. Closing it drops every
trace and removes its spill directory.
"""

from __future__ import annotations

import importlib
import itertools
import os
import threading
import weakref

import pyarrow as pa

import arrangedb
from arrangedb.pager import MemoryBudget, SpillDirectory
from arrangedb.spine.storage.context import StorageContext
from arrangedb.spine import persist
from arrangedb.spine.build.idle import IdleMerger
from arrangedb.spine.data import roles
from arrangedb.spine.data.ingest import (Columns, is_file_input, is_plan, open_batches,
                                         target_schemas)
from arrangedb.spine.trace import Trace


# What an engine's first operations would otherwise load inside its measurement.
# (The spine's own modules are loaded by importing it; the operators, a layer above,
# load when a job first uses one.)
_CODE = ("pyarrow.compute", "zstandard")
_code_loaded = False


def _load_code() -> None:
    """Load, once per process, the code every engine's work needs -- pyarrow's compute
    module, zstandard, and pandas, which pyarrow imports on its first
    conversion from or to numpy when it is installed (~35 MiB, 0.13 s) -- before the
    budget takes its RSS baseline: the allowance is for what the work holds beside its
    reservations, and code is loaded once per process, not per job. Parquet and
    dataset readers (~15 MiB) load only when an input is a Parquet file or folder."""
    global _code_loaded
    if _code_loaded:
        return
    for module in _CODE:
        importlib.import_module(module)
    pa.array([0])
    _code_loaded = True
    _warn_slow_sorts()


class SlowSortWarning(UserWarning):
    """numpy was loaded before arrangedb on a CPU where its default sorts are slow."""


def _warn_slow_sorts() -> None:
    """Say, once per process, that numpy sorts with its slow AVX-512 kernels here and
    how to give it the fast ones. The setting is still to be made only when numpy was
    loaded before ``import arrangedb`` could make it (``arrangedb/__init__.py``)."""
    import warnings

    setting = arrangedb.numpy_sort_setting()
    if setting is not None:
        warnings.warn(
            f"numpy was imported before arrangedb, and on this CPU (AMD Zen 4) its AVX-512 "
            f"sorts run ~5x slower than its AVX2 ones, and arranging ~1.4x slower: "
            f"import arrangedb before numpy and pyarrow, or set "
            f"NPY_DISABLE_CPU_FEATURES=\"{setting}\" in the environment "
            f"(ARRANGEDB_TUNE_NUMPY=0 silences this)", SlowSortWarning, stacklevel=4)


_open: "weakref.WeakValueDictionary[int, Engine]" = weakref.WeakValueDictionary()
_ids = itertools.count(1)
_registry_lock = threading.Lock()


def engine_for(stream_schema: pa.Schema | None = None, engine=None, who: str = "this operator"
               ) -> "Engine":
    """The engine an operator runs in: ``engine`` when given, else the engine that made
    the stream (its schema says which), else the one engine open in the process. A job
    has one budget and one spill directory: no operator makes an engine of its own."""
    if engine is not None:
        return engine
    made_by = roles.engine_id(stream_schema) if stream_schema is not None else None
    with _registry_lock:
        if made_by is not None and made_by in _open:
            return _open[made_by]
        live = list(_open.values())
    if len(live) == 1:
        return live[0]
    if not live:
        raise ValueError(f"{who} needs an engine for its budget and spill directory, and none "
                         f"is open: open one (arrangedb.Engine(...)) or pass engine=")
    raise ValueError(f"{who}: {len(live)} engines are open and the input does not say which "
                     f"made it: pass engine=")


class Engine:
    """One memory budget and one spill directory, and the traces arranged under them.

    ``spill_dir``: where the engine's private spill directory goes (created when
    missing), else ``$ARRANGEDB_SPILL_DIR``, else the temp dir. ``memory_budget``: bytes
    or a size such as "512MiB". ``codec``: "auto" (chosen per column) or a codec name.
    ``idle_merge``: merge traces' batches on a background thread while the engine is
    otherwise quiet (:mod:`arrangedb.spine.build.idle`); default on, off with
    ``$ARRANGEDB_IDLE_MERGE=0``. Use it as a context manager: closing drops its traces
    and spill files."""

    def __init__(self, spill_dir=None, memory_budget="1GiB", codec: str = "auto",
                 idle_merge: bool | None = None):
        _load_code()
        self.budget = MemoryBudget(memory_budget)
        try:
            self.spill = SpillDirectory(spill_dir)
        except BaseException:
            self.budget.close()
            raise
        self.ctx = StorageContext.for_budget(self.budget, self.spill, codec)
        if idle_merge is None:
            idle_merge = os.environ.get("ARRANGEDB_IDLE_MERGE", "1") != "0"
        if idle_merge:
            self.ctx.idle = IdleMerger(self.ctx)
        self._traces: list[Trace] = []
        self._closed = False
        with _registry_lock:
            self.id = self.ctx.engine_id = next(_ids)
            _open[self.id] = self

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def arrange(self, data, key, vals=None, time=None, diff=None, name=None) -> Trace:
        """Arrange ``data`` by ``key``: sorted runs within the budget, spilled and merged."""
        if self._closed:
            raise RuntimeError("the engine is closed")
        if is_plan(data):   # run by the build, in batches as large as its runs take
            schema, source = data.schema, data
        else:
            schema, stream = open_batches(data)
            # the build opens a file again (only the columns it needs) and knows a
            # table's size; a stream is read once, from here
            if is_file_input(data) or isinstance(data, (pa.Table, pa.RecordBatch)):
                source = data
            else:
                source = pa.RecordBatchReader.from_batches(schema, stream)
        cols = Columns.resolve(schema, key, vals, time, diff)
        if is_file_input(data):
            schema = pa.schema([schema.field(c) for c in cols.needed()])
        key_schema, val_schema = target_schemas(schema, cols)
        trace = Trace(self.ctx, key_schema, val_schema, cols, name)
        trace.add_runs(trace.runs.build(source, cols.time or False, cols.diff or False))
        self._traces.append(trace)
        trace.notify_idle()
        return trace

    def view(self, plan, key=None, name=None, path=None, history: str = "last") -> Trace:
        """A maintained view: a trace holding ``plan``'s output (arranged by ``key``;
        default: its group columns, its input's key, or all columns), brought up to date
        from its inputs' changes before each read (``refresh()``). ``path``: the view
        checkpointed there, resumed over ``plan``'s inputs (loaded traces) instead of
        running the plan. ``history``: ``"last"`` keeps the changes of its last refresh
        and the state before them, ``"all"`` every time. See :mod:`arrangedb.ops.view`."""
        if self._closed:
            raise RuntimeError("the engine is closed")
        maintained = getattr(plan, "maintained", None)
        if maintained is None:
            raise TypeError(f"engine.view takes a plan of arrangedb's operators (join, "
                            f"group_by, reduce, ...), not {type(plan).__name__}")
        view = maintained(self, key, name, path, history)
        if path is not None:
            return view   # load() tracks it
        self._traces.append(view)
        return view

    def load(self, path, version: int | None = None, make_trace=Trace) -> Trace:
        """The trace checkpointed (or saved) at ``path``, at ``version`` (None: the
        newest), memory-mapped in place: no payload is decoded. It accepts inserts and
        merges like any trace; its next ``checkpoint()`` writes the next version there.
        ``make_trace``: the trace's class (a view resumes as a view)."""
        if self._closed:
            raise RuntimeError("the engine is closed")
        trace = persist.load(path, self.ctx, make_trace, version)
        trace.restore_upper()
        self._traces.append(trace)   # merged once written to: a version is read as it is
        return trace

    def load_all(self, paths, then=()) -> Trace:
        """The traces saved at ``paths`` (oldest first, one schema) as one trace, with
        the updates of each stream in ``then`` (times at or after theirs) added after
        them: every directory mapped in place and nothing merged -- reads walk the
        batches in one k-way pass, and no insert pays merge fuel for the others. For a
        reader of a history kept as one directory per commit (an arranged dataset's
        partition on Spark)."""
        if self._closed:
            raise RuntimeError("the engine is closed")
        parts = [self.load(p) for p in paths]
        if not parts:
            raise ValueError("load_all needs at least one directory")
        first = parts[0]
        for t in parts[1:]:
            if t.key_schema != first.key_schema or t.val_schema != first.val_schema:
                raise ValueError(f"load_all: {t!r} and {first!r} differ in schema")
        batches = [b for t in parts for b in t.batches()]
        trace = Trace(self.ctx, first.key_schema, first.val_schema, first.columns,
                      first.name)
        trace.spine.set_since(max(t.since for t in parts))
        upper = max(t.upper() for t in parts)
        for data in then:
            runs = trace.runs.build(data, None, None, resident=True, lower=upper)
            batches += runs
            upper = max([upper] + [r.description.upper for r in runs if len(r)])
        # as one input: a k-way level, no fuel paid (the loaded traces keep their
        # files' leases and close them with the engine)
        trace.spine.insert_runs(batches)
        trace.restore_upper()
        self._traces.append(trace)
        return trace

    def wait_merged(self, timeout: float | None = None) -> bool:
        """Wait until the idle merger has no merge work left (or ``timeout`` seconds);
        whether so. Merging goes on without this: it is for measuring a settled engine."""
        return self.ctx.idle is None or self.ctx.idle.wait(timeout)

    def stats(self) -> dict:
        b = self.budget.stats()
        before = arrangedb.RSS_AT_IMPORT
        return {
            "memory_budget": self.budget.limit,
            "held_bytes": self.budget.held,
            "peak_held_bytes": self.budget.peak_held,
            "peak_rss_bytes": self.budget.peak_rss,
            "baseline_rss_bytes": self.budget.baseline_rss,
            "rss_before_engine_code_bytes": before,
            "peak_rss_over_before_engine_code_bytes": (
                self.budget.peak_rss - before if before is not None else None),
            "bytes_spilled": self.spill.bytes_written,
            "bytes_on_disk": self.spill.bytes_on_disk,
            "spill_dir": str(self.spill.path),
            "budget": b,
            "resident_bytes": self.ctx.resident.bytes,
            "resident_batches_paged_out": self.ctx.resident.paged_out,
            "idle_merge_slices": self.ctx.idle.slices if self.ctx.idle is not None else 0,
            **(self.ctx.block_cache.stats() if self.ctx.block_cache is not None else {}),
        }

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with _registry_lock:
            _open.pop(self.id, None)
        if self.ctx.idle is not None:
            self.ctx.idle.close()   # after its slice in progress, before the traces go
        for t in self._traces:
            t.close()
        self._traces.clear()
        self.ctx.close()
        self.spill.close()
        self.budget.close()
