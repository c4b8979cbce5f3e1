"""Parts: the key-range slices a batch is made of -- the protocol, and parts in memory.

Design
------
A batch is a sequence of parts with increasing, disjoint key ranges; a key never spans
two parts. Each part is one :class:`PartLayout` (the seeds' layout). There are three
kinds: ``MemoryPart`` (a layout held in memory, for a spine without a pager),
``ResidentPart`` (a resident batch's sorted updates, :mod:`.resident`) and
``PagedPart`` (regions of the batch's page file, one per buffer of each encoded
column, named ``p<index>/<field>.<buffer>``; :mod:`.paged`). A part keeps its first and
last key in memory, so that searches find the parts to touch without reading any.

Reading a part decodes it into :class:`Updates` plus ``key_starts`` (where each key's
rows begin), which readers use to cut windows at key boundaries. A lookup reads a paged
part through ``lookup_layout``: keys and bounds decoded, vals, times and diffs decoded
only at the rows :func:`select_vals` takes (only the zstd blocks holding them, with the
engine's block cache).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa

from arrangedb.spine.data.layout import PartLayout, expand_singleton, from_layout, leaf_totals
from arrangedb.spine.data.updates import Updates, coded_value_bytes
from arrangedb.spine.storage.dictionaries import with_dictionaries

FIELDS = ("keys", "key_bounds", "vals", "val_bounds", "times", "diffs")


def payload_bytes(table: pa.Table | None, rows: np.ndarray | None = None) -> int:
    """Bytes of key/val data proper: values of fixed-width columns, bytes of strings.
    ``rows``: of those rows only (gathered for string columns alone)."""
    if table is None:
        return 0
    total = 0
    n = table.num_rows if rows is None else len(rows)
    for col in table.columns:
        t = col.type
        if pa.types.is_binary(t) or pa.types.is_string(t) or \
                pa.types.is_large_binary(t) or pa.types.is_large_string(t):
            if rows is not None:
                col = col.take(pa.array(rows))
            total += int(sum(_value_bytes(c) for c in col.chunks))
        elif pa.types.is_dictionary(t):   # strings kept as their codes: the strings
            if rows is not None:
                col = col.take(pa.array(rows))
            total += sum(coded_value_bytes(c) for c in col.chunks)
        elif pa.types.is_boolean(t):
            total += (n + 7) // 8
        elif pa.types.is_null(t):
            continue    # nulls only: no values
        else:
            total += n * (t.bit_width // 8)
    return total


def _value_bytes(chunk: pa.Array) -> int:
    if len(chunk) == 0:
        return 0
    offs = np.frombuffer(chunk.buffers()[1], dtype=np.int64 if chunk.type in
                         (pa.large_binary(), pa.large_string()) else np.int32)
    return int(offs[chunk.offset + len(chunk)] - offs[chunk.offset])


def key_starts_of(layout: PartLayout) -> np.ndarray:
    """Row index (in the expanded updates) where each key starts, plus the end."""
    leaves = layout.leaf_bounds
    stored = np.diff(leaves.astype(np.int64))
    leaf_counts = np.where(stored == 0, 1, stored)
    leaf_end = np.zeros(len(leaf_counts) + 1, dtype=np.int64)
    np.cumsum(leaf_counts, out=leaf_end[1:])
    if layout.vals is None:
        return leaf_end
    return leaf_end[layout.key_bounds.astype(np.int64)]


def expand(layout: PartLayout) -> tuple[Updates, np.ndarray]:
    """A layout's updates and key starts; one stored (time, diff) needs no leaf bounds."""
    if len(layout.times) == 1:
        return expand_singleton(layout.keys, layout.key_bounds, layout.vals,
                                layout.times[0], layout.diffs[0])
    return from_layout(layout), key_starts_of(layout)


def boundary_key(keys: pa.Table, row: int) -> pa.Table:
    """A one-row copy of ``keys[row]``: a slice would keep the whole part's buffers alive."""
    return keys.take(pa.array([row], pa.int64())).combine_chunks()


