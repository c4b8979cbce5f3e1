"""The second thread the engine's array kernels may use: big sorts, zstd blocks.

numpy's sorts and zstd (de)compression drop the GIL, so two halves of such work run on
two cores at once. ``threads()`` is 2 by default on a machine with two cores or more;
``ARRANGEDB_THREADS=1`` (or ``set_threads(1)``) keeps everything on the calling thread,
which is what a Spark task does when the executor's other cores run other tasks.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

_threads = min(2, int(os.environ.get("ARRANGEDB_THREADS", 0) or os.cpu_count() or 1))
_worker: ThreadPoolExecutor | None = None
_worker_pid = -1
_guard = threading.Lock()
_local = threading.local()   # .alone: this thread's kernels stay on it


def set_threads(n: int) -> None:
    """Threads the kernels of this process may use (1 or 2)."""
    global _threads
    _threads = max(1, min(2, int(n)))


def threads() -> int:
    """Threads the calling thread's kernels may use now."""
    return 1 if getattr(_local, "alone", False) else _threads


@contextmanager
def alone(on: bool = True):
    """Meanwhile (``on``), the calling thread's kernels run on it alone: another of the
    engine's threads holds the second core (a Parquet input's reader, decoding)."""
    before = getattr(_local, "alone", False)
    _local.alone = before or on
    try:
        yield
    finally:
        _local.alone = before


def _helper() -> ThreadPoolExecutor:
    global _worker, _worker_pid
    with _guard:
        if _worker is None or _worker_pid != os.getpid():   # a forked child has no thread
            _worker = ThreadPoolExecutor(1, thread_name_prefix="arrangedb-kernel")
            _worker_pid = os.getpid()
        return _worker


def both(first, second):
    """``(first(), second())``, the first on the helper thread when two are allowed."""
    if threads() < 2 or threading.current_thread().name.startswith("arrangedb-kernel"):
        return first(), second()   # (nested on the helper itself: waiting would deadlock)
    pending = _helper().submit(first)
    try:
        b = second()
    finally:
        a = pending.result()   # never leave work running on a buffer the caller frees
    return a, b
