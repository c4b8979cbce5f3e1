"""Exertion: how much merge work a trace does when nobody asks it to.

The idle merger (:mod:`arrangedb.spine.build.idle`) asks a trace's exertion policy, a
plain function, before each slice of work, as differential dataflow's spine asks its
``ExertionLogic``: given the state of the trace's levels, it returns the fuel (input
updates of merge work) to spend now, or None for none. Work spent this way is never
charged to the next insert. A trace's policy is ``trace.exertion``; replace it to merge
more eagerly, less eagerly, or never in idle time.

Whatever the fuel, ``exert`` works in this order: merges in progress first; then, with
none left and the policy still asking, the two lowest batches start merging; then a lone
batch whose updates were compacted to an older logical frontier than the trace's is
merged with nothing, which advances its times and consolidates what that makes equal.

The default policy is proportional, as Materialize's exertion logic: a batch far smaller
than the largest (a delta) is left as it is, for the inserts after it to merge with
their own fuel as the spine's levels fill. Merging a 1% delta into a 40M-row batch in
idle time rewrites all 40M rows for it; meanwhile every insert waits for the merge's
slices and pays its share of fuel (0.07-0.21 s for a 150k-update delta into 7.5M rows,
against 0.01 s with the delta left alone), and reads gain nothing -- the batches are
read side by side -- or lose, where the merge keeps two times for every changed row.
"""

from __future__ import annotations

from dataclasses import dataclass

SLICE_FUEL = 1 << 19
"""The default policy's fuel per call: about 0.1-0.3 s of merging, so a write or a read
that arrives meanwhile waits at most that long for the machine."""


@dataclass(frozen=True)
class LevelState:
    """One occupied level of a trace's spine, as a policy sees it."""

    level: int          # updates on level i are about 2**i
    batches: int        # 1, or the inputs of the merge in progress
    updates: int        # updates in those batches
    merging: bool       # a merge is in progress (or waiting for fuel)
    behind: bool        # some batch here is compacted to an older frontier than the trace's


PROPORTIONALITY = 16
"""A batch is merged in idle time only if it holds at least 1/16 of the largest batch's
updates. (Judged by levels -- within four of the largest's -- a 1.2M-update delta beside
30M, 1/25 of it, went in: a two-hop loop of 1% changes rewrote the 30M every two or
three steps, and each insert meanwhile paid fuel to that merge.)"""


def default_exertion(levels: list[LevelState]) -> int | None:
    """A slice of fuel while merging would change much: a merge in progress, a batch
    within :data:`PROPORTIONALITY` of the largest, or a lone batch behind the logical
    frontier."""
    if any(s.merging for s in levels) or _close_to_largest(levels):
        return SLICE_FUEL
    if len(levels) == 1 and levels[0].behind:
        return SLICE_FUEL
    return None


def together(levels: list[LevelState]) -> int | None:
    """:func:`default_exertion` without compacting a lone batch: for traces read only at
    their latest time, whose old versions cancel when their batches merge anyway (a
    lone batch's compaction rewrites every update to advance its times)."""
    if any(s.merging for s in levels) or _close_to_largest(levels):
        return SLICE_FUEL
    return None


def _close_to_largest(levels: list[LevelState]) -> bool:
    """Whether a batch other than the largest is within :data:`PROPORTIONALITY` of it."""
    if len(levels) < 2:
        return False
    top = max(s.updates for s in levels)
    return sum(1 for s in levels if s.updates * PROPORTIONALITY >= top) > 1


def never(levels: list[LevelState]) -> None:
    """A policy for traces that should only merge when inserts pay for it."""
    return None
