"""Per-key partials of several runs summed over a window of integer keys, by position.

Right after ``arrange`` a fact side is many sorted runs, and each run holds most of the
dimension's keys: joined run by run, a dimension block meets one partial row per key
*per run* (16 runs of 40M orders: ~29M partial rows for 4M customers), each run matched
and grouped on its own. When the key is one integer column and a dimension block's keys
are dense enough (ids), the runs' partials are first summed into arrays indexed by
``key - first key of the block`` (a piece's keys are distinct: one gather, add and
scatter per partial and piece -- no sort, no match), and the block is matched and grouped
once, as if the runs had been merged. Integer partials are summed in int64 (exact, and
wrapping as the grouping's sums would), float ones in float64.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

MAX_SPAN = 1 << 20        # keys in a window (8 MiB per partial array)
MAX_SPARSITY = 4          # a window at most this many times the block's keys


class DensePartials:
    """The summed partials of the pieces (keys, partials) added, for the keys in
    ``[first, first + span)``; keys outside it are dropped (they meet no key of the
    block). Partials that are one array in every piece stay one array."""

    def __init__(self, first: int, span: int, key_field: pa.Field):
        self.first, self.span, self.key_field = first, span, key_field
        self.present = np.zeros(span, bool)
        self.sums: dict[frozenset, np.ndarray] = {}   # a class of partials -> its sums
        self.dtypes: dict[str, np.dtype] = {}
        self.pieces = 0

    @classmethod
    def over(cls, keys: pa.Table) -> "DensePartials | None":
        """A window over a block's ``keys`` (sorted, distinct), or None when they are
        not one integer column or too sparse for one."""
        if keys.num_columns != 1 or keys.num_rows == 0 \
                or not pa.types.is_integer(keys.schema.field(0).type):
            return None
        col = keys.column(0)
        first, last = col[0].as_py(), col[keys.num_rows - 1].as_py()
        span = last - first + 1
        if span > MAX_SPAN or span > MAX_SPARSITY * keys.num_rows + 1024:
            return None
        return cls(first, span, keys.schema.field(0))

    def add(self, keys: pa.Table, sums: dict[str, np.ndarray]) -> None:
        """Add a piece: distinct keys (one column) and their partials."""
        col = keys.column(0)
        k = (col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()).to_numpy()
        idx = k.astype(np.int64) - np.int64(self.first)
        inside = None
        if len(idx) and (idx[0] < 0 or idx[-1] >= self.span):   # keys come sorted
            inside = np.flatnonzero((idx >= 0) & (idx < self.span))
            idx = idx[inside]
        if not len(idx):
            return
        self.pieces += 1
        self.present[idx] = True
        for names, x in _classes(sums).items():
            x = x if inside is None else x[inside]
            for name in names:
                self.dtypes.setdefault(name, x.dtype)
            self._split_by(names)
            covered = frozenset()
            for cls in [c for c in self.sums if c <= names]:
                self.sums[cls][idx] += x   # distinct keys: a fancy-indexed add is exact
                covered |= cls
            if names - covered:   # partials new to the window
                acc = self.sums[names - covered] = np.zeros(self.span, _acc_dtype(x.dtype))
                acc[idx] += x

    def _split_by(self, names: frozenset) -> None:
        """Split each class of partials that ``names`` cuts in two (one array so far,
        two from this piece on), so that every class is within ``names`` or apart."""
        for cls in [c for c in self.sums if c & names and not c <= names]:
            acc = self.sums.pop(cls)
            self.sums[cls - names] = acc
            self.sums[cls & names] = acc.copy()

    def result(self) -> tuple[pa.Table, dict[str, np.ndarray]] | None:
        """(the keys present, sorted, and their partials), or None if nothing was added."""
        if not self.pieces:
            return None
        at = np.flatnonzero(self.present)
        keys = pa.table([pa.array(at + np.int64(self.first)).cast(self.key_field.type)],
                        schema=pa.schema([self.key_field]))
        out = {}
        for names, acc in self.sums.items():
            shared = acc[at]
            for name in sorted(names):
                out[name] = shared.astype(self.dtypes[name], copy=False)
        return keys, out


def _classes(sums: dict[str, np.ndarray]) -> dict[frozenset, np.ndarray]:
    """The partials grouped by the array they are (several partials may be one array)."""
    by_id: dict[int, list] = {}
    for name, x in sums.items():
        by_id.setdefault(id(x), [x]).append(name)
    return {frozenset(v[1:]): v[0] for v in by_id.values()}


def _acc_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dtype.kind == "f" else np.dtype(np.int64)
