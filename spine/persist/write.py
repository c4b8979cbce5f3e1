"""Writing checkpoints: a version's new page files, its manifest, and retention.

A checkpoint writes only the batches the directory does not hold yet; a merged batch
inherits its inputs' files while they hold at most ``REWRITE_RATIO`` times its stored
bytes and number at most ``MAX_INHERITED`` (:func:`inherit`). Order of writes: page
files, each fsync'd; the directory fsync'd; the manifest under a temporary name,
fsync'd, renamed, the directory fsync'd. Retention keeps the newest ``retain`` versions
and deletes a page file only when no retained manifest names it, no live lease holds it
and the writer's own trace does not read it. See :mod:`arrangedb.spine.persist`.
"""

from __future__ import annotations

import datetime
import errno
import os
import secrets
from dataclasses import dataclass, field


from arrangedb.pager import ManifestError, PageWriter
from arrangedb.pager.diskio import disk
from arrangedb.pager.dirlock import DirectoryLock
from arrangedb.pager.leases import Lease, leased
from arrangedb.spine.storage.batch import Batch
from arrangedb.spine.data.description import Description
from arrangedb.spine.storage.encode import write_part
from arrangedb.spine.persist.manifest import (CheckpointConflict, FORMAT, FORMAT_VERSION,
                                              LEGACY_MANIFEST, PAGE_SUFFIX, encode_entry,
                                              encode_manifest, is_page_file, is_temporary,
                                              list_versions, manifest_name, read_manifest,
                                              schema_b64, schemas, schemas_of, table_b64)

REWRITE_RATIO = 2.0


MAX_INHERITED = 16


def _entry(parts, directory_crc: int, d: Description, name: str, size: int) -> dict:
    return {
        "file": name, "size": size, "directory_crc": directory_crc,
        "description": [d.lower, d.upper, d.since],
        "parts": [{
            "num_updates": p.num_updates, "num_keys": p.num_keys,
            "payload": p.payload, "stored": p.stored,
            "first_key": table_b64(p.first_key), "last_key": table_b64(p.last_key),
            "columns": p.columns,
        } for p in parts],
    }


def _write_resident(batch: Batch, target: str, codec: str) -> tuple[dict, int]:
    """Encode a batch held in memory into the page file ``target`` (fsync'd); its manifest
    entry and the bytes written. The batch itself stays as it is: a reader may be
    walking it."""
    writer = PageWriter(None, path=target, mode=0o666, durable=True)
    try:
        parts = [write_part(writer, i, p.layout(), codec, (batch.key_schema, batch.val_schema))
                 for i, p in enumerate(batch.parts)]
        pagefile = writer.finish()
    except BaseException:
        writer.abort()
        raise
    try:
        return (_entry(parts, pagefile.directory_crc, batch.description,
                       os.path.basename(target), pagefile.size), writer.bytes_written)
    finally:
        pagefile.close()


def _staged_in(batch: Batch, path: str) -> bool:
    """Whether ``batch``'s page file is in the directory ``path`` already (an insert
    staged it there: :meth:`CheckpointState.stage_writer`), so that a checkpoint names
    it where it is. Not one whose fsync failed: it is copied to a new file instead."""
    return (batch.pagefile is not None and os.path.dirname(batch.pagefile.path) == path
            and not batch.pagefile.sync_failed)


def updates_in(entries: list[dict]) -> int:
    return sum(p["num_updates"] for e in entries for p in e["parts"])


# -- what a trace knows of its checkpoint directory -----------------------------------------


def _new_token() -> str:
    """The random part of a writer's file names: 64 bits, so that no two writers of a
    directory ever pick the same names."""
    return secrets.token_hex(8)


@dataclass
class CheckpointState:
    """A trace's tie to its checkpoint directory: the version it continues, the writer
    role (once it checkpoints), the lease on the files it reads."""

    path: str
    version: int
    lock: DirectoryLock | None = None
    lease: Lease | None = None
    read_files: set = field(default_factory=set)   # files of ``path`` the trace maps
    files: dict = field(default_factory=dict)      # version -> its files, as far as known
    manifest: tuple | None = None   # (stat identity, checksum) of ``version``'s manifest
    held: list = field(default_factory=list)       # leases on directories left behind
    entry_json: dict = field(default_factory=dict)  # file -> its entry, encoded
    staged: int = 0   # page files inserts wrote into ``path`` (:meth:`stage_writer`)
    token: str = field(default_factory=_new_token)

    def stage_writer(self) -> PageWriter:
        """A page writer for a run an insert writes while this trace is the directory's
        writer: straight into the directory (the umask's permissions, write-back started)
        under a name no manifest uses yet. The next checkpoint fsyncs and names the file
        where it is instead of copying it; until then retention keeps it (``read_files``)
        and the batch deletes it when it goes. A killed writer's staged files are
        collected by the next writer's retention, as any file no version names."""
        self.staged += 1
        name = f"batch-{self.token}-i{self.staged:05d}{PAGE_SUFFIX}"
        self.read_files.add(name)
        return PageWriter(None, path=os.path.join(self.path, name), mode=0o666,
                          writeback=True)

    def remember_manifest(self, checksum: int) -> None:
        mpath = os.path.join(self.path, manifest_name(self.version))
        self.manifest = (identity(mpath), checksum)

    def close(self) -> None:
        for lease in self.held:
            lease.release()
        self.held = []
        if self.lease is not None:
            self.lease.release()
            self.lease = None
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def identity(path: str) -> tuple:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def _same_manifest(path: str, state: CheckpointState) -> bool:
    """Whether the directory's manifest of ``state.version`` is still the one the trace
    loaded or wrote (not a directory replaced by another history)."""
    if state.manifest is None:
        return True
    mpath = os.path.join(path, manifest_name(state.version))
    try:
        if identity(mpath) == state.manifest[0]:
            return True
        return read_manifest(path, state.version)["checksum"] == state.manifest[1]
    except (OSError, ManifestError):
        return False


