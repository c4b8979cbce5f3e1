"""Builder: turns a stream of sorted, consolidated chunks into a batch (push, then seal).

Design
------
Chunks arrive in key order, each ending at a key boundary (readers guarantee it). The
builder gathers them until a part's worth (``part_bytes``) is buffered, cuts a part at a
key boundary, encodes it and streams it into the batch's page file, so a merge of any
size holds at most about one part in memory. Buffered bytes are reserved from the budget.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from arrangedb.spine.storage.batch import Batch
from arrangedb.spine.storage.context import StorageContext
from arrangedb.spine.data.description import Description
from arrangedb.spine.data.kernels import key_starts
from arrangedb.spine.data.layout import to_layout
from arrangedb.spine.storage.part import MemoryPart, boundary_key, payload_bytes
from arrangedb.spine.data.updates import Updates, extent
from arrangedb.spine.storage.encode import write_part


class Builder:
    def __init__(self, ctx: StorageContext, key_schema: pa.Schema, val_schema: pa.Schema | None,
                 new_writer=None, part_bytes: int | None = None):
        """``new_writer``: makes the page writer (default: a spill file of ``ctx``);
        ``part_bytes``: the decoded size of a part (default: ``ctx.part_bytes``)."""
        self.ctx = ctx
        self.part_bytes = part_bytes if part_bytes is not None else ctx.part_bytes
        self.key_schema = key_schema
        self.val_schema = val_schema
        self.parts = []
        self._pending: list[Updates] = []
        self._pending_bytes = 0
        self._reserved = 0
        if new_writer is not None:
            self._writer = new_writer()
        else:
            self._writer = ctx.new_writer() if ctx.spill is not None else None
        self._codec_choices: dict = {}   # column -> codec, chosen on the first part
        self._lower = None
        self._upper = 0

    def push(self, chunk: Updates) -> None:
        """Append sorted, consolidated updates whose keys all follow what came before."""
        if len(chunk) == 0:
            return
        lo, hi = extent(chunk.times)
        self._lower = lo if self._lower is None else min(self._lower, lo)
        self._upper = max(self._upper, hi + 1)
        nbytes = chunk.nbytes
        self.ctx.reserve(nbytes, "builder")
        self._reserved += nbytes
        self._pending.append(chunk)
        self._pending_bytes += nbytes
        if self._pending_bytes >= self.part_bytes:
            self._flush(final=False)

    def _flush(self, final: bool = True) -> None:
        """Cut buffered updates into parts of about ``self.part_bytes``, at key boundaries."""
        if not self._pending:
            return
        run = Updates.concat(self._pending)
        self._pending, self._pending_bytes = [], 0
        per_row = max(run.decoded_nbytes // max(len(run), 1), 1)
        rows = max(self.part_bytes // per_row, 1)
        if len(run) <= rows:
            self._emit(run)
            self._settle()
            return
        starts = key_starts(run.keys)
        cuts = [0]
        while len(run) - cuts[-1] > rows:
            i = int(np.searchsorted(starts, cuts[-1] + rows, side="left"))
            cuts.append(int(starts[min(i, len(starts) - 1)]))
        if final or cuts[-1] == len(run):
            cuts.append(len(run))
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            if hi > lo:   # the part's key starts are a slice of the run's (cuts are starts)
                a, b = np.searchsorted(starts, [lo, hi])
                self._emit(run.slice(lo, hi), starts[a:b] - lo)
        if cuts[-1] < len(run):  # keep the tail to fill the next part
            tail = run.slice(cuts[-1], len(run))
            self._pending, self._pending_bytes = [tail], tail.nbytes
        self._settle()

    def cut(self) -> None:
        """Write what is buffered now, the next push starting a new key: a sorted run
        pushed after it then goes out as it is, never concatenated with the tail."""
        self._flush()

    @property
    def reserved(self) -> int:
        """What the builder holds on the budget for the updates it buffers."""
        return self._reserved

    def _settle(self) -> None:
        """Hold a reservation for exactly what is still buffered."""
        if self._writer is None:
            return  # memory parts stay resident: their bytes stay reserved
        self.ctx.release(self._reserved - self._pending_bytes)
        self._reserved = self._pending_bytes

    def _emit(self, run: Updates, kstarts: np.ndarray | None = None) -> None:
        if self._writer is None:   # a part kept in memory is read as it is: codes decoded
            run = run.with_plain_vals()
        layout = to_layout(run, kstarts)
        if self._writer is None:
            part = MemoryPart(
                num_updates=layout.num_updates, num_keys=layout.keys.num_rows,
                first_key=boundary_key(layout.keys, 0),
                last_key=boundary_key(layout.keys, layout.keys.num_rows - 1),
                payload=payload_bytes(layout.keys) + payload_bytes(layout.vals),
                stored=_layout_bytes(layout), data=layout)
        else:
            part = write_part(self._writer, len(self.parts), layout, self.ctx.codec,
                              (self.key_schema, self.val_schema), self._codec_choices)
        self.parts.append(part)

    def done(self, since: int = 0, lower: int | None = None, upper: int | None = None) -> Batch:
        """Seal: write the last part and the directory; return the immutable batch."""
        self._flush()
        # given bounds (a merge's inputs') win: times advanced to a logical frontier
        # past them stay inside the interval the inputs tiled
        low = lower if lower is not None else (self._lower if self._lower is not None else 0)
        desc = Description(low, upper if upper is not None else self._upper, since)
        if self._writer is not None and not self.parts:
            self._writer.abort()
            self._writer = None
        if self._writer is None:
            return Batch(self.parts, desc, self.key_schema, self.val_schema)
        pagefile = self._writer.finish(budget=self.ctx.budget)
        for p in self.parts:
            p.pagefile = pagefile
            p.cache = self.ctx.block_cache
        return Batch(self.parts, desc, self.key_schema, self.val_schema, pagefile=pagefile)

    def abort(self) -> None:
        self.ctx.release(self._reserved)
        self._reserved = 0
        if self._writer is not None:
            self._writer.abort()


def _layout_bytes(layout) -> int:
    n = layout.keys.nbytes + layout.times.nbytes + layout.diffs.nbytes + layout.key_bounds.nbytes
    if layout.vals is not None:
        n += layout.vals.nbytes + layout.val_bounds.nbytes
    return n
