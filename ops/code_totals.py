"""Totals per group of partial aggregates, over the codes of one dictionary column.

A grouping on one dictionary-coded column needs no hashing: each row's code is its
group's index, and ``np.bincount`` (or ``np.add.at``) sums the partials into one slot per
dictionary value -- ~6x faster than hashing the codes. :class:`CodeTotals` takes the
codes and the partials a piece at a time (the chunks of a column, or the A pieces that
meet one B block in ``join_group_by``), so that no piece is ever concatenated with the
others, and gives one partial row per group present.

Arithmetic:

* float partials are summed by ``bincount`` in row order, a window at a time;
* int64 (and narrower signed) partials by ``np.add.at`` into int64 totals: exact, and
  wrapping as an int64 sum does, with no bound to check;
* uint64 partials by ``bincount`` while their totals stay exact in float64 (checked);
  past that :meth:`CodeTotals.add` says no, and the caller groups another way.

Codes are cast to ``intp`` a window at a time into one reused buffer: ``bincount`` and
``add.at`` cast narrower codes to ``intp`` first, and a whole piece's cast, faulted in
afresh, cost a third more than the windows, which stay in cache.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

WINDOW = 1 << 16   # codes cast and counted at once


def per_array(cols: dict, fn) -> dict:
    """``fn(array)`` for each partial, once per array (None stays None): partials that
    share one array (a count and a sum's valid rows, over a column without nulls) keep
    sharing it, so that :meth:`CodeTotals.add` sums it once."""
    done, out = {}, {}
    for p, x in cols.items():
        if x is not None and id(x) not in done:
            done[id(x)] = fn(x)
        out[p] = None if x is None else done[id(x)]
    return out


class CodeTotals:
    """Partials summed per code of one dictionary (nulls in slot ``len(dictionary)``).

    ``add`` takes a piece's codes and its partials by name; a partial given as None
    counts the piece's rows. Partials given as one array under several names (a count
    and a sum's valid rows over a column without nulls) are summed once."""

    def __init__(self, dictionary: pa.Array):
        self.dictionary = dictionary
        self.slots = len(dictionary) + 1
        self._totals: dict[str, np.ndarray | None] = {}
        self._seen = np.zeros(self.slots, bool)   # groups with a row
        self._float_bound: dict[str, float] = {}  # uint64 partials: what their sums may reach
        self._window = np.empty(WINDOW, np.intp)

    def add(self, codes: np.ndarray, null: np.ndarray | None, cols: dict) -> bool:
        """Add a piece: ``codes`` (integers below ``len(dictionary)``), ``null`` (rows
        whose group is null, or None) and ``cols`` (partial name -> array as long as
        ``codes``, or None). False, with nothing added, when a uint64 partial's totals
        could pass what float64 holds exactly."""
        n = len(codes)
        arrays: dict[int, tuple[np.ndarray | None, list[str]]] = {}
        for p, c in cols.items():
            arrays.setdefault(id(c), (c, []))[1].append(p)
        # uint64 partials: what this piece may add to their float64 sums
        bounds = {i: (float(c.max()) if n else 0.0) * n for i, (c, _) in arrays.items()
                  if c is not None and c.dtype.kind == "u"}
        for i, bound in bounds.items():
            if max(self._float_bound.get(p, 0.0) for p in arrays[i][1]) + bound >= 2**53:
                return False
        # a partial of integers >= 1 on every row tells which groups have rows; else
        # the rows are counted
        marker = next((i for i, (c, _) in arrays.items() if c is not None
                       and c.dtype.kind == "i" and n and c.min() >= 1), None)
        count_rows = marker is None or any(c is None for c, _ in arrays.values())
        piece = {i: np.zeros(self.slots, np.int64 if c.dtype.kind == "i" else np.float64)
                 for i, (c, _) in arrays.items() if c is not None}
        rows = np.zeros(self.slots, np.int64) if count_rows else None
        for start in range(0, n, WINDOW):
            stop = min(start + WINDOW, n)
            idx = self._window[: stop - start]
            idx[...] = codes[start:stop]
            if null is not None:
                idx[null[start:stop]] = self.slots - 1
            if count_rows:
                rows += np.bincount(idx, minlength=self.slots)
            for i, (c, _) in arrays.items():
                if c is None:
                    continue
                if c.dtype.kind == "i":
                    np.add.at(piece[i], idx, c[start:stop])
                else:
                    piece[i] += np.bincount(idx, weights=c[start:stop], minlength=self.slots)
        for p in cols:   # the partials' order, whichever arrays they share
            self._totals.setdefault(p, None)
        for i, (c, names) in arrays.items():
            total = rows if c is None else piece[i]
            for p in names:
                if self._totals[p] is not None:
                    self._totals[p] += total
                else:
                    self._totals[p] = total.copy()
            if i in bounds:
                for p in names:
                    self._float_bound[p] = self._float_bound.get(p, 0.0) + bounds[i]
        self._seen |= (rows if count_rows else piece[marker]) > 0
        return True

    def slots_of(self, dictionary: pa.Array) -> np.ndarray | None:
        """Each value of ``dictionary`` (no nulls) as this totals' code of that value: a
        block's codes over its own dictionary then count here. None when one is
        missing, or the two do not compare."""
        if dictionary.equals(self.dictionary):
            return np.arange(len(dictionary), dtype=np.intp)
        try:
            at = pc.index_in(dictionary, value_set=self.dictionary)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
        return None if at.null_count else at.to_numpy().astype(np.intp)

    def merge(self, other: "CodeTotals") -> bool:
        """Add ``other``'s totals (of the same partials) into these, its groups mapped
        onto these slots (:meth:`slots_of`); False, with nothing added, when a value of
        its dictionary is missing here or a uint64 partial's float sums could pass what
        float64 holds exactly."""
        slots = self.slots_of(other.dictionary)
        if slots is None or list(other._totals) != list(self._totals):
            return False
        if any(self._float_bound.get(p, 0.0) + b >= 2**53
               for p, b in other._float_bound.items()):
            return False
        onto = np.append(slots, self.slots - 1)   # its null slot onto ours
        for p, total in other._totals.items():   # each partial's totals an array of its own
            np.add.at(self._totals[p], onto, total)
        self._seen[onto[other._seen]] = True
        for p, b in other._float_bound.items():
            self._float_bound[p] = self._float_bound.get(p, 0.0) + b
        return True

    def table(self, by: str) -> pa.Table:
        """One row per group with a row: the group's value (null for slot
        ``len(dictionary)``) and each partial's total (integers as int64), in the order
        the partials were first given."""
        present = np.flatnonzero(self._seen)
        null_slot = self.slots - 1
        out = {by: self.dictionary.take(pa.array(present, pa.int64(), mask=present == null_slot))}
        for p, total in self._totals.items():
            at = total[present]
            out[p] = pa.array(at if at.dtype.kind != "f" or not self._is_int(p)
                              else at.astype(np.int64))
        return pa.table(out)

    def _is_int(self, p: str) -> bool:
        return p in self._float_bound   # uint64 partials are summed as floats
