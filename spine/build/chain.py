"""Chains: the runs of an input read in key order, written on into one batch.

A build cuts its input into runs by what a sort may hold, each a batch of its own
unless it chains. When the input comes in key order -- a dimension read by its id, a fact table
by the key it was written in -- a run's keys all follow the previous run's: the two
never need merging, so the second run's parts go on into the first one's page file.
Such an input arranges into one batch whatever its size, which readers walk as one
source and the idle merger leaves alone (as two runs, a 1M-row dimension at 128 MiB
would be two batches, merged by every join that reads it).

The chain holds its builder open between runs: a run's last part stays buffered (a
part's worth, reserved) until the next run goes on, or the chain closes. A run of a
part or more first writes it as it is, so that the run's rows are never concatenated
with it (its parts are slices of it); a smaller run -- a file read in key order is
sealed a batch at a time (:class:`KeyOrder`) -- fills it instead, so that the batch's
parts stay of their size. A build cuts its runs between keys (:func:`split_last_key`),
so that such runs chain.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from arrangedb.spine.build.builder import Builder
from arrangedb.spine.data.codes import count_le
from arrangedb.spine.data.kernels import keys_in_order
from arrangedb.spine.data.updates import Updates
from arrangedb.spine.storage.batch import Batch
from arrangedb.spine.storage.part import boundary_key


class Chain:
    """The open batch of the runs of one build that follow each other in key order."""

    def __init__(self, whole_part_bytes=None, expected: int = 0):
        """``whole_part_bytes``: payload bytes -> the part size of a batch read on its
        own (``StorageContext.whole_part_bytes``); ``expected``: the input's payload,
        when its size is known. A batch that is likely to hold the whole input (its
        first run came in key order) has parts of that size, as a merge's output has:
        fewer parts to read (lineitem's 30M rows, read warm: 39 parts against 47)."""
        self._whole_part_bytes = whole_part_bytes
        self.expected = expected
        self.builder: Builder | None = None
        self._last: pa.Table | None = None   # the last key written
        self._payload = 0
        self._large = False
        # closed batches with parts larger than the base size: with other batches left,
        # merging down takes them (a reader walking several holds a part of each)
        self.large: list[Batch] = []

    @property
    def open(self) -> bool:
        return self.builder is not None

    def follows(self, run: Updates) -> bool:
        """Whether every key of ``run`` (sorted) comes after the open batch's last."""
        return (self._last is not None and len(run) > 0
                and count_le(run.keys.slice(0, 1), self._last) == 0)

    def start(self, builder: Builder, run: Updates, large: bool = False,
              ordered: bool = False) -> None:
        """Open a batch with ``run``, written through ``builder``; ``large``: its parts
        are sized for a merge already; ``ordered``: ``run`` came in key order, so the
        next runs are likely to follow it."""
        self.builder, self._large, self._payload = builder, large, 0
        if ordered:
            self._grow(max(self.expected, run.decoded_nbytes))
        self.push(run)

    def push(self, run: Updates) -> None:
        """Write ``run`` on into the open batch (it :meth:`follows` it, or is empty)."""
        if not len(run):
            return
        if self._last is not None:
            if run.decoded_nbytes >= self.builder.part_bytes:
                self.builder.cut()   # (module notes)
            self._grow(self._payload + run.decoded_nbytes)
        self.builder.push(run)
        self._payload += run.decoded_nbytes
        self._last = boundary_key(run.keys, len(run) - 1)

    def _grow(self, payload: int) -> None:
        """Parts of a batch of ``payload`` bytes read on its own, from the next cut on."""
        if self._whole_part_bytes is None:
            return
        size = self._whole_part_bytes(payload)
        if size > self.builder.part_bytes:
            self.builder.part_bytes, self._large = size, True

    def close(self) -> Batch | None:
        """The open batch, sealed (None when none is open)."""
        builder, self.builder, self._last = self.builder, None, None
        if builder is None:
            return None
        try:
            batch = builder.done()
        except BaseException:
            builder.abort()
            raise
        if self._large:
            self.large.append(batch)
        return batch

    def abort(self) -> None:
        builder, self.builder, self._last = self.builder, None, None
        if builder is not None:
            builder.abort()


class KeyOrder:
    """Whether an input's batches so far come in key order (one fixed-width key
    column): each in order, none starting before the one before it ended. Input in no
    order is told by its first batch's first 64 keys, and no batch is looked at after."""

    def __init__(self):
        self.ordered = True
        self._last: pa.Table | None = None   # the last key of the batches seen

    def see(self, upd: Updates) -> bool:
        """Take the input's next batch ``upd``; whether all so far are in key order."""
        if self.ordered and len(upd):
            self.ordered = keys_in_order(upd.keys) and (
                self._last is None or count_le(self._last, upd.keys.slice(0, 1)) == 1)
            self._last = upd.keys.slice(len(upd) - 1, 1)
        return self.ordered


def split_last_key(buffered: list[Updates]) -> list[Updates]:
    """Cut the rows at the end of ``buffered`` that hold its last key off it (returned,
    in order), when the key is one integer column and some earlier row holds another
    key; else nothing is cut."""
    last = _key_values(buffered[-1])
    if last is None or not len(last):
        return []
    key, tail = last[-1], []
    for i in range(len(buffered) - 1, -1, -1):
        values = _key_values(buffered[i])
        if values is None:
            break
        for window in (values[-256:], values):   # a key's rows are mostly few
            other = np.flatnonzero(window != key)
            if len(other):
                keep = len(values) - len(window) + int(other[-1]) + 1
                tail.insert(0, buffered[i].slice(keep, len(values)))
                buffered[i] = buffered[i].slice(0, keep)
                del buffered[i + 1:]
                return [t for t in tail if len(t)]
        tail.insert(0, buffered[i])   # all of it the last key: look further back
    return []   # one key throughout: nothing to cut


def _key_values(upd: Updates) -> np.ndarray | None:
    keys = upd.keys
    if keys.num_columns != 1:
        return None
    col = keys.column(0)
    if not pa.types.is_integer(col.type) or col.null_count:
        return None
    return col.to_numpy()
