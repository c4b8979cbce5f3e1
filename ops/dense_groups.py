"""Grouping on one integer column whose values span a small range, without hashing.

Each value less the smallest is its group's slot, and ``np.bincount`` sums the partials
into one array per partial, as DuckDB's perfect hash aggregation does: customer ids,
dates as days, small enumerations. 7.5M rows of 750k customer ids with a count and a
float sum group in 0.16 s this way, against 0.47 s through Arrow's hash grouping (in
1M-row chunks, as ``group_by`` hands them over: 0.11 s). The slot arrays stay near the
input's size (at most four slots per row, and 1M slots), as a hash table would.

Arithmetic: float partials are summed in row order; integer partials exactly, by
``np.add.at`` (a weighted ``bincount`` goes through float64 and back: 294k rows into
750k slots took 4.6 ms against 0.4); uint64 partials whose sums could pass int64 are
left to the hash grouping.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SLOTS_PER_ROW = 4     # a range up to four times the rows (plus SLOTS_FLOOR) goes by slot,
SLOTS_FLOOR = 1 << 12
MAX_SLOTS = 1 << 20   # and never past 8 MiB per partial's totals


def dense_groups(chunk: pa.Table, by: list[str], cols: dict) -> pa.Table | None:
    """Partials of ``chunk`` grouped on its one integer group column by slot, groups in
    ascending order; None when the column is not of that form (nulls, a wide range) or
    a partial is not a numpy-readable number column without nulls.

    ``cols``: per partial, its per-row values (numpy, an Arrow column, or None for one
    per row); partials given as one array under several names are summed once."""
    if len(by) != 1:
        return None
    column = chunk.column(by[0])
    n = len(column)
    if not pa.types.is_integer(column.type) or column.null_count or n == 0:
        return None
    keys = column.to_numpy()
    lo, hi = int(keys.min()), int(keys.max())
    span = hi - lo + 1
    if span > min(SLOTS_PER_ROW * n + SLOTS_FLOOR, MAX_SLOTS):
        return None
    values = {}
    for p, c in cols.items():
        if c is None or id(c) in values:
            continue
        if not isinstance(c, np.ndarray):
            if c.null_count or not (pa.types.is_integer(c.type) or pa.types.is_floating(c.type)):
                return None
            c = c.to_numpy()
        values[id(cols[p])] = c
    slot = _slots(keys, lo)
    rows = np.bincount(slot, minlength=span)
    totals = {}
    for i, c in values.items():
        totals[i] = _summed(slot, c, span)
        if totals[i] is None:
            return None
    present = np.flatnonzero(rows)
    out = {by[0]: _values(present, lo, column.type)}
    for p, c in cols.items():
        out[p] = pa.array((rows if c is None else totals[id(c)])[present])
    return pa.table(out)


def _wide(unsigned: bool) -> type:
    """The 64-bit integer type keys are offset in (narrow types' offsets wrap)."""
    return np.uint64 if unsigned else np.int64


def _slots(keys: np.ndarray, lo: int) -> np.ndarray:
    """Each key's slot: its offset from ``lo``."""
    wide = _wide(keys.dtype.kind == "u")
    return (keys.astype(wide, copy=False) - wide(lo)).astype(np.intp, copy=False)


def _values(slots: np.ndarray, lo: int, t: pa.DataType) -> pa.Array:
    """The keys of type ``t`` at ``slots`` (the inverse of :func:`_slots`)."""
    wide = _wide(pa.types.is_unsigned_integer(t))
    return pa.array(slots.astype(wide) + wide(lo), pa.from_numpy_dtype(wide)).cast(t)


def _summed(slot: np.ndarray, c: np.ndarray, span: int) -> np.ndarray | None:
    """``c`` summed per slot: float64 for floats, int64 for integers (exactly)."""
    if c.dtype.kind == "f":
        return np.bincount(slot, weights=c, minlength=span)
    if c.dtype.kind == "u" and len(c) and int(c.max()) * len(c) >= 2 ** 63:
        return None   # its sums could pass int64
    if c.dtype.kind not in "iub":
        return None
    total = np.zeros(span, np.int64)
    np.add.at(total, slot, c.astype(np.int64, copy=False))
    return total


def _add_repeated(total: np.ndarray, slot: np.ndarray, values: np.ndarray) -> None:
    """``values`` added into ``total`` at ``slot``, slots repeating: floats by ``bincount``
    over the whole range when the rows are many beside it, else (and integers, exactly)
    by ``np.add.at``, which costs per row only. Zeros add nothing: a count that changes
    not at all (an update's retraction and insertion) costs one pass."""
    if not values.any():
        return
    if values.dtype.kind == "f" and SLOTS_PER_ROW * len(slot) >= len(total):
        total += _summed(slot, values, len(total))
    else:
        np.add.at(total, slot, values)


class SlotTotals:
    """Running totals per slot of one integer group column, across a grouping's chunks:
    each chunk's grouped partials (one row per group) are added into one array per
    partial, so a grouping of many chunks over a narrow range of integers never holds,
    combines or spills tables of partials -- one pass, as DuckDB's perfect hash
    aggregation. The arrays grow as chunks widen the range, up to ``max_slots``.
    """

    def __init__(self, by: str, key_type: pa.DataType, dtypes: dict, max_slots: int):
        self.by, self.key_type, self.dtypes, self.max_slots = by, key_type, dtypes, max_slots
        self.lo = None   # the value of slot 0
        self.present = np.zeros(0, bool)
        self.totals = {p: np.zeros(0, t) for p, t in dtypes.items()}

    @classmethod
    def for_partials(cls, schema: pa.Schema, by: list[str], max_slots: int,
                     added: frozenset) -> "SlotTotals | None":
        """Totals for grouped partials of ``schema`` (the group column, then the
        partials), or None unless one integer group column and int64 or float64 partials
        that add up (``added``: counts and sums) only: mins, maxes and decimal sums keep
        the general path."""
        if len(by) != 1 or not pa.types.is_integer(schema.field(by[0]).type):
            return None
        dtypes = {}
        for f in schema:
            if f.name == by[0]:
                continue
            if f.name not in added or f.type not in (pa.int64(), pa.float64()):
                return None
            dtypes[f.name] = np.dtype(f.type.to_pandas_dtype())
        return cls(by[0], schema.field(by[0]).type, dtypes, max_slots)

    @property
    def nbytes(self) -> int:
        return self.present.nbytes + sum(t.nbytes for t in self.totals.values())

    def add(self, part: pa.Table, distinct: bool = True) -> pa.Table | None:
        """Add partials: grouped ones (``distinct`` groups), or rows whose groups repeat
        (``distinct=False``: partials of a first phase as they come, uncombined). The
        rows left out (a null group) are returned, or None, with nothing added, when the
        part's groups would widen the range past ``max_slots`` (or its columns do not
        fit)."""
        column = part.column(self.by)
        if column.type != self.key_type or any(part.column(p).null_count
                                               for p in self.totals):
            return None
        left = part.slice(0, 0)
        if column.null_count:
            valid = column.is_valid()
            left, part = part.filter(pc.invert(valid)), part.filter(valid)
            column = part.column(self.by)
        if len(column):
            keys = column.to_numpy()
            lo, hi = int(keys.min()), int(keys.max())
            if self.lo is not None:
                lo, hi = min(lo, self.lo), max(hi, self.lo + len(self.present) - 1)
            if hi - lo + 1 > self.max_slots:
                return None
            values = {p: part.column(p).to_numpy() for p in self.totals}
            if not distinct and any(v.dtype != self.totals[p].dtype
                                    for p, v in values.items()):
                return None
            self._cover(lo, hi)
            slot = _slots(keys, self.lo)
            for p, total in self.totals.items():
                if distinct:
                    total[slot] += values[p]
                else:
                    _add_repeated(total, slot, values[p])
            self.present[slot] = True
        return left

    def _cover(self, lo: int, hi: int) -> None:
        """Grow the arrays to slots ``lo..hi`` (values), keeping what they hold."""
        span = hi - lo + 1
        if self.lo == lo and len(self.present) == span:
            return
        at = 0 if self.lo is None else self.lo - lo
        grown = np.zeros(span, bool)
        grown[at:at + len(self.present)] = self.present
        self.present = grown
        for p, total in self.totals.items():
            t = np.zeros(span, total.dtype)
            t[at:at + len(total)] = total
            self.totals[p] = t
        self.lo = lo

    def table(self) -> pa.Table:
        """One row per group with partials added, in ascending order."""
        present = np.flatnonzero(self.present)
        out = {self.by: _values(present, self.lo or 0, self.key_type)}
        out.update((p, pa.array(t[present])) for p, t in self.totals.items())
        return pa.table(out)
