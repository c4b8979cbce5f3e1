"""Leases: which files of a shared directory a live reader still maps.

A process that reads files of a checkpoint directory holds a lease on them: a file in
``<dir>/leases/`` listing their names, on which it holds a shared ``flock`` for as long
as it reads them. A writer that deletes files (retention) first asks :func:`leased`,
which skips every lease whose lock it can take -- its holder is gone (closed, exited,
SIGKILLed: the kernel dropped the lock) -- and removes such leases.

A lease is written under a temporary name, locked, and only then renamed to
``*.lease``: a writer never sees a lease that is not locked yet.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import time

LEASES = "leases"
_SUFFIX = ".lease"
_STALE_TMP = 60.0   # seconds: a lease is renamed in microseconds after its creation


class Lease:
    """A live reader's hold on ``files`` (names relative to ``directory``)."""

    def __init__(self, directory: str, files):
        folder = os.path.join(directory, LEASES)
        os.makedirs(folder, exist_ok=True)
        name = f"{os.getpid()}-{secrets.token_hex(4)}"
        tmp = os.path.join(folder, name + ".tmp")
        self.path = os.path.join(folder, name + _SUFFIX)
        self._fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_SH)
            os.write(self._fd, json.dumps(sorted(files)).encode())
            os.rename(tmp, self.path)
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            _unlink(tmp)
            raise

    def release(self) -> None:
        if self._fd >= 0:
            _unlink(self.path)
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass


def leased(directory: str) -> set[str]:
    """The files live leases hold; leases of dead holders are removed."""
    folder = os.path.join(directory, LEASES)
    try:
        entries = os.listdir(folder)
    except FileNotFoundError:
        return set()
    names = [n for n in entries if n.endswith(_SUFFIX)]
    for n in entries:   # a reader killed before its lease was renamed in: long gone
        path = os.path.join(folder, n)
        try:
            if n.endswith(".tmp") and time.time() - os.path.getmtime(path) > _STALE_TMP:
                _unlink(path)
        except OSError:
            pass
    held: set[str] = set()
    for name in names:
        path = os.path.join(folder, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue   # released meanwhile
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                held.update(json.loads(os.pread(fd, 1 << 24, 0) or b"[]"))   # alive
            else:
                _unlink(path)   # its holder is gone
        finally:
            os.close(fd)
    return held


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
