"""Exertion: how much merge work a trace does when nobody asks it to.

The idle merger (:mod:`arrangedb.spine.build.idle`) asks a trace's exertion policy, a
plain function, before each slice of work, as differential dataflow's spine asks its
``ExertionLogic``: given the state of the trace's levels, it returns the fuel (input
updates of merge work) to spend now, or None for none. Work spent this way is never
charged to the next insert. A trace's policy is ``trace.exertion``; replace it to merge
more eagerly, less eagerly, or never in idle time.

Whatever the fuel, ``exert`` works in this order: merges in progress first; then, with
none left, the two lowest batches start merging; then a lone batch whose updates were
compacted to an older logical frontier than the trace's is merged with nothing, which
advances its times and consolidates what that makes equal.
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


def default_exertion(levels: list[LevelState]) -> int | None:
    """A slice of fuel while merging would change anything: a merge in progress, two
    batches that could merge into one, or a batch behind the logical frontier."""
    if len(levels) > 1 or any(s.merging or s.behind for s in levels):
        return SLICE_FUEL
    return None


def together(levels: list[LevelState]) -> int | None:
    """:func:`default_exertion` without compacting a lone batch: for traces read only at
    their latest time, whose old versions cancel when their batches merge anyway (a
    lone batch's compaction rewrites every update to advance its times)."""
    if len(levels) > 1 or any(s.merging for s in levels):
        return SLICE_FUEL
    return None


def never(levels: list[LevelState]) -> None:
    """A policy for traces that should only merge when inserts pay for it."""
    return None
