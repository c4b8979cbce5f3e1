"""Checkpoints: a trace made durable in a directory, version by version, differentially.

Design
------
A checkpoint directory holds immutable page files (one per batch) and one manifest per
version, ``manifest-<version>.json``: the key and val schemas, the roles of the columns,
the compaction frontier, and for every batch its description, its page file (name,
size, directory checksum) and its parts' directory (counts, byte sizes, first and last
key, the regions of each column). Batches are immutable, so a version shares every file
it can with the version before: a checkpoint writes only the batches the directory does
not hold yet, and a small manifest. Each batch in memory remembers which files of its
directory hold its updates (``Batch.checkpointed``); a merge of such batches inherits
their files (:func:`inherit`), so background merging does not turn the next small
checkpoint into a rewrite of the whole trace. The policy: a merged batch keeps
referencing its inputs' files while they hold at most ``REWRITE_RATIO`` times its own
stored bytes (retractions consolidated away make them larger) and number at most
``MAX_INHERITED`` files; past that, the next checkpoint writes it anew.

Loading maps the version's page files in place (no payload is decoded) and holds a
lease on them (:mod:`arrangedb.pager.leases`) while the trace is open.

Invariants
----------
- Order of writes: page files, each fsync'd; the directory fsync'd; the manifest under
  a temporary name, fsync'd, renamed, the directory fsync'd. A version exists once its
  manifest does; a crash at any instant leaves the last completed version (or the new
  one, if its rename reached the disk), never a mix. Leftovers are removed by the next
  writer (temporary files, and files no manifest names).
- One writer per directory (:class:`arrangedb.pager.dirlock.DirectoryLock`): a trace
  holds the writer role from its first checkpoint into a directory until it is closed.
  A trace checkpoints only on top of the version it was loaded from or last wrote; a
  trace of another schema, or one whose base the directory moved past, is refused.
- Retention keeps the newest ``retain`` versions. A page file is deleted only when no
  retained manifest names it, no live lease holds it, and the writer's own trace does
  not read it.
- Files are new files under names no earlier checkpoint used, created with ``O_EXCL``,
  never hard links to spill files: nothing ever truncates or rewrites a file a reader
  may map. They take the permissions the umask gives.
- Every manifest carries an XXH3-64 checksum of its canonical JSON and the identity of
  each page file it names: damage or swapped files are reported (``ManifestError``,
  ``PageFileError``) naming the file and the version.
- ``manifest.json`` (formats 1 and 2: one saved version, written before versions
  existed) still loads.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import os
import re
import secrets
from dataclasses import dataclass, field

import pyarrow as pa

from arrangedb.pager import ManifestError, PageFile, PageFileError, PageWriter
from arrangedb.pager.checksum import checksum64
from arrangedb.pager.diskio import disk
from arrangedb.pager.dirlock import LOCK_FILE, DirectoryLock
from arrangedb.pager.leases import LEASES, Lease, leased
from arrangedb.spine.storage.batch import Batch
from arrangedb.spine.data.description import Description
from arrangedb.spine.data.ingest import Columns
from arrangedb.spine.storage.paged import PagedPart
from arrangedb.spine.storage.encode import write_part

LEGACY_MANIFEST = "manifest.json"
FORMAT = "arrangedb-checkpoint"
FORMAT_VERSION = 3   # 3: one manifest per version (2: manifest.json with a checksum; 1: none)
REWRITE_RATIO = 2.0
MAX_INHERITED = 16
_MANIFEST = re.compile(r"^manifest-(\d{6,})\.json$")
_PAGE_SUFFIX = ".page"


class CheckpointConflict(RuntimeError):
    """The directory holds a history this trace does not continue (a fork, another
    schema), or versions where a first save was asked."""


def manifest_name(version: int) -> str:
    return f"manifest-{version:06d}.json"


def list_versions(path: str) -> list[int]:
    """Version numbers whose manifests exist in ``path``, ascending."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_MANIFEST.match, names) if m)


# -- the manifest ---------------------------------------------------------------------------

