"""Join benchmark: orders x customers -> count, sum(amount) per region, arrangedb vs DuckDB.

The same code as ``bench/compare.py`` (both use ``bench/_orders.py``; read its docstring
for the cases, the arrangedb plans and how time and RSS are measured), one test per
(budget, case, amounts: two-decimal float64 or int64 cents). Each test runs one
subprocess per system; the benchmarked body runs once (``rounds=1``) and every figure
lands in ``benchmark.extra_info``. The tests assert that
the results are equal (counts exactly, sums to a relative 1e-9), and at full scale that
the best plan of each case meets its target (``TARGETS``).

Scale: smoke (0.005, seconds) by default; ``ARRANGEDB_BENCH_SCALE=full`` -> scale 1.0.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _orders  # noqa: E402

SCALE = _orders.default_scale()
FULL = _orders.env_full()
# DuckDB's time over arrangedb's for the best plan of each case (the tuned plans:
# join_group_by and the pre-aggregated arrangement are in the table beside the plain one)
TARGETS = {"cold": 1 / 3, "warm": 8.0, "incremental": 25.0}
# ... and for the natural plan (group_by(join(...)) as written, no option, no merge asked
# for), the targets of the fast-by-default work
NATURAL_TARGETS = {"cold": 0.5, "warm": 8.0, "incremental": 25.0}
THREADS = 2


@pytest.fixture(scope="module")
def paths():
    return _orders.ensure_data(SCALE)


@pytest.mark.parametrize("amounts", _orders.AMOUNTS)
@pytest.mark.parametrize("case", _orders.CASES)
@pytest.mark.parametrize("budget", list(_orders.BUDGETS))
def test_join_vs_duckdb(benchmark, budget, case, amounts):
    paths = _orders.ensure_data(SCALE, amounts=amounts)

    def run():
        return {system: _orders.run_worker(system, case, paths, budget, THREADS)
                for system in ("arrangedb", "duckdb")}

    res = benchmark.pedantic(run, rounds=1, iterations=1)
    rows = _orders.rows_of(budget, case, res)
    benchmark.extra_info.update({"scale": SCALE, "budget": budget, "case": case,
                                 "amounts": amounts})
    for r in rows:
        p = r["plan"]
        benchmark.extra_info.update({
            f"{p}_arrangedb_seconds": r["arrangedb_seconds"],
            f"{p}_duckdb_seconds": r["duckdb_seconds"],
            f"{p}_ratio_duckdb_over_arrangedb": r["ratio"],
            f"{p}_arrangedb_peak_rss_bytes": r["arrangedb_peak_rss"],
            f"{p}_duckdb_peak_rss_bytes": r["duckdb_peak_rss"],
            f"{p}_arrangedb_held_before_bytes": r["arrangedb_held_before"],
            f"{p}_duckdb_held_before_bytes": r["duckdb_held_before"],
            f"{p}_arrangedb_bytes_spilled": r["arrangedb_spilled"],
        })
    print("\n" + _orders.format_table(rows))
    assert len(rows) == {"cold": 1, "warm": 4, "incremental": 3}[case]
    for r in rows:
        assert r["equal"], f"{budget} {case} {r['plan']}: {r['problems']}"
    if FULL:   # at smoke size fixed costs decide: the targets are for 40M x 4M
        best = max(r["ratio"] for r in rows)
        assert best >= TARGETS[case], f"{budget} {case} {amounts}: best plan {best:.2f}x"
        natural = next(r["ratio"] for r in rows if r["plan"] == "natural")
        if natural < NATURAL_TARGETS[case]:   # named, not hidden; the rest still runs
            pytest.xfail(f"{budget} {case} {amounts}: the natural plan is {natural:.2f}x "
                         f"DuckDB, target {NATURAL_TARGETS[case]}x")


def test_result_check_can_fail(paths):
    """The equality check catches an off-by-one count, a wrong sum and a missing region."""
    good = {"A": [10, 1234.5], "B": [3, 7.25]}
    assert _orders.compare_results(good, {k: list(v) for k, v in good.items()}) == []
    assert _orders.compare_results(good, {"A": [11, 1234.5], "B": [3, 7.25]})
    assert _orders.compare_results(good, {"A": [10, 1234.5 * (1 + 1e-8)], "B": [3, 7.25]})
    assert _orders.compare_results(good, {"A": [10, 1234.5]})
    assert _orders.compare_results({}, {})
    assert _orders.compare_results(good, {"A": [10, 1234.5 * (1 + 1e-12)], "B": [3, 7.25]}) == []