def inherit(result: Batch, inputs: list[Batch]) -> None:
    """A merge's output keeps its inputs' checkpoint files while they are a fair stand-in
    for it (module docstring); else the next checkpoint writes it."""
    if not inputs or any(b.checkpointed is None for b in inputs):
        return
    dirs = {b.checkpointed[0] for b in inputs}
    if len(dirs) != 1:
        return
    entries = [e for b in inputs for e in b.checkpointed[1]]
    files_bytes = sum(e["size"] for e in entries)
    if len(entries) <= MAX_INHERITED and files_bytes <= REWRITE_RATIO * max(
            result.stored_bytes, 1):
        result.checkpointed = (dirs.pop(), entries)


# -- writing a version ------------------------------------------------------------------------


def checkpoint(trace, path, retain: int = 10, release_writer: bool = False) -> int:
    """Write the next version of ``trace`` into ``path``; returns its number (see the
    module docstring). The caller holds the trace's write lock."""
    if not isinstance(retain, int) or retain < 1:
        raise ValueError(f"retain must be a positive int, not {retain!r}")
    state = trace._checkpoint
    if path is None:
        if state is None:
            raise ValueError("checkpoint() needs a path: this trace was neither loaded from "
                             "nor checkpointed to a directory")
        path = state.path
    path = os.path.abspath(os.fspath(path))
    same = state is not None and state.path == path
    if os.path.exists(os.path.join(path, LEGACY_MANIFEST)):
        raise CheckpointConflict(f"{path!r} holds a trace saved by an older arrangedb "
                                 f"(manifest.json): load it and checkpoint elsewhere")
    if not same or not os.path.isdir(path):
        # its entry made durable too (each level made): a version reported written must
        # not vanish with a directory entry power loss took back
        disk().make_dirs(path)
    held = same and state.lock is not None
    lock = state.lock if held else DirectoryLock(path)
    if not held:
        lock.acquire()   # DirectoryLocked names the other writer
    try:
        version, known, checksum, texts = _write_version(trace, path,
                                                          state if same else None)
    except BaseException:
        if not held:
            lock.release()
        raise
    if same:
        state.version = version
        state.lock = lock
    else:
        held = []
        if state is not None:   # its files are still read: the lease on them stays
            held = state.held + ([state.lease] if state.lease is not None else [])
            if state.read_files and os.path.isdir(state.path):
                try:   # the files it staged there too, which no lease named
                    held.append(Lease(state.path, state.read_files))
                except OSError:
                    pass   # the version is durable: a retention there may take them
            state.lease, state.held = None, []
            state.close()
        trace._checkpoint = state = CheckpointState(path, version, lock, files=known,
                                                    held=held)
    state.entry_json = texts
    state.remember_manifest(checksum)
    try:   # the version is durable and the trace knows it: whatever happens here
        _retain(path, version, retain, state, state.files)
    except (OSError, ValueError):
        pass   # what retention left, the next checkpoint collects
    finally:
        if release_writer:
            state.lock.release()
            state.lock = None
    return version


