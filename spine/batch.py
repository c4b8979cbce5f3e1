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

from arrangedb.spine.description import Description
from arrangedb.spine.part import Part


class Batch:
    def __init__(self, parts: list[Part], description: Description, key_schema: pa.Schema,
                 val_schema: pa.Schema | None, pagefile=None, owned: bool = True):
        self.parts = parts
        self.description = description
        self.key_schema = key_schema
        self.val_schema = val_schema
        self.pagefile = pagefile
        if pagefile is not None:
            # an owned page file (in the spill directory) goes with the batch; a saved
            # trace's files belong to their directory and are only unmapped
            self._finalizer = weakref.finalize(self, pagefile.delete if owned else pagefile.close)

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
    def bytes_in_memory(self) -> int:
        return 0 if self.pagefile is not None else self.stored_bytes

    def drop(self) -> None:
        """Delete the page file now (the spine calls this once nothing can read it)."""
        if self.pagefile is not None:
            self._finalizer()
