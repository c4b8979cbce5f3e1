"""Shared code of the orders x customers join benchmark (bench/compare.py, bench/bench_join.py).

The query
---------
``orders`` (order_id, customer_id, amount, status) joined with ``customers``
(customer_id, name, region) on customer_id; per region, the number of orders and the sum
of their amounts. Data come from :func:`arrangedb.tools.datagen.generate` (fixed seed),
cached under ``tempfile.gettempdir()/arrangedb-bench/scale-<S>``; smoke scale is 0.005,
full scale 1.0 (40M orders x 4M customers).

Cases (each measured for arrangedb and DuckDB, at one memory budget):

``cold``
    From the Parquet files. arrangedb: arrange orders by customer_id (vals [amount]) and
    customers by customer_id (vals [region]), then the natural query
    ``group_by(join(orders_t, customers_t), by="region", aggs=...)``; the time is the
    total. DuckDB: the query straight over ``read_parquet``. Before either, the files
    are read once, untimed (:func:`read_through`): cold means from the files, not from
    the disk.
``warm``
    Arrangements / tables already built (not timed); only the query is timed. After the
    build the engine is left idle until its idle merger has settled the traces
    (``engine.wait_merged()``, not timed: time passing, no merge asked for). arrangedb
    has four plans, reported separately:

    * ``natural``: ``group_by(join(orders_t, customers_t), by="region", aggs=...)`` --
      what a newcomer writes, with no option; the planner runs it as eager aggregation
      (``plan.explain()`` says so);
    * ``plain``: ``group_by(join(orders_t, customers_t, expand=True,
      read_dictionary=["region"]), by="region")`` -- a full merge join of the two
      arrangements with SQL bag semantics (one row per order: a multiset reader, so
      the join need not consolidate runs by val, only merge them by key); region comes
      out as dictionary codes, which group_by counts with ``bincount``;
    * ``fused``: ``join_group_by(orders_t, customers_t, by="region")`` -- the same
      query over the same two arrangements, with count and sum(amount) pushed below the
      join (eager aggregation): orders are summed per customer straight off their stored
      layout, and each customer's region meets one partial row instead of its orders.
      The same work DuckDB is asked for (it could aggregate below the join too); its
      incremental form is the ``plain`` plan's change join.
    * ``preagg``: built alongside the arrangements (not timed), an arrangement of
      orders reduced per customer (``reduce(orders_t, n=count, s=sum(amount))``,
      arranged by customer_id); the warm query joins that key-level arrangement
      (<= 4M rows instead of 40M) with customers and sums n and s per region. This is
      the differential-dataflow way -- a shared, maintained arrangement -- and is *not*
      the same amount of work as DuckDB's query: DuckDB is given no such index.

    DuckDB: tables created from Parquet in a database file (not timed), the query timed.

    Each warm figure is the median of ``WARM_RUNS`` runs of the query, one after the
    other (arrangedb: each plan's runs in a row), for both systems: a single run on this
    machine varies by a fifth and more, and the first query after the idle merger
    settled a trace also maps and checks its new pages for the first time.
``incremental``
    1% of orders (a fixed-seed sample of order ids) get new amounts. arrangedb inserts
    the delta into the orders trace at time 1 (old amount with diff -1, new amount with
    diff +1), computes the result's change with ``group_by(join(..., since=1,
    upto=2), by="region", aggs=...)`` and adds it to the previous result (``natural``;
    ``plain`` is the same with ``read_dictionary`` and ``weight="diff"`` spelled out);
    the pre-aggregated plan aggregates the orders' changes per customer (count and sum
    are linear), looks up the touched customers' old rows in its key-level arrangement,
    inserts their retraction and replacement at time 1 and joins *that* incrementally
    with customers (``preagg``). Both times include the insert into the
    orders trace. DuckDB: ``UPDATE`` its table from the delta and recompute the query.
    The end results of every plan are checked equal to DuckDB's.

Measurement: one subprocess per (system, case, budget)
------------------------------------------------------
Every measurement runs in a fresh interpreter (``python bench/_orders.py --worker ...``
prints one JSON line), so neither system sees the other's memory, and no case sees the
memory an earlier case left behind (DuckDB's buffer pool and Arrow's/glibc's allocators
give freed memory back lazily, which would hide a later case's peak). The untimed setup
(building arrangements, loading tables) is repeated per subprocess; this costs build
time at full scale but keeps every figure clean.

Peak RSS is "peak during the timed phase minus RSS right before it":

* arrangedb: the engine's ``stats()["peak_rss_bytes"] - stats()["baseline_rss_bytes"]``.
  For ``cold`` the engine is created at the start of the timed phase, so this is
  exactly the engine's figure. For ``warm``/``incremental`` the engine's peak counter is
  restarted at the start of the timed phase (``budget.peak_rss = budget.rss()``; the
  baseline, hence the budget's behaviour, is left alone) and the figure is the peak
  minus the RSS at that point; the resident state held by then (arrangements, pages)
  is reported separately as ``held_before``. The engine's own lifetime figure (peak
  over its baseline, build included) is kept as ``engine_peak_over_baseline``.
  The warm plans run one after the other in the same subprocess, each in its own
  window; the incremental case has one window over the insert and both plans' changes.
  Neither system's allocators are trimmed before a timed phase: each reuses the memory
  it holds, as a live process does.
* DuckDB: the process RSS sampled by a thread every 20 ms (psutil) during the timed
  phase, minus the RSS right before; ``held_before`` is the RSS after loading the
  tables minus the RSS of the fresh process.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import arrangedb  # noqa: F401 -- first, as its programs do: it tunes numpy and Arrow as they load
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

SMOKE_SCALE = 0.005
FULL_SCALE = 1.0
SEED = 42
DELTA_SEED = 7
DELTA_FRACTION = 0.01
REL_TOL = 1e-9
LOOKUP_CHUNK = 1 << 19
CASES = ("cold", "warm", "incremental")
WARM_RUNS = 3   # runs of each warm query; the median is reported
BUDGETS = {"512MiB": "512MB", "128MiB": "128MB"}   # arrangedb budget -> DuckDB memory_limit

AGGS = {"orders": ("count", None), "amount": ("sum", "amount")}
PREAGGS = {"n": ("count", None), "s": ("sum", "amount")}
PREAGG_SUMS = {"orders": ("sum", "n"), "amount": ("sum", "s")}
REGION = ["region"]   # joins hand region over as dictionary codes: group_by bincounts them

QUERY = """
SELECT c.region AS region, count(*) AS orders, sum(o.amount) AS amount
FROM {orders} o JOIN {customers} c ON o.customer_id = c.customer_id
GROUP BY c.region ORDER BY c.region
"""


def duckdb_limit(budget: str) -> str:
    """DuckDB's memory_limit for an arrangedb budget: '512MiB' -> '512MB' (as the issue)."""
    return BUDGETS.get(budget) or budget.replace("iB", "B")


