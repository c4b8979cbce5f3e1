"""Maintained views against DuckDB: after every change to their inputs (inserts and
retractions, with duplicates, nulls, skew and keys without a match), each view reads as
DuckDB's answer to the same query over the inputs' rows at that time."""

from __future__ import annotations

from collections import Counter

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import arrangedb
from arrangedb import distinct, group_by, join, reduce, threshold, top_k
from arrangedb.ops import view_delta

ALL_AGGS = {"n": ("count", None), "nx": ("count", "x"), "s": ("sum", "x"),
            "lo": ("min", "x"), "hi": ("max", "y"), "m": ("mean", "x"),
            "my": ("mean", "y"), "u": ("count_distinct", "y"), "uz": ("count_distinct", "z")}
ALL_SQL = """SELECT k, count(*) n, count(x) nx, sum(x) s, min(x) lo, max(y) hi, avg(x) m,
                    avg(y) my, count(DISTINCT y) u, count(DISTINCT z) uz
             FROM f GROUP BY k"""
JOINED = "coalesce(f.k, d.k) k, x, y, z, g"

# name: (the plan over facts f and dimensions d, DuckDB's query, columns compared)
CASES = {
    "reduce, every aggregate": (lambda f, d: reduce(f, ALL_AGGS), ALL_SQL, None),
    "mean and distinct count alone": (
        lambda f, d: reduce(f, {"m": ("mean", "x"), "u": ("count_distinct", "z")}),
        "SELECT k, avg(x) m, count(DISTINCT z) u FROM f GROUP BY k", None),
    "distinct": (lambda f, d: distinct(f),
                 "SELECT DISTINCT k, x, y, z FROM f", None),
    "threshold": (lambda f, d: threshold(f, lambda c: c >= 2),   # rows keep their count
                  """SELECT k, x, y, z, unnest(range(count(*))) FROM f GROUP BY k, x, y, z
                     HAVING count(*) >= 2""", ["k", "x", "y", "z"]),
    # which of tied rows is kept is the operator's choice: the kept values are not
    "top_k": (lambda f, d: top_k(f, 2, by="y"),
              """SELECT k, y FROM (SELECT k, y, row_number() OVER (PARTITION BY k
                 ORDER BY y DESC) r FROM f) WHERE r <= 2""", ["k", "y"]),
    "inner join": (lambda f, d: join(f, d), f"SELECT {JOINED} FROM f JOIN d ON f.k = d.k",
                   None),
    "left join": (lambda f, d: join(f, d, how="left"),
                  f"SELECT {JOINED} FROM f LEFT JOIN d ON f.k = d.k", None),
    "right join": (lambda f, d: join(f, d, how="right"),
                   f"SELECT {JOINED} FROM f RIGHT JOIN d ON f.k = d.k", None),
    "full join": (lambda f, d: join(f, d, how="full"),
                  f"SELECT {JOINED} FROM f FULL JOIN d ON f.k = d.k", None),
    "semi join": (lambda f, d: join(f, d, how="semi"),
                  "SELECT k, x, y, z FROM f SEMI JOIN d USING (k)", None),
    "anti join": (lambda f, d: join(f, d, how="anti"),
                  "SELECT k, x, y, z FROM f ANTI JOIN d USING (k)", None),
    "count and sum per group of a join": (
        lambda f, d: group_by(join(f, d), by="g", aggs={"n": ("count", None),
                                                         "s": ("sum", "y")}),
        "SELECT g, count(*) n, sum(y) s FROM f JOIN d ON f.k = d.k GROUP BY g", None),
    "max per group of a join": (
        lambda f, d: group_by(join(f, d), by="g", aggs={"hi": ("max", "x")}),
        "SELECT g, max(x) hi FROM f JOIN d ON f.k = d.k GROUP BY g", None),
}