def _write_version(trace, path: str, state: CheckpointState | None
                   ) -> tuple[int, dict, int, dict]:
    """Write the next version; returns it, the files of each version known, its
    manifest's checksum and its entries encoded (per file). Retention is the caller's,
    once the trace has taken the version as its own."""
    versions = list_versions(path)
    base = state.version if state is not None else 0
    latest = versions[-1] if versions else 0
    if latest != base:
        # (a trace continuing ``latest`` was loaded from it or wrote it: same schema)
        if base == 0 and schemas(read_manifest(path, latest)) != schemas_of(trace):
            raise CheckpointConflict(f"{path!r} holds a trace of another schema "
                                     f"(version {latest})")
        raise CheckpointConflict(
            f"{path!r} is at version {latest}, but this trace continues version {base}: "
            f"it would fork the history (load version {latest} to continue it, or "
            f"checkpoint into another directory)")
    elif latest and not _same_manifest(path, state):
        try:
            other = schemas(read_manifest(path, latest)) != schemas_of(trace)
        except (OSError, ManifestError):
            other = False
        raise CheckpointConflict(
            f"{path!r}: version {latest} is not the one this trace continues (the "
            f"directory was replaced{', by a trace of another schema' if other else ''})")
    io = disk()
    _remove_temporaries(path)
    batches = trace.batches()
    token = _new_token()
    written, entries, marks, new_bytes = [], [], [], 0
    try:
        for i, batch in enumerate(batches):
            if batch.checkpointed is not None and batch.checkpointed[0] == path:
                entries += batch.checkpointed[1]
                continue
            pf = batch.pagefile
            if _staged_in(batch, path):   # by an insert: made durable where it is
                try:
                    io.fsync_path(pf.path)
                except OSError:
                    pf.sync_failed = True   # never trusted to a manifest: copied next time
                    raise
                entry = _entry(batch.parts, pf.directory_crc, batch.description,
                               os.path.basename(pf.path), pf.size)
                size = pf.data_bytes
            else:
                name = f"batch-{token}-{i:05d}{PAGE_SUFFIX}"
                target = os.path.join(path, name)
                if os.path.lexists(target):   # never over, nor (failing) removing, a file
                    raise FileExistsError(errno.EEXIST, "a checkpoint's new page file "
                                          "exists already", target)
                if pf is not None:   # its spill file, copied in the kernel
                    size = io.copy_file(pf.path, target)
                    entry = _entry(batch.parts, pf.directory_crc, batch.description, name,
                                   pf.size)
                else:   # held in memory (a resident insert): encoded into the directory
                    entry, size = _write_resident(batch, target, trace.ctx.codec)
                written.append(target)   # made whole by this checkpoint: removed on failure
            entry["written"] = size
            new_bytes += size
            entries.append(entry)
            marks.append((batch, entry))
        io.fsync_dir(path)   # the page files' entries, before a manifest names them
        version = (versions[-1] if versions else 0) + 1
        c = trace.columns
        manifest = {
            "format": FORMAT, "version": FORMAT_VERSION, "checkpoint": version,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "name": trace.name, "key_schema": schema_b64(trace.key_schema),
            "val_schema": schema_b64(trace.val_schema),
            "columns": {"key": c.key, "vals": c.vals, "time": c.time, "diff": c.diff},
            "since": trace.since, "updates": updates_in(entries),
            "bytes": sum(e.get("written", e["size"]) for e in entries), "new_bytes": new_bytes,
            "batches": entries,
        }
        final = os.path.join(path, manifest_name(version))
        tmp = f"{final}.{token}.tmp"
        written.append(tmp)
        cached = state.entry_json if state is not None else {}
        texts = {e["file"]: cached.get(e["file"]) or encode_entry(e) for e in entries}
        data, checksum = encode_manifest(manifest, [texts[e["file"]] for e in entries])
        io.write_file(tmp, data)
        io.rename(tmp, final)
        written[-1] = final   # not durable until the directory is: a failure takes it back
        io.fsync_dir(path)
    except BaseException:
        for f in written:
            io.unlink_quietly(f)
        raise
    for batch, entry in marks:
        if _staged_in(batch, path):
            batch.keep_file()   # named by a manifest now: retention decides its end
        batch.checkpointed = (path, [entry])
    files = {e["file"] for e in entries}
    if state is not None:
        state.files[version] = files
    known = state.files if state is not None else {version: files}
    return version, known, checksum, texts


def _remove_temporaries(path: str) -> None:
    """Temporary files of a checkpoint that died before its rename (by their names: a
    directory may hold other files, which are never touched)."""
    for name in os.listdir(path):
        if is_temporary(name):
            disk().unlink_quietly(os.path.join(path, name))


def _retain(path: str, newest: int, retain: int, state: CheckpointState | None,
            known: dict) -> None:
    """Drop versions older than the newest ``retain``, then every page file nothing
    needs. Manifests go first: a reader checks its version's manifest after taking its
    lease, so a file is never collected under a reader that found it named."""
    io = disk()
    versions = list_versions(path)
    removed = False
    for v in versions:
        if v <= newest - retain:
            io.unlink_quietly(os.path.join(path, manifest_name(v)))
            removed = True
    if removed:   # the manifests' removal durable before the files they name go: power
        io.fsync_dir(path)   # loss never brings back a version whose files are gone
        removed = False
    kept = [v for v in versions if v > newest - retain]
    needed = set(leased(path))   # (a live lease that cannot be read: ValueError, nothing goes)
    if state is not None:
        needed |= state.read_files
    for v in kept:
        if v not in known:   # a version this trace neither wrote nor loaded
            try:
                known[v] = {e["file"] for e in read_manifest(path, v)["batches"]}
            except (ManifestError, FileNotFoundError):
                return   # a damaged retained version: collect nothing rather than guess
        needed |= known[v]
    for v in [v for v in known if v not in kept]:
        del known[v]
    for name in os.listdir(path):
        if is_page_file(name) and name not in needed:
            io.unlink_quietly(os.path.join(path, name))
            removed = True
    if removed:
        io.fsync_dir(path)


# -- reading a version ------------------------------------------------------------------------
