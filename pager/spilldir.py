"""SpillDirectory: one private directory per engine under a spill root.

The root is the argument, else ``$ARRANGEDB_SPILL_DIR``, else the system temp dir. A
missing root is created with its parents (0700), as DuckDB's ``temp_directory`` and
Spark's ``spark.local.dir`` are; one that is a file or cannot be written fails when the
engine starts, not at the first spill. Each engine gets ``<root>/arrangedb-<pid>-<random>`` (0700, files 0600) with
an ``owner`` file holding the process id and its start time, which the engine holds
``flock``'d while it lives. At the next start, a directory is removed when its owner
file's lock is free and its pid is dead (or was reused by a process started at another
time). The lock is what keeps a live engine's directory when the pid cannot tell: an
engine in another PID namespace (a container sharing the spill root) has a pid that
means nothing here. Two engines in one or two processes never share a directory.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import itertools
import os
import secrets
import shutil
import tempfile
import weakref

import psutil

from arrangedb.pager.diskio import disk
from arrangedb.pager.errors import SpillError

PREFIX = "arrangedb-"
OWNER_FILE = "owner"
ENV_VAR = "ARRANGEDB_SPILL_DIR"


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def remove_stale(root: str) -> list[str]:
    """Remove spill directories under ``root`` whose owning process is gone."""
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    uid = os.getuid()
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != uid:
                continue
            fd = os.open(os.path.join(entry.path, OWNER_FILE), os.O_RDONLY)
        except OSError:
            continue   # not ours to judge (half-created, foreign, or racing its owner)
        try:
            if _dead(fd):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
        finally:
            os.close(fd)
    return removed


def _dead(owner_fd: int) -> bool:
    """Whether the owner of a spill directory is gone: its lock free, and its pid dead
    or reused (a directory made by an arrangedb that took no lock is judged by pid)."""
    try:
        fcntl.flock(owner_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False   # held: the owner lives, in whatever PID namespace
    try:
        pid_text, started_text = os.read(owner_fd, 256).decode().split()
        pid, started = int(pid_text), float(started_text)
    except (OSError, ValueError, UnicodeDecodeError):
        return False   # being written by its owner, or not ours
    alive = _start_time(pid)
    return alive is None or abs(alive - started) > 1.0


def _close_and_remove(path: str, owner_fd: int) -> None:
    """Remove the directory, then let its lock go."""
    shutil.rmtree(path, ignore_errors=True)
    if owner_fd >= 0:
        try:
            os.close(owner_fd)
        except OSError:
            pass


class SpillDirectory:
    """A private directory for one engine's page files."""

    def __init__(self, root: str | os.PathLike | None = None):
        root = os.fspath(root) if root is not None else (
            os.environ.get(ENV_VAR) or tempfile.gettempdir())
        self.root = os.path.abspath(root)
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise SpillError(errno.ENOTDIR,
                             f"spill directory root {self.root!r} is not a directory "
                             f"(set spill_dir= or {ENV_VAR})")
        try:
            # 0700 each (os.makedirs gives the parents the umask's mode); a spill
            # directory outlives no crash, so nothing is fsync'd
            disk().make_dirs(self.root, 0o700, durable=False)
        except OSError as e:
            raise SpillError(e.errno, f"spill directory root {self.root!r} cannot be created: "
                                      f"{e.strerror} (set spill_dir= or {ENV_VAR})") from e
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise SpillError(errno.EACCES,
                             f"spill directory root {self.root!r} is not writable by this user")
        remove_stale(self.root)
        pid = os.getpid()
        path = os.path.join(self.root, f"{PREFIX}{pid}-{secrets.token_hex(4)}")
        fd = -1
        try:
            os.mkdir(path, 0o700)
            fd = os.open(os.path.join(path, OWNER_FILE), os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                         0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)   # held while the engine lives (module notes)
            os.write(fd, f"{pid} {_start_time(pid) or 0.0}\n".encode())
        except OSError as e:
            _close_and_remove(path, fd)
            raise SpillError(e.errno, f"cannot create a spill directory under {self.root!r}: "
                                      f"{e.strerror}") from e
        self.path = path
        self.bytes_written = 0
        self._names = itertools.count()
        self._closed = False
        self._finalizer = weakref.finalize(self, _close_and_remove, path, fd)
        atexit.register(self._finalizer)

    def new_path(self, hint: str = "batch") -> str:
        if self._closed:
            raise SpillError(errno.EBADF, f"spill directory {self.path!r} is closed")
        return os.path.join(self.path, f"{hint}-{next(self._names):06d}.pg")

    @property
    def bytes_on_disk(self) -> int:
        total = 0
        try:
            for entry in os.scandir(self.path):
                if entry.name.endswith(".pg"):
                    total += entry.stat().st_blocks * 512   # allocated: holes are free
        except OSError:
            pass
        return total

    def close(self) -> None:
        """Remove the directory and everything in it (idempotent; also runs at exit)."""
        self._closed = True
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"SpillDirectory({self.path!r})"
