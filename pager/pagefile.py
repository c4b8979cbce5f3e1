"""Page files: append-only files of 64-byte-aligned regions, written once, read by mmap.

Format (version 3)
------------------
::

    [0, 64)      header: magic "ARNGDBPG", u32 version, u32 flags, u64 directory offset,
                 u64 directory length, u32 directory crc32, padding, u32 header crc32
    [64, ...)    regions, each starting at a multiple of 64 (regions of 64 KiB and more
                 at a multiple of the page size, of 1 MiB and more at a multiple of 1 MiB)
    [dir, end)   directory: JSON, one entry per region (name, offset, length, checksum,
                 codec, codec_version, meta)

A writer streams regions into ``<name>.tmp`` as they come (nothing is buffered beyond the
region being written), then writes the directory and the header and renames the file
into place: a reader never sees a half-written file. A region's checksum (XXH3-64,
:mod:`arrangedb.pager.checksum`, faster than the read itself) is checked before any
decoder sees its bytes: the first time a :class:`PageFile` maps the region, and again
after the budget dropped its pages under memory pressure, when they come back from the
file. Version 2 files (``wsum64`` checksums) still read.

Files are created with ``O_EXCL`` under names no other writer uses, and never written
again once finished: nothing ever truncates or rewrites a file a reader may map.
Disk operations go through :mod:`arrangedb.pager.diskio`, where tests inject faults.

Residency
---------
A mapped region's pages count against the budget while a reader uses them:
:meth:`PageFile.buffer` charges the region's length, :meth:`PageFile.release` gives the
region's pages back to the kernel (``MADV_DONTNEED`` -- clean file pages, so they simply
refault from the file if touched again) and uncharges. Regions still charged when the
budget runs short are released least-recently-mapped first by the budget's mapped-regions
spiller.

A fault maps more than the page asked for: fault-around and large page-cache folios map
whole aligned neighbourhoods (a megabyte for one touched byte on this machine's kernel),
so reading a region can leave pages of its unread neighbours mapped and uncharged.
Releasing a wide window around every region would drop pages the next sequential read
is about to use; instead, release is exact and the spiller, when the budget asks,
sweeps the page files released since its last call, dropping every page outside the
regions still in use.
"""

from __future__ import annotations

import errno
import itertools
import json
import mmap
import os
import struct
import threading
import weakref
import zlib
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from arrangedb.pager.checksum import checksum64, wsum64
from arrangedb.pager.diskio import disk
from arrangedb.pager.errors import PageFileError, SpillError
from arrangedb.pager.extents import occupied_bytes, written_bytes
from arrangedb.pager.mapped_regions import MappedRegions
from arrangedb.pager.sizes import format_size

MAGIC = b"ARNGDBPG"
VERSION = 3   # 3: region checksums are XXH3-64 (2: wsum64, still read; 1 had crc32)
_CHECKSUMS = {2: wsum64, 3: checksum64}
ALIGN = 64
HEADER = struct.Struct("<8sIIQQI")   # magic, version, flags, dir offset, dir length, dir crc
HEADER_SIZE = 64
PAGE = mmap.PAGESIZE
PAGE_ALIGN_FROM = 64 << 10   # regions this large start on a page: released exactly, alone
FOLIO = 1 << 20              # and from a folio's size up, on a folio (see add_region)
_ZEROS = bytes(ALIGN)
_PAGEFILE_KEYS = itertools.count()   # ids can be reused once a PageFile is collected


@dataclass(frozen=True)
class RegionInfo:
    name: str
    offset: int
    length: int
    checksum: int
    codec: str = "plain"
    codec_version: int = 1
    meta: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"name": self.name, "offset": self.offset, "length": self.length,
                "checksum": self.checksum, "codec": self.codec,
                "codec_version": self.codec_version, "meta": self.meta}


def _as_bytes(data) -> memoryview:
    if isinstance(data, pa.Buffer):
        return memoryview(data)
    if isinstance(data, np.ndarray):
        # via a uint8 view: the buffer protocol refuses datetime64/timedelta64 dtypes
        return memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
    return memoryview(data).cast("B")


def _align(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) & ~(to - 1)