def env_full() -> bool:
    return os.environ.get("ARRANGEDB_BENCH_SCALE", "smoke") == "full"


def default_scale() -> float:
    return FULL_SCALE if env_full() else SMOKE_SCALE


def bench_root() -> Path:
    return Path(tempfile.gettempdir()) / "arrangedb-bench"


# -- data -------------------------------------------------------------------------------------
AMOUNTS = ("float", "int64")   # two-decimal float64 amounts, or int64 cents


def ensure_data(scale: float, seed: int = SEED, amounts: str = "float") -> dict:
    """Generate (or reuse) the Parquet files and the 1% delta; return their paths.
    ``amounts="int64"``: the same data with every amount as int64 cents."""
    from arrangedb.tools.datagen import generate

    if amounts not in AMOUNTS:
        raise ValueError(f"amounts must be one of {AMOUNTS}, not {amounts!r}")
    root = bench_root() / f"scale-{scale:g}-seed-{seed}"
    info = generate(root, scale=scale, seed=seed)
    paths = {"orders": info["orders"], "customers": info["customers"]}
    paths["delta"] = str(_ensure_delta(root, paths["orders"], _num_rows(paths["orders"])))
    if amounts == "int64":
        for name, columns in (("orders", ["amount"]), ("delta", ["old_amount", "new_amount"])):
            paths[name] = str(_as_cents(Path(paths[name]), columns))
    return paths


def _as_cents(path: Path, columns: list[str]) -> Path:
    """``path`` with ``columns`` (two-decimal floats) as int64 cents, row group by row
    group (written once, beside it)."""
    out = path.with_name(f"{path.stem}-cents.parquet")
    if out.exists():
        return out
    src = pq.ParquetFile(path)
    tmp = out.with_suffix(".tmp")
    with pq.ParquetWriter(tmp, _cents_schema(src.schema_arrow, columns)) as w:
        for g in range(src.num_row_groups):
            t = src.read_row_group(g)
            for c in columns:
                cents = pc.cast(pc.round(pc.multiply(t[c], 100.0)), pa.int64())
                t = t.set_column(t.column_names.index(c), c, cents)
            w.write_table(t)
    os.replace(tmp, out)
    return out


