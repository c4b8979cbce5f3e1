"""Loading a checkpoint: a version's page files mapped in place (no payload decoded)
under a lease (:mod:`arrangedb.pager.leases`), and the listing of versions."""

from __future__ import annotations

import binascii
import datetime
import os

import pyarrow as pa

from arrangedb.pager import ManifestError, PageFile, PageFileError
from arrangedb.pager.leases import Lease
from arrangedb.spine.storage.batch import Batch
from arrangedb.spine.data.description import Description
from arrangedb.spine.data.ingest import Columns
from arrangedb.spine.storage.paged import PagedPart
from arrangedb.spine.persist.manifest import (LEGACY_MANIFEST, list_versions, read_manifest,
                                              schema_from, table_from)
from arrangedb.spine.persist.write import CheckpointState, identity, updates_in

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
        state.manifest = (identity(m["__path__"]), m["checksum"])
    return trace


def _trace_of(m: dict, path: str, ctx, make_trace, legacy: bool):
    mpath, v = m["__path__"], m["__version__"]
    opened: list[PageFile] = []
    try:
        key_schema, val_schema = schema_from(m["key_schema"]), schema_from(m["val_schema"])
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
                               first_key=table_from(p["first_key"]),
                               last_key=table_from(p["last_key"]), payload=p["payload"],
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
            "updates": m.get("updates", updates_in(m["batches"])),
            "batches": len(m["batches"]),
            "bytes": m.get("bytes", sum(e.get("size", 0) for e in m["batches"])),
            "new_bytes": m.get("new_bytes", sum(e.get("size", 0) for e in m["batches"])),
        })
    return out


def is_checkpoint_dir(path: str) -> bool:
    return bool(list_versions(path)) or os.path.exists(os.path.join(path, LEGACY_MANIFEST))
