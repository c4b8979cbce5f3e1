"""Fault injection for tests: every disk operation and budget reservation is a point.

:class:`Faults` is installed as the pager's disk (:mod:`arrangedb.pager.diskio`) and
wraps :meth:`MemoryBudget.reserve`; each operation it sees is numbered, and the
``fail_at``-th raises -- an ``OSError`` (ENOSPC or EIO) at a disk point, a
``BudgetExceeded`` or a plain ``MemoryError`` at a reservation. Run an operation once
with ``fail_at=None`` to count its points, then once per point.
"""

from __future__ import annotations

import contextlib
import errno
import os

from arrangedb.pager import BudgetExceeded, MemoryBudget
from arrangedb.pager.diskio import DiskIO, using


class InjectedFault(Exception):
    """Marks the errors this module raises (tests check that the right one surfaced)."""


def injected(error: BaseException) -> bool:
    """Whether ``error`` is, or was raised from, an injected fault (the pager wraps
    OSErrors into errors that name the spill directory)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, InjectedFault):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


class DiskFault(OSError, InjectedFault):
    pass


class BudgetFault(BudgetExceeded, InjectedFault):
    pass


class AllocationFault(MemoryError, InjectedFault):
    pass


class Faults(DiskIO):
    def __init__(self, fail_at: int | None = None):
        self.fail_at = fail_at
        self.points: list[str] = []

    def _point(self, what: str) -> None:
        self.points.append(what)
        if len(self.points) != self.fail_at:
            return
        n = len(self.points)
        if what == "reserve":   # alternate the two ways memory runs out
            raise (BudgetFault if n % 2 else AllocationFault)(f"injected at point {n}")
        code = errno.ENOSPC if n % 2 else errno.EIO
        raise DiskFault(code, f"injected {what} fault at point {n}: {os.strerror(code)}")

    # -- disk points ---------------------------------------------------------------------
    def open(self, path, flags, mode=0o666):
        if flags & (os.O_WRONLY | os.O_RDWR):
            self._point("create")
        return super().open(path, flags, mode)

    def pwrite(self, fd, data, offset):
        self._point("write")
        return super().pwrite(fd, data, offset)

    def copy_range(self, src_fd, dst_fd, count, offset):
        self._point("copy")
        return super().copy_range(src_fd, dst_fd, count, offset)

    def fsync(self, fd):
        self._point("fsync")
        super().fsync(fd)

    def rename(self, src, dst):
        self._point("rename")
        super().rename(src, dst)

    def mmap(self, fd, length):
        self._point("mmap")
        return super().mmap(fd, length)

    @contextlib.contextmanager
    def installed(self, monkeypatch):
        """The faults in force: the disk, and every budget's reservations."""
        reserve = MemoryBudget.reserve

        def faulty_reserve(budget, nbytes, what="unnamed"):
            self._point("reserve")
            return reserve(budget, nbytes, what)

        with monkeypatch.context() as m:
            m.setattr(MemoryBudget, "reserve", faulty_reserve)
            with using(self):
                yield self
