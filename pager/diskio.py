"""The pager's disk operations, behind one replaceable object.

Every write, fsync, rename, unlink and mmap that the pager and the persistence code make
goes through :func:`disk`. Production uses :class:`DiskIO`, a thin pass-through to
:mod:`os` and :mod:`mmap`. Tests install a subclass (:func:`using`) that fails the n-th
operation or forgets writes that were never fsync'd -- the way SQLite's I/O-error tests
and FoundationDB's simulation reach every failure point without a broken disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os

COPY_CHUNK = 8 << 20
"""Bytes a copy hands to the kernel at a time, each followed by a write-back hint."""

_SYNC_FILE_RANGE_WRITE = 2


def _load_sync_file_range():
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None   # not Linux: copies simply fsync at the end
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()


def data_ranges(fd: int, size: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` ranges of a file that hold data, holes left out (the whole
    file where the file system cannot tell)."""
    ranges, pos = [], 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:   # nothing but a hole past ``pos``
                break
            return [(0, size)]
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        ranges.append((start, end))
        pos = end
    return ranges


class DiskIO:
    """Pass-through disk operations; subclasses inject faults."""

    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        return os.open(path, flags, mode)

    def pwrite(self, fd: int, data, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        os.mkdir(path, mode)

    def copy_range(self, src_fd: int, dst_fd: int, count: int, offset: int) -> int:
        """Copy bytes between files in the kernel (a reflink where the file system can):
        none of them pass through this process's memory."""
        try:
            return os.copy_file_range(src_fd, dst_fd, count, offset, offset)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
        data = os.pread(src_fd, min(count, 8 << 20), offset)
        return self.pwrite(dst_fd, data, offset) if data else 0

    def mmap(self, fd: int, length: int) -> mmap.mmap:
        return mmap.mmap(fd, length, access=mmap.ACCESS_READ)

    def fsync_path(self, path: str) -> None:
        """Make a finished file's contents durable (a file written without fsync)."""
        fd = os.open(path, os.O_RDONLY)
        try:
            self.fsync(fd)
        finally:
            os.close(fd)

    def fsync_dir(self, path: str) -> None:
        """Make the directory's entries (creations, renames, removals) durable."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self.fsync(fd)
        finally:
            os.close(fd)

    # -- composed from the operations above ----------------------------------------------
    def make_dirs(self, path: str, mode: int = 0o777, durable: bool = True) -> None:
        """Create the directory ``path`` and its missing parents (``mode``). ``durable``:
        each new level's entry is fsync'd in its parent as it is made, and ``path``'s
        even when it was there already (made just before, unsynced), so that files made
        durable in ``path`` survive power loss with it (``os.makedirs`` fsyncs nothing)."""
        path = os.path.abspath(path)
        missing, level = [], path
        while not os.path.isdir(level):
            missing.append(level)
            if os.path.dirname(level) == level:
                break
            level = os.path.dirname(level)
        for d in reversed(missing):
            try:
                self.mkdir(d, mode)
            except FileExistsError:   # made meanwhile by another writer: fine
                if not os.path.isdir(d):
                    raise
            if durable:
                self.fsync_dir(os.path.dirname(d))
        if durable and not missing:
            self.fsync_dir(os.path.dirname(path))

    def write_all(self, fd: int, data, offset: int) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            n = self.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n

    def start_writeback(self, fd: int, offset: int, count: int) -> None:
        """Have the kernel start writing ``[offset, offset + count)`` back now, without
        waiting: the fsync that follows finds less to write. A hint; nothing is durable
        until that fsync."""
        if _sync_file_range is not None:
            _sync_file_range(fd, offset, count, _SYNC_FILE_RANGE_WRITE)

    def copy_file(self, src: str, dst: str, mode: int = 0o666) -> int:
        """Copy ``src`` into a new file ``dst`` (which must not exist), fsync'd; returns
        the bytes written. Holes of ``src`` (a page file's alignment gaps) stay holes,
        and write-back starts chunk by chunk while the copy goes on, as RocksDB's
        ``bytes_per_sync`` does, so that the final fsync waits on one chunk, not on all.
        A partial copy is removed."""
        src_fd = os.open(src, os.O_RDONLY)
        try:
            size = os.fstat(src_fd).st_size
            fd = self.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            try:
                written = end = 0
                for start, end in data_ranges(src_fd, size):
                    done = start
                    while done < end:
                        n = self.copy_range(src_fd, fd, min(end - done, COPY_CHUNK), done)
                        if n <= 0:
                            raise OSError(errno.EIO, f"{src!r} ended at {done} of {size} bytes")
                        self.start_writeback(fd, done, n)
                        done += n
                    written += end - start
                if end < size:   # a trailing hole
                    os.ftruncate(fd, size)
                self.fsync(fd)
            except BaseException:
                self.close(fd)
                self.unlink_quietly(dst)
                raise
            self.close(fd)
            return written
        finally:
            os.close(src_fd)

    def unlink_quietly(self, path: str) -> None:
        try:
            self.unlink(path)
        except OSError:
            pass   # gone already, or the disk refuses: nothing of it is visible either way

    def write_file(self, path: str, data, mode: int = 0o666) -> None:
        """Create ``path`` (which must not exist) with ``data``, fsync'd."""
        fd = self.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            self.write_all(fd, data, 0)
            self.fsync(fd)
        except BaseException:
            self.close(fd)
            self.unlink_quietly(path)
            raise
        self.close(fd)


_disk = DiskIO()


def disk() -> DiskIO:
    """The disk operations in force."""
    return _disk


@contextlib.contextmanager
def using(io: DiskIO):
    """Run the block with ``io`` in force (tests: fault injection, power loss)."""
    global _disk
    previous, _disk = _disk, io
    try:
        yield io
    finally:
        _disk = previous
