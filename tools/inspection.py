"""`arrangedb inspect`: what is in a spill or checkpoint directory, and is it intact?

When an engine spills more than expected, or a page file is suspected corrupt, this
lists every page file under a directory with its regions, codecs, compression and
checksum status -- without a budget, an engine or a traceback: a file that cannot be
opened is listed with the reason. A checkpoint directory's versions come first: number,
time, updates, batches, bytes and the bytes that checkpoint wrote.
"""

from __future__ import annotations

import os

import numpy as np

from arrangedb.pager import PageFile, format_size

RAW_SIZE_KEYS = ("raw_bytes", "raw_nbytes", "uncompressed_bytes", "raw_size", "nbytes")
"""Keys a region's meta (or its ``codec_meta``) may use for the decoded size in bytes."""


def _page_files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no such spill directory: {path!r}")
    found = []
    for parent, dirs, files in os.walk(path):
        dirs.sort()
        found.extend(os.path.join(parent, f) for f in sorted(files)
                     if f.endswith((".pg", ".page")))
    return found


def _raw_size(meta: dict) -> int | None:
    """The decoded size from an explicit key, else from a numpy codec_meta's dtype x length."""
    codec_meta = meta.get("codec_meta")
    for where in (meta, codec_meta):
        if not isinstance(where, dict):
            continue
        for key in RAW_SIZE_KEYS:
            value = where.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
    if isinstance(codec_meta, dict) and codec_meta.get("kind") == "numpy":
        try:
            return np.dtype(codec_meta["dtype"]).itemsize * int(codec_meta["length"])
        except (KeyError, TypeError, ValueError):
            return None
    return None


def _inspect_file(path: str, top: str) -> dict:
    row = {"path": path, "name": os.path.relpath(path, top) if path != top else path,
           "size": None, "regions": [], "error": None, "ok": False}
    try:
        row["size"] = os.path.getsize(path)
        pf = PageFile.open(path)
    except Exception as e:   # noqa: BLE001 - any failure is reported, never raised
        row["error"] = str(e) or type(e).__name__
        return row
    try:
        checks = pf.verify()
        # A column's raw size may sit on its first buffer only (the spine's layout) or on
        # every region (one region per chunk): compare raw and stored over the column.
        raw_of, stored_of = {}, {}
        for info in pf.regions.values():
            meta = info.meta if isinstance(info.meta, dict) else {}
            key = meta.get("column", ("region", info.name))
            raw = _raw_size(meta)
            raw_of[info.name] = raw
            stored_of[key] = stored_of.get(key, 0) + info.length
            if raw is not None:
                stored_of[("raw", key)] = stored_of.get(("raw", key), 0) + raw
        for info in pf.regions.values():
            meta = info.meta if isinstance(info.meta, dict) else {}
            key = meta.get("column", ("region", info.name))
            raw, stored = raw_of[info.name], stored_of[key]
            row["regions"].append({
                "name": info.name, "offset": info.offset, "length": info.length,
                "codec": info.codec, "codec_version": info.codec_version,
                "checksum": "ok" if checks[info.name] else "BAD",
                "column": meta.get("column"), "raw_bytes": raw,
                "ratio": None if raw is None else
                stored_of[("raw", key)] / stored if stored else float("inf"),  # stride
            })
        row["ok"] = all(checks.values())
    except Exception as e:   # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {e}"
    finally:
        pf.close()
    return row


def _ratio(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return "no bytes" if ratio == float("inf") else f"{ratio:.2f}x"


def inspect_versions(path) -> list[dict] | None:
    """``arrangedb.versions(path)`` for a checkpoint directory (None for any other); a
    damaged manifest is a row with an ``error``."""
    from arrangedb.spine import persist

    top = os.fspath(path)
    if not os.path.isdir(top) or not persist.is_checkpoint_dir(top):
        return None
    rows = []
    for v in persist.list_versions(top) or [1]:
        try:
            rows.extend(r for r in persist.versions(top) if r["version"] == v)
        except Exception as e:   # noqa: BLE001 - reported, never raised
            rows.append({"version": v, "error": str(e) or type(e).__name__})
    return rows


def format_versions(rows: list[dict]) -> str:
    out = [f"{len(rows)} version{'s' * (len(rows) != 1)}"]
    for r in rows:
        if "error" in r:
            out.append(f"  version {r['version']}  ERROR: {r['error']}")
            continue
        out.append(f"  version {r['version']}  {r['created']:%Y-%m-%d %H:%M:%S} UTC  "
                   f"{r['updates']:,} updates  {r['batches']} batches  "
                   f"{format_size(r['bytes'])}  (wrote {format_size(r['new_bytes'])})")
    return "\n".join(out)


def inspect_dir(path) -> list[dict]:
    """One row per page file (``*.pg``, ``*.page``) under ``path`` (recursively), sorted
    by path.

    A row: path, name (relative to ``path``), size, ok, error (None or the reason the file
    could not be read) and regions: name, offset, length, codec, codec_version, checksum
    ("ok"/"BAD"), column, raw_bytes and ratio (raw/stored summed over the column's regions,
    given on the regions that record a raw size; None when the meta records no raw size
    and is not a numpy codec_meta with dtype and length).
    """
    top = os.path.abspath(os.fspath(path))
    return [_inspect_file(p, top) for p in _page_files(top)]


def _status(row: dict) -> str:
    if row["error"]:
        return "ERROR"
    bad = sum(r["checksum"] != "ok" for r in row["regions"])
    return f"CORRUPT ({bad} of {len(row['regions'])} regions fail their checksum)" if bad \
        else "ok"


def format_inspect(rows: list[dict]) -> str:
    """An aligned text table: a summary line per file, then its regions by column."""
    if not rows:
        return "no page files found"
    header = ("region", "offset", "length", "codec", "ver", "checksum", "ratio")
    cells = []
    for row in rows:
        for r in row["regions"]:
            cells.append((r["name"], str(r["offset"]), format_size(r["length"]), r["codec"],
                          str(r["codec_version"]), r["checksum"],
                          _ratio(r["ratio"])))
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(header)]
    right = {1, 2, 4, 6}

    def line(values, indent="    "):
        return indent + "  ".join(v.rjust(w) if i in right else v.ljust(w)
                                  for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    out = []
    total = sum(r["size"] or 0 for r in rows)
    bad = sum(not r["ok"] for r in rows)
    out.append(f"{len(rows)} page file{'s' * (len(rows) != 1)}, {format_size(total)}"
               + (f", {bad} unreadable or corrupt" if bad else ", all checksums ok"))
    it = iter(cells)
    for row in rows:
        size = format_size(row["size"]) if row["size"] is not None else "?"
        out.append("")
        if row["error"]:
            out.append(f"{row['name']}  {size}  ERROR: {row['error']}")
            continue
        out.append(f"{row['name']}  {size}  {len(row['regions'])} regions  {_status(row)}")
        if not row["regions"]:
            continue
        out.append(line(header))
        mine = [next(it) for _ in row["regions"]]
        by_column: dict = {}
        for r, c in zip(row["regions"], mine):
            by_column.setdefault(r["column"], []).append(c)
        for column, group in by_column.items():
            if column is not None:
                out.append(f"  {column}")
            elif len(by_column) > 1:
                out.append("  (no column)")
            out.extend(line(c) for c in group)
    return "\n".join(out)
