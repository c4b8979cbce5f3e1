"""`arrangedb spill-demo`: push several times the memory budget through the pager.

It shows, on generated data, the pager's one promise in numbers: data far larger than
the budget goes to page files and comes back intact, while the process's RSS stays
within budget + RSS_ALLOWANCE. Random int64 data is generated in 4 MiB chunks, written
through PageWriter into ~32 MiB page files, then scanned back and checked against the
sums taken at write time.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from arrangedb.pager import (RSS_ALLOWANCE, MemoryBudget, PageFile, PageWriter, SpillDirectory,
                             format_size, parse_size)
from arrangedb.tools.progress import Bar

CHUNK = 4 << 20
FILE_SIZE = 32 << 20
MiB = 1 << 20


class _Bytes:
    """A progress bar (:class:`arrangedb.tools.progress.Bar`) counting bytes, with a rate."""

    def __init__(self, label: str, total: int, out):
        self.bar, self.total, self.done = Bar(label, out), max(total, 1), 0
        self.start = time.perf_counter()

    def _detail(self) -> str:
        rate = self.done / MiB / max(time.perf_counter() - self.start, 1e-9)
        return f"{self.done / MiB:.1f}/{self.total / MiB:.1f} MiB {rate:.1f} MiB/s"

    def update(self, nbytes: int) -> None:
        self.done += nbytes
        self.bar.update(self.done, self.total, self._detail())

    def close(self) -> float:
        self.bar.finish(self._detail())
        return time.perf_counter() - self.start


def _write(budget, spill, total: int, out) -> tuple[list[str], list[int], float, float]:
    """Generate and write; return paths, per-chunk sums, seconds in the pager, seconds in all."""
    rng = np.random.default_rng(2024)
    paths, sums, writer, pager_s = [], [], None, 0.0
    chunks_per_file = max(FILE_SIZE // CHUNK, 1)
    n_chunks = -(-total // CHUNK)
    bar = _Bytes("write", n_chunks * CHUNK, out)
    try:
        for i in range(n_chunks):
            with budget.reservation(CHUNK, "generated chunk"):
                chunk = rng.integers(-(1 << 63), (1 << 63) - 1, CHUNK // 8, dtype=np.int64,
                                     endpoint=True)
                sums.append(int(chunk.sum()))
                t0 = time.perf_counter()
                if writer is None:
                    writer = PageWriter(spill, "demo")
                writer.add_region(f"chunk{i:06d}", chunk,
                                  meta={"column": "values", "raw_bytes": chunk.nbytes})
                del chunk
                if (i + 1) % chunks_per_file == 0 or i == n_chunks - 1:
                    writer.finish().close()
                    paths.append(writer.path)
                    writer = None
                pager_s += time.perf_counter() - t0
            bar.update(CHUNK)
    finally:
        if writer is not None:
            writer.abort()
        seconds = bar.close()
    return paths, sums, pager_s, seconds


def _scan(budget, paths, sums, out) -> tuple[int, float]:
    bar = _Bytes("scan", len(sums) * CHUNK, out)
    scanned = 0
    try:
        for path in paths:
            pf = PageFile.open(path, budget=budget)
            try:
                for name in pf.regions:
                    values = pf.numpy(name, np.int64)
                    got, want = int(values.sum()), sums[int(name[len("chunk"):])]
                    if got != want:
                        raise AssertionError(f"{path}, region {name!r}: sum {got} != {want}")
                    scanned += values.nbytes
                    del values
                    pf.release(name)
                    bar.update(CHUNK)
            finally:
                pf.close()
    finally:
        seconds = bar.close()
    return scanned, seconds


def run(budget="64MiB", factor=8, spill_dir=None, out=sys.stderr) -> dict:
    """Write ``factor`` x ``budget`` through the pager, scan it back; return the figures."""
    limit = parse_size(budget)
    if factor <= 0:
        raise ValueError(f"factor must be positive, got {factor!r}")
    total = int(limit * factor)
    mem = MemoryBudget(limit, sample_interval=0.02)
    spill = SpillDirectory(spill_dir)
    try:
        out.write(f"spill demo: {format_size(total)} ({factor}x a {format_size(limit)} budget) "
                  f"through page files in {spill.path}\n")
        paths, sums, write_s, elapsed_s = _write(mem, spill, total, out)
        spilled = spill.bytes_written
        scanned, scan_s = _scan(mem, paths, sums, out)
        mem.close()
        stats = mem.stats()
    finally:
        mem.close()
        spill.close()
    over = stats["peak_rss_over_baseline_bytes"]
    result = {
        "budget_bytes": limit, "factor": factor, "bytes_generated": len(sums) * CHUNK,
        "bytes_spilled": spilled, "bytes_scanned": scanned, "page_files": len(paths),
        "write_seconds": write_s, "generate_and_write_seconds": elapsed_s,
        "scan_seconds": scan_s,
        "write_MBps": len(sums) * CHUNK / write_s / 1e6 if write_s else 0.0,
        "scan_MBps": scanned / scan_s / 1e6 if scan_s else 0.0,
        "baseline_rss_bytes": stats["baseline_rss_bytes"],
        "peak_rss_bytes": stats["peak_rss_bytes"],
        "peak_rss_over_baseline_bytes": over, "rss_allowance_bytes": RSS_ALLOWANCE,
        "peak_held_bytes": stats["peak_held_bytes"],
        "within_budget": over <= limit + RSS_ALLOWANCE,
    }
    out.write(
        f"wrote   {format_size(spilled)} in {len(paths)} page files: "
        f"{result['write_MBps']:,.0f} MB/s in the pager ({elapsed_s:.1f}s with generation)\n"
        f"scanned {format_size(scanned)}, every chunk's sum checked: "
        f"{result['scan_MBps']:,.0f} MB/s\n"
        f"peak RSS over baseline {format_size(over)} against budget {format_size(limit)} + "
        f"allowance {format_size(RSS_ALLOWANCE)}: "
        f"{'within' if result['within_budget'] else 'OVER'}\n")
    out.flush()
    return result
