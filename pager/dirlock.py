"""One writer per directory: an advisory lock file that names its holder.

``flock`` on ``<dir>/.arrangedb-writer`` -- held by an open file description, so two
engines of one process exclude each other as two processes do, and released by the
kernel when the holder dies (a SIGKILLed writer leaves no stale lock). The file names
the holder's process id and host so that the refused writer's error can say who it is.
Single-host: a lock on a shared network file system is not relied on.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time

from arrangedb.pager.errors import DirectoryLocked

LOCK_FILE = ".arrangedb-writer"
_RECORD = 128   # bytes of the holder's name record


class DirectoryLock:
    """``with DirectoryLock(path):`` -- raises :class:`DirectoryLocked` when another
    writer holds ``path``."""

    def __init__(self, path: str, what: str = "writing"):
        self.path = os.fspath(path)
        self.what = what
        self._fd = -1

    def acquire(self) -> None:
        lock = os.path.join(self.path, LOCK_FILE)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_holder(fd)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DirectoryLocked(
                    errno.EBUSY, f"{self.path!r} is being written by another writer "
                                 f"({holder}); one writer at a time may use a directory "
                                 f"-- retry once it is done") from None
            raise
        self._fd = fd
        # a fixed-size record written over the last holder's: no truncation, and once
        # the file has its block, no new space needed (a full disk still takes a lock)
        name = f"pid {os.getpid()} on host {socket.gethostname()}"[:_RECORD - 1]
        try:
            os.pwrite(fd, name.ljust(_RECORD - 1).encode() + b"\n", 0)
        except OSError:
            pass   # the lock holds all the same; a refused writer reads "pid unknown"

    def release(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)   # closing the description drops the flock

    def __enter__(self) -> "DirectoryLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    """The holder's name; it writes it just after it takes the lock, so a writer refused
    in between waits a moment for it."""
    for _ in range(50):
        try:
            text = os.pread(fd, _RECORD, 0).decode(errors="replace").strip()
        except OSError:
            text = ""
        if text:
            return text
        time.sleep(0.01)
    return "pid unknown: it has not written its name"
