"""TraceHandle: a shared reader's hold on a trace's history and batch boundaries.

A trace compacts only to the minimum of its live handles' frontiers (see
:mod:`arrangedb.spine.trace`); a handle moves its own frontiers forward, never back, and
closing or dropping it lets go of what it held.
"""

from __future__ import annotations


class TraceHandle:
    """A shared reader's hold on a trace's history (logical) and batch boundaries (physical)."""

    def __init__(self, trace, holds_only: bool = False):
        self._trace = trace
        self.logical = trace.since
        self.physical: int | None = None
        self.closed = False
        # a hold (a view's on its inputs) keeps history that other handles would let
        # go, but never lets a trace compact by itself: one with no other handle keeps
        # all its history, as before the view
        self.holds_only = holds_only

    @property
    def trace(self):
        return self._trace

    def set_logical_compaction(self, frontier: int) -> None:
        """Allow the trace to forget history before ``frontier`` (never moves backwards)."""
        if frontier < self.logical:
            raise ValueError(f"logical compaction frontier cannot move back from "
                             f"{self.logical} to {frontier}")
        self.logical = int(frontier)
        self._trace.update_frontiers()

    def release_through(self, frontier: int) -> None:
        """A hold's ``set_logical_compaction``, without taking the trace's write lock
        (a merge slice may hold it): the trace applies it at its next write. Letting
        go of history late is always safe."""
        if not self.holds_only:
            raise ValueError("release_through is for holds: use set_logical_compaction")
        self.logical = max(self.logical, int(frontier))

    def set_physical_compaction(self, frontier: int) -> None:
        """Allow the trace to merge away batch boundaries before ``frontier``."""
        if self.physical is not None and frontier < self.physical:
            raise ValueError(f"physical compaction frontier cannot move back from "
                             f"{self.physical} to {frontier}")
        self.physical = int(frontier)
        self._trace.update_frontiers()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._trace.update_frontiers()

    def __enter__(self) -> "TraceHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        # The trace lets go of this handle's frontiers at its next write: a collection
        # may run in any thread, even inside a write, where changing the spine is unsafe.
        self.closed = True

    # reads go through the shared trace
    def snapshot(self, at=None):
        return self._trace.snapshot(at)

    def lookup(self, keys, at=None):
        return self._trace.lookup(keys, at)

    def changes(self, since, upto=None):
        return self._trace.changes(since, upto)
