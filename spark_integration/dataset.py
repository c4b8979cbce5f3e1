"""Arranged datasets: per-partition arrangements on shared storage, with a timeline.

Layout of a dataset directory::

    _arrangedb_dataset.json        the committed manifest, replaced atomically
    _arrangedb_dataset.lock        held by the one writer (the driver) while it commits
    part-NNNNN/cVVVVVV-aTTTT/      a saved trace: partition N's updates of commit V,
                                   written by task attempt T
    _views/<id>/                   maintained views over the dataset (datasets themselves)

A commit is one time (an ``insert``, ``upsert`` or ``delete``) or, for a view, an interval
of times. The manifest lists the commits in time order and, for each, the directory each
partition's task wrote; a partition at time ``t`` is its directories of the commits whose
first time is at most ``t``, read at ``t``.

Commit protocol (Spark's file commit protocol, with the driver as the one committer):
every task attempt writes its own directory (two attempts of a task never share one),
fsync'd before the task reports it; the driver collects one report per partition from
the attempts Spark counted as successful, writes the next manifest under a temporary
name, fsyncs it, renames it over the old one and fsyncs the directory. A reader sees the
old manifest or the new one, never a mix. Directories of failed, retried or speculative
attempts are never named by a manifest and are removed after the commit.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import zlib
from dataclasses import dataclass

import pyarrow as pa

from arrangedb.pager import ManifestError, disk, leased

MANIFEST = "_arrangedb_dataset.json"
LOCK = "_arrangedb_dataset.lock"
FORMAT = 2
_ATTEMPT = re.compile(r"^c(\d{6,})-")   # an attempt's entry: cVVVVVV-aTTTT, or a routed file
_REQUIRED = ("format", "key", "vals", "num_partitions", "schema", "version", "since",
             "batch_ids", "commits")   # what every manifest of this format holds


def part_dir(pid: int) -> str:
    return f"part-{pid:05d}"


def check_keys(rows, keys: list[str]) -> None:
    """An arranged dataset's keys are never null: ``rows`` (a batch or table) checked."""
    for k in keys:
        if rows.column(k).null_count:
            raise ValueError(f"key column {k!r} holds nulls: an arranged dataset's keys "
                             f"must not be null")


def attempt_prefix(version: int) -> str:
    return f"c{version:06d}-"


# -- the manifest -------------------------------------------------------------------------

def _checksum(m: dict) -> int:
    body = {k: v for k, v in m.items() if k != "checksum"}
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())


def read_manifest(path: str) -> dict:
    mpath = os.path.join(path, MANIFEST)
    try:
        with open(mpath, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path!r} is not an arranged dataset (no {MANIFEST}); "
                                f"write one with arrange_df") from None
    try:
        m = json.loads(raw)
    except ValueError as e:
        raise ManifestError(f"{mpath!r} is damaged: not JSON ({e})") from None
    if not isinstance(m, dict):
        raise ManifestError(f"{mpath!r} is damaged: not a JSON object")
    if "checksum" not in m and "format" not in m:
        # written before datasets had times (and checksums): one base at time 0
        n = m.get("num_partitions")
        if not isinstance(n, int) or "commits" in m:
            raise ManifestError(f"{mpath!r} is damaged: it has no checksum, and is not a "
                                f"manifest of the first format either")
        m.update(format=FORMAT, version=1, since=0, unique=False, batch_ids={},
                 commits=[{"lower": 0, "upper": 1, "times": [0], "batch_id": None, "version": 1,
                           "updates": m.get("updates", 0),
                           "parts": {str(p): part_dir(p) for p in range(n)}}])
        return m
    # checked whatever the rest holds: a damaged key name must not pass for another format
    if m.get("checksum") != _checksum(m):
        raise ManifestError(f"{mpath!r} is damaged: its checksum does not match its contents")
    missing = [k for k in _REQUIRED if k not in m]
    if missing:
        raise ManifestError(f"{mpath!r} is damaged: it lacks {', '.join(missing)}")
    return m


