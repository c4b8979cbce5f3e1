"""arrangedb vs DuckDB on one query: orders x customers on customer_id, count and sum(amount)
per region -- cold (from Parquet), warm (arrangements / tables built) and incremental (1% of
orders updated), under the same memory budget, measured in the same run.

    python bench/compare.py [--scale S] [--budget 512MiB] [--budget 128MiB] [--threads 2]
                            [--amounts float|int64] [--json OUT.json] [--plot OUT.png]

``--scale`` defaults to the smoke scale (0.005), or 1.0 (40M orders x 4M customers) with
``ARRANGEDB_BENCH_SCALE=full``. ``--budget`` may be repeated (default: 512MiB and 128MiB);
DuckDB gets the same figure as ``memory_limit`` (512MiB -> '512MB'). Data are generated
once per scale with a fixed seed under ``tempfile.gettempdir()/arrangedb-bench``.

Each (system, case, budget) runs in its own subprocess (see ``bench/_orders.py`` for why,
and for exactly what each case and plan measures). The table gives per case and
arrangedb plan: both times, the ratio DuckDB time / arrangedb time (> 1: arrangedb is
faster), the peak RSS of the timed phase over the RSS right before it (``peak``), the
RSS already held when the timed phase started (``held``: arrangements or loaded tables),
what arrangedb spilled, and whether the two results are equal (counts exactly, sums to a
relative 1e-9). The exit status is 1 when any result differs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _orders  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=_orders.default_scale(),
                    help=f"data scale (smoke {_orders.SMOKE_SCALE}, full {_orders.FULL_SCALE};"
                         " default from ARRANGEDB_BENCH_SCALE)")
    ap.add_argument("--budget", action="append", default=None,
                    help="memory budget, repeatable (default: 512MiB and 128MiB)")
    ap.add_argument("--threads", type=int, default=2, help="DuckDB threads (and Arrow's)")
    ap.add_argument("--case", action="append", choices=_orders.CASES, default=None,
                    help="run only these cases (repeatable; default: all)")
    ap.add_argument("--amounts", choices=_orders.AMOUNTS, default="float",
                    help="amounts as two-decimal float64 (default) or int64 cents")
    ap.add_argument("--json", default=None, help="also write every figure to this file")
    ap.add_argument("--plot", default=None, metavar="OUT.png",
                    help="also draw the times side by side, with the ratios, and each "
                         "run's RSS over time against its budget (needs matplotlib)")
    args = ap.parse_args(argv)
    budgets = args.budget or list(_orders.BUDGETS)
    cases = args.case or list(_orders.CASES)

    t0 = time.perf_counter()
    print(f"data: scale {args.scale:g} (generating if needed) ...", flush=True)
    paths = _orders.ensure_data(args.scale, amounts=args.amounts)
    print(f"data ready in {time.perf_counter() - t0:.1f}s: {paths['orders']}", flush=True)
    results = _orders.run_all(args.scale, budgets=budgets, threads=args.threads, cases=cases,
                              log=lambda m: print(m, flush=True), amounts=args.amounts)
    rows = [row for (budget, case), res in results.items()
            for row in _orders.rows_of(budget, case, res)]
    print()
    print(f"orders x customers -> count, sum(amount) per region; scale {args.scale:g}, "
          f"{args.amounts} amounts, threads {args.threads}; "
          f"ratio = DuckDB s / arrangedb s (> 1: arrangedb faster);")
    print("peak = peak RSS of the timed phase over the RSS before it; held = RSS held when it "
          "started; spill = arrangedb bytes spilled (cumulative)")
    print(_orders.format_table(rows))
    print(f"\ntotal wall time {time.perf_counter() - t0:.1f}s")
    bad = [r for r in rows if not r["equal"]]
    for r in bad:
        print(f"MISMATCH {r['budget']} {r['case']} {r['plan']}: {'; '.join(r['problems'])}")
    raw = {f"{b}/{c}": r for (b, c), r in results.items()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"scale": args.scale, "threads": args.threads, "rows": rows,
                       "raw": raw}, f, indent=1)
    if args.plot:
        import plots

        plots.compare_chart(rows, raw, args.plot,
                            f"orders x customers, count and sum per region; scale "
                            f"{args.scale:g}, {args.threads} threads; label: DuckDB s / "
                            f"arrangedb s")
        print(f"chart: {args.plot}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
