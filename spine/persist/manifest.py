"""Checkpoint manifests: one per version, ``manifest-<version>.json``, naming the schemas,
the compaction frontier and, for every batch, its description, its page file's identity
and its parts' directory; their encoding, checksum and reading (formats 1-3). The format
is described in docs/CHECKPOINTS.md."""

from __future__ import annotations

import base64
import json
import os
import re

import pyarrow as pa

from arrangedb.pager import ManifestError
from arrangedb.pager.checksum import checksum64

LEGACY_MANIFEST = "manifest.json"


FORMAT = "arrangedb-checkpoint"


FORMAT_VERSION = 3   # 3: one manifest per version (2: manifest.json with a checksum; 1: none)


_MANIFEST = re.compile(r"^manifest-(\d{6,})\.json$")


PAGE_SUFFIX = ".page"


# the names a checkpoint gives its files: nothing else in a directory is ever removed
_PAGE_FILE = re.compile(r"^batch-[0-9a-f]+-i?\d+\.page$")
_TEMPORARY = re.compile(r"^(batch-[0-9a-f]+-i?\d+\.page|manifest-\d{6,}\.json\.[0-9a-f]+)\.tmp$")


def is_page_file(name: str) -> bool:
    """Whether ``name`` is a page file a checkpoint (or a staged insert) writes."""
    return _PAGE_FILE.match(name) is not None


def is_temporary(name: str) -> bool:
    """Whether ``name`` is a checkpoint's file before its rename (a killed writer's)."""
    return _TEMPORARY.match(name) is not None


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


def schema_b64(schema: pa.Schema | None) -> str | None:
    return None if schema is None else base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from(b64: str | None) -> pa.Schema | None:
    return None if b64 is None else pa.ipc.read_schema(pa.py_buffer(base64.b64decode(b64)))


def table_b64(table: pa.Table) -> str:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return base64.b64encode(sink.getvalue().to_pybytes()).decode()


def table_from(b64: str) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(base64.b64decode(b64))).read_all()


_CHECKSUM_FIELD = b',"checksum":'


def _canonical_checksum(manifest: dict) -> int:
    """Format 2: XXH3-64 of the canonical JSON (keys sorted) without the checksum."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return checksum64(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def encode_entry(entry: dict) -> bytes:
    """One batch's manifest entry as JSON (what :func:`encode_manifest` splices)."""
    return json.dumps(entry, separators=(",", ":")).encode()


def encode_manifest(manifest: dict, batches: list[bytes] | None = None) -> tuple[bytes, int]:
    """Format 3: the manifest's JSON with ``"checksum"`` as its last member, the XXH3-64
    of every byte before that member (no re-serialization to check it); and that
    checksum. ``batches``: the entries already encoded (:func:`encode_entry`), spliced in
    as the ``"batches"`` member instead of encoding ``manifest["batches"]`` again -- most
    entries of a version are the previous version's."""
    if batches is not None:
        rest = {k: v for k, v in manifest.items() if k != "batches"}
        head = (json.dumps(rest, separators=(",", ":")).encode()[:-1] + b',"batches":['
                + b",".join(batches) + b"]")
    else:
        head = json.dumps(manifest, separators=(",", ":")).encode()[:-1]   # no closing brace
    checksum = checksum64(head)
    return head + _CHECKSUM_FIELD + str(checksum).encode() + b"}", checksum


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
    # format 1 has no checksum: what it must hold is checked here instead
    needed = ("key_schema", "val_schema", "batches") if fmt == 1 else ("batches",)
    missing = [k for k in needed if k not in m]
    if missing or not isinstance(m["batches"], list):
        lacks = ", ".join(missing) or "a list of batches"
        raise ManifestError(f"{mpath!r} is damaged: it lacks {lacks}")
    m["__path__"], m["__version__"] = mpath, version or 1
    return m


def schemas(m: dict) -> tuple:
    return m["key_schema"], m["val_schema"]


def schemas_of(trace) -> tuple:
    return schema_b64(trace.key_schema), schema_b64(trace.val_schema)


def _span(versions: list[int]) -> str:
    return f"{versions[0]}..{versions[-1]}" if versions else "none"
