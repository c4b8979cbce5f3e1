"""What a maintained view keeps of its past: the policy behind ``engine.view(history=)``.

``"last"`` (the default): the changes of its last refresh and the state before them.
Before each refresh the view's own logical frontier moves to the time before the
refresh's first change (its upper frontier less one), so its merges fold the earlier
times together -- as Materialize keeps an index's history only for its compaction
window. A view stepped many times then holds about its contents and one refresh's
changes, and a refresh reads a touched key's few rows, not one pair more per earlier
refresh (the two-hop view of the shapes benchmark, stepped eight times by a 1%
lineitem delta, the idle merger settling between steps: 0.04-0.21 s a refresh, against
0.045 s growing to 0.70 s keeping every time). ``"all"``: every time since the view
was made, as a trace keeps it. Either way a handle on the view holds history for its
reader (:class:`arrangedb.spine.Trace` compacts no further than its handles hold).
"""

from __future__ import annotations

HISTORIES = ("last", "all")

HINT = (" (a view keeps the changes of its last refresh and the state before them: a "
        "handle, view.handle(), holds more for its reader, and "
        "engine.view(..., history='all') keeps every time)")


def checked_history(history) -> str:
    """``history`` when it names a policy, else a ValueError naming the choices."""
    if history not in HISTORIES:
        raise ValueError(f"history={history!r}: a view keeps 'last' (its last refresh's "
                         f"changes and the state before them) or 'all' (every time)")
    return history


def own_since(history: str, upper: int, since: int | None) -> int | None:
    """The view's own logical frontier before a refresh from ``upper``: what it lets go
    (None: nothing)."""
    if history != "last" or upper <= 1:
        return since
    return max(since or 0, upper - 1)


def hint(history: str) -> str:
    """What an error refusing a read before the view's frontier adds."""
    return HINT if history == "last" else ""