def _schema_b64(schema: pa.Schema | None) -> str | None:
    return None if schema is None else base64.b64encode(schema.serialize().to_pybytes()).decode()


def _schema_from(b64: str | None) -> pa.Schema | None:
    return None if b64 is None else pa.ipc.read_schema(pa.py_buffer(base64.b64decode(b64)))


def _table_b64(table: pa.Table) -> str:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return base64.b64encode(sink.getvalue().to_pybytes()).decode()


def _table_from(b64: str) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(base64.b64decode(b64))).read_all()


_CHECKSUM_FIELD = b',"checksum":'


def _canonical_checksum(manifest: dict) -> int:
    """Format 2: XXH3-64 of the canonical JSON (keys sorted) without the checksum."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return checksum64(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def _encode_manifest(manifest: dict) -> bytes:
    """Format 3: the manifest's JSON with ``"checksum"`` as its last member, the XXH3-64
    of every byte before that member (no re-serialization to check it)."""
    body = json.dumps(manifest, separators=(",", ":")).encode()
    head = body[:-1]   # all but the closing brace
    return head + _CHECKSUM_FIELD + str(checksum64(head)).encode() + b"}"


def _checksum_ok(raw: bytes, m: dict) -> bool:
    if m.get("version") == 2:
        return m["checksum"] == _canonical_checksum(m)
    # a JSON string cannot hold an unescaped quote: the last occurrence is the member
    at = raw.rfind(_CHECKSUM_FIELD)
    return at > 0 and m["checksum"] == checksum64(raw[:at])


def read_manifest(path: str, version: int | None = None) -> dict:
    """The manifest of ``version`` (None: the newest; a directory of the older single
    ``manifest.json`` has version 1), checked; ``ManifestError`` naming the file when it
    is damaged or of a format this version does not read."""
    path = os.fspath(path)
    versions = list_versions(path)
    if versions:
        if version is None:
            version = versions[-1]
        if version not in versions:
            raise FileNotFoundError(f"{path!r} holds no version {version} (versions: "
                                    f"{_span(versions)})")
        mpath = os.path.join(path, manifest_name(version))
    else:
        mpath = os.path.join(path, LEGACY_MANIFEST)
        if not os.path.exists(mpath):
            raise FileNotFoundError(f"{path!r} holds no checkpoint or saved trace "
                                    f"(no manifest-*.json, no {LEGACY_MANIFEST})")
        if version not in (None, 1):
            raise FileNotFoundError(f"{path!r} holds one saved version (1), not {version}")
    try:
        with open(mpath, "rb") as f:
            raw = f.read()
        m = json.loads(raw)
        if not isinstance(m, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise ManifestError(f"{mpath!r} is damaged: {e}") from e
    fmt = m.get("version")
    if m.get("format") not in (FORMAT, "arrangedb-trace"):
        raise ManifestError(f"{mpath!r} is not the manifest of a checkpoint")
    if fmt not in (1, 2, FORMAT_VERSION) or (fmt == 1) == ("checksum" in m):
        raise ManifestError(f"{mpath!r} has manifest format version {fmt!r}; this "
                            f"arrangedb reads versions 1 to {FORMAT_VERSION}")
    if fmt >= 2 and not _checksum_ok(raw, m):
        raise ManifestError(f"{mpath!r}: checksum mismatch (the manifest is damaged)")
    if fmt == FORMAT_VERSION and m.get("checkpoint") != version:
        raise ManifestError(f"{mpath!r} names version {m.get('checkpoint')!r}, not {version}")
    m["__path__"], m["__version__"] = mpath, version or 1
    return m


def _schemas(m: dict) -> tuple:
    return m["key_schema"], m["val_schema"]


def _schemas_of(trace) -> tuple:
    return _schema_b64(trace.key_schema), _schema_b64(trace.val_schema)


def _span(versions: list[int]) -> str:
    return f"{versions[0]}..{versions[-1]}" if versions else "none"


def _entry(parts, directory_crc: int, d: Description, name: str, size: int) -> dict:
    return {
        "file": name, "size": size, "directory_crc": directory_crc,
        "description": [d.lower, d.upper, d.since],
        "parts": [{
            "num_updates": p.num_updates, "num_keys": p.num_keys,
            "payload": p.payload, "stored": p.stored,
            "first_key": _table_b64(p.first_key), "last_key": _table_b64(p.last_key),
            "columns": p.columns,
        } for p in parts],
    }


def _write_resident(batch: Batch, target: str, codec: str) -> dict:
    """Encode a batch held in memory into the page file ``target`` (fsync'd); its manifest
    entry. The batch itself stays as it is: a reader may be walking it."""
    writer = PageWriter(None, path=target, mode=0o666, durable=True)
    try:
        parts = [write_part(writer, i, p.layout(), codec, (batch.key_schema, batch.val_schema))
                 for i, p in enumerate(batch.parts)]
        pagefile = writer.finish()
    except BaseException:
        writer.abort()
        raise
    try:
        return _entry(parts, pagefile.directory_crc, batch.description,
                      os.path.basename(target), pagefile.size)
    finally:
        pagefile.close()


def _updates(entries: list[dict]) -> int:
    return sum(p["num_updates"] for e in entries for p in e["parts"])


# -- what a trace knows of its checkpoint directory -----------------------------------------

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

    def remember_manifest(self) -> None:
        mpath = os.path.join(self.path, manifest_name(self.version))
        self.manifest = (_identity(mpath), read_manifest(self.path, self.version)["checksum"])

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


def _identity(path: str) -> tuple:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def _same_manifest(path: str, state: CheckpointState) -> bool:
    """Whether the directory's manifest of ``state.version`` is still the one the trace
    loaded or wrote (not a directory replaced by another history)."""
    if state.manifest is None:
        return True
    mpath = os.path.join(path, manifest_name(state.version))
    try:
        if _identity(mpath) == state.manifest[0]:
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
    os.makedirs(path, exist_ok=True)
    held = same and state.lock is not None
    lock = state.lock if held else DirectoryLock(path)
    if not held:
        lock.acquire()   # DirectoryLocked names the other writer
    try:
        version, known = _write_version(trace, path, state if same else None, retain)
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
            state.lease, state.held = None, []
            state.close()
        trace._checkpoint = state = CheckpointState(path, version, lock, files=known,
                                                    held=held)
    state.remember_manifest()
    if release_writer:
        state.lock.release()
        state.lock = None
    return version


def _write_version(trace, path: str, state: CheckpointState | None, retain: int
                   ) -> tuple[int, dict]:
    """Write the next version; returns it and the files of each retained version known."""
    versions = list_versions(path)
    base = state.version if state is not None else 0
    latest = versions[-1] if versions else 0
    if latest != base:
        # (a trace continuing ``latest`` was loaded from it or wrote it: same schema)
        if base == 0 and _schemas(read_manifest(path, latest)) != _schemas_of(trace):
            raise CheckpointConflict(f"{path!r} holds a trace of another schema "
                                     f"(version {latest})")
        raise CheckpointConflict(
            f"{path!r} is at version {latest}, but this trace continues version {base}: "
            f"it would fork the history (load version {latest} to continue it, or "
            f"checkpoint into another directory)")
    elif latest and not _same_manifest(path, state):
        try:
            other = _schemas(read_manifest(path, latest)) != _schemas_of(trace)
        except (OSError, ManifestError):
            other = False
        raise CheckpointConflict(
            f"{path!r}: version {latest} is not the one this trace continues (the "
            f"directory was replaced{', by a trace of another schema' if other else ''})")
    io = disk()
    _remove_temporaries(path)
    batches = trace.batches()
    token = secrets.token_hex(4)
    written, entries, marks, new_bytes = [], [], [], 0
    try:
        for i, batch in enumerate(batches):
            if batch.checkpointed is not None and batch.checkpointed[0] == path:
                entries += batch.checkpointed[1]
                continue
            name = f"batch-{token}-{i:05d}{_PAGE_SUFFIX}"
            target = os.path.join(path, name)
            written.append(target)
            if batch.pagefile is not None:   # its spill file, copied in the kernel
                size = io.copy_file(batch.pagefile.path, target)
                entry = _entry(batch.parts, batch.pagefile.directory_crc,
                               batch.description, name, size)
            else:   # held in memory (a resident insert): encoded into the directory
                entry = _write_resident(batch, target, trace.ctx.codec)
                size = entry["size"]
            new_bytes += size
            entries.append(entry)
            marks.append((batch, entry))
        io.fsync_dir(path)   # the page files' entries, before a manifest names them
        version = (versions[-1] if versions else 0) + 1
        c = trace.columns
        manifest = {
            "format": FORMAT, "version": FORMAT_VERSION, "checkpoint": version,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "name": trace.name, "key_schema": _schema_b64(trace.key_schema),
            "val_schema": _schema_b64(trace.val_schema),
            "columns": {"key": c.key, "vals": c.vals, "time": c.time, "diff": c.diff},
            "since": trace.since, "updates": _updates(entries),
            "bytes": sum(e["size"] for e in entries), "new_bytes": new_bytes,
            "batches": entries,
        }
        final = os.path.join(path, manifest_name(version))
        tmp = f"{final}.{token}.tmp"
        written.append(tmp)
        io.write_file(tmp, _encode_manifest(manifest))
        io.rename(tmp, final)
        written[-1] = final   # not durable until the directory is: a failure takes it back
        io.fsync_dir(path)
    except BaseException:
        for f in written:
            io.unlink_quietly(f)
        raise
    for batch, entry in marks:
        batch.checkpointed = (path, [entry])
    files = {e["file"] for e in entries}
    if state is not None:
        state.files[version] = files
    known = state.files if state is not None else {version: files}
    try:
        _retain(path, version, retain, state, known)
    except OSError:
        pass   # the version is durable; what retention left, the next checkpoint collects
    return version, known


def _remove_temporaries(path: str) -> None:
    """Temporary files of a checkpoint that died before its rename."""
    for name in os.listdir(path):
        if name.endswith(".tmp"):
            disk().unlink_quietly(os.path.join(path, name))


def _retain(path: str, newest: int, retain: int, state: CheckpointState | None,
            known: dict) -> None:
    """Drop versions older than the newest ``retain``, then every page file nothing
    needs. Manifests go first: a reader checks its version's manifest after taking its
    lease, so a file is never collected under a reader that found it named."""
    io = disk()
    versions = list_versions(path)
    for v in versions:
        if v <= newest - retain:
            io.unlink_quietly(os.path.join(path, manifest_name(v)))
    kept = [v for v in versions if v > newest - retain]
    needed = set(leased(path))
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
        if name.endswith(_PAGE_SUFFIX) and name not in needed:
            io.unlink_quietly(os.path.join(path, name))
    io.fsync_dir(path)


# -- reading a version ------------------------------------------------------------------------

def load(path, ctx, make_trace, version: int | None = None):
    """The trace of ``version`` (None: the newest) at ``path``, its page files mapped in
    place; ``make_trace(ctx, key_schema, val_schema, columns, name)`` makes the trace."""
    path = os.path.abspath(os.fspath(path))
    for _ in range(100):
        m = read_manifest(path, version)
        v = m["__version__"]
        legacy = not list_versions(path)
        files = {b["file"] for b in m["batches"]}
        lease = None
        if not legacy:
            try:
                lease = Lease(path, files)
            except OSError:
                pass   # a full or read-only directory: the mappings hold the files open
        try:
            trace = _trace_of(m, path, ctx, make_trace, legacy)
        except PageFileError:
            if lease is not None:
                lease.release()
            if version is None and not os.path.exists(m["__path__"]):
                continue   # collected under a lease-less load: take the newest again
            raise
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        # retention drops a manifest before it collects files: ours still there means
        # our lease was seen by any collection that could take our files
        if legacy or os.path.exists(m["__path__"]):
            break
        trace.close()
        if lease is not None:
            lease.release()
        if version is not None:
            raise FileNotFoundError(f"{path!r}: version {version} was dropped by retention")
    else:
        raise RuntimeError(f"{path!r}: versions kept changing under the load")
    if not legacy:
        trace._checkpoint = state = CheckpointState(path, v, lease=lease, read_files=files,
                                                    files={v: files})
        state.manifest = (_identity(m["__path__"]), m["checksum"])
    return trace


def _trace_of(m: dict, path: str, ctx, make_trace, legacy: bool):
    mpath, v = m["__path__"], m["__version__"]
    opened: list[PageFile] = []
    try:
        key_schema, val_schema = _schema_from(m["key_schema"]), _schema_from(m["val_schema"])
        c = m["columns"]
        columns = Columns(c["key"], c["vals"], c["time"], c["diff"])
        batches = []
        for b in m["batches"]:
            pf = PageFile.open(os.path.join(path, b["file"]), budget=ctx.budget)
            opened.append(pf)
            if "size" in b and (pf.size != b["size"] or
                                pf.directory_crc != b["directory_crc"]):
                raise PageFileError(f"page file {pf.path!r} is not the one {mpath!r} names "
                                    f"(size {pf.size}, expected {b['size']}): swapped or "
                                    f"replaced")
            parts = [PagedPart(num_updates=p["num_updates"], num_keys=p["num_keys"],
                               first_key=_table_from(p["first_key"]),
                               last_key=_table_from(p["last_key"]), payload=p["payload"],
                               stored=p["stored"], pagefile=pf, columns=p["columns"],
                               schemas=(key_schema, val_schema), cache=ctx.block_cache)
                     for p in b["parts"]]
            lower, upper, since = b["description"]
            batch = Batch(parts, Description(lower, upper, since), key_schema, val_schema,
                          pagefile=pf, owned=False)
            if not legacy:
                batch.checkpointed = (path, [b])
            batches.append(batch)
        since = int(m["since"])
    except PageFileError as e:
        _close(opened)
        raise PageFileError(f"version {v} of {path!r}: {e}") from e
    except (KeyError, TypeError, ValueError, IndexError, binascii.Error, pa.ArrowException) \
            as e:
        _close(opened)
        raise ManifestError(f"{mpath!r} is damaged: {type(e).__name__}: {e}") from e
    trace = make_trace(ctx, key_schema, val_schema, columns, m.get("name"))
    trace.spine.set_since(since)
    # back as they were written: loading does no merge work (a later insert or exert may)
    trace.spine.insert_runs(batches)
    return trace


def _close(pagefiles: list[PageFile]) -> None:
    for pf in pagefiles:
        pf.close()


# -- what a directory holds -------------------------------------------------------------------

def versions(path) -> list[dict]:
    """One dict per retained version, ascending: ``version``, ``created`` (an aware UTC
    datetime), ``updates``, ``batches``, ``bytes`` (its files' total) and ``new_bytes``
    (what that checkpoint wrote)."""
    path = os.fspath(path)
    out = []
    for v in list_versions(path) or ([1] if os.path.exists(
            os.path.join(path, LEGACY_MANIFEST)) else []):
        m = read_manifest(path, v)
        created = m.get("created")
        out.append({
            "version": v,
            "created": datetime.datetime.fromisoformat(created) if created else
            datetime.datetime.fromtimestamp(os.path.getmtime(m["__path__"]),
                                            datetime.timezone.utc),
            "updates": m.get("updates", _updates(m["batches"])),
            "batches": len(m["batches"]),
            "bytes": m.get("bytes", sum(e.get("size", 0) for e in m["batches"])),
            "new_bytes": m.get("new_bytes", sum(e.get("size", 0) for e in m["batches"])),
        })
    return out


def is_checkpoint_dir(path: str) -> bool:
    return bool(list_versions(path)) or os.path.exists(os.path.join(path, LEGACY_MANIFEST))


__all__ = ["CheckpointConflict", "LEASES", "LOCK_FILE", "checkpoint", "inherit",
           "is_checkpoint_dir", "list_versions", "load", "read_manifest", "versions"]