def _cents_schema(schema: pa.Schema, columns: list[str]) -> pa.Schema:
    return pa.schema([pa.field(f.name, pa.int64()) if f.name in columns else f
                      for f in schema])


def _num_rows(path: str) -> int:
    return pq.ParquetFile(path).metadata.num_rows


def rows_at(path: str, positions: np.ndarray, columns: list[str]) -> pa.Table:
    """The rows at sorted ``positions`` of a Parquet file, row group by row group."""
    pf = pq.ParquetFile(path)
    pieces, start = [], 0
    for g in range(pf.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        lo, hi = np.searchsorted(positions, [start, start + n])
        if hi > lo:
            t = pf.read_row_group(g, columns=columns)
            pieces.append(t.take(pa.array(positions[lo:hi] - start)))
        start += n
    return pa.concat_tables(pieces)


def _ensure_delta(root: Path, orders_path: str, n_orders: int) -> Path:
    """``delta.parquet``: order_id, customer_id, old_amount, new_amount for a fixed-seed 1%.

    order ids are 0..n-1 in file order (datagen writes them with arange), so the sample's
    rows are found by position, row group by row group (vectorized within each).
    """
    out = root / f"delta-{DELTA_SEED}.parquet"
    if out.exists():
        return out
    rng = np.random.default_rng(DELTA_SEED)
    k = max(1, int(round(n_orders * DELTA_FRACTION)))
    ids = np.sort(rng.choice(n_orders, size=k, replace=False)).astype(np.int64)
    new_amount = np.round(rng.uniform(1.0, 500_000.0, k), 2)
    t = rows_at(orders_path, ids, ["order_id", "customer_id", "amount"])
    if not np.array_equal(t["order_id"].to_numpy(), ids):
        raise RuntimeError("orders.parquet: order_id is not the row position")
    t = t.rename_columns(["order_id", "customer_id", "old_amount"])
    t = t.append_column("new_amount", pa.array(new_amount))
    tmp = out.with_suffix(".tmp")
    pq.write_table(t, tmp)
    os.replace(tmp, out)
    return out


# -- results ----------------------------------------------------------------------------------
def as_result(table: pa.Table) -> dict:
    """{region: [orders, amount]} from a table region, orders, amount (20 rows)."""
    cols = table.select(["region", "orders", "amount"]).to_pydict()
    return {r: [int(n), float(s)] for r, n, s in zip(cols["region"], cols["orders"],
                                                       cols["amount"])}


def add_change(result: pa.Table, change: pa.Table, by: str, names: list[str],
               count: str) -> pa.Table:
    """``result`` (a row per group) plus ``change`` (a row per changed group), as a reader
    keeps a small aggregate current; groups left with ``count`` 0 are gone. Both tables hold
    a row per group, so groups are matched by position (``index_in``), not by a hash join:
    Arrow's join wakes its thread pool and costs 1-6 ms on five rows."""
    at = pc.fill_null(pc.index_in(change[by], value_set=result[by]), -1).to_numpy()
    hit = at >= 0
    cols = {by: pa.concat_arrays([result[by].combine_chunks(),
                                  change[by].combine_chunks().filter(pa.array(~hit))])}
    for a in names:
        values = result[a].fill_null(0).to_numpy().copy()
        step = change[a].fill_null(0).to_numpy()
        values[at[hit]] += step[hit]
        cols[a] = pa.array(np.concatenate([values, step[~hit]]), result.schema.field(a).type)
    out = pa.table(cols)
    return out.filter(pc.not_equal(out[count], 0))


def apply_delta(result: pa.Table, delta: pa.Table) -> pa.Table:
    """previous result + per-region change (regions absent from the change keep theirs)."""
    d = delta.rename_columns(["region", "orders", "amount"])
    return add_change(result, d, "region", ["orders", "amount"], "orders").sort_by("region")


def compare_results(ours: dict, theirs: dict, rel_tol: float = REL_TOL) -> list[str]:
    """Differences between two {group: [aggregates]}: integers (counts) exact, floats
    (sums) to ``rel_tol``; an empty result is a difference too."""
    problems = []
    for g in sorted(set(ours) | set(theirs)):
        if g not in ours or g not in theirs:
            problems.append(f"{g}: only in {'ours' if g in ours else 'theirs'}")
            continue
        for i, (a, b) in enumerate(zip(ours[g], theirs[g])):
            if isinstance(a, int) and isinstance(b, int):
                if a != b:
                    problems.append(f"{g}: aggregate {i}: {a} != {b}")
            elif not math.isclose(a, b, rel_tol=rel_tol, abs_tol=0.0):
                problems.append(f"{g}: aggregate {i}: {a!r} != {b!r} (rel diff "
                                f"{abs(a - b) / max(abs(a), abs(b)):.3g})")
    if not ours or not theirs:
        problems.append("an empty result")
    return problems


# -- measurement ------------------------------------------------------------------------------
class RssSampler:
    """Peak RSS, sampled by a thread every ``interval`` seconds while the block runs: of
    this process, or with ``tree=True`` of it and all its descendants (a Spark driver, its
    JVM and the Python workers). ``timeline=True`` also keeps every sample as
    ``(seconds since the start, bytes)`` for the charts."""

    def __init__(self, interval: float = 0.02, tree: bool = False, timeline: bool = False):
        self.interval, self.tree = interval, tree
        self.proc = psutil.Process()
        self._stop = threading.Event()
        self.before = self.peak = 0
        self.samples: list[tuple[float, int]] | None = [] if timeline else None

    def rss(self) -> int:
        if not self.tree:
            return self.proc.memory_info().rss
        total = 0
        for p in [self.proc] + self.proc.children(recursive=True):
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass   # a worker that ended between the listing and the reading
        return total

    def _record(self) -> None:
        rss = self.rss()
        self.peak = max(self.peak, rss)
        if self.samples is not None:
            self.samples.append((time.perf_counter() - self._t0, rss))

    def _loop(self):
        while not self._stop.wait(self.interval):
            self._record()

    def __enter__(self):
        self._t0 = time.perf_counter()
        self.before = self.peak = self.rss()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._record()

    @property
    def delta(self) -> int:
        return self.peak - self.before

    def timeline(self, points: int = 400) -> list[tuple[float, int]]:
        """The samples, thinned to about ``points`` (each kept one the peak of its span)."""
        s = self.samples or []
        step = max(1, len(s) // points)
        return [max(s[i:i + step], key=lambda x: x[1]) for i in range(0, len(s), step)]


def _release():
    from arrangedb.pager import release_freed_memory

    release_freed_memory()


# -- arrangedb --------------------------------------------------------------------------------
def _read_all(reader: pa.RecordBatchReader) -> pa.Table:
    return reader.read_all()


def ad_build(engine, paths: dict):
    """Arrange orders (customer_id -> amount) and customers (customer_id -> region),
    straight from their Parquet files: the engine decodes only the columns it arranges,
    a batch ahead of its sort."""
    orders_t = engine.arrange(paths["orders"], key=["customer_id"], vals=["amount"],
                              name="orders")
    customers_t = engine.arrange(paths["customers"], key=["customer_id"], vals=["region"],
                                 name="customers")
    return orders_t, customers_t


def ad_build_preagg(engine, orders_t):
    """The key-level arrangement: orders reduced per customer (n, s), by customer_id."""
    from arrangedb import reduce

    return engine.arrange(reduce(orders_t, PREAGGS), key=["customer_id"], vals=["n", "s"],
                          name="orders_per_customer")


def ad_natural(engine, orders_t, customers_t) -> pa.Table:
    """The query as a newcomer writes it: no options; the planner picks the plan."""
    from arrangedb import group_by, join

    return _read_all(group_by(join(orders_t, customers_t), by="region", aggs=AGGS)
                     ).sort_by("region")


def ad_natural_change(engine, orders_t, customers_t) -> pa.Table:
    """The natural query's change over [1, 2): the join's changes, grouped (weighed by
    their diff, which the change stream marks)."""
    from arrangedb import group_by, join

    return _read_all(group_by(join(orders_t, customers_t, since=1, upto=2), by="region",
                              aggs=AGGS))


def ad_plain(engine, orders_t, customers_t) -> pa.Table:
    from arrangedb import group_by, join

    joined = join(orders_t, customers_t, expand=True, read_dictionary=REGION)
    return _read_all(group_by(joined, by="region", aggs=AGGS, weight="count",
                              engine=engine)).sort_by("region")


def ad_fused(engine, orders_t, customers_t) -> pa.Table:
    from arrangedb import join_group_by

    return _read_all(join_group_by(orders_t, customers_t, by="region", aggs=AGGS,
                                   engine=engine)).sort_by("region")


def ad_preagg(engine, preagg_t, customers_t) -> pa.Table:
    from arrangedb import group_by, join

    return _read_all(group_by(join(preagg_t, customers_t, read_dictionary=REGION), by="region",
                              aggs=PREAGG_SUMS, weight="count", engine=engine)
                     ).sort_by("region")


def delta_updates(paths: dict) -> pa.Table:
    """The delta as updates at time 1: old amounts with diff -1, new ones with diff +1."""
    d = pq.read_table(paths["delta"])
    n = d.num_rows
    cid = pa.concat_arrays([d["customer_id"].combine_chunks()] * 2)
    amount = pa.concat_arrays([d["old_amount"].combine_chunks(),
                               d["new_amount"].combine_chunks()])
    return pa.table({"customer_id": cid, "amount": amount,
                     "t": pa.array(np.ones(2 * n, np.uint64)),
                     "d": pa.array(np.repeat(np.array([-1, 1], np.int64), n))})


def ad_plain_change(engine, orders_t, customers_t) -> pa.Table:
    """The plain result's change over [1, 2): join's changes, weighed by diff per region."""
    from arrangedb import group_by, join

    return _read_all(group_by(join(orders_t, customers_t, since=1, upto=2,
                                   read_dictionary=REGION), by="region",
                              aggs=AGGS, weight="diff", engine=engine))


def ad_preagg_change(engine, orders_t, preagg_t, customers_t) -> pa.Table:
    """Maintain the per-customer arrangement from orders' changes, then join its changes.

    count and sum are linear: a customer's change is the aggregate of its orders'
    changes (weighed by diff), so only the key-level arrangement's old rows of the
    touched customers are looked up -- never the 40M-row orders arrangement.
    """
    from arrangedb import group_by, join

    delta = _read_all(group_by(orders_t.changes(1, 2), by="customer_id",
                               aggs={"dn": ("count", None), "ds": ("sum", "amount")},
                               weight="diff", engine=engine)).sort_by("customer_id")
    s_type = preagg_t.val_schema.field("s").type   # int64 sums of integer amounts
    schema = pa.schema([("customer_id", pa.int64()), ("n", pa.int64()), ("s", s_type),
                        ("time", pa.uint64()), ("diff", pa.int64())])

    def updates():
        """Retraction and replacement of each touched customer's row, a chunk at a time
        (a batched, sorted lookup per chunk keeps the working set small; chunks of 512k
        keys, because every chunk spanning the key range decodes every part's keys)."""
        for lo in range(0, delta.num_rows, LOOKUP_CHUNK):
            d = delta.slice(lo, LOOKUP_CHUNK)
            old = preagg_t.lookup(d.select(["customer_id"]), at=0)
            qi = old.column("query_index").to_numpy()
            n_old = np.zeros(d.num_rows, np.int64)
            s_old = np.zeros(d.num_rows, s_type.to_pandas_dtype())
            has_old = np.zeros(d.num_rows, bool)
            n_old[qi] = old.column("n").to_numpy()
            s_old[qi] = old.column("s").to_numpy()
            has_old[qi] = True
            n_new = n_old + d.column("dn").to_numpy()
            s_new = s_old + d.column("ds").to_numpy()
            keys = d.column("customer_id").to_numpy()
            ret, ins = has_old, n_new != 0
            yield pa.record_batch([
                np.concatenate([keys[ret], keys[ins]]),
                np.concatenate([n_old[ret], n_new[ins]]),
                np.concatenate([s_old[ret], s_new[ins]]),
                np.ones(int(ret.sum() + ins.sum()), np.uint64),
                np.concatenate([-np.ones(int(ret.sum()), np.int64),
                                np.ones(int(ins.sum()), np.int64)])], schema=schema)

    if delta.num_rows:
        preagg_t.insert(pa.RecordBatchReader.from_batches(schema, updates()),
                        time="time", diff="diff")
    return _read_all(group_by(join(preagg_t, customers_t, since=1, upto=2,
                                   read_dictionary=REGION), by="region",
                              aggs=PREAGG_SUMS, weight="diff", engine=engine))


def _engine_figures(engine, phase_start_rss: int | None) -> dict:
    s = engine.stats()
    start = s["baseline_rss_bytes"] if phase_start_rss is None else phase_start_rss
    return {"peak_rss": s["peak_rss_bytes"] - start,
            "held_before": start - s["baseline_rss_bytes"],
            "bytes_spilled": s["bytes_spilled"]}


def _restart_peak(engine) -> int:
    """Start a measurement window: the engine's peak restarts at the RSS now. Nothing is
    trimmed first, for either system: each reuses what its allocators hold, as a live
    process does (a trim here made arrangedb fault its next blocks in afresh, where
    DuckDB's timed phase was not trimmed before)."""
    rss = engine.budget.rss()
    engine.budget.peak_rss = rss
    return rss


def read_through(paths) -> None:
    """Read each file once, untimed, before a cold run of either system: "cold" means
    from the Parquet files, not from the disk. The OS (and this VM's host) drops files
    left unread for a while from its caches, and the system measured first would pay
    for reading them back: the 640 MB orders file made one arrange 12-20 s instead of
    ~4 s, where DuckDB, right after, read it from memory."""
    buf = bytearray(8 << 20)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def _warm_up_arrangedb(workdir: str) -> None:
    """Import and first-call costs (lazy modules, Arrow kernels, pandas probing in
    ``pa.array``) paid on 100 rows in a throwaway engine, so timed phases measure work."""
    from arrangedb import Engine

    n = 100
    orders = pa.table({"customer_id": np.arange(n, dtype=np.int64) % 10,
                       "amount": np.linspace(1.0, 2.0, n)})
    customers = pa.table({"customer_id": np.arange(10, dtype=np.int64),
                          "region": pa.array(["A", "B"] * 5)})
    with Engine(spill_dir=workdir, memory_budget="64MiB") as engine:
        o = engine.arrange(orders, key=["customer_id"], vals=["amount"])
        c = engine.arrange(customers, key=["customer_id"], vals=["region"])
        p = ad_build_preagg(engine, o)
        base = ad_plain(engine, o, c)
        ad_natural(engine, o, c)
        ad_fused(engine, o, c)
        ad_preagg(engine, p, c)
        o.insert(pa.table({"customer_id": pa.array([1], pa.int64()), "amount": [9.0],
                           "t": pa.array([1], pa.uint64()), "d": pa.array([1], pa.int64())}),
                 time="t", diff="d")
        as_result(apply_delta(base, ad_plain_change(engine, o, c)))
        ad_natural_change(engine, o, c)
        ad_preagg_change(engine, o, p, c)
    _release()


def arrangedb_case(case: str, paths: dict, budget: str, threads: int, workdir: str) -> dict:
    from arrangedb import Engine

    pa.set_cpu_count(max(1, threads))
    _warm_up_arrangedb(workdir)
    out: dict = {"system": "arrangedb", "case": case, "budget": budget}
    lifetime_peak = 0
    if case == "cold":
        read_through([paths["orders"], paths["customers"]])
        t0 = time.perf_counter()
        with Engine(spill_dir=workdir, memory_budget=budget) as engine:
            orders_t, customers_t = ad_build(engine, paths)
            res = ad_natural(engine, orders_t, customers_t)
            out["seconds"] = time.perf_counter() - t0
            out.update(_engine_figures(engine, None))
            out["engine_peak_over_baseline"] = out["peak_rss"]
            out["result"] = as_result(res)
        return out
    with Engine(spill_dir=workdir, memory_budget=budget) as engine:
        t0 = time.perf_counter()
        orders_t, customers_t = ad_build(engine, paths)
        preagg_t = ad_build_preagg(engine, orders_t)
        out["setup_seconds"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        engine.wait_merged()   # time passes: the idle merger settles the traces
        out["idle_merge_seconds"] = time.perf_counter() - t0
        out["orders_trace"] = {k: orders_t.stats()[k] for k in ("updates", "batches", "parts")}
        if case == "warm":
            plans = {}
            for plan, fn in (("natural", lambda: ad_natural(engine, orders_t, customers_t)),
                             ("plain", lambda: ad_plain(engine, orders_t, customers_t)),
                             ("fused", lambda: ad_fused(engine, orders_t, customers_t)),
                             ("preagg", lambda: ad_preagg(engine, preagg_t, customers_t))):
                lifetime_peak = max(lifetime_peak, engine.budget.peak_rss)
                start = _restart_peak(engine)
                runs = []
                for _ in range(WARM_RUNS):
                    t0 = time.perf_counter()
                    res = fn()
                    runs.append(time.perf_counter() - t0)
                plans[plan] = {"seconds": float(np.median(runs)), "runs": runs,
                               **_engine_figures(engine, start), "result": as_result(res)}
            out["plans"] = plans
        elif case == "incremental":
            base_plain = ad_plain(engine, orders_t, customers_t)
            base_pre = ad_preagg(engine, preagg_t, customers_t)
            upd = delta_updates(paths)
            lifetime_peak = engine.budget.peak_rss
            start = _restart_peak(engine)
            t0 = time.perf_counter()
            orders_t.insert(upd, time="t", diff="d")
            delta_rows = upd.num_rows
            del upd   # the input is stored now; the bench need not hold it (DuckDB does not)
            t1 = time.perf_counter()
            natural = apply_delta(base_plain, ad_natural_change(engine, orders_t,
                                                                customers_t))
            tn = time.perf_counter()
            plain = apply_delta(base_plain, ad_plain_change(engine, orders_t, customers_t))
            t2 = time.perf_counter()
            pre = apply_delta(base_pre, ad_preagg_change(engine, orders_t, preagg_t,
                                                         customers_t))
            t3 = time.perf_counter()
            figs = _engine_figures(engine, start)   # one window over insert + both plans
            out["insert_seconds"] = t1 - t0
            out["plans"] = {
                "natural": {"seconds": (t1 - t0) + (tn - t1), "change_seconds": tn - t1,
                            **figs, "result": as_result(natural)},
                "plain": {"seconds": (t1 - t0) + (t2 - tn), "change_seconds": t2 - tn,
                          **figs, "result": as_result(plain)},
                "preagg": {"seconds": (t1 - t0) + (t3 - t2), "change_seconds": t3 - t2,
                           **figs, "result": as_result(pre)},
            }
            out["delta_rows"] = delta_rows
        else:
            raise ValueError(f"unknown case {case!r}")
        s = engine.stats()
        out["engine_peak_over_baseline"] = (max(lifetime_peak, s["peak_rss_bytes"])
                                            - s["baseline_rss_bytes"])
    return out


# -- DuckDB -----------------------------------------------------------------------------------
def _duck(memory_limit: str, threads: int, workdir: str, database: str = ":memory:"):
    import duckdb

    con = duckdb.connect(database)
    con.execute(f"SET memory_limit='{memory_limit}'")
    con.execute(f"SET threads={int(threads)}")
    con.execute(f"SET temp_directory='{os.path.join(workdir, 'duckdb_tmp')}'")
    con.execute("SET preserve_insertion_order=false")
    return con


def _duck_query(con, orders: str, customers: str) -> pa.Table:
    rows = con.execute(QUERY.format(orders=orders, customers=customers)).fetchall()
    region, n, s = zip(*rows) if rows else ((), (), ())
    return pa.table({"region": pa.array(region, pa.string()), "orders": pa.array(n, pa.int64()),
                     "amount": pa.array([float(x) for x in s], pa.float64())})


def _pq(path: str) -> str:
    return "read_parquet('" + path.replace("'", "''") + "')"


def duckdb_case(case: str, paths: dict, memory_limit: str, threads: int, workdir: str) -> dict:
    out: dict = {"system": "duckdb", "case": case, "budget": memory_limit}
    warm = _duck(memory_limit, threads, workdir)       # first-call costs, as for arrangedb
    as_result(_duck_query(warm, "(SELECT 1 AS customer_id, 2.0::DOUBLE AS amount)",
                          "(SELECT 1 AS customer_id, 'A' AS region)"))
    warm.close()
    fresh = psutil.Process().memory_info().rss
    if case == "cold":
        read_through([paths["orders"], paths["customers"]])
        con = _duck(memory_limit, threads, workdir)
        with RssSampler() as rss:
            t0 = time.perf_counter()
            res = _duck_query(con, _pq(paths["orders"]), _pq(paths["customers"]))
            out["seconds"] = time.perf_counter() - t0
        con.close()
        out.update(peak_rss=rss.delta, held_before=rss.before - fresh,
                   result=as_result(res))
        return out
    # Tables live in a database file so that DuckDB can page them out under its limit.
    con = _duck(memory_limit, threads, workdir, os.path.join(workdir, "bench.duckdb"))
    t0 = time.perf_counter()
    con.execute(f"CREATE TABLE orders AS SELECT * FROM {_pq(paths['orders'])}")
    con.execute(f"CREATE TABLE customers AS SELECT * FROM {_pq(paths['customers'])}")
    if case == "incremental":
        con.execute(f"CREATE TABLE delta AS SELECT * FROM {_pq(paths['delta'])}")
    con.execute("CHECKPOINT")
    out["setup_seconds"] = time.perf_counter() - t0
    if case == "warm":
        with RssSampler() as rss:
            runs = []
            for _ in range(WARM_RUNS):
                t0 = time.perf_counter()
                res = _duck_query(con, "orders", "customers")
                runs.append(time.perf_counter() - t0)
        out["seconds"], out["runs"] = float(np.median(runs)), runs
    elif case == "incremental":
        with RssSampler() as rss:
            t0 = time.perf_counter()
            con.execute("UPDATE orders SET amount = delta.new_amount FROM delta "
                        "WHERE orders.order_id = delta.order_id")
            t1 = time.perf_counter()
            res = _duck_query(con, "orders", "customers")
            out["seconds"] = time.perf_counter() - t0
            out["update_seconds"] = t1 - t0
    else:
        raise ValueError(f"unknown case {case!r}")
    con.close()
    out.update(peak_rss=rss.delta, held_before=rss.before - fresh, result=as_result(res))
    return out


# -- subprocess driver ------------------------------------------------------------------------
def in_subprocess(script: str, spec: dict, label: str) -> dict:
    """Run ``script --worker SPEC`` in a fresh interpreter (so that its RSS is its own),
    with a work directory of its own under the bench root, passed as ``spec["workdir"]``
    and removed afterwards; the JSON of its last output line."""
    workroot = bench_root() / "work"
    workroot.mkdir(parents=True, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix=label.replace("/", "-") + "-", dir=workroot)
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(script), "--worker",
                               json.dumps({**spec, "workdir": workdir})],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{label} failed (exit {proc.returncode}):\n"
                               f"{proc.stderr[-4000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_worker(system: str, case: str, paths: dict, budget: str, threads: int) -> dict:
    """Run one (system, case, budget) measurement in a fresh interpreter."""
    return in_subprocess(__file__, {"system": system, "case": case, "paths": paths,
                                    "budget": budget, "threads": threads},
                         f"{system}/{case}/{budget}")


def _worker_main(spec: dict) -> dict:
    # the whole run's RSS (setup included) for the charts; 50 ms is enough to draw it
    with RssSampler(interval=0.05, timeline=True) as run:
        if spec["system"] == "arrangedb":
            out = arrangedb_case(spec["case"], spec["paths"], spec["budget"], spec["threads"],
                                 spec["workdir"])
        else:
            out = duckdb_case(spec["case"], spec["paths"], duckdb_limit(spec["budget"]),
                              spec["threads"], spec["workdir"])
    out["rss_timeline"] = run.timeline()
    return out


def run_all(scale: float, budgets=tuple(BUDGETS), threads: int = 2, cases=CASES,
            log=None, amounts: str = "float") -> dict:
    """Every (budget, case) for both systems; returns {(budget, case): {system: figures}}."""
    paths = ensure_data(scale, amounts=amounts)
    out = {}
    for budget in budgets:
        for case in cases:
            for system in ("arrangedb", "duckdb"):
                t0 = time.perf_counter()
                r = run_worker(system, case, paths, budget, threads)
                if log:
                    log(f"  {budget:>7} {case:<12} {system:<10} done in "
                        f"{time.perf_counter() - t0:.1f}s (wall, setup included)")
                out.setdefault((budget, case), {})[system] = r
    return out


def rows_of(budget: str, case: str, res: dict) -> list[dict]:
    """Table rows (one per arrangedb plan) with the DuckDB figures and the check."""
    ad, dk = res["arrangedb"], res["duckdb"]
    plans = ad.get("plans") or {"natural": ad}
    rows = []
    for plan, fig in plans.items():
        problems = compare_results(fig["result"], dk["result"])
        rows.append({
            "budget": budget, "case": case, "plan": plan,
            "arrangedb_seconds": fig["seconds"], "duckdb_seconds": dk["seconds"],
            "ratio": dk["seconds"] / fig["seconds"] if fig["seconds"] > 0 else float("inf"),
            "arrangedb_peak_rss": fig["peak_rss"], "duckdb_peak_rss": dk["peak_rss"],
            "arrangedb_held_before": fig["held_before"], "duckdb_held_before": dk["held_before"],
            "arrangedb_spilled": fig.get("bytes_spilled", 0),
            "equal": not problems, "problems": problems,
        })
    return rows


def format_table(rows: list[dict]) -> str:
    def mib(b):
        return f"{b / (1 << 20):8.1f}"

    head = (f"{'budget':>7} {'case':<12} {'plan':<7} {'arrangedb s':>11} {'duckdb s':>9} "
            f"{'ratio':>7} {'ad peakMiB':>10} {'dk peakMiB':>10} {'ad heldMiB':>10} "
            f"{'dk heldMiB':>10} {'ad spillMiB':>11} {'equal':>5}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['budget']:>7} {r['case']:<12} {r['plan']:<7} {r['arrangedb_seconds']:11.3f} "
            f"{r['duckdb_seconds']:9.3f} {r['ratio']:7.2f} {mib(r['arrangedb_peak_rss']):>10} "
            f"{mib(r['duckdb_peak_rss']):>10} {mib(r['arrangedb_held_before']):>10} "
            f"{mib(r['duckdb_held_before']):>10} {mib(r['arrangedb_spilled']):>11} "
            f"{'yes' if r['equal'] else 'NO':>5}")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", required=True, help="JSON spec (internal)")
    spec = json.loads(ap.parse_args().worker)
    print(json.dumps(_worker_main(spec)))
