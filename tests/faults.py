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
import shutil

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

    def mkdir(self, path, mode=0o777):
        self._point("mkdir")
        super().mkdir(path, mode)

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


class PowerCut(OSError, InjectedFault):
    pass


class PowerLoss(DiskIO):
    """A disk that loses power at its ``cut_at``-th operation.

    Until the cut it works and remembers what is durable: a file's contents as of its
    last fsync, and directory entries (files created, renames) as of their directory's
    last fsync. ``watch``: a folder whose new subdirectories, made by anything (this
    disk's ``mkdir`` or ``os.makedirs``), are judged too -- one whose entry its parent
    never fsync'd after it was made is lost with what it holds. At the cut, and for every operation after it (the process is gone:
    no cleanup code reaches the disk), it raises :class:`PowerCut`. :meth:`restore`
    then puts the disk in the state a machine finds after power comes back: every
    write and every directory change that was not made durable is undone.
    """

    def __init__(self, cut_at: int | None = None, watch=None):
        self.cut_at = cut_at
        self.watch = None if watch is None else os.path.abspath(watch)
        self._dirs_before = set(self._dirs()) if watch is not None else set()
        self._durable_dirs: set[str] = set()
        self.ops = 0
        self.dead = False
        self._paths: dict[int, str] = {}     # fd open for writing -> path
        self._synced: dict[str, bytes] = {}  # path -> contents at its last fsync
        self._written: set[str] = set()      # paths written since they were opened
        self._undo: list[tuple] = []         # directory changes not yet durable, in order

    def _tick(self, what: str) -> None:
        if not self.dead:
            self.ops += 1
            self.dead = self.ops == self.cut_at
        if self.dead:
            raise PowerCut(errno.EIO, f"power lost at operation {self.cut_at} ({what})")

    def open(self, path, flags, mode=0o666):
        writing = bool(flags & (os.O_WRONLY | os.O_RDWR))
        if writing:
            self._tick("create")
        existed = os.path.exists(path)
        fd = super().open(path, flags, mode)
        if writing:
            self._paths[fd] = path
            self._written.add(path)
            if not existed:
                self._undo.append(("created", path))
        return fd

    def pwrite(self, fd, data, offset):
        self._tick("write")
        return super().pwrite(fd, data, offset)

    def copy_range(self, src_fd, dst_fd, count, offset):
        self._tick("copy")
        return super().copy_range(src_fd, dst_fd, count, offset)

    def fsync(self, fd):
        self._tick("fsync")
        super().fsync(fd)
        path = self._paths.get(fd)
        if path is not None:
            with open(path, "rb") as f:
                self._synced[path] = f.read()

    def fsync_path(self, path):
        self._tick("fsync")
        with open(path, "rb") as f:
            self._synced[path] = f.read()

    def _dirs(self):
        for root, dirs, _ in os.walk(self.watch):
            for d in dirs:
                yield os.path.join(root, d)

    def fsync_dir(self, path):
        self._tick("fsync_dir")
        path = os.path.abspath(path)
        if self.watch is not None and os.path.isdir(path):
            self._durable_dirs |= {e.path for e in os.scandir(path) if e.is_dir()}
        self._undo = [u for u in self._undo if os.path.dirname(os.path.abspath(u[1])) != path]

    def close(self, fd):
        self._paths.pop(fd, None)
        super().close(fd)   # closing is allowed after the cut: it changes nothing on disk

    def rename(self, src, dst):
        self._tick("rename")
        before = open(dst, "rb").read() if os.path.exists(dst) else None
        super().rename(src, dst)
        self._undo.append(("renamed", dst, src, before))
        if src in self._synced:
            self._synced[dst] = self._synced.pop(src)
        if src in self._written:
            self._written.discard(src)
            self._written.add(dst)

    def unlink(self, path):
        self._tick("unlink")
        super().unlink(path)

    def mkdir(self, path, mode=0o777):
        self._tick("mkdir")
        super().mkdir(path, mode)

    def mmap(self, fd, length):
        self._tick("mmap")
        return super().mmap(fd, length)

    def restore(self) -> None:
        """The disk after power comes back (call once, after the cut)."""
        for change in reversed(self._undo):
            if change[0] == "created":
                if os.path.exists(change[1]):
                    os.unlink(change[1])
                self._written.discard(change[1])
            else:
                _, dst, src, before = change
                if os.path.exists(dst):
                    os.rename(dst, src)
                    if dst in self._synced:
                        self._synced[src] = self._synced.pop(dst)
                    self._written.discard(dst)
                    self._written.add(src)
                if before is not None:
                    with open(dst, "wb") as f:
                        f.write(before)
        for path in self._written:
            if os.path.exists(path):
                with open(path, "wb") as f:
                    f.write(self._synced.get(path, b""))
        if self.watch is not None:   # new directories never made durable: gone, whole
            for d in sorted(self._dirs()):
                if d not in self._dirs_before and d not in self._durable_dirs:
                    shutil.rmtree(d, ignore_errors=True)
