"""Saving a trace to a directory and loading it back: arrange once, query many times.

Design
------
A saved trace is a directory of immutable page files (one per batch) plus
``manifest.json``: the key and val schemas, the roles of the columns, the compaction
frontier, and for every batch its description, the identity of its page file (size and
directory checksum) and its parts' directory (counts, byte sizes, first and last key,
and the regions of each column). Loading maps the page files read-only and never
deletes them: they belong to the saved directory, not to the engine.

Invariants
----------
- One writer per directory (:class:`arrangedb.pager.dirlock.DirectoryLock`); a second
  one is refused with :class:`DirectoryLocked` naming the first.
- Page files are new files under names no earlier save used (a random token), copied
  (never hard-linked: a saved file must not share an inode -- or 0600 permissions --
  with a live spill file), created with ``O_EXCL``: nothing ever truncates or writes a
  file that a trace may be reading.
- Order of writes: page files, fsync each; the manifest under a temporary name, fsync,
  rename; fsync the directory. A save that fails removes what it wrote; the directory
  holds a manifest only once everything it names is durable.
- The manifest carries an XXH3-64 checksum of its canonical JSON, and names each page
  file's size and directory checksum: a damaged manifest, or page files swapped or
  replaced, is reported (:class:`ManifestError`, :class:`PageFileError`) naming the
  file, never read as data.
- Saved files take the permissions the umask gives (they are meant to be shared).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import secrets

import pyarrow as pa

from arrangedb.pager import ManifestError, PageFile, PageFileError
from arrangedb.pager.checksum import checksum64
from arrangedb.pager.diskio import disk
from arrangedb.pager.dirlock import DirectoryLock
from arrangedb.spine.batch import Batch
from arrangedb.spine.description import Description
from arrangedb.spine.ingest import Columns
from arrangedb.spine.part import PagedPart

MANIFEST = "manifest.json"
FORMAT_VERSION = 2   # 2: a checksum and page-file identities (1: neither, still read)
_PAGE_SUFFIX = ".page"


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


def save_trace(trace, path) -> None:
    """Write ``trace`` to the directory ``path`` (created; must not hold a manifest)."""
    path = os.path.abspath(os.fspath(path))
    os.makedirs(path, exist_ok=True)
    with DirectoryLock(path, "saving"):
        if os.path.exists(os.path.join(path, MANIFEST)):
            raise FileExistsError(f"{path!r} already holds a saved trace")
        _remove_leftovers(path)
        written: list[str] = []
        try:
            _write(trace, path, written)
        except BaseException:
            for f in written:
                disk().unlink_quietly(f)
            raise


def _remove_leftovers(path: str) -> None:
    """Files of saves that failed or were killed before their manifest landed: no
    manifest names them, and the lock says no writer is at work."""
    for entry in os.scandir(path):
        if entry.name.startswith("batch-") and entry.name.endswith((_PAGE_SUFFIX, ".tmp")) \
                or entry.name.startswith(MANIFEST + "."):
            disk().unlink_quietly(entry.path)


def _write(trace, path: str, written: list[str]) -> None:
    if trace.ctx.resident is not None:     # a saved trace is page files and a manifest
        for batch in trace.spine.batches():
            trace.ctx.resident.page_out(batch)
    io = disk()
    token = secrets.token_hex(4)
    batches = []
    for i, batch in enumerate(trace.spine.batches()):
        if batch.pagefile is None:
            raise ValueError("only traces of an Engine (with a spill directory) can be saved")
        name = f"batch-{token}-{i:05d}{_PAGE_SUFFIX}"
        target = os.path.join(path, name)
        written.append(target)
        size = io.copy_file(batch.pagefile.path, target)
        d = batch.description
        batches.append({
            "file": name, "size": size, "directory_crc": batch.pagefile.directory_crc,
            "description": [d.lower, d.upper, d.since],
            "parts": [{
                "num_updates": p.num_updates, "num_keys": p.num_keys,
                "payload": p.payload, "stored": p.stored,
                "first_key": _table_b64(p.first_key), "last_key": _table_b64(p.last_key),
                "columns": p.columns,
            } for p in batch.parts],
        })
    c = trace.columns
    manifest = {
        "format": "arrangedb-trace", "version": FORMAT_VERSION, "name": trace.name,
        "key_schema": _schema_b64(trace.key_schema), "val_schema": _schema_b64(trace.val_schema),
        "columns": {"key": c.key, "vals": c.vals, "time": c.time, "diff": c.diff},
        "since": trace.since, "batches": batches,
    }
    manifest["checksum"] = _manifest_checksum(manifest)
    tmp = os.path.join(path, f"{MANIFEST}.{token}.tmp")
    written.append(tmp)
    io.write_file(tmp, json.dumps(manifest, separators=(",", ":")).encode())
    io.fsync_dir(path)        # the page files' entries, before the manifest names them
    final = os.path.join(path, MANIFEST)
    io.rename(tmp, final)
    written[-1] = final   # not yet durable: a failing fsync takes the save back
    io.fsync_dir(path)
    written.clear()


def _manifest_checksum(manifest: dict) -> int:
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return checksum64(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def read_manifest(path: str) -> dict:
    """The manifest of the saved trace at ``path``, checked; :class:`ManifestError`
    (naming the file) when it is damaged or of a format this version does not read."""
    mpath = os.path.join(path, MANIFEST)
    if not os.path.exists(mpath):
        raise FileNotFoundError(f"{path!r} holds no saved trace (no {MANIFEST})")
    try:
        with open(mpath, "rb") as f:
            m = json.loads(f.read())
        if not isinstance(m, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise ManifestError(f"{mpath!r} is damaged: {e}") from e
    if m.get("format") != "arrangedb-trace":
        raise ManifestError(f"{mpath!r} is not the manifest of a saved trace")
    version = m.get("version")
    if version not in (1, FORMAT_VERSION) or (version == 1) == ("checksum" in m):
        raise ManifestError(f"{mpath!r} has manifest format version {version!r}; this "
                            f"arrangedb reads versions 1 to {FORMAT_VERSION}")
    if version >= 2 and m["checksum"] != _manifest_checksum(m):
        raise ManifestError(f"{mpath!r}: checksum mismatch (the manifest is damaged)")
    return m


def load_trace(path, ctx):
    """The trace saved at ``path``, reading its page files in place."""
    from arrangedb.spine.trace import Trace

    path = os.fspath(path)
    m = read_manifest(path)
    mpath = os.path.join(path, MANIFEST)
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
            batches.append(Batch(parts, Description(lower, upper, since), key_schema,
                                 val_schema, pagefile=pf, owned=False))
        since = int(m["since"])
    except PageFileError:
        _close(opened)
        raise
    except (KeyError, TypeError, ValueError, IndexError, binascii.Error, pa.ArrowException) \
            as e:
        _close(opened)
        raise ManifestError(f"{mpath!r} is damaged: {type(e).__name__}: {e}") from e
    trace = Trace(ctx, key_schema, val_schema, columns, m.get("name"))
    trace.spine.set_since(since)
    # back as they were saved: loading does no merge work (a later insert or exert may)
    trace.spine.insert_runs(batches)
    return trace


def _close(pagefiles: list[PageFile]) -> None:
    for pf in pagefiles:
        pf.close()
