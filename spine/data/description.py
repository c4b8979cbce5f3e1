"""Description: what a batch says about itself -- the times it covers and its compaction.

Mirrors differential dataflow's ``Description``: ``lower``/``upper`` bound the times of
the updates it holds (``lower <= time < upper``), and ``since`` is the logical compaction
frontier it was merged to: every time in it is ``>= since`` or was advanced to it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Description:
    lower: int
    upper: int
    since: int = 0

    @staticmethod
    def covering(descriptions: list["Description"], since: int) -> "Description":
        lower = min(d.lower for d in descriptions)
        upper = max(d.upper for d in descriptions)
        return Description(lower, upper, since)
