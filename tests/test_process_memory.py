"""The memory contract as a container limit sees it: a fresh process that arranges and
joins 8x its budget peaks within ``budget + PROCESS_RSS_ALLOWANCE`` of RSS, counted from
the process's start -- the interpreter, numpy, pyarrow, pandas (which pyarrow imports)
and arrangedb's code included. The natural plan, ``group_by(join(...))``, from Parquet
files written by another process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

WRITE = textwrap.dedent("""
    import sys, numpy as np, pyarrow as pa, pyarrow.parquet as pq
    budget, folder = int(sys.argv[1]), sys.argv[2]
    n_orders = 8 * budget // 32          # 4 int64 columns: 8x the budget
    n_customers = n_orders // 10
    rng = np.random.default_rng(7)
    cols = ["customer_id", "amount", "qty", "day"]
    with pq.ParquetWriter(f"{folder}/orders.parquet",
                          pa.schema([(c, pa.int64()) for c in cols])) as w:
        for start in range(0, n_orders, 1 << 20):
            n = min(1 << 20, n_orders - start)
            w.write_table(pa.table({"customer_id": rng.integers(0, n_customers, n),
                                    "amount": rng.integers(0, 1000, n),
                                    "qty": rng.integers(0, 10, n),
                                    "day": rng.integers(0, 365, n)}))
    k = np.arange(n_customers)
    pq.write_table(pa.table({"customer_id": k, "region": k % 20, "segment": k % 5, "x": k}),
                   f"{folder}/customers.parquet")
""")

JOB = textwrap.dedent("""
    import json, sys
    budget, folder = int(sys.argv[1]), sys.argv[2]
    import arrangedb as adb
    from arrangedb.pager import PROCESS_RSS_ALLOWANCE

    with adb.Engine(spill_dir=f"{folder}/spill", memory_budget=budget) as e:
        orders = e.arrange(f"{folder}/orders.parquet", key=["customer_id"])
        customers = e.arrange(f"{folder}/customers.parquet", key=["customer_id"])
        out = adb.group_by(adb.join(orders, customers), by="region",
                           aggs={"orders": ("count", None),
                                 "amount": ("sum", "amount")}).read_all()
        s = e.stats()
    # the kernel's high-water mark of this process's memory since exec (ru_maxrss would
    # also count the RSS of the parent that spawned it, whose memory it shared until exec)
    with open("/proc/self/status") as f:
        peak = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
    print(json.dumps({"orders": out.column("orders").to_pylist(), "groups": out.num_rows,
                      "peak": peak, "engine_peak": s["peak_rss_bytes"],
                      "before_code": s["rss_before_engine_code_bytes"],
                      "over_before_code": s["peak_rss_over_before_engine_code_bytes"],
                      "spilled": s["bytes_spilled"], "allowance": PROCESS_RSS_ALLOWANCE}))
""")


@pytest.mark.slow
def test_whole_process_within_budget_plus_allowance(tmp_path):
    budget = 64 << 20
    subprocess.run([sys.executable, "-c", WRITE, str(budget), str(tmp_path)], check=True,
                   timeout=300)
    out = subprocess.run([sys.executable, "-c", JOB, str(budget), str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["groups"] == 20 and sum(r["orders"]) == 8 * budget // 32
    assert r["spilled"] >= 2 * budget, "the inputs did not go through page files"
    # the engine's own figures agree with the kernel's high-water mark
    assert r["before_code"] < r["engine_peak"] <= r["peak"] + (4 << 20)
    assert r["over_before_code"] == r["engine_peak"] - r["before_code"]
    print(f"whole process peak {r['peak'] / 2**20:.0f} MiB, "
          f"limit {(budget + r['allowance']) / 2**20:.0f} MiB")
    assert r["peak"] <= budget + r["allowance"]
