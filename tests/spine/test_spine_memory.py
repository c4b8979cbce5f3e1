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


WIDE_SCRIPT = textwrap.dedent("""
    import json, sys, zlib
    import numpy as np, pyarrow as pa
    from arrangedb import Engine
    from arrangedb.pager import RSS_ALLOWANCE

    budget, width, root = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    n = 4 * budget // width          # 4x the budget in string bytes alone
    step = (8 << 20) // width        # input batches of ~8 MiB
    expected = {"rows": n, "crc": 0}

    def generate():
        rng = np.random.default_rng(0)
        pad = "x" * (width - 8)
        for lo in range(0, n, step):
            m = min(step, n - lo)
            yield pa.record_batch({"k": rng.integers(0, n // 2, m),
                                   "s": pa.array([pad + "%08d" % i for i in range(lo, lo + m)])})

    with Engine(spill_dir=root, memory_budget=budget) as engine:
        trace = engine.arrange(generate(), key=["k"], vals=["s"])
        rows, ids = 0, []
        for b in trace.snapshot():
            rows += int(b.column("count").to_numpy().sum())
            ids.append(pa.compute.utf8_slice_codeunits(b.column("s"), width - 8).cast(pa.int64()))
        stats, batches = engine.stats(), len(trace.batches())
    ids = np.sort(np.concatenate([a.to_numpy() for a in ids]))
    print(json.dumps({"rows": rows, "expected_rows": n,
                      "ids_are_every_row_once": bool((ids == np.arange(n)).all()),
                      "batches": batches,
                      "grown": stats["peak_rss_bytes"] - stats["baseline_rss_bytes"],
                      "allowance": RSS_ALLOWANCE}))
""")


@pytest.mark.slow
def test_rows_of_long_strings_are_merged_and_read_within_the_budget(tmp_path):
    """A merge step is sized in bytes, not rows alone: 400-byte strings 4x the budget,
    sorted into runs and merged down, stay within it."""
    budget = 48 << 20
    out = subprocess.run([sys.executable, "-c", WIDE_SCRIPT, str(budget), "400",
                          str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["rows"] == r["expected_rows"] and r["ids_are_every_row_once"]
    print(f"peak RSS over baseline {r['grown'] / 2**20:.0f} MiB, "
          f"limit {(budget + r['allowance']) / 2**20:.0f} MiB, {r['batches']} batches")
    assert r["grown"] <= budget + r["allowance"]


SETTLED_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, pyarrow as pa
    from arrangedb import Engine
    from arrangedb.pager import RSS_ALLOWANCE

    budget, root = int(sys.argv[1]), sys.argv[2]
    rng = np.random.default_rng(1)
    total = {"count": 0, "val_sum": 0}

    def batches(n, step=1 << 16):
        for lo in range(0, n, step):
            k = rng.integers(0, 1 << 40, min(step, n - lo))
            v = rng.integers(0, 1 << 20, len(k))
            total["count"] += len(k)
            total["val_sum"] += int(v.sum())
            yield pa.record_batch({"k": k, "v": v})

    rows = 4 * budget // 16
    with Engine(spill_dir=root, memory_budget=budget) as engine:
        trace = engine.arrange(batches(rows), key=["k"], vals=["v"])
        engine.wait_merged()
        settled = [len(b.parts) for b in trace.batches()]
        for _ in range(3):   # inserts the spine merges into batches of large parts
            trace.insert(pa.Table.from_batches(list(batches(rows // 4))))
        shape = [len(b) for b in trace.batches()]
        count = val_sum = 0
        for b in trace.snapshot():
            c = b.column("count").to_numpy()
            count += int(c.sum())
            val_sum += int((b.column("v").to_numpy() * c).sum())
        stats = engine.stats()
        large = engine.ctx.large_part_bytes > engine.ctx.part_bytes
    print(json.dumps({"expected": total, "got": {"count": count, "val_sum": val_sum},
                      "settled_parts": settled, "batches": shape, "large": large,
                      "peak_rss": stats["peak_rss_bytes"],
                      "baseline_rss": stats["baseline_rss_bytes"], "allowance": RSS_ALLOWANCE}))
""")


@pytest.mark.slow
def test_reading_settled_batches_of_large_parts_stays_within_the_budget(tmp_path):
    """A trace settled into batches of large parts, then written to (its merges cut
    large parts again) and read whole while several such batches coexist."""
    budget = 32 << 20
    out = subprocess.run([sys.executable, "-c", SETTLED_SCRIPT, str(budget), str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["got"] == r["expected"]
    assert r["large"] and len(r["settled_parts"]) == 1
    assert len(r["batches"]) >= 2, "the inserts were all merged into one batch"
    grown = r["peak_rss"] - r["baseline_rss"]
    assert grown <= budget + r["allowance"]


ONE_ROW_GROUP_SCRIPT = textwrap.dedent("""
    import json, sys
    from arrangedb import Engine
    from arrangedb.pager import RSS_ALLOWANCE
    budget, path, root = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    with Engine(spill_dir=root, memory_budget=budget) as engine:
        trace = engine.arrange(path, key=["k"], vals=["x", "y"])
        stats = engine.stats()
        rows = trace.stats()["updates"]
    print(json.dumps({"rows": rows, "allowance": RSS_ALLOWANCE,
                      "grown": stats["peak_rss_bytes"] - stats["baseline_rss_bytes"]}))
""")


@pytest.mark.slow
def test_a_parquet_file_of_one_row_group_six_times_the_budget_is_read_within_it(tmp_path):
    """A file written as one row group (192 MiB at a 32 MiB budget) is read a buffer at a
    time, in batches of bounded bytes: pyarrow otherwise holds the whole row group's
    column chunks, out of the budget's sight (the engine grew ~200 MiB)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    budget = 32 << 20
    n = 6 * budget // 24
    rng = np.random.default_rng(1)
    path = tmp_path / "one-row-group.parquet"
    pq.write_table(pa.table({"k": rng.integers(0, n, n), "x": rng.integers(0, 1 << 40, n),
                             "y": rng.random(n)}), path, row_group_size=n, compression="zstd")
    out = subprocess.run([sys.executable, "-c", ONE_ROW_GROUP_SCRIPT, str(budget), str(path),
                          str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["rows"] == n
    print(f"peak RSS over baseline {r['grown'] / 2**20:.0f} MiB, "
          f"limit {(budget + r['allowance']) / 2**20:.0f} MiB")
    assert r["grown"] <= budget + r["allowance"]