def _facts(rng, n, keys):
    k = rng.zipf(1.4, n) % keys   # skewed: a few keys hold most rows
    x = pa.array(rng.integers(-50, 50, n).astype(float), mask=rng.random(n) < 0.15)
    z = pa.array(rng.choice(["p", "q", "r", "s"], n), mask=rng.random(n) < 0.1)
    return pa.table({"k": pa.array(k, pa.int64()), "x": x,
                     "y": pa.array(rng.integers(0, 6, n), pa.int64()), "z": z})


def _rows(trace, at=None) -> pa.Table:
    """A trace's rows at ``at`` (None: its latest time), each repeated as often as it is
    present."""
    snap = trace.snapshot(at).read_all()
    repeat = np.repeat(np.arange(snap.num_rows), snap.column("count").to_numpy())
    return snap.take(pa.array(repeat, pa.int64())).drop_columns(["count"])


def _bag(table: pa.Table, cols: list[str], weight: str | None = None) -> Counter:
    counts = table.column(weight).to_pylist() if weight else [1] * table.num_rows
    out = Counter()
    for row, c in zip(zip(*(table.column(n).to_pylist() for n in cols)), counts):
        out[tuple(round(v, 6) if isinstance(v, float) else v for v in row)] += c
    return +out


def _want(sql: str, facts, dims, at=None) -> pa.Table:
    con = duckdb.connect()
    con.register("f", _rows(facts, at))
    con.register("d", _rows(dims, at))
    return con.sql(sql).to_arrow_table()


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("seed, pieces", [(0, False), (1, True)])
def test_a_view_reads_as_duckdb_after_every_change(tmp_path, monkeypatch, case, seed, pieces):
    """``pieces``: a refresh reads its changes a block at a time (the smallest pieces).
    The last step inserts at two times before the view is read: it refreshes both, and
    reads exactly at each."""
    if pieces:
        monkeypatch.setattr(view_delta, "CHUNK_SHARE", 1 << 40)
    make, sql, cols = CASES[case]
    rng = np.random.default_rng(seed)
    keys = 30
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as e:
        base = _facts(rng, 400, keys)
        facts = e.arrange(pa.concat_tables([base, base.slice(0, 40)]),   # duplicates
                          key=["k"], vals=["x", "y", "z"])
        dk = np.arange(0, keys, 3)   # most fact keys have no dimension row
        dims = e.arrange(pa.table({"k": pa.array(np.r_[dk, keys + 5], pa.int64()),
                                   "g": pa.array(rng.choice(["a", "b", "c"], len(dk) + 1))}),
                         key=["k"], vals=["g"])
        view = e.view(make(facts, dims))
        for step in range(4):
            if step:
                present = _rows(facts)
                gone = present.take(pa.array(rng.choice(present.num_rows, 60, replace=False)))
                added = _facts(rng, 80, keys if step < 3 else keys + 10)   # new keys too
                change = pa.concat_tables([added, gone]).append_column(
                    "d", pa.array(np.r_[np.ones(80), -np.ones(60)].astype(np.int64)))
                if step == 3:   # two times for one refresh
                    facts.insert(change.slice(0, 70), diff="d")
                    between = facts.upper() - 1
                    dims.insert(pa.table({"k": pa.array([7], pa.int64()), "g": ["a"]}))
                    facts.insert(change.slice(70), diff="d")
                else:
                    facts.insert(change, diff="d")
                if step == 2:
                    dims.insert(pa.table({"k": pa.array([1, 4], pa.int64()),
                                          "g": ["b", "c"]}))
            want = _want(sql, facts, dims)
            got = view.snapshot().read_all()
            compared = cols or want.column_names
            assert _bag(got, compared, "count") == _bag(want, compared), (case, step)
        if case != "max per group of a join":
            # exact at the earlier time too (a view refreshed whole folds its times onto
            # the last)
            want = _want(sql, facts, dims, between)
            got = view.snapshot(between).read_all()
            assert _bag(got, compared, "count") == _bag(want, compared), (case, "between")
        if case.startswith(("reduce", "mean")):
            s = view.stats()
            assert s["refresh_kind"] == "stored aggregates" and s["keys_from_state"] > 0
