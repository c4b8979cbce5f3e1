"""Key sums: each key's sum of a part's numeric val columns, for a grouped sum.

A part whose updates share one time sums its vals per key on their encoding
(``codecs.segment_sums``) instead of decoding them. Under one stored (time, diff) every
val counts alike, and the sums are plain (each key's values, which the reader weighs by
that one diff). When a few vals count otherwise (a consolidated join output counts some
rows twice), the plain sums are weighed by the usual count and corrected at the few odd
rows (taken from the encoding as a part is read, from the column as it is written):
sums of value x count. A part of several times (inserts merged with their later
retractions) is summed so too, each val weighed by its total over all its updates:
sums for a reader at or after the part's last time, who alone asks for them.

A part whose keys hold ``KEY_SUMS_FROM`` vals or more on average stores these sums as it
is written (``p<index>/key_sums/<column>``, see :mod:`.encode`), and a read takes them
instead of summing: 10M amounts over 1M keys, ~18 ms summed on their encoding, are a
number per key read. They cost a value per key on disk, so parts of about one val per
key, where they would repeat the column, store none.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from arrangedb.spine.data.layout import leaf_update_index

KEY_SUMS_FROM = 2   # vals per key, on average, from which a part stores its key sums


def leaf_counts(val_bounds: np.ndarray, diffs: np.ndarray) -> np.ndarray | None:
    """Each leaf's count in a part whose updates share one time, from its leaf bounds;
    None when a leaf holds several updates."""
    if len(val_bounds) < 2 or val_bounds[0] != 0 or val_bounds[1] != 1:
        return None
    idx, per_leaf = leaf_update_index(val_bounds)
    if (per_leaf > 1).any():
        return None
    return (diffs if idx is None else diffs[idx]).astype(np.int64)


def run_counts(group: dict, diffs: np.ndarray) -> np.ndarray | None:
    """Each leaf's count in a part whose updates share one time, from its leaf bounds
    stored as runs (``offsets``' metadata, no bytes): a run of steps of 1 stores one
    update per leaf, a run of 0 repeats the last one stored. None when the bounds are
    stored otherwise, or a leaf holds several updates."""
    meta = group.get("meta") or {}
    if group.get("codec") != "offsets" or meta.get("form") != "runs" or meta.get("first") != 0:
        return None
    steps, lengths = meta.get("deltas") or [], meta.get("counts") or []
    if len(steps) != len(lengths) or any(d not in (0, 1) or c < 0 for d, c in zip(steps, lengths)):
        return None
    out = np.empty(sum(lengths), np.int64)
    leaf = stored = 0
    for step, length in zip(steps, lengths):   # the few runs of the metadata
        if step:
            if stored + length > len(diffs):
                return None
            out[leaf:leaf + length] = diffs[stored:stored + length]
            stored += length
        elif length:
            if stored == 0:
                return None
            out[leaf:leaf + length] = diffs[stored - 1]
        leaf += length
    return out if stored == len(diffs) else None


def usual_count(counts: np.ndarray) -> tuple[int, np.ndarray] | None:
    """The count most leaves have, and the leaves counted otherwise; None when those are
    not few (more than an eighth): weighing every value is then as cheap."""
    sample = counts[:: max(1, len(counts) // 64)]
    distinct, seen = np.unique(sample, return_counts=True)
    unit = int(distinct[np.argmax(seen)])   # the usual count, whatever the first row's
    odd = np.flatnonzero(counts != unit)
    return None if len(odd) > len(counts) // 8 else (unit, odd)


def weighable(t: pa.DataType) -> bool:
    """Whether a column's sums are weighed by the counts when a few rows count otherwise:
    not a decimal's, whose sums stay exact as limbs of its unweighted sums."""
    return not pa.types.is_decimal(t)


def weigh(sums: np.ndarray, key_bounds: np.ndarray, counts: np.ndarray, unit: int,
          odd: np.ndarray, values_at) -> np.ndarray | None:
    """Plain per-key ``sums`` (each val once) made sums of value x count, in place: times
    the usual count ``unit``, plus each ``odd`` leaf's value (``values_at(rows)``) times
    the rest of its count. None for float sums that are not all finite (a value inf or
    NaN): the correction would make inf - inf, or inf x 0, NaN."""
    if sums.dtype.kind == "f" and not np.isfinite(sums).all():
        return None
    if unit != 1:
        sums *= unit
    if len(odd):   # in the sums' type: unsigned values wrap into int64 as summed
        odd_key = np.searchsorted(key_bounds.astype(np.int64), odd, side="right") - 1
        values = np.asarray(values_at(odd)).astype(sums.dtype, copy=False)
        np.add.at(sums, odd_key, values * (counts[odd] - unit))
    return sums
