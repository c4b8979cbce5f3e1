"""Batch: an immutable, sorted run of updates, made of parts, with its description.

Design
------
A batch knows its parts (in key order, each with first/last key in memory), its
description, and the page file behind them if any. It is never modified; merging makes
a new batch. When the last reference goes (the spine dropped it and no reader holds it),
its page file is deleted.
"""

from __future__ import annotations

import weakref

import pyarrow as pa

from arrangedb.spine.data.description import Description
from arrangedb.spine.storage.part import Part


class Batch:
    def __init__(self, parts: list[Part], description: Description, key_schema: pa.Schema,
                 val_schema: pa.Schema | None, pagefile=None, owned: bool = True):
        self.parts = parts
        self.description = description
        self.key_schema = key_schema
        self.val_schema = val_schema
        self.pagefile = None
        self._finalizer = None
        self._cache = None   # the engine's block cache, which forgets the file with it
        self._on_drop = None
        self._nonnegative = None
        self._nonnegative_totals = None
        self._first_keys = None
        self.retraction_seq: int | None = None   # set by the spine when inserted with retractions
        # (directory, manifest entries) of the checkpoint files holding these updates
        self.checkpointed: tuple[str, list[dict]] | None = None
        if pagefile is not None:
            self._set_pagefile(pagefile, owned)

    def _set_pagefile(self, pagefile, owned: bool = True) -> None:
        # an owned page file (in the spill directory) goes with the batch; a saved
        # trace's files belong to their directory and are only unmapped
        self.pagefile = pagefile
        self._cache = next((p.cache for p in self.parts
                            if getattr(p, "cache", None) is not None), None)
        self._finalizer = weakref.finalize(self, _gone, pagefile, owned, self._cache)

    def nonnegative(self) -> bool:
        """Whether no update of the batch has a negative diff (it retracts nothing);
        found once, from the parts' stored diffs (one value per part, mostly)."""
        if self._nonnegative is None:
            self._nonnegative = all(p.min_diff() >= 0 for p in self.parts)
        return self._nonnegative

    def nonnegative_at(self, at: int | None) -> bool:
        """Whether no (key, val) of the batch accumulates to a negative count at ``at``:
        what a reader summing batches side by side needs to know that a count is a
        row's multiplicity. Retractions that cancel what the batch itself inserted (a
        merge of inserts and their later retractions) leave it so; found once, and only
        answered for times that see every update of the batch (False before)."""
        if self.nonnegative():
            return True
        if at is not None and at < self.description.upper - 1:
            return False
        if self._nonnegative_totals is None:
            self._nonnegative_totals = all(p.min_total() >= 0 for p in self.parts)
        return self._nonnegative_totals

    def first_keys(self) -> pa.Table:
        """Each part's first key, a row per part: found once (a batch's keys never
        change; paging a resident batch out keeps its parts' bounds)."""
        if self._first_keys is None:
            self._first_keys = pa.concat_tables(
                [p.first_key for p in self.parts]).combine_chunks()
        return self._first_keys

    def keep_file(self) -> None:
        """The page file now belongs to a checkpoint directory (a manifest names it): once
        the batch goes, it is only unmapped; retention decides when it is deleted."""
        if self._finalizer is not None and self._finalizer.detach() is not None:
            self._finalizer = weakref.finalize(self, _gone, self.pagefile, False, self._cache)

    def attach(self, parts: list[Part], pagefile) -> None:
        """Move a resident batch's parts into ``pagefile``: the same rows, part for part
        (a reader walking the batch by part index reads either kind alike)."""
        assert self.pagefile is None and len(parts) == len(self.parts)
        self.parts[:] = parts
        self._set_pagefile(pagefile)

    def on_drop(self, fn) -> None:
        """Call ``fn`` when the spine drops this batch (a resident batch's reservation)."""
        self._on_drop = fn

    def __len__(self) -> int:
        return sum(p.num_updates for p in self.parts)

    def __repr__(self) -> str:
        d = self.description
        return f"Batch(updates={len(self)}, parts={len(self.parts)}, [{d.lower}, {d.upper}) since {d.since})"

    @property
    def num_keys(self) -> int:
        return sum(p.num_keys for p in self.parts)

    @property
    def payload_bytes(self) -> int:
        return sum(p.payload for p in self.parts)

    @property
    def stored_bytes(self) -> int:
        return sum(p.stored for p in self.parts)

    @property
    def bytes_on_disk(self) -> int:
        return self.pagefile.data_bytes if self.pagefile is not None else 0

    @property
    def file_bytes(self) -> int:
        """Every byte the batch occupies: its page file whole (header, directory, codec
        metadata, padding), or its encoded buffers while it has no file."""
        return self.pagefile.file_bytes if self.pagefile is not None else self.stored_bytes

    @property
    def bytes_in_memory(self) -> int:
        return 0 if self.pagefile is not None else self.stored_bytes

    def drop(self) -> None:
        """Delete the page file now (the spine calls this once nothing can read it)."""
        if self._on_drop is not None:
            self._on_drop()
        if self._finalizer is not None:
            self._finalizer()


def _gone(pagefile, owned: bool, cache) -> None:
    """A batch's end: its page file deleted (or, a saved trace's, unmapped), and what the
    block cache holds of it dropped."""
    (pagefile.delete if owned else pagefile.close)()
    if cache is not None:
        cache.forget(pagefile.path)


def payload_per_update(batches) -> float:
    """The mean key and val data of an update of ``batches`` (0 when they hold none): an
    update read from them is this wide, and a time and a diff more."""
    n = sum(len(b) for b in batches)
    return sum(b.payload_bytes for b in batches) / n if n else 0.0


def byte_stats(batches: list[Batch], updates: int) -> dict:
    """The byte figures of ``Trace.stats``: payload, encoded buffers, every byte of the
    files, and per update what lies beyond the payload -- in the files (bounds, times,
    offsets, directory, padding: the overhead) and in the buffers alone."""
    payload = sum(b.payload_bytes for b in batches)
    stored = sum(b.stored_bytes for b in batches)
    occupied = sum(b.file_bytes for b in batches)
    return {"payload_bytes": payload, "stored_bytes": stored, "file_bytes": occupied,
            "overhead_bytes_per_update": (occupied - payload) / updates if updates else 0.0,
            "buffer_overhead_bytes_per_update":
                (stored - payload) / updates if updates else 0.0}