def write_manifest(path: str, m: dict) -> None:
    """Replace the manifest atomically and durably: temporary file, fsync, rename, fsync
    of the directory."""
    m = dict(m, checksum=None)
    m["checksum"] = _checksum(m)
    tmp = os.path.join(path, f"{MANIFEST}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(m, f, indent=1)
        f.flush()
        disk().fsync(f.fileno())
    os.replace(tmp, os.path.join(path, MANIFEST))
    disk().fsync_dir(path)


def new_manifest(keys, vals, n: int, schema: pa.Schema, unique: bool, **extra) -> dict:
    return {"format": FORMAT, "key": keys, "vals": vals, "num_partitions": n,
            "schema": schema.serialize().to_pybytes().hex(),
            "partitioning": "Spark hash partitioning (murmur3) of the key columns",
            "unique": unique, "version": 0, "since": 0, "batch_ids": {}, "commits": [],
            **extra}


def schema_of(m: dict) -> pa.Schema:
    """The dataset's key and val columns, as its manifest records them."""
    return pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(m["schema"])))


def latest_time(m: dict) -> int | None:
    return max((t for c in m["commits"] for t in c["times"]), default=None)


@contextlib.contextmanager
def writer(path: str):
    """The writer role for a dataset (one committer at a time on this host); attempts of
    an earlier commit that never landed, and its manifest's temporary, are removed
    first, and so are the directories a compaction replaced once no reader holds them."""
    with open(os.path.join(path, LOCK), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            m = read_manifest(path)
            remove_attempts(path, m["version"] + 1, keep=())
            for name in os.listdir(path):   # a crashed committer's manifest, never renamed
                if name.startswith(f"{MANIFEST}.tmp-"):
                    disk().unlink_quietly(os.path.join(path, name))
            _remove_unread(path, _unnamed(path, m))   # left by a compaction while read
            yield m
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _attempts(path: str):
    """Every entry a task attempt wrote under the partitions: (its path relative to the
    dataset, the commit version its name carries)."""
    for part in os.listdir(path):
        if not part.startswith("part-") or not os.path.isdir(os.path.join(path, part)):
            continue
        for d in os.listdir(os.path.join(path, part)):
            found = _ATTEMPT.match(d)
            if found:
                yield f"{part}/{d}", int(found.group(1))


def remove_attempts(path: str, version: int, keep) -> None:
    """Remove the directories written for commit ``version`` that ``keep`` does not name."""
    keep = set(keep)
    for rel, v in _attempts(path):
        if v == version and rel not in keep:
            full = os.path.join(path, rel)
            if os.path.isdir(full):
                shutil.rmtree(full, ignore_errors=True)
            else:   # a routed file of the cold path (parquet_source)
                with contextlib.suppress(FileNotFoundError):
                    os.remove(full)


def commit(path: str, m: dict, reports, times: list[int], batch_id=None,
           replace: bool = False, since: int | None = None, entry: dict | None = None,
           **fields) -> dict:
    """Publish the directories the tasks reported (rows of partition, dir, updates) as
    commit ``m['version'] + 1``; ``replace``: they hold the whole dataset (compaction).
    Each commit records the version its data runs through (a compaction's: the last
    version it folds), which is what a view's steps count by. ``fields``: top-level
    entries of the manifest to set with it."""
    version = m["version"] + 1
    parts, updates = {}, 0
    for r in reports:
        pid = str(r["partition"])
        if pid in parts:
            raise RuntimeError(f"two task attempts reported partition {pid} of commit "
                               f"{version}")
        if r["dir"]:
            parts[pid] = r["dir"]
        updates += r["updates"]
    entry = {"lower": min(times), "upper": max(times) + 1, "times": sorted(times),
             "batch_id": None if batch_id is None else str(batch_id), "parts": parts,
             "updates": updates, "version": m["version"] if replace else version,
             **(entry or {})}
    if replace:   # the versions it folds: a view that saw some of them cannot split it
        entry["compacted_from"] = min((c["version"] for c in m["commits"]), default=0)
    old_dirs = {d for c in m["commits"] for d in c["parts"].values()}
    new = dict(m, version=version, commits=[entry] if replace else m["commits"] + [entry],
               **fields)
    if batch_id is not None:
        new["batch_ids"] = dict(m["batch_ids"], **{str(batch_id): max(times)})
    if since is not None:
        new["since"] = since
    write_manifest(path, new)
    # committed: what follows only tidies up (the next writer removes what it leaves), and
    # must not make a committed write look failed to its caller
    with contextlib.suppress(OSError):
        remove_attempts(path, version, keep=parts.values())
        if replace:   # what the compacted commit replaces is no longer named by any version
            _remove_unread(path, old_dirs - set(parts.values()))
    return new


def _unnamed(path: str, m: dict) -> list[str]:
    """The attempt directories of commits through ``m``'s version that it does not name
    (what a compaction replaced while a reader held it)."""
    named = {d for c in m["commits"] for d in c["parts"].values()}
    return [rel for rel, v in _attempts(path) if v <= m["version"] and rel not in named
            and os.path.isdir(os.path.join(path, rel))]


def _remove_unread(path: str, dirs) -> None:
    """Remove the directories ``dirs`` in which no live reader holds a lease (a task
    still loading them: engine.load leases the files it maps); the others stay for a
    later writer to find unread."""
    for d in dirs:
        full = os.path.join(path, d)
        try:
            if leased(full):
                continue
        except (OSError, ValueError):
            continue   # a lease that cannot be read: held, for all we know
        shutil.rmtree(full, ignore_errors=True)


def resolve_at(m: dict, at: int | None, path: str) -> int:
    latest = latest_time(m)
    if latest is None:
        raise ValueError(f"{path!r} holds no committed time")
    if at is None:
        return latest
    at = int(at)
    if at < m["since"]:
        raise ValueError(f"{path!r}: time {at} is before the compaction frontier "
                         f"{m['since']} (compact(before={m['since']}) folded it away)")
    first = min(t for c in m["commits"] for t in c["times"])
    if at < first:
        raise ValueError(f"{path!r} has no data at time {at}: its first time is {first}")
    return at


def parts_at(m: dict, at: int) -> list[list[str]]:
    """Each partition's directories (oldest first) of the commits that begin by ``at``."""
    out = [[] for _ in range(m["num_partitions"])]
    for c in m["commits"]:
        if c["lower"] <= at:
            for pid, d in c["parts"].items():
                out[int(pid)].append(d)
    return out


def through(m: dict) -> int:
    """The version the dataset's data runs through (what a view has seen once it has
    folded every commit)."""
    return max((c["version"] for c in m["commits"]), default=0)


def split_seen(m: dict, seen: int) -> tuple[list[list[str]], list[tuple[int, list[list[str]]]]]:
    """Each partition's directories of the commits through version ``seen``, and the
    later commits as (time, each partition's directories), oldest first."""
    n = m["num_partitions"]
    old = [[] for _ in range(n)]
    new = []
    for c in m["commits"]:
        if c["version"] <= seen:
            for pid, d in c["parts"].items():
                old[int(pid)].append(d)
        else:
            parts = [[] for _ in range(n)]
            for pid, d in c["parts"].items():
                parts[int(pid)].append(d)
            new.append((max(c["times"]), parts))
    return old, new


@dataclass(frozen=True)
class Layout:
    """What a task needs to read a partition: the dataset's root, its key and val
    columns, and each partition's directories at the time read."""
    root: str
    key: list[str]
    vals: list[str]
    schema: pa.Schema
    parts: list[list[str]]
    at: int
    # for a view's step: later commits (time, each partition's directories), their
    # updates inserted at max(their time, floor)
    fresh: tuple = ()
    floor: int = 0