@dataclass
class Part:
    num_updates: int
    num_keys: int
    first_key: pa.Table
    last_key: pa.Table
    payload: int
    stored: int
    decodes = True   # reading makes new arrays (a reader reserves them); not for resident
    distinct_leaves = True   # lookup_layout holds each (key, val) once

    def layout(self) -> PartLayout:
        raise NotImplementedError

    def lookup_layout(self, dictionary: frozenset = frozenset(), dense: bool = False
                      ) -> PartLayout:
        """The layout for ``select_vals``; call ``release()`` once done with it.
        ``dictionary``: val columns to take as dictionary arrays (see :meth:`read`).
        ``dense``: the caller found the keys' positions without reading them (dense
        keys, :meth:`dense_first_key`, or :meth:`rank_positions`) and only takes keys
        at positions; a paged part then does not decode them."""
        return self._coded_layout(dictionary)

    def dense_first_key(self) -> int | None:
        """The first key when the part's keys are every integer from its first to its
        last key (dense ids): key i is then ``first + i``, found without reading the
        keys. None otherwise. Judged from the boundary keys a part keeps in memory (once:
        a part never changes, and a lookup asks of every part it visits)."""
        try:
            return self._dense_first
        except AttributeError:
            self._dense_first = self._judge_dense()
            return self._dense_first

    def rank_positions(self, queries: pa.Array) -> tuple[np.ndarray, np.ndarray] | None:
        """Positions of the integer ``queries`` among the part's keys and which were
        found, through its key rank index (:mod:`.keyrank`); None when it has none.
        Call ``release()`` once done."""
        return None

    def _judge_dense(self) -> int | None:
        if self.num_keys == 0 or self.first_key.num_columns != 1 \
                or not pa.types.is_integer(self.first_key.schema.field(0).type):
            return None
        lo, hi = self.first_key.column(0)[0].as_py(), self.last_key.column(0)[0].as_py()
        if hi - lo != self.num_keys - 1 or lo < -2**63 or hi >= 2**63:
            return None
        return lo

    def read(self, dictionary: frozenset = frozenset()) -> tuple[Updates, np.ndarray]:
        """The part's updates, one row each, and where each key's rows start.

        ``dictionary``: names of val columns to hand over as dictionary arrays (int32
        codes), their strings not gathered per row."""
        return expand(self._coded_layout(dictionary))

    def stored_layout(self, dictionary: frozenset = frozenset()) -> PartLayout | None:
        """The layout as stored, every column decoded, keys never expanded to rows (for
        readers that work per key); None when the part holds no layout (a resident
        part: its ``read`` is as cheap). Under one stored (time, diff) the leaf bounds
        may be absent (None): every leaf is then one update of it."""
        return self._coded_layout(dictionary)

    def summed_layout(self, dictionary: frozenset = frozenset(), sums: frozenset = frozenset(),
                      columns: frozenset | None = None, at: int | None = None,
                      linear: bool = False, keep: bool = False, scan: bool = False
                      ) -> tuple[PartLayout | None, dict, np.ndarray | None]:
        """:meth:`stored_layout`, with the val columns named in ``sums`` summed per key
        rather than decoded where the part allows it: ``(layout, {column: per-key sums},
        counts)``.

        A part can when the column's encoding sums runs of values without decoding them
        (``codecs.segment_sums``) and it holds one stored (time, diff), every val one
        update of it: the sums are then unweighted, each row counting that diff. Or when
        its updates share one time and only a few count otherwise than the rest: the
        sums are then of value x count, and ``counts`` holds each val's count (its leaf
        bounds may then be absent). With ``linear`` (a reader that only sums counts, and
        takes a zero), also when its updates span several times, all visible at ``at``:
        ``counts`` then holds each val's total, zero where its updates cancel. The
        layout lacks a column summed. ``columns``: the other val columns the reader
        needs (None: all); the layout may hold more. ``keep``: a query's read, whose
        decoded columns a paged part keeps for the next (``blockcache.KeptColumns``);
        ``scan``: one of a read larger than the block cache, whose columns give way."""
        return self.stored_layout(dictionary), {}, None

    def val_nulls(self, name: str) -> int | None:
        """How many of the part's stored values of val column ``name`` are null; None
        when the part does not know without reading them."""
        vals = self.layout().vals
        return vals.column(name).null_count if vals is not None else 0

    def min_diff(self) -> int:
        """The smallest diff stored in the part (1 when it holds none)."""
        diffs = self.layout().diffs
        return int(diffs.min()) if len(diffs) else 1

    def min_total(self) -> int:
        """The smallest count a (key, val) of the part totals over all its updates (1
        when it holds none): below zero only where the part's own updates leave a row
        retracted more often than inserted."""
        layout = self.layout()
        return min_total(layout.leaf_bounds, layout.times, layout.diffs)

    def _coded_layout(self, dictionary: frozenset) -> PartLayout:
        layout = self.layout()
        if not dictionary:
            return layout
        return replace(layout, vals=with_dictionaries(layout.vals, dictionary))

    def release(self) -> None:
        """Let go of resident bytes once a reader has finished with this part."""


@dataclass
class MemoryPart(Part):
    data: PartLayout = field(default=None, repr=False)

    def layout(self) -> PartLayout:
        return self.data


def min_total(leaf_bounds, times: np.ndarray, diffs: np.ndarray) -> int:
    """The smallest leaf total of stored updates (:meth:`Part.min_total`)."""
    if not len(diffs):
        return 1
    if len(diffs) == 1 or diffs.min() >= 0:
        return int(diffs.min())   # (a sum of nonnegative diffs is no smaller)
    return int(leaf_totals(leaf_bounds, times, diffs).min())
