"""Eager aggregation grouped by a dimension's dictionary column: the totals run across
the dimension's parts, whose dictionaries hold the column's values in orders of their
own, and close only when a part holds a value they lack."""

from __future__ import annotations

import importlib

import numpy as np
import pyarrow as pa
import pytest

import arrangedb as adb
from arrangedb.ops.code_totals import CodeTotals
from test_ops import sql

jgb = importlib.import_module("arrangedb.ops.join_group_by")   # the module, not the function


def _group_values(nkeys: int, kind: str, rng) -> list:
    """The dimension's group column by key: ``permuted``, the same five values in every
    stretch of keys, met in a different order in each; ``growing``, a value no earlier
    key holds from the middle on (and nulls throughout)."""
    if kind == "permuted":
        values = ["north", "south", "east", "west", "centre"]
        out = []
        for start in range(0, nkeys, 5_000):
            order = rng.permutation(values)
            out += [order[(i // 7) % 5] for i in range(min(5_000, nkeys - start))]
        return out
    return [None if i % 11 == 0 else ("late" if i >= nkeys // 2 and i % 3 == 0
                                      else f"g{i % 4}") for i in range(nkeys)]


@pytest.mark.parametrize("kind", ["permuted", "growing"])
def test_totals_run_across_dimension_parts(tmp_path, monkeypatch, kind):
    """A fact side summed per key meets a dimension of many parts: the group codes of
    every part count into totals that run across the parts (one table of totals for the
    whole read when every part's values are the first part's, a new one from the part
    that brings a new value), and the result is DuckDB's."""
    rng = np.random.default_rng(5)
    nkeys = 60_000
    R = pa.table({"k": np.arange(nkeys), "g": pa.array(_group_values(nkeys, kind, rng))})
    L = pa.table({"k": rng.integers(-50, nkeys + 50, 300_000),
                  "x": np.round(rng.random(300_000) * 100, 2),
                  "i": rng.integers(-50, 50, 300_000)})
    tables = []
    table = CodeTotals.table
    monkeypatch.setattr(CodeTotals, "table",
                        lambda self, by: tables.append(len(self.dictionary)) or table(self, by))
    monkeypatch.setattr(jgb, "GATHER_KEYS", 4_096)   # several groupings per dimension block
    with adb.Engine(spill_dir=tmp_path, memory_budget="16MiB", idle_merge=False) as e:
        lt, rt = e.arrange(L, key=["k"]), e.arrange(R, key=["k"])
        assert len(rt.batches()) == 1 and len(rt.batches()[0].parts) > 2
        got = adb.group_by(adb.join(lt, rt), by="g",
                           aggs={"n": ("count", None), "sx": ("sum", "x"),
                                 "si": ("sum", "i")}).read_all()
    if kind == "permuted":
        assert tables == [5]
    else:   # the parts before "late" make one table, those from it on another
        assert len(tables) == 2 and tables[1] == 5
    want = sql("select g, count(*) n, sum(x) sx, sum(i) si from L join R using (k) "
               "group by g order by g nulls last", L=L, R=R)
    got = got.sort_by([("g", "ascending", "at_end")])
    for c in ("g", "n", "si"):
        assert got.column(c).to_pylist() == want.column(c).to_pylist()
    np.testing.assert_allclose(got.column("sx").to_numpy(), want.column("sx").to_numpy(),
                               rtol=1e-12)


def test_slots_of_maps_a_dictionary_into_the_totals():
    """A dictionary whose values the totals hold maps onto their slots, whatever its
    order; one with a value they lack, or of another type, does not."""
    totals = CodeTotals(pa.array(["a", "b", "c"]))
    assert totals.slots_of(pa.array(["a", "b", "c"])).tolist() == [0, 1, 2]
    assert totals.slots_of(pa.array(["c", "a"])).tolist() == [2, 0]
    assert totals.slots_of(pa.array(["a", "d"])) is None
    assert totals.slots_of(pa.array([1, 2])) is None


def test_open_totals_close_past_a_share_of_the_budget_in_dictionary_bytes(tmp_path,
                                                                           monkeypatch):
    """Totals over long strings close once their dictionaries hold a sixteenth of the
    budget (at least 1 MiB), not only past 64k slots: 4 MB of distinct 1 KiB groups
    across the dimension's parts are never all held, and the result is DuckDB's."""
    from arrangedb.ops.coded_groups import RunningTotals

    rng = np.random.default_rng(8)
    nkeys = 4_000
    R = pa.table({"k": np.arange(nkeys), "g": ["y" * 1016 + "%08d" % i for i in range(nkeys)]})
    L = pa.table({"k": rng.integers(0, nkeys, 40_000), "x": rng.integers(0, 9, 40_000)})
    held = []
    add = RunningTotals.add
    monkeypatch.setattr(RunningTotals, "add", lambda self, got, bb: (
        add(self, got, bb), held.append(sum(t.dictionary.nbytes for t in self._totals)))[0])
    with adb.Engine(spill_dir=tmp_path, memory_budget="16MiB", idle_merge=False) as e:
        lt, rt = e.arrange(L, key=["k"]), e.arrange(R, key=["k"])
        assert len(rt.batches()[0].parts) > 4
        got = adb.group_by(adb.join(lt, rt), by="g",
                           aggs={"n": ("count", None), "s": ("sum", "x")}).read_all()
    assert held and max(held) <= 2 << 20, max(held)   # 1 MiB and a part's dictionary
    want = sql("select g, count(*) n, sum(x) s from L join R using (k) group by g", L=L, R=R)
    assert sorted(got.to_pylist(), key=lambda r: r["g"]) == \
        sorted(want.cast(got.schema).to_pylist(), key=lambda r: r["g"])
