"""``row_counts``: the count of given (key, val) rows, searched in each key's vals, against
a model of the trace's updates -- over resident and paged batches, merged or not, with
integer, string and no vals, at every time."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrangedb
from arrangedb.spine.read.lookup import row_counts

UPDATES = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 6), st.integers(0, 3),
                             st.sampled_from([-2, -1, 1, 1, 2])), min_size=1, max_size=120)


def _val(kind: str, v: int):
    return f"v{v:02d}" if kind == "string" else v


def _table(rows, kind: str) -> pa.Table:
    cols = {"k": pa.array([r[0] for r in rows], pa.int64())}
    if kind != "key-only":
        cols["v"] = pa.array([_val(kind, r[1]) for r in rows],
                             pa.string() if kind == "string" else pa.int64())
    cols["t"] = pa.array([r[2] for r in rows], pa.uint64())
    cols["d"] = pa.array([r[3] for r in rows], pa.int64())
    return pa.table(cols)


@pytest.mark.parametrize("kind", ["int", "string", "key-only"])
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(updates=UPDATES, merge=st.sampled_from(["none", "exert", "all"]),
       asked=st.lists(st.tuples(st.integers(-1, 31), st.integers(0, 6)), max_size=40),
       at=st.sampled_from([None, 0, 1, 2, 3]))
def test_row_counts_equal_the_model(tmp_path, kind, updates, merge, asked, at):
    """The arrange's rows (time 0) are one batch; times 1 and 2 one insert (a resident
    batch, whose lookup layout repeats a val at both times), time 3 another."""
    first = [u for u in updates if u[2] == 0] or [(0, 0, 0, 1)]
    later = [u for u in updates if u[2] > 0]
    vals = [] if kind == "key-only" else ["v"]
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB", idle_merge=False) as e:
        trace = e.arrange(_table(first, kind), key=["k"], vals=vals, time="t", diff="d")
        for times in ((1, 2), (3,)):
            batch = [u for u in later if u[2] in times]
            if batch:
                trace.insert(_table(batch, kind), time="t", diff="d")
        if merge == "exert":
            trace.exert(50)
        elif merge == "all":
            trace.merge_all()
        model: dict = {}
        for k, v, t, d in first + later:
            if at is None or t <= at:
                row = k if kind == "key-only" else (k, v)
                model[row] = model.get(row, 0) + d
        # rows the updates hold (every other one), and rows at random
        asked = asked + [(k, v) for k, v, _, _ in updates[::2]]
        rows = sorted({(k, 0 if kind == "key-only" else v) for k, v in asked})
        keys = pa.table({"k": pa.array([r[0] for r in rows], pa.int64())})
        val_table = None if kind == "key-only" else pa.table(
            {"v": pa.array([_val(kind, r[1]) for r in rows],
                           pa.string() if kind == "string" else pa.int64())})
        got = row_counts(trace, keys, val_table, at)
        want = [model.get(r[0] if kind == "key-only" else r, 0) for r in rows]
        assert got.tolist() == want
