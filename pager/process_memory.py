"""The process's memory as the kernel and the allocators see it: RSS read cheaply from
``/proc/self/statm``, glibc's malloc tuned for the engine's large short-lived blocks,
and freed memory handed back to the OS (glibc's heap and Arrow's pool). Mechanism only:
when to trim is the budget's policy (:mod:`arrangedb.pager.budget`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os

import psutil

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class StatmReader:
    """The process's RSS from /proc/self/statm through a kept-open descriptor.

    It is the counter psutil's ``memory_info().rss`` reads on Linux, at a seventh of the
    cost (~2 us against ~15 us: psutil opens and parses the file each time), for the
    reservation points; the background sampler keeps asking psutil. A forked child
    (a Spark worker) must not read its parent's file: the owner's pid is checked.
    """

    def __init__(self, process: psutil.Process):
        self._process = process
        self._pid = os.getpid()
        self._fd = -1
        if process.pid == self._pid:
            with contextlib.suppress(OSError):
                self._fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)

    def __call__(self) -> int:
        if self._fd >= 0 and os.getpid() == self._pid:
            with contextlib.suppress(OSError, ValueError, IndexError):
                return int(os.pread(self._fd, 128, 0).split()[1]) * _PAGE_SIZE
        return self._process.memory_info().rss

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


_libc = None


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 << 20    # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit
_tuned = False


def _libc_handle():
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        _libc = ctypes.CDLL(name) if name else False
    return _libc


def tune_allocator() -> bool:
    """Let glibc keep big freed blocks for reuse instead of unmapping each one (once per
    process; ``ARRANGEDB_TUNE_MALLOC=0`` leaves malloc alone). Returns whether it did.

    By default glibc serves every block above a (dynamic) threshold with its own mmap and
    gives it back on free, so each sort of a run, each merge step, faults its temporaries
    in afresh: measured here, arranging 40M rows under 512 MiB spent 2.3 s of system time
    in page faults, 1.3 s with blocks up to 32 MiB kept on the heap and the heap not
    trimmed on every free (~1 s less wall time). RSS stays honest: what is kept is reused
    by the next step of the same size, and :func:`release_freed_memory` (called after
    every build, merge and under budget pressure) trims the heap explicitly.
    """
    global _tuned
    if _tuned or os.environ.get("ARRANGEDB_TUNE_MALLOC", "1") == "0":
        return _tuned
    _no_numpy_huge_pages()
    libc = _libc_handle()
    if libc and hasattr(libc, "mallopt"):
        _tuned = bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)
                      and libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30))
    return _tuned


def _no_numpy_huge_pages() -> None:
    """Have numpy stop asking the kernel for transparent huge pages for its large arrays
    (``madvise(MADV_HUGEPAGE)``, what ``NUMPY_MADVISE_HUGEPAGE=0`` does at numpy's load).
    A huge page is zeroed whole, and compacted for when memory is fragmented, at the
    first touch of a fresh array: arranging 10M orders and 1M customers from Parquet
    took 0.90 s in 4 KiB pages against 1.04-1.07 s (0.2 s more system time) with huge
    pages, and the 40M-row build the same either way (its blocks are reused by then)."""
    import numpy as np

    setter = getattr(getattr(getattr(np, "_core", None), "multiarray", None),
                     "_set_madvise_hugepage", None)
    if setter is not None:
        with contextlib.suppress(Exception):
            setter(False)


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (malloc.h, glibc 2.33+)."""
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def heap_free_bytes() -> int | None:
    """Bytes glibc's malloc holds freed in its heaps (``mallinfo2().fordblks``: what a
    trim could hand back), or None where that is not known (another libc, an older
    glibc). Microseconds: it walks the free lists (2-3 us with 2 GiB freed in 150
    blocks)."""
    libc = _libc_handle()
    fn = getattr(libc, "mallinfo2", None) if libc else None
    if fn is None:
        return None
    fn.restype = _MallInfo2
    try:
        return int(fn().fordblks)
    except (OSError, ValueError):
        return None


def release_freed_memory() -> None:
    """Hand freed heap memory back to the OS so RSS reflects what is really held.

    Arrow's pool (jemalloc/mimalloc) and glibc's malloc both keep freed blocks for reuse;
    after a big merge that retention would read as RSS the budget no longer holds.
    """
    import pyarrow as pa

    with contextlib.suppress(Exception):
        pa.default_memory_pool().release_unused()
    libc = _libc_handle()
    if libc and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def peak_rss() -> int | None:
    """The kernel's high-water mark of the process's RSS (``VmHWM``), or None where
    /proc does not say. Unlike ``ru_maxrss`` it counts only this process's own memory:
    a process spawned by a large one (vfork and exec) does not inherit its figure."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
