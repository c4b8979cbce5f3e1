"""Query shapes beyond the one join: arrangedb's natural code vs DuckDB on TPC-H-like data.

Three shapes (``bench/_shapes.py`` says what each plan does): a fact table joined to a
large dimension grouped by a low-cardinality string of the dimension (``fact_dim``:
lineitem x orders per o_orderpriority), a dimension joined to a dimension grouped by a
string (``dim_dim``: orders x customer per c_mktsegment), and a two-hop join
(``two_hop``: lineitem x orders, kept per customer by a view, x customer per c_nation). Each in
three cases -- cold (from Parquet, arrange included), warm, incremental (1% of the fact
rows updated) -- at a 512 MiB budget, DuckDB with the same ``memory_limit`` and 2
threads, one test per (shape, case), each system in its own subprocess. The results are
asserted equal to DuckDB's (counts exactly, sums to a relative 1e-9).

Scale: smoke (0.005: 150k line items, seconds) by default, where one subprocess per
(system, shape) runs the three cases in turn; ``ARRANGEDB_BENCH_SCALE=full`` -> scale 1
(30M line items, 7.5M orders, 750k customers), one subprocess per (system, shape, case),
where every target (``TARGETS``: DuckDB's time over arrangedb's; the engine's peak RSS
over its baseline within the budget plus ``RSS_ALLOWANCE``) is asserted, or reported
with ``pytest.xfail`` naming the measured figure when missed.
"""

from __future__ import annotations

import functools
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _orders  # noqa: E402
import _shapes  # noqa: E402

SCALE = _orders.default_scale()
FULL = _orders.env_full()
TARGETS = {"cold": 0.5, "warm": 8.0, "incremental": 25.0}


@functools.lru_cache(maxsize=None)
def _paths() -> tuple:
    return tuple(sorted(_shapes.ensure_data(SCALE).items()))


@functools.lru_cache(maxsize=None)
def _measured(shape: str, cases: tuple) -> dict:
    return _shapes.measure(shape, cases, dict(_paths()))


def measured(shape: str, case: str) -> dict:
    """{system: figures} of one (shape, case); at smoke size a shape's three cases are
    measured together (one interpreter start per system and shape)."""
    return _measured(shape, (case,) if FULL else _shapes.CASES)[case]


@pytest.mark.parametrize("case", _shapes.CASES)
@pytest.mark.parametrize("shape", list(_shapes.SHAPES))
def test_shape_vs_duckdb(benchmark, shape, case):
    res = benchmark.pedantic(lambda: measured(shape, case), rounds=1, iterations=1)
    row = _shapes.row_of(shape, case, res)
    benchmark.extra_info.update({"scale": SCALE, "budget": _shapes.BUDGET, "shape": shape,
                                 "case": case, **{k: v for k, v in row.items()
                                                  if k not in ("shape", "case", "problems")}})
    print("\n" + _shapes.format_table([row]))
    if res["arrangedb"].get("explain") and FULL:
        print(res["arrangedb"]["explain"])
    assert row["equal"], f"{shape} {case}: {row['problems']}"
    if not FULL:   # at smoke size fixed costs decide: the targets are for 30M line items
        return
    from arrangedb.pager.budget import RSS_ALLOWANCE
    from arrangedb.pager.sizes import parse_size

    missed = []
    if row["ratio"] < TARGETS[case]:
        missed.append(f"{row['ratio']:.2f}x DuckDB ({row['arrangedb_seconds']:.3f} s vs "
                      f"{row['duckdb_seconds']:.3f} s), target {TARGETS[case]}x")
    limit = parse_size(_shapes.BUDGET) + RSS_ALLOWANCE
    if row["arrangedb_engine_peak"] > limit:
        missed.append(f"peak RSS {row['arrangedb_engine_peak'] / 2**20:.0f} MiB over the "
                      f"engine's baseline, limit {limit / 2**20:.0f} MiB")
    if missed:   # named, not hidden
        pytest.xfail(f"{shape} {case}: " + "; ".join(missed))


def test_result_check_can_fail():
    """The equality check catches an off-by-one count, a wrong sum and a missing group."""
    good = {"A": [10, 1234.5], "B": [3, 7.25]}
    check = _shapes.compare_results
    assert check(good, {k: list(v) for k, v in good.items()}) == []
    assert check(good, {"A": [11, 1234.5], "B": [3, 7.25]})
    assert check(good, {"A": [10, 1234.5 * (1 + 1e-8)], "B": [3, 7.25]})
    assert check(good, {"A": [10, 1234.5]})
    assert check({}, {})
    assert check(good, {"A": [10, 1234.5 * (1 + 1e-12)], "B": [3, 7.25]}) == []


def test_a_change_adds_into_the_previous_result():
    """Groups in both add up, a group new in the change is added, one whose count
    reaches zero is gone, and one the change leaves alone keeps its row."""
    import pyarrow as pa

    shape = _shapes.SHAPES["fact_dim"]
    before = pa.table({"o_orderpriority": ["1-URGENT", "2-HIGH", "3-MEDIUM"],
                       "n": [5, 2, 7], "s": [10.5, 4.0, 1.0]})
    change = pa.table({"o_orderpriority": ["4-NOT SPECIFIED", "2-HIGH", "1-URGENT"],
                       "n": [1, -2, 1], "s": [0.25, -4.0, 2.0]})
    after = _shapes.as_result(shape, _shapes.apply_delta(shape, before, change))
    assert after == {"1-URGENT": [6, 12.5], "3-MEDIUM": [7, 1.0], "4-NOT SPECIFIED": [1, 0.25]}
