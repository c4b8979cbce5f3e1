"""Saving a trace to a directory and loading it back: arrange once, query many times.

Design
------
A saved trace is a directory of immutable page files (one per batch, hard-linked from
the spill directory when the file system allows, else copied) plus ``manifest.json``:
the key and val schemas, the roles of the columns, the compaction frontier, and for
every batch its description and its parts' directory (counts, byte sizes, first and
last key, and the regions of each column). Loading maps the page files read-only and
never deletes them: they belong to the saved directory, not to the engine.
"""

from __future__ import annotations

import base64
import json
import os
import shutil

import pyarrow as pa

from arrangedb.spine.batch import Batch
from arrangedb.spine.description import Description
from arrangedb.spine.ingest import Columns
from arrangedb.spine.part import PagedPart

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


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
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    if os.path.exists(os.path.join(path, MANIFEST)):
        raise FileExistsError(f"{path!r} already holds a saved trace")
    if trace.ctx.resident is not None:     # a saved trace is page files and a manifest
        for batch in trace.spine.batches():
            trace.ctx.resident.page_out(batch)
    batches = []
    for i, batch in enumerate(trace.spine.batches()):
        if batch.pagefile is None:
            raise ValueError("only traces of an Engine (with a spill directory) can be saved")
        name = f"batch-{i:05d}.page"
        target = os.path.join(path, name)
        try:
            os.link(batch.pagefile.path, target)
        except OSError:
            shutil.copyfile(batch.pagefile.path, target)
        d = batch.description
        batches.append({
            "file": name,
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
    tmp = os.path.join(path, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f)
    os.replace(tmp, os.path.join(path, MANIFEST))


def load_trace(path, ctx):
    """The trace saved at ``path``, reading its page files in place."""
    from arrangedb.pager import PageFile
    from arrangedb.spine.trace import Trace

    path = os.fspath(path)
    mpath = os.path.join(path, MANIFEST)
    if not os.path.exists(mpath):
        raise FileNotFoundError(f"{path!r} holds no saved trace (no {MANIFEST})")
    with open(mpath) as f:
        m = json.load(f)
    if m.get("format") != "arrangedb-trace" or m.get("version", 0) > FORMAT_VERSION:
        raise ValueError(f"{mpath!r} is not a saved trace this version of arrangedb reads")
    key_schema, val_schema = _schema_from(m["key_schema"]), _schema_from(m["val_schema"])
    c = m["columns"]
    trace = Trace(ctx, key_schema, val_schema,
                  Columns(c["key"], c["vals"], c["time"], c["diff"]), m.get("name"))
    trace.spine.since = m["since"]
    batches = []
    for b in m["batches"]:
        pf = PageFile.open(os.path.join(path, b["file"]), budget=ctx.budget)
        parts = [PagedPart(num_updates=p["num_updates"], num_keys=p["num_keys"],
                           first_key=_table_from(p["first_key"]),
                           last_key=_table_from(p["last_key"]), payload=p["payload"],
                           stored=p["stored"], pagefile=pf, columns=p["columns"],
                           schemas=(key_schema, val_schema), cache=ctx.block_cache)
                 for p in b["parts"]]
        lower, upper, since = b["description"]
        batches.append(Batch(parts, Description(lower, upper, since), key_schema, val_schema,
                             pagefile=pf, owned=False))
    # back as they were saved: loading does no merge work (a later insert or exert may)
    trace.spine.insert_runs(batches)
    return trace
