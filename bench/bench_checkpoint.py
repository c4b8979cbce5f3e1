"""Checkpoint benchmark: the orders arrangement of bench/compare.py made durable.

One process builds (arrange orders and customers from Parquet under 512 MiB, merged as
the warm case leaves them), checkpoints both, inserts the 1% delta of bench/compare.py
and checkpoints again, then times the warm query (``group_by(join(...))`` per region).
A second, fresh process loads the newest versions and times the same query. Figures,
as ratios of the same run:

- ``write_ratio``: the first checkpoint's bytes per second over raw sequential writes of
  as many bytes (8 MiB ``os.write`` calls, then one fsync; the better of two) -- target
  >= 0.8;
- ``delta_bytes_ratio`` / ``delta_time_ratio``: the second checkpoint's bytes and time
  over the first's -- targets <= 0.03 and <= 0.05;
- ``load_ratio``: loading both traces over arranging them -- target <= 0.01; loading
  decodes no payload (nothing is mapped or reserved once it returns);
- ``query_ratio``: the warm query after loading in the new process over the same query
  in the building process -- target <= 1.5.

The delta goes into a trace that is its directory's writer: its page file is written
there as the insert arrives (the insert's time is reported beside), and the checkpoint
fsyncs and names it.

Scale: smoke (0.005) by default, one run, asserting what small data can show (the delta
checkpoint's bytes, nothing decoded at load, equal results); ``ARRANGEDB_BENCH_SCALE=full``
runs 40M x 4M three times and asserts every target on the median of each ratio.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _orders  # noqa: E402

SCALE = _orders.default_scale()
FULL = _orders.env_full()
BUDGET = "512MiB"


def _query(engine, orders_t, customers_t):
    from arrangedb import group_by, join

    return group_by(join(orders_t, customers_t), by="region", aggs=_orders.AGGS,
                    engine=engine).read_all().sort_by("region")


def _best_of(n, fn):
    best, out = float("inf"), None
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _raw_write_seconds(directory: str, nbytes: int) -> float:
    block = os.urandom(8 << 20)
    path = os.path.join(directory, "raw.bin")
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, block[: min(left, len(block))])
        os.fsync(fd)
    finally:
        os.close(fd)
    seconds = time.perf_counter() - t0
    os.unlink(path)
    return seconds


def build(paths: dict, root: str) -> dict:
    import arrangedb

    with arrangedb.Engine(spill_dir=root, memory_budget=BUDGET) as engine:
        t0 = time.perf_counter()
        orders_t, customers_t = _orders.ad_build(engine, paths)
        arrange_s = time.perf_counter() - t0
        orders_t.merge_all()
        customers_t.merge_all()
        t0 = time.perf_counter()
        orders_t.checkpoint(os.path.join(root, "orders"))
        first_s = time.perf_counter() - t0
        customers_t.checkpoint(os.path.join(root, "customers"))
        first_bytes = arrangedb.versions(os.path.join(root, "orders"))[-1]["new_bytes"]
        raw_s = min(_raw_write_seconds(root, first_bytes) for _ in range(2))
        delta = _orders.delta_updates(paths)
        t0 = time.perf_counter()
        orders_t.insert(delta, time="t", diff="d")
        insert_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        orders_t.checkpoint()
        second_s = time.perf_counter() - t0
        second_bytes = arrangedb.versions(os.path.join(root, "orders"))[-1]["new_bytes"]
        query_s, result = _best_of(3, lambda: _query(engine, orders_t, customers_t))
    return {"arrange_s": arrange_s, "insert_s": insert_s, "first_s": first_s, "first_bytes": first_bytes,
            "raw_s": raw_s, "second_s": second_s, "second_bytes": second_bytes,
            "query_s": query_s, "result": _orders.as_result(result)}


def load(root: str) -> dict:
    import arrangedb

    with arrangedb.Engine(spill_dir=root, memory_budget=BUDGET) as engine:
        t0 = time.perf_counter()
        orders_t = engine.load(os.path.join(root, "orders"))
        customers_t = engine.load(os.path.join(root, "customers"))
        load_s = time.perf_counter() - t0
        held_after_load = engine.stats()["held_bytes"]
        query_s, result = _best_of(3, lambda: _query(engine, orders_t, customers_t))
    return {"load_s": load_s, "held_after_load": held_after_load, "query_s": query_s,
            "result": _orders.as_result(result)}


def _worker(kind: str, *args) -> dict:
    out = subprocess.run([sys.executable, __file__, kind, *map(json.dumps, args)],
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"{kind} worker failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


ROUNDS = 3 if FULL else 1   # whole scenarios; the median of each ratio is asserted


def _ratios(built: dict, loaded: dict) -> dict:
    return {
        "write_ratio": built["raw_s"] / built["first_s"],   # bytes/s over raw bytes/s
        "delta_bytes_ratio": built["second_bytes"] / built["first_bytes"],
        "delta_time_ratio": built["second_s"] / built["first_s"],
        "load_ratio": loaded["load_s"] / built["arrange_s"],
        "query_ratio": loaded["query_s"] / built["query_s"],
    }


def test_checkpoint_write_delta_load_and_query(benchmark):
    paths = _orders.ensure_data(SCALE)
    runs = []

    def run():
        for _ in range(ROUNDS):
            with tempfile.TemporaryDirectory(prefix="arrangedb-bench-ckpt-") as root:
                built = _worker("build", paths, root)
                loaded = _worker("load", root)
            runs.append((built, loaded))

    benchmark.pedantic(run, rounds=1, iterations=1)
    per_run = [_ratios(b, lo) for b, lo in runs]
    ratios = {k: statistics.median(r[k] for r in per_run) for k in per_run[0]}
    benchmark.extra_info.update({"scale": SCALE, "runs": [
        {**{k: v for k, v in b.items() if k != "result"}, "load_s": lo["load_s"],
         "loaded_query_s": lo["query_s"]} for b, lo in runs], **ratios})
    for (built, loaded), r in zip(runs, per_run):
        print(f"\ncheckpoint, scale {SCALE:g}: first {built['first_bytes'] / 1e6:.1f} MB in "
              f"{built['first_s']:.3f} s (raw write+fsync {built['raw_s']:.3f} s); a 1% delta "
              f"inserted in {built['insert_s']:.3f} s, checkpointed: "
              f"{built['second_bytes'] / 1e6:.2f} MB in {built['second_s']:.3f} s; load "
              f"{loaded['load_s']:.3f} s vs arrange {built['arrange_s']:.2f} s; warm query "
              f"{built['query_s']:.3f} s built, {loaded['query_s']:.3f} s loaded\n" +
              "; ".join(f"{k} {v:.3f}" for k, v in r.items()))
    print("median of runs: " + "; ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    for built, loaded in runs:
        assert loaded["result"] == built["result"]
        assert loaded["held_after_load"] == 0, "loading decoded or mapped payload"
    # small files are mostly headers and directories: at smoke size the delta's share
    # is larger, but still a small fraction (a full rewrite would be ~1)
    if not FULL:
        assert ratios["delta_bytes_ratio"] <= 0.1
        return
    assert ratios["load_ratio"] <= 0.01
    assert ratios["query_ratio"] <= 1.5
    assert ratios["write_ratio"] >= 0.8
    assert ratios["delta_bytes_ratio"] <= 0.03
    assert ratios["delta_time_ratio"] <= 0.05


if __name__ == "__main__":
    kind, *args = sys.argv[1:]
    fn = {"build": build, "load": load}[kind]
    print(json.dumps(fn(*map(json.loads, args))))
