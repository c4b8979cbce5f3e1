"""arrangedb: a spill-to-disk, paged storage engine for differential-dataflow arrangements.

Public API::

    with arrangedb.Engine(spill_dir=None, memory_budget="1GiB") as engine:
        trace = engine.arrange(table, key=["k"], vals=["v"])
        trace.snapshot(at=None)      # RecordBatchReader: key, vals, count
        trace.lookup(keys, at=None)  # Table: query_index, key, vals, count
        trace.changes(since, upto)   # RecordBatchReader: key, vals, time, diff

Names are loaded on first use, so ``import arrangedb.codecs`` (say) does not pull in the
whole engine.
"""

import importlib
import os

__version__ = "0.1.0"


def _rss_now() -> int | None:
    """The process's RSS from /proc (no psutil: this runs at ``import arrangedb``)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _tune_arrow_allocator() -> None:
    """Have Arrow's allocator (mimalloc) commit arena memory as it is used, not a whole
    arena at once. Its purge delay stays at mimalloc's default: giving freed memory back
    at once (``MIMALLOC_PURGE_DELAY=0``) lowered the peak of a job arranging and joining
    8x a 64 MiB budget by ~9 MiB, but faulted every large buffer in afresh: the 40M-row
    join query's cold run took 4.9-5.1 s instead of 3.8, a distinct view's refresh 0.52 s
    instead of 0.36. mimalloc reads its options when pyarrow loads, so this works only
    when arrangedb is imported first; the environment's own settings win, and
    ``ARRANGEDB_TUNE_MALLOC=0`` leaves the allocators alone (as it does glibc's)."""
    import sys

    if "pyarrow" in sys.modules or os.environ.get("ARRANGEDB_TUNE_MALLOC", "1") == "0":
        return
    os.environ.setdefault("MIMALLOC_ARENA_EAGER_COMMIT", "0")


def _slow_avx512_sorts(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this is an AMD Zen 4 CPU (family 25 with AVX-512), where numpy's AVX-512
    sorts run several times slower than its AVX2 ones: their partition step stores
    with ``vpcompress`` to memory, which Zen 4 microcodes (Zen 5 is family 26)."""
    family = vendor = None
    try:
        with open(cpuinfo) as f:
            for line in f:
                name, _, value = line.partition(":")
                name = name.strip()
                if name == "vendor_id":
                    vendor = value.strip()
                elif name == "cpu family":
                    family = value.strip()
                elif name == "flags":
                    return (vendor == "AuthenticAMD" and family == "25"
                            and "avx512f" in value.split())
    except OSError:
        pass
    return False


def _tune_numpy_sorts() -> None:
    """Have numpy sort with its AVX2 kernels on CPUs where its AVX-512 ones are slow
    (:func:`_slow_avx512_sorts`): measured on a Zen 4 EPYC, sorting 1M int64 took
    51 ns a value with AVX-512 and 10 with AVX2, argsort 75 and 28, and arranging
    40M rows took 2.3-2.6 s instead of 3.4-3.6; numpy's arithmetic runs at the same
    speed either way.
    numpy reads ``NPY_DISABLE_CPU_FEATURES`` when it loads, so this works only when
    arrangedb is imported before numpy (and pyarrow, which loads numpy); the
    environment's own setting wins, and ``ARRANGEDB_TUNE_NUMPY=0`` leaves numpy alone.
    The feature names are numpy 2.4's (older ones name them otherwise)."""
    import sys

    setting = numpy_sort_setting()
    if setting is not None and "numpy" not in sys.modules:
        os.environ["NPY_DISABLE_CPU_FEATURES"] = setting


def numpy_sort_setting() -> str | None:
    """The ``NPY_DISABLE_CPU_FEATURES`` value that gives numpy its AVX2 sorts on this
    machine, or None: a fast machine, numpy older than 2.4, the environment's own
    setting, or ``ARRANGEDB_TUNE_NUMPY=0``. Processes started from this one (a local
    Spark session's Python workers) load numpy afresh and can take it."""
    if ("NPY_DISABLE_CPU_FEATURES" in os.environ
            or os.environ.get("ARRANGEDB_TUNE_NUMPY", "1") == "0"):
        return None
    version = _numpy_version()
    if version is None or version < (2, 4) or not _slow_avx512_sorts():
        return None
    return "X86_V4 AVX512_ICL AVX512_SPR"


def _numpy_version() -> tuple[int, int] | None:
    """(major, minor) of the installed numpy, read from its ``version.py`` without
    loading it (``importlib.metadata`` costs ~25 ms at import)."""
    import importlib.util
    import re

    try:
        spec = importlib.util.find_spec("numpy")
        path = os.path.join(spec.submodule_search_locations[0], "version.py")
        with open(path) as f:
            found = re.search(r'^version\s*=\s*["\'](\d+)\.(\d+)', f.read(), re.M)
    except (AttributeError, ImportError, IndexError, OSError, TypeError):
        return None
    return (int(found.group(1)), int(found.group(2))) if found else None


_tune_arrow_allocator()
_tune_numpy_sorts()
RSS_AT_IMPORT = _rss_now()
"""The process's RSS when ``arrangedb`` was imported, before any engine code was loaded:
what ``Engine.stats()["rss_before_engine_code_bytes"]`` reports."""

_EXPORTS = {
    "Engine": "arrangedb.spine.engine",
    "SlowSortWarning": "arrangedb.spine.engine",
    "Trace": "arrangedb.spine.trace",
    "TraceHandle": "arrangedb.spine.handle",
    "SchemaError": "arrangedb.spine.data.ingest",
    "MemoryBudget": "arrangedb.pager",
    "BudgetExceeded": "arrangedb.pager",
    "SpillError": "arrangedb.pager",
    "PageFileError": "arrangedb.pager",
    "CorruptionError": "arrangedb.pager",
    "ManifestError": "arrangedb.pager",
    "DirectoryLocked": "arrangedb.pager",
    "versions": "arrangedb.spine.persist",
    "CheckpointConflict": "arrangedb.spine.persist",
    "join": "arrangedb.ops",
    "join_group_by": "arrangedb.ops",
    "reduce": "arrangedb.ops",
    "distinct": "arrangedb.ops",
    "top_k": "arrangedb.ops",
    "threshold": "arrangedb.ops",
    "group_by": "arrangedb.ops",
    "Plan": "arrangedb.ops",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'arrangedb' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