def _page_span(offset: int, length: int) -> tuple[int, int]:
    return offset // PAGE * PAGE, _align(offset + length, PAGE)


class PageWriter:
    """Streams regions into a new page file; ``finish()`` makes it visible atomically.

    ``mode``: permission bits before the umask -- 0600 for private spill files, 0666
    for files meant to be shared (saved traces). ``durable``: ``finish`` fsyncs the file
    before it is renamed into place (the caller fsyncs the directory)."""

    def __init__(self, spill, name_hint: str = "batch", path: str | None = None,
                 mode: int = 0o600, durable: bool = False, writeback: bool = False):
        self.spill = spill
        self._writeback = writeback   # not durable, but start writing it back at finish
        self.path = path or spill.new_path(name_hint)
        self._tmp = self.path + ".tmp"
        self.regions: dict[str, RegionInfo] = {}
        self._durable = durable
        self._fd = -1
        self._done = True   # until the file exists: nothing to abort
        try:
            self._fd = disk().open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except OSError as e:
            raise self._spill_error(e, 0) from e
        self._pos = HEADER_SIZE
        self._written = HEADER_SIZE   # what bytes_written reports: alignment gaps are holes
        self._done = False

    def _spill_error(self, e: OSError, size: int) -> SpillError:
        where = os.path.dirname(self.path)
        kind, hint = (("spill directory", "point spill_dir elsewhere") if self.spill is not None
                      else ("directory", "write elsewhere"))
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return SpillError(e.errno, f"{kind} {where!r} is full: could not write "
                                       f"{format_size(size)} more to {os.path.basename(self.path)}"
                                       f" (free space on that disk, or {hint})")
        return SpillError(e.errno, f"cannot write to {kind} {where!r}: {e.strerror}")

    def add_region(self, name: str, data, codec: str = "plain", codec_version: int = 1,
                   meta: dict | None = None) -> RegionInfo:
        if self._done:
            raise ValueError(f"page file {self.path!r} is already finished")
        if name in self.regions:
            raise ValueError(f"region {name!r} written twice to {self.path!r}")
        view = _as_bytes(data)
        length = view.nbytes
        if length >= PAGE_ALIGN_FROM:
            # A large region owns whole pages: releasing it never drops a neighbour's page
            # still being read. From FOLIO up it starts where the page cache's large
            # folios (naturally aligned) start, so its faults map none of a neighbour's
            # (~10% faster scans here). The skipped bytes are a hole: no disk, no cache.
            self._pos = _align(self._pos, FOLIO if length >= FOLIO else PAGE)
        try:
            disk().write_all(self._fd, view, self._pos)
        except OSError as e:
            self.abort()
            raise self._spill_error(e, length) from e
        # summed after the write: the kernel's copy just brought the bytes into cache
        info = RegionInfo(name, self._pos, length, checksum64(view), codec, codec_version,
                          meta or {})
        self.regions[name] = info
        self._pos = _align(self._pos + length)
        self._written += length
        return info

    def finish(self, budget=None) -> "PageFile":
        directory = json.dumps({"regions": [r.to_json() for r in self.regions.values()]},
                               separators=(",", ":")).encode()
        header = HEADER.pack(MAGIC, VERSION, 0, self._pos, len(directory), zlib.crc32(directory))
        header = header.ljust(HEADER_SIZE - 4, b"\0")
        header += struct.pack("<I", zlib.crc32(header))
        if self._done:
            raise ValueError(f"page file {self.path!r} is already finished")
        io = disk()
        try:
            io.write_all(self._fd, directory, self._pos)
            io.write_all(self._fd, header, 0)
            if self._durable:
                io.fsync(self._fd)
            elif self._writeback:
                io.start_writeback(self._fd, 0, 0)   # to the end: a later fsync waits less
            fd, self._fd = self._fd, -1
            io.close(fd)
            io.rename(self._tmp, self.path)
        except OSError as e:
            self.abort()
            raise self._spill_error(e, len(directory)) from e
        self._done = True
        self.bytes_written = self._written + len(directory)   # holes left out
        if self.spill is not None:
            self.spill.bytes_written += self.bytes_written
        try:
            return PageFile.open(self.path, budget=budget)
        except BaseException:
            disk().unlink_quietly(self.path)   # finished but never handed out: nobody reads it
            raise

    def abort(self) -> None:
        """Drop the unfinished file; nothing of it becomes visible."""
        if self._done and self._fd < 0:
            return
        self._done = True
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            try:
                disk().close(fd)
            except OSError:
                pass
        disk().unlink_quietly(self._tmp)

    def __del__(self):
        if not getattr(self, "_done", True):
            self.abort()


