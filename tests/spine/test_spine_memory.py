"""Memory is a contract: arranging and reading back 8x the budget stays within it.

Runs in a fresh interpreter (a subprocess) so that the process RSS the budget samples is
the engine's and not the test runner's. The data is generated batch by batch, so the
input itself never sits in memory; correctness is checked with sums computed on the way.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, pyarrow as pa
    from arrangedb import Engine
    from arrangedb.pager import RSS_ALLOWANCE

    budget, factor, root = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    rows_per_batch = 1 << 16
    row_bytes = 8 + 8               # key and val: a snapshot stores no time/diff per row
    batches = factor * budget // (row_bytes * rows_per_batch)
    expected = {"rows": 0, "key_sum": 0, "val_sum": 0}

    def generate():
        rng = np.random.default_rng(0)
        for i in range(batches):
            k = rng.integers(0, 1 << 40, rows_per_batch)
            v = rng.integers(0, 1 << 20, rows_per_batch)
            expected["rows"] += rows_per_batch
            expected["key_sum"] += int(k.sum())
            expected["val_sum"] += int(v.sum())
            yield pa.record_batch({"k": k, "v": v})

    with Engine(spill_dir=root, memory_budget=budget) as engine:
        trace = engine.arrange(generate(), key=["k"], vals=["v"])
        rows = key_sum = val_sum = 0
        last = -1
        ordered = True
        for b in trace.snapshot():
            k = b.column("k").to_numpy()
            c = b.column("count").to_numpy()
            ordered &= bool(k[0] >= last) and bool((np.diff(k) >= 0).all())
            last = int(k[-1])
            rows += int(c.sum())
            key_sum += int((k * c).sum())
            val_sum += int((b.column("v").to_numpy() * c).sum())
        stats = engine.stats()
    print(json.dumps({"expected": expected, "got": {"rows": rows, "key_sum": key_sum,
                      "val_sum": val_sum}, "ordered": ordered,
                      "peak_rss": stats["peak_rss_bytes"],
                      "baseline_rss": stats["baseline_rss_bytes"], "spilled": stats["bytes_spilled"],
                      "allowance": RSS_ALLOWANCE}))
""")


@pytest.mark.slow
def test_arrange_and_read_back_eight_times_the_budget(tmp_path):
    budget = 32 << 20
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(budget), "8", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["got"] == r["expected"]
    assert r["ordered"]
    # compressed by the codecs, and written once: runs are read k-way, not merged first
    assert r["spilled"] >= 2 * budget, "the data did not go through the page files"
    grown = r["peak_rss"] - r["baseline_rss"]
    peak_mib = grown / 2**20
    limit_mib = (budget + r["allowance"]) / 2**20
    print(f"peak RSS over baseline {peak_mib:.0f} MiB, limit {limit_mib:.0f} MiB, "
          f"spilled {r['spilled'] / 2**20:.0f} MiB")
    assert grown <= budget + r["allowance"]
