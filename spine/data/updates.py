"""Updates: a flat, columnar run of ``(key, val, time, diff)`` rows.

The unit every kernel consumes and produces. A batch part is stored in the compact
layout of :mod:`arrangedb.spine.data.layout` and decoded into ``Updates`` to be worked on.

Invariants
----------
- ``keys`` (and ``vals`` unless key-only) have one row per update; ``times`` is uint64,
  ``diffs`` int64, all four of equal length.
- When a function says its result is *sorted*, rows are ordered by (key, val, time) and
  *consolidated*: no two rows share (key, val, time) and no diff is zero.
- ``times`` and ``diffs`` may be read-only stride-0 views holding one value for every
  row (:func:`constant`, as reads of a part storing one (time, diff) make them): no
  kernel writes into them, and they cost one element of memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def constant(value, n: int, dtype) -> np.ndarray:
    """``n`` copies of ``value`` as a read-only stride-0 view (one element of memory)."""
    # built directly: np.broadcast_to's checks cost ~10 us, once per part read
    out = np.ndarray((n,), dtype=dtype, buffer=np.full(1, value, dtype=dtype), strides=(0,))
    out.flags.writeable = False
    return out


def is_constant(a: np.ndarray) -> bool:
    """True for a stride-0 view made by :func:`constant` (every element the same)."""
    return len(a) > 1 and a.strides[0] == 0


def all_equal(a: np.ndarray) -> bool:
    """Every element of a non-empty array equal (no scan of a stride-0 view)."""
    return is_constant(a) or bool(a[0] == a[-1] and (a == a[0]).all())


def extent(a: np.ndarray) -> tuple[int, int]:
    """Smallest and largest element of a non-empty array (no scan of a stride-0 view)."""
    if is_constant(a):
        return int(a[0]), int(a[0])
    return int(a.min()), int(a.max())


def _nbytes(a: np.ndarray) -> int:
    return a.itemsize if is_constant(a) else a.nbytes


def _take_column(a: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """``a[indices]``; a stride-0 view stays one (its rows are all alike)."""
    return constant(a[0], len(indices), a.dtype) if is_constant(a) else a[indices]


def concat_column(arrays: list[np.ndarray], dtype) -> np.ndarray:
    """Concatenated, staying a stride-0 view when every piece holds one and the same
    value (ingest of input without time/diff columns: no 16 bytes per row to fill)."""
    first = arrays[0][0]
    if all(len(a) == 1 or is_constant(a) for a in arrays) and all(a[0] == first for a in arrays):
        return constant(first, sum(len(a) for a in arrays), dtype)
    return np.concatenate(arrays)


def _combined(table: pa.Table) -> pa.Table:
    """``table`` with each column in one chunk. Numbers without nulls are joined by
    numpy: malloc keeps the blocks a run's sort frees for the next run's, where Arrow's
    pool hands them back and the next run faults its 16 MB in afresh."""
    if all(c.num_chunks <= 1 for c in table.columns):
        return table
    cols = []
    for col in table.columns:
        if col.num_chunks > 1 and col.null_count == 0 and _plain_numbers(col.type):
            col = pa.array(np.concatenate([c.to_numpy() for c in col.chunks]), col.type)
        elif col.num_chunks > 1:
            col = col.combine_chunks()
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=table.schema)


def _plain_numbers(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def coded_value_bytes(chunk: pa.DictionaryArray) -> int:
    """Bytes of the strings a dictionary array's rows stand for (its dictionary holds
    strings or binaries): what the rows hold once decoded, less their offsets."""
    lengths = pc.binary_length(chunk.dictionary).to_numpy(zero_copy_only=False)
    used = np.bincount(pc.drop_null(chunk.indices).to_numpy(), minlength=len(lengths))
    return int(used @ lengths)


@dataclass(frozen=True)
class Updates:
    keys: pa.Table
    vals: pa.Table | None
    times: np.ndarray
    diffs: np.ndarray

    def __len__(self) -> int:
        return len(self.diffs)

    @property
    def nbytes(self) -> int:
        n = self.keys.nbytes + _nbytes(self.times) + _nbytes(self.diffs)
        return n + (self.vals.nbytes if self.vals is not None else 0)

    @cached_property
    def decoded_nbytes(self) -> int:
        """``nbytes`` as the rows read back: a dictionary-coded val column (codes kept
        from the input) counted as the values it stands for, which parts are sized by.
        Kept once known: a run is sized by it several times on its way into a batch
        (~1 ms a time for 750k coded rows)."""
        n = self.nbytes
        for col in self.vals.columns if self.vals is not None else ():
            if pa.types.is_dictionary(col.type):   # the values, and an offset a row
                n += sum(coded_value_bytes(c) + 4 * len(c) - c.nbytes for c in col.chunks)
        return n

    def take(self, indices: np.ndarray) -> "Updates":
        idx = pa.array(indices) if not isinstance(indices, pa.Array) else indices
        vals = self.vals.take(idx) if self.vals is not None else None
        return Updates(self.keys.take(idx), vals, _take_column(self.times, indices),
                       _take_column(self.diffs, indices))

    def take_payload(self, indices: np.ndarray) -> tuple[pa.Table, pa.Table | None]:
        """Keys and vals of the given rows (times and diffs are the caller's business)."""
        idx = pa.array(indices)
        return self.keys.take(idx), (self.vals.take(idx) if self.vals is not None else None)

    def slice(self, start: int, stop: int) -> "Updates":
        n = stop - start
        vals = self.vals.slice(start, n) if self.vals is not None else None
        return Updates(self.keys.slice(start, n), vals, self.times[start:stop],
                       self.diffs[start:stop])

    def with_plain_vals(self) -> "Updates":
        """The same rows with dictionary-coded val columns (codes kept from the input,
        for the ``dict`` codec) decoded into their values, as reads return them."""
        if self.vals is None or not any(pa.types.is_dictionary(f.type)
                                        for f in self.vals.schema):
            return self
        cols = [c.dictionary_decode() if pa.types.is_dictionary(c.type) else c
                for c in (c.combine_chunks() for c in self.vals.columns)]
        return Updates(self.keys, pa.Table.from_arrays(cols, names=self.vals.column_names),
                       self.times, self.diffs)

    def contiguous(self) -> "Updates":
        """The same rows with each column in one chunk: kernels that read a column as
        one array (codes, gathers) then neither concatenate nor walk chunks."""
        vals = _combined(self.vals) if self.vals is not None else None
        return Updates(_combined(self.keys), vals, self.times, self.diffs)

    @staticmethod
    def concat(parts: list["Updates"]) -> "Updates":
        parts = [p for p in parts if len(p)] or parts[:1]
        if len(parts) == 1:
            return parts[0]
        keys = pa.concat_tables([p.keys for p in parts])
        vals = pa.concat_tables([p.vals for p in parts]) if parts[0].vals is not None else None
        return Updates(keys, vals, concat_column([p.times for p in parts], np.uint64),
                       concat_column([p.diffs for p in parts], np.int64))

    @staticmethod
    def empty(key_schema: pa.Schema, val_schema: pa.Schema | None) -> "Updates":
        vals = val_schema.empty_table() if val_schema is not None else None
        return Updates(key_schema.empty_table(), vals, np.zeros(0, np.uint64),
                       np.zeros(0, np.int64))