class PageFile:
    """A finished page file, mapped read-only; regions come out as zero-copy views."""

    def __init__(self, path: str, size: int, mm, regions: dict[str, RegionInfo], budget,
                 version: int = VERSION, directory_crc: int = 0):
        self.path = path
        self.size = size
        self.regions = regions
        self.version = version
        self.directory_crc = directory_crc   # identifies the file's contents (manifests)
        self.sync_failed = False   # an fsync failed: another proves nothing (reported once)
        self._checksum = _CHECKSUMS[version]
        self._mm = mm
        self._view = memoryview(mm) if mm is not None else memoryview(b"")
        self._verified: set[str] = set()
        self._mapped: dict[str, int] = {}   # regions touched since their last release
        self._mapped_regions = MappedRegions.of(budget) if budget is not None else None
        self._lock = threading.Lock()
        self._key = next(_PAGEFILE_KEYS)
        self._ref = weakref.ref(self)

    @property
    def data_bytes(self) -> int:   # header, regions, directory: the bytes written
        return written_bytes(self.size, self.regions.values(), HEADER_SIZE, ALIGN)

    @property
    def file_bytes(self) -> int:   # and the padding, not the holes: what ``du`` counts
        return occupied_bytes(self.size, self.regions.values(), HEADER_SIZE, PAGE)

    @classmethod
    def open(cls, path, budget=None) -> "PageFile":
        path = os.fspath(path)
        io = disk()
        try:
            fd = io.open(path, os.O_RDONLY)
        except OSError as e:
            raise PageFileError(f"cannot open page file {path!r}: {e.strerror}") from e
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                raise PageFileError(f"{path!r} is not a page file: {size} bytes is shorter "
                                    f"than the {HEADER_SIZE}-byte header (truncated?)")
            header = os.pread(fd, HEADER_SIZE, 0)
            magic, version, _flags, dir_off, dir_len, dir_crc = HEADER.unpack_from(header)
            if magic != MAGIC:
                raise PageFileError(f"{path!r} is not an arrangedb page file (bad magic "
                                    f"{magic!r})")
            (hcrc,) = struct.unpack_from("<I", header, HEADER_SIZE - 4)
            if zlib.crc32(header[: HEADER_SIZE - 4]) != hcrc:
                raise PageFileError(f"page file {path!r}: header checksum mismatch (corrupt)")
            if version not in _CHECKSUMS:
                raise PageFileError(f"page file {path!r} has format version {version}; this "
                                    f"arrangedb reads version {VERSION} (and older ones from {min(_CHECKSUMS)})")
            if dir_off + dir_len > size:
                raise PageFileError(f"page file {path!r} is truncated: directory ends at "
                                    f"{dir_off + dir_len} but the file has {size} bytes")
            directory = os.pread(fd, dir_len, dir_off)
            if zlib.crc32(directory) != dir_crc:
                raise PageFileError(f"page file {path!r}: directory checksum mismatch (corrupt)")
            regions = {}
            try:
                entries = json.loads(directory)["regions"]
                for r in entries:
                    info = RegionInfo(**r)
                    regions[info.name] = info
            except (ValueError, KeyError, TypeError) as e:
                raise PageFileError(f"page file {path!r}: unreadable directory ({e})") from e
            for info in regions.values():
                if info.offset < HEADER_SIZE or info.offset + info.length > dir_off:
                    raise PageFileError(f"page file {path!r}, region {info.name!r}: lies "
                                        f"outside the data section (corrupt)")
            try:
                mm = io.mmap(fd, 0) if size else None
            except (OSError, ValueError) as e:
                raise PageFileError(f"cannot map page file {path!r}: {e}") from e
        finally:
            os.close(fd)
        return cls(path, size, mm, regions, budget, version, dir_crc)

    def _region(self, name: str) -> RegionInfo:
        try:
            return self.regions[name]
        except KeyError:
            raise PageFileError(f"page file {self.path!r} has no region {name!r}") from None

    def buffer(self, name: str) -> memoryview:
        """Zero-copy view of a region, charged to the budget as mapped; its checksum is verified on
        its first map and after memory pressure dropped its pages (see the module)."""
        info = self._region(name)
        if self._mm is None or self._mm.closed:
            raise PageFileError(f"page file {self.path!r} is closed")
        view = self._view[info.offset: info.offset + info.length]
        if name not in self._verified:
            if self._checksum(view) != info.checksum:
                raise PageFileError(f"page file {self.path!r}, region {name!r}: checksum "
                                    f"mismatch (corrupt page file)")
            self._verified.add(name)
        if name not in self._mapped and info.length:
            if self._mapped_regions is not None:
                self._mapped_regions.budget.reserve(info.length, "mapped pages")
                self._mapped_regions.regions[(self._key, name)] = (self._ref, info.length)
            with self._lock:
                self._mapped[name] = info.length
        return view

    def numpy(self, name: str, dtype) -> np.ndarray:
        return np.frombuffer(self.buffer(name), dtype=dtype)

    def arrow_buffer(self, name: str) -> pa.Buffer:
        return pa.py_buffer(self.buffer(name))

    def verify(self) -> dict[str, bool]:
        """Check every region's checksum without charging the budget (for inspect)."""
        out = {}
        for name, info in self.regions.items():
            view = self._view[info.offset: info.offset + info.length]
            out[name] = self._checksum(view) == info.checksum
            self._advise(*_page_span(info.offset, info.length))
        return out

    def _advise(self, start: int, end: int) -> None:
        """MADV_DONTNEED over [start, end), page-aligned by the caller."""
        if self._mm is None or self._mm.closed or end <= start:
            return
        try:
            self._mm.madvise(mmap.MADV_DONTNEED, start, min(end, self.size) - start)
        except (OSError, ValueError):
            pass   # advice only: a kernel refusing it leaves pages to the page cache

    def release(self, name: str | None = None, reverify: bool = False) -> int:
        """Give a region's (or every region's) pages back; return the bytes uncharged.
        ``reverify``: check the region's bytes again when next mapped (its pages may then
        come from the disk)."""
        if reverify and name is not None:
            self._verified.discard(name)
        return self.release_all([name] if name is not None else list(self._mapped))

    def release_all(self, names) -> int:
        """:meth:`release` of several regions at once: regions stored side by side (a
        part's columns) give their pages back in one madvise, and the budget is told
        once."""
        freed, spans = 0, []
        for n in names:
            with self._lock:
                length = self._mapped.pop(n, 0)
            if not length:
                continue
            info = self.regions[n]
            spans.append(_page_span(info.offset, info.length))
            if self._mapped_regions is not None:
                self._mapped_regions.regions.pop((self._key, n), None)
                freed += length
        spans.sort()
        start = end = None
        for lo, hi in spans:
            if start is not None and lo > end:
                self._advise(start, end)
                start = None
            if start is None:
                start, end = lo, hi
            end = max(end, hi)
        if start is not None:
            self._advise(start, end)
        if freed:
            self._mapped_regions.released.add(self)
            self._mapped_regions.budget.release(freed, "mapped pages")
        return freed

    def sweep(self) -> None:
        """Drop every mapped page outside the regions in use (fault-around leftovers)."""
        with self._lock:
            in_use = sorted(_page_span(self.regions[n].offset, self.regions[n].length)
                            for n in self._mapped)
        pos = 0
        for start, end in in_use + [(self.size, self.size)]:
            self._advise(pos, start)
            pos = max(pos, end)

    def close(self) -> None:
        self.release()
        if self._mm is not None and not self._mm.closed:
            try:
                self._view.release()
                self._mm.close()
            except BufferError:
                pass   # a caller still holds a view; the mapping goes with the last one

    def delete(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __repr__(self) -> str:
        return f"PageFile({self.path!r}, {len(self.regions)} regions, {format_size(self.size)})"
