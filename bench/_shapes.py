"""Shared code of the query-shapes benchmark (bench/bench_shapes.py): three join shapes
over TPC-H-like data, arrangedb's natural code against DuckDB.

Data
----
Written once per (scale, seed) under ``bench_root()/shapes-<S>-seed-<seed>`` as Parquet
(vectorized, chunked, fixed seed; scale 1 -- the full size -- and smoke scale 0.005):

* ``customer`` (750k at scale 1): ``c_custkey`` 1..N, ``c_nation`` (string, 25 TPC-H
  nations), ``c_mktsegment`` (string, 5 segments);
* ``orders`` (7.5M): ``o_orderkey`` (TPC-H's sparse keys: 8 used of every 32),
  ``o_custkey`` (uniform over the customers), ``o_orderpriority`` (string, 5 values);
* ``lineitem`` (~30M: 1-7 lines per order): ``l_orderkey``, ``l_linenumber``,
  ``l_quantity`` (1-50), ``l_extendedprice`` (quantity times a price, two decimals).

Deltas (1% of the fact rows of a shape, a fixed-seed sample by row position):
``lineitem_delta`` gives 1% of line items a new ``l_extendedprice``; ``orders_delta``
moves 1% of orders to another customer (a new ``o_custkey``).

Shapes (the code is what a newcomer writes: ``engine.arrange`` straight from Parquet,
then ``group_by(join(...))``, no option, no merge asked for; ``plan.explain()`` shows
what the planner makes of it):

``fact_dim`` -- a fact table joined to a large dimension, grouped by a low-cardinality
    string of the dimension. lineitem (by l_orderkey, val l_extendedprice) joined with
    orders (by o_orderkey, val o_orderpriority); count and sum(l_extendedprice) per
    o_orderpriority. The planner runs it as eager aggregation: line items are summed per
    order key straight off their stored layout, and each order's priority meets one
    partial row (its code counted with ``bincount``), never a joined row.
``dim_dim`` -- a dimension joined to a dimension, grouped by a string. orders (by
    o_custkey, val o_orderkey) joined with customer (by c_custkey, val c_mktsegment);
    count per c_mktsegment. Eager aggregation again: orders are counted per customer
    below the join.
``two_hop`` -- (lineitem joined with orders on the order key) joined with customer on the
    customer key, sum(l_extendedprice) and count per c_nation. The first hop is kept
    pre-aggregated per customer, differential dataflow's idiom for a repeated
    aggregation: ``by_customer = engine.view(group_by(join(lineitem_t, orders_t),
    by="o_custkey", aggs=...))`` (built by eager aggregation: line items summed per order
    off their layout, each order's partial row added into its customer's slot), and the
    query sums that view per nation, ``group_by(join(by_customer, customer_t),
    by="c_nation", aggs={"n": ("sum", "n"), "s": ("sum", "s")})``. The cold figure pays
    for the arranges and the view; the warm figure reads the view (750k rows) -- a
    maintained, shared arrangement, which DuckDB is not given: it recomputes both joins.
    The delta needs no code of its own: the view applies the first join's changes,
    grouped per customer, when the query reads it.

Cases, per shape, each in its own subprocess per system (as in ``bench/_orders.py``, whose
measurement helpers this reuses; its docstring says how time and RSS are measured):

``cold``    from the Parquet files: arrangedb arranges what the shape reads and runs the
            query (the time is the total); DuckDB runs the query over ``read_parquet``.
            Both read the files once first, untimed (``_orders.read_through``).
``warm``    arrangements / tables built and settled (not timed), the query timed: the
            median of ``WARM_RUNS`` runs, for both systems (as in ``bench/_orders.py``).
``incremental``  the shape's delta: arrangedb inserts it into the fact trace at time 1
            (old rows diff -1, new rows +1) and reads the result's change
            ``group_by(join(..., since=1, upto=2))`` (for two_hop, of the view, which
            refreshes itself first), added to the previous result; DuckDB ``UPDATE``\\s
            its table and recomputes. Results are checked equal to DuckDB's (counts
            exactly, sums to a relative 1e-9).

    python bench/_shapes.py [--scale S] [--shape NAME] [--case CASE]   # a table
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import arrangedb  # noqa: F401 -- first, as its programs do: it tunes numpy and Arrow as they load
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _orders  # noqa: E402
from _orders import RssSampler, bench_root  # noqa: E402

CUSTOMERS_PER_SCALE = 750_000
ORDERS_PER_SCALE = 7_500_000
MAX_LINES = 7
CHUNK = 1 << 20   # orders per generated chunk; row groups of CHUNK rows
SEED = 42
DELTA_SEED = 7
DELTA_FRACTION = 0.01
CASES = _orders.CASES
WARM_RUNS = _orders.WARM_RUNS   # runs of each warm query, for both systems; the median counts
BUDGET = "512MiB"
NATIONS = ["ALGERIA", "ARGENTINA", "BRAZIL", "CANADA", "EGYPT", "ETHIOPIA", "FRANCE",
           "GERMANY", "INDIA", "INDONESIA", "IRAN", "IRAQ", "JAPAN", "JORDAN", "KENYA",
           "MOROCCO", "MOZAMBIQUE", "PERU", "CHINA", "ROMANIA", "SAUDI ARABIA", "VIETNAM",
           "RUSSIA", "UNITED KINGDOM", "UNITED STATES"]
SEGMENTS = ["AUTOMOBILE", "BUILDING", "FURNITURE", "HOUSEHOLD", "MACHINERY"]
PRIORITIES = ["1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW"]
LINEITEM_SCHEMA = pa.schema([("l_orderkey", pa.int64()), ("l_linenumber", pa.int64()),
                             ("l_quantity", pa.int64()), ("l_extendedprice", pa.float64())])


# -- data -------------------------------------------------------------------------------------
def sizes(scale: float) -> tuple[int, int]:
    """(orders, customers) at ``scale``; line items are 1-7 per order (~4x orders)."""
    return max(1, int(ORDERS_PER_SCALE * scale)), max(1, int(CUSTOMERS_PER_SCALE * scale))


def _strings(rng, n: int, values: list[str]) -> pa.Array:
    codes = pa.array(rng.integers(0, len(values), n).astype(np.int8))
    return pa.DictionaryArray.from_arrays(codes, pa.array(values)).cast(pa.string())


def orderkeys(index: np.ndarray) -> np.ndarray:
    """TPC-H's sparse order keys: the first 8 of every 32, from 1."""
    return (index // 8) * 32 + index % 8 + 1


def _customer_chunk(rng, start: int, n: int) -> pa.Table:
    return pa.table({"c_custkey": np.arange(start + 1, start + n + 1, dtype=np.int64),
                     "c_nation": _strings(rng, n, NATIONS),
                     "c_mktsegment": _strings(rng, n, SEGMENTS)})


def _orders_chunk(rng, start: int, n: int, customers: int) -> tuple[pa.Table, pa.Table]:
    """``n`` orders from index ``start`` and their line items (vectorized: a repeat of
    each order's key over its 1-7 lines)."""
    keys = orderkeys(np.arange(start, start + n, dtype=np.int64))
    orders = pa.table({"o_orderkey": keys,
                       "o_custkey": rng.integers(1, customers + 1, n, dtype=np.int64),
                       "o_orderpriority": _strings(rng, n, PRIORITIES)})
    lines = rng.integers(1, MAX_LINES + 1, n)
    total = int(lines.sum())
    first = np.repeat(np.cumsum(lines) - lines, lines)
    quantity = rng.integers(1, 51, total, dtype=np.int64)
    price = np.round(quantity * rng.uniform(9.0, 2000.0, total), 2)
    lineitem = pa.table({"l_orderkey": np.repeat(keys, lines),
                         "l_linenumber": (np.arange(total) - first + 1).astype(np.int64),
                         "l_quantity": quantity, "l_extendedprice": price})
    return orders, lineitem


def generate(path, scale: float, seed: int = SEED) -> dict:
    """Write customer, orders and lineitem Parquet files under ``path`` (reused when the
    same scale and seed wrote them); return their paths and sizes."""
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    n_orders, n_customers = sizes(scale)
    files = {t: os.path.join(path, f"{t}.parquet") for t in ("customer", "orders", "lineitem")}
    meta_path = os.path.join(path, "datagen.json")
    meta = {"scale": scale, "seed": seed, "orders": n_orders, "customers": n_customers}
    if os.path.exists(meta_path) and all(os.path.exists(p) for p in files.values()):
        with open(meta_path) as f:
            if json.load(f) == meta:
                return {**meta, **files}
    rng = np.random.default_rng(seed)

    def write(name, chunks):
        tmp, writer = files[name] + ".tmp", None
        for t in chunks:
            if writer is None:
                writer = pq.ParquetWriter(tmp, t.schema, compression="snappy")
            writer.write_table(t, row_group_size=CHUNK)
        writer.close()
        os.replace(tmp, files[name])

    write("customer", (_customer_chunk(rng, s, min(CHUNK, n_customers - s))
                       for s in range(0, n_customers, CHUNK)))
    lw = pq.ParquetWriter(files["lineitem"] + ".tmp", LINEITEM_SCHEMA, compression="snappy")

    def orders_chunks():
        for s in range(0, n_orders, CHUNK):
            o, li = _orders_chunk(rng, s, min(CHUNK, n_orders - s), n_customers)
            lw.write_table(li, row_group_size=CHUNK)
            yield o
    write("orders", orders_chunks())
    lw.close()
    os.replace(files["lineitem"] + ".tmp", files["lineitem"])
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    return {**meta, **files}


def _sample(path: str, rng) -> np.ndarray:
    n = pq.ParquetFile(path).metadata.num_rows
    k = max(1, int(round(n * DELTA_FRACTION)))
    return np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64)


def _ensure_deltas(root: Path, files: dict, n_customers: int) -> dict:
    """``lineitem_delta``: l_orderkey, l_linenumber, old_price, new_price for 1% of line
    items; ``orders_delta``: o_orderkey, old_custkey, new_custkey for 1% of orders."""
    out = {"lineitem_delta": root / f"lineitem-delta-{DELTA_SEED}.parquet",
           "orders_delta": root / f"orders-delta-{DELTA_SEED}.parquet"}
    if not all(p.exists() for p in out.values()):
        rng = np.random.default_rng(DELTA_SEED)
        li = _orders.rows_at(files["lineitem"], _sample(files["lineitem"], rng),
                      ["l_orderkey", "l_linenumber", "l_quantity", "l_extendedprice"])
        qty = li["l_quantity"].to_numpy()
        new_price = np.round(qty * rng.uniform(9.0, 2000.0, li.num_rows), 2)
        li = pa.table({"l_orderkey": li["l_orderkey"], "l_linenumber": li["l_linenumber"],
                       "old_price": li["l_extendedprice"], "new_price": new_price})
        od = _orders.rows_at(files["orders"], _sample(files["orders"], rng), ["o_orderkey", "o_custkey"])
        od = pa.table({"o_orderkey": od["o_orderkey"], "old_custkey": od["o_custkey"],
                       "new_custkey": rng.integers(1, n_customers + 1, od.num_rows,
                                                   dtype=np.int64)})
        for name, t in (("lineitem_delta", li), ("orders_delta", od)):
            tmp = out[name].with_suffix(".tmp")
            pq.write_table(t, tmp)
            os.replace(tmp, out[name])
    return {k: str(v) for k, v in out.items()}


def ensure_data(scale: float, seed: int = SEED) -> dict:
    """Generate (or reuse) the three tables and the two deltas; return their paths."""
    root = bench_root() / f"shapes-{scale:g}-seed-{seed}"
    info = generate(root, scale, seed)
    files = {t: info[t] for t in ("customer", "orders", "lineitem")}
    return {**files, **_ensure_deltas(root, files, info["customers"])}


def lineitem_updates(src) -> pa.Table:
    """The lineitem delta as updates at time 1 (old price diff -1, new +1)."""
    d = _table(src["lineitem_delta"])
    n = d.num_rows
    return pa.table({"l_orderkey": pa.concat_arrays([d["l_orderkey"].combine_chunks()] * 2),
                     "l_extendedprice": pa.concat_arrays([d["old_price"].combine_chunks(),
                                                          d["new_price"].combine_chunks()]),
                     "t": np.ones(2 * n, np.uint64),
                     "d": np.repeat(np.array([-1, 1], np.int64), n)})


def orders_updates(src) -> pa.Table:
    """The orders delta as updates at time 1 (old customer diff -1, new +1)."""
    d = _table(src["orders_delta"])
    n = d.num_rows
    return pa.table({"o_custkey": pa.concat_arrays([d["old_custkey"].combine_chunks(),
                                                    d["new_custkey"].combine_chunks()]),
                     "o_orderkey": pa.concat_arrays([d["o_orderkey"].combine_chunks()] * 2),
                     "t": np.ones(2 * n, np.uint64),
                     "d": np.repeat(np.array([-1, 1], np.int64), n)})


def _table(x) -> pa.Table:
    return x if isinstance(x, pa.Table) else pq.read_table(x)


# -- the shapes -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    name: str
    title: str
    by: str
    aggs: dict
    sql: str          # DuckDB's query; {lineitem}, {orders}, {customer} are table sources
    delta: str        # lineitem_delta or orders_delta
    update_sql: str   # DuckDB's UPDATE from table ``delta``


SHAPES = {s.name: s for s in (
    Shape("fact_dim", "lineitem x orders -> count, sum(l_extendedprice) per o_orderpriority",
          "o_orderpriority",
          {"n": ("count", None), "s": ("sum", "l_extendedprice")},
          "SELECT o_orderpriority, count(*) AS n, sum(l_extendedprice) AS s "
          "FROM {lineitem} JOIN {orders} ON l_orderkey = o_orderkey GROUP BY 1",
          "lineitem_delta",
          "UPDATE lineitem SET l_extendedprice = delta.new_price FROM delta WHERE "
          "lineitem.l_orderkey = delta.l_orderkey AND "
          "lineitem.l_linenumber = delta.l_linenumber"),
    Shape("dim_dim", "orders x customer -> count per c_mktsegment", "c_mktsegment",
          {"n": ("count", None)},
          "SELECT c_mktsegment, count(*) AS n "
          "FROM {orders} JOIN {customer} ON o_custkey = c_custkey GROUP BY 1",
          "orders_delta",
          "UPDATE orders SET o_custkey = delta.new_custkey FROM delta WHERE "
          "orders.o_orderkey = delta.o_orderkey"),
    Shape("two_hop", "(lineitem x orders) x customer -> count, sum(l_extendedprice) per "
          "c_nation", "c_nation",
          {"n": ("count", None), "s": ("sum", "l_extendedprice")},
          "SELECT c_nation, count(*) AS n, sum(l_extendedprice) AS s "
          "FROM {lineitem} JOIN {orders} ON l_orderkey = o_orderkey "
          "JOIN {customer} ON o_custkey = c_custkey GROUP BY 1",
          "lineitem_delta",
          "UPDATE lineitem SET l_extendedprice = delta.new_price FROM delta WHERE "
          "lineitem.l_orderkey = delta.l_orderkey AND "
          "lineitem.l_linenumber = delta.l_linenumber"),
)}


def ad_build(shape: Shape, engine, src) -> dict:
    """Arrange what the shape reads, straight from ``src`` (paths or tables)."""
    if shape.name == "fact_dim":
        return {"fact": engine.arrange(src["lineitem"], key=["l_orderkey"],
                                       vals=["l_extendedprice"], name="lineitem"),
                "dim": engine.arrange(src["orders"], key=["o_orderkey"],
                                      vals=["o_orderpriority"], name="orders")}
    if shape.name == "dim_dim":
        return {"fact": engine.arrange(src["orders"], key=["o_custkey"], vals=["o_orderkey"],
                                       name="orders"),
                "dim": engine.arrange(src["customer"], key=["c_custkey"],
                                      vals=["c_mktsegment"], name="customer")}
    from arrangedb import group_by, join

    lineitem_t = engine.arrange(src["lineitem"], key=["l_orderkey"], vals=["l_extendedprice"],
                                name="lineitem")
    orders_t = engine.arrange(src["orders"], key=["o_orderkey"], vals=["o_custkey"],
                              name="orders")
    by_customer = engine.view(group_by(join(lineitem_t, orders_t), by="o_custkey",
                                       aggs=shape.aggs), name="lineitem_by_customer")
    return {"fact": lineitem_t, "orders": orders_t, "mid": by_customer,
            "dim": engine.arrange(src["customer"], key=["c_custkey"], vals=["c_nation"],
                                  name="customer")}


def _left(shape: Shape, traces: dict):
    return traces["mid"] if shape.name == "two_hop" else traces["fact"]


def _aggs(shape: Shape) -> dict:
    """The query's aggregates: two_hop's add up the view's per-customer ones."""
    if shape.name == "two_hop":
        return {a: ("sum", a) for a in shape.aggs}
    return shape.aggs


def ad_query(shape: Shape, traces: dict):
    """The natural query, as a plan."""
    from arrangedb import group_by, join

    return group_by(join(_left(shape, traces), traces["dim"]), by=shape.by, aggs=_aggs(shape))


def ad_change(shape: Shape, traces: dict, updates: pa.Table) -> pa.Table:
    """Insert the delta at time 1 and read the result's change over [1, 2)."""
    from arrangedb import group_by, join

    traces["fact"].insert(updates, time="t", diff="d")
    return group_by(join(_left(shape, traces), traces["dim"], since=1, upto=2), by=shape.by,
                    aggs=_aggs(shape)).read_all()


def updates_of(shape: Shape, src) -> pa.Table:
    return (lineitem_updates if shape.delta == "lineitem_delta" else orders_updates)(src)


# -- results ----------------------------------------------------------------------------------
def as_result(shape: Shape, table: pa.Table) -> dict:
    """{group: [aggregates in the shape's order]}."""
    cols = table.select([shape.by, *shape.aggs]).to_pydict()
    return {g: [cols[a][i] for a in shape.aggs] for i, g in enumerate(cols[shape.by])}


def apply_delta(shape: Shape, result: pa.Table, change: pa.Table) -> pa.Table:
    """previous result + per-group change (groups absent from the change keep theirs)."""
    return _orders.add_change(result.select([shape.by, *shape.aggs]),
                              change.select([shape.by, *shape.aggs]), shape.by,
                              list(shape.aggs), "n")


compare_results = _orders.compare_results


# -- arrangedb --------------------------------------------------------------------------------
def _tiny_source() -> dict:
    """100 rows per table with the real schemas, for the warm-up."""
    rng = np.random.default_rng(0)
    customer = _customer_chunk(rng, 0, 10)
    orders, lineitem = _orders_chunk(rng, 0, 30, 10)
    li = lineitem.slice(0, 4)
    od = orders.slice(0, 3)
    return {"customer": customer, "orders": orders, "lineitem": lineitem,
            "lineitem_delta": pa.table({"l_orderkey": li["l_orderkey"],
                                        "l_linenumber": li["l_linenumber"],
                                        "old_price": li["l_extendedprice"],
                                        "new_price": pc.add(li["l_extendedprice"], 1.0)}),
            "orders_delta": pa.table({"o_orderkey": od["o_orderkey"],
                                      "old_custkey": od["o_custkey"],
                                      "new_custkey": pa.array([1, 2, 3], pa.int64())})}


def _warm_up(shape: Shape, workdir: str) -> None:
    """First-call costs (lazy modules, Arrow kernels) paid on tiny tables, so that the
    timed phases measure work."""
    from arrangedb import Engine

    src = _tiny_source()
    with Engine(spill_dir=workdir, memory_budget="64MiB") as engine:
        traces = ad_build(shape, engine, src)
        base = ad_query(shape, traces).read_all()
        apply_delta(shape, base, ad_change(shape, traces, updates_of(shape, src)))
    _orders._release()


def arrangedb_case(shape: Shape, case: str, src: dict, budget: str, threads: int,
                   workdir: str) -> dict:
    from arrangedb import Engine

    pa.set_cpu_count(max(1, threads))
    _warm_up(shape, workdir)
    out: dict = {"system": "arrangedb", "shape": shape.name, "case": case}
    if case == "cold":
        _orders.read_through([src[t] for t in ("lineitem", "orders", "customer")])
        t0 = time.perf_counter()
        with Engine(spill_dir=workdir, memory_budget=budget) as engine:
            traces = ad_build(shape, engine, src)
            plan = ad_query(shape, traces)
            res = plan.read_all()
            out["seconds"] = time.perf_counter() - t0
            out.update(_orders._engine_figures(engine, None))
            out["engine_peak_over_baseline"] = out["peak_rss"]
            out["explain"] = plan.explain()
            out["result"] = as_result(shape, res)
        return out
    with Engine(spill_dir=workdir, memory_budget=budget) as engine:
        t0 = time.perf_counter()
        traces = ad_build(shape, engine, src)
        out["setup_seconds"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        engine.wait_merged()   # time passes: the idle merger settles the traces
        out["idle_merge_seconds"] = time.perf_counter() - t0
        lifetime_peak = engine.budget.peak_rss
        if case == "warm":
            start = _orders._restart_peak(engine)
            runs = []
            for _ in range(WARM_RUNS):
                t0 = time.perf_counter()
                plan = ad_query(shape, traces)
                res = plan.read_all()
                runs.append(time.perf_counter() - t0)
            out["seconds"], out["runs"] = float(np.median(runs)), runs
            out["explain"] = plan.explain()
        elif case == "incremental":
            base = ad_query(shape, traces).read_all()
            upd = updates_of(shape, src)
            out["delta_rows"] = upd.num_rows
            lifetime_peak = max(lifetime_peak, engine.budget.peak_rss)
            start = _orders._restart_peak(engine)
            t0 = time.perf_counter()
            res = apply_delta(shape, base, ad_change(shape, traces, upd))
            out["seconds"] = time.perf_counter() - t0
        else:
            raise ValueError(f"unknown case {case!r}")
        out.update(_orders._engine_figures(engine, start))
        out["result"] = as_result(shape, res)
        s = engine.stats()
        out["engine_peak_over_baseline"] = (max(lifetime_peak, s["peak_rss_bytes"])
                                            - s["baseline_rss_bytes"])
    return out


# -- DuckDB -----------------------------------------------------------------------------------
def _duck_query(shape: Shape, con, **tables) -> pa.Table:
    rows = con.execute(shape.sql.format(**tables)).fetchall()
    cols = list(zip(*rows)) if rows else [()] * (1 + len(shape.aggs))
    schema = pa.schema([(shape.by, pa.string()),
                        *((a, pa.float64() if fn == "sum" else pa.int64())
                          for a, (fn, _) in shape.aggs.items())])
    return pa.table([pa.array(c, f.type) for c, f in zip(cols, schema)], schema=schema)


def duckdb_case(shape: Shape, case: str, src: dict, memory_limit: str, threads: int,
                workdir: str) -> dict:
    import psutil

    out: dict = {"system": "duckdb", "shape": shape.name, "case": case}
    tiny = os.path.join(workdir, "tiny")
    os.makedirs(tiny, exist_ok=True)
    small = {}
    for name, t in _tiny_source().items():   # first-call costs, as for arrangedb
        small[name] = os.path.join(tiny, f"{name}.parquet")
        pq.write_table(t, small[name])
    warm = _orders._duck(memory_limit, threads, workdir)
    _duck_query(shape, warm, **{t: _orders._pq(small[t])
                                for t in ("lineitem", "orders", "customer")})
    warm.close()
    fresh = psutil.Process().memory_info().rss
    if case == "cold":
        _orders.read_through([src[t] for t in ("lineitem", "orders", "customer")])
        con = _orders._duck(memory_limit, threads, workdir)
        with RssSampler() as rss:
            t0 = time.perf_counter()
            res = _duck_query(shape, con, **{t: _orders._pq(src[t])
                                             for t in ("lineitem", "orders", "customer")})
            out["seconds"] = time.perf_counter() - t0
        con.close()
        out.update(peak_rss=rss.delta, held_before=rss.before - fresh,
                   result=as_result(shape, res))
        return out
    con = _orders._duck(memory_limit, threads, workdir, os.path.join(workdir, "bench.duckdb"))
    t0 = time.perf_counter()
    used = [t for t in ("lineitem", "orders", "customer") if "{" + t + "}" in shape.sql]
    for t in used:
        con.execute(f"CREATE TABLE {t} AS SELECT * FROM {_orders._pq(src[t])}")
    if case == "incremental":
        con.execute(f"CREATE TABLE delta AS SELECT * FROM {_orders._pq(src[shape.delta])}")
    con.execute("CHECKPOINT")
    out["setup_seconds"] = time.perf_counter() - t0
    with RssSampler() as rss:
        if case == "warm":
            runs = []
            for _ in range(WARM_RUNS):
                t0 = time.perf_counter()
                res = _duck_query(shape, con, **{t: t for t in used})
                runs.append(time.perf_counter() - t0)
            out["seconds"], out["runs"] = float(np.median(runs)), runs
        elif case == "incremental":
            t0 = time.perf_counter()
            con.execute(shape.update_sql)
            out["update_seconds"] = time.perf_counter() - t0
            res = _duck_query(shape, con, **{t: t for t in used})
            out["seconds"] = time.perf_counter() - t0
        else:
            raise ValueError(f"unknown case {case!r}")
    con.close()
    out.update(peak_rss=rss.delta, held_before=rss.before - fresh, result=as_result(shape, res))
    return out


# -- subprocess driver ------------------------------------------------------------------------
def run_worker(system: str, shape: str, cases, src: dict, budget: str = BUDGET,
               threads: int = 2) -> dict:
    """Measure ``cases`` of one (system, shape) in a fresh interpreter, one after the
    other; {case: figures}. Figures are clean with one case per call (no case sees the
    memory an earlier one left); several share the interpreter's start-up (smoke size)."""
    return _orders.in_subprocess(__file__, {"system": system, "shape": shape,
                                            "cases": list(cases), "src": src,
                                            "budget": budget, "threads": threads},
                                 f"{system}/{shape}/{','.join(cases)}")


def measure(shape: str, cases, src: dict, budget: str = BUDGET, threads: int = 2) -> dict:
    """{case: {system: figures}} for both systems."""
    res = {s: run_worker(s, shape, cases, src, budget, threads) for s in ("arrangedb", "duckdb")}
    return {c: {s: res[s][c] for s in res} for c in cases}


def _worker_main(spec: dict) -> dict:
    shape = SHAPES[spec["shape"]]
    out = {}
    for case in spec["cases"]:
        workdir = tempfile.mkdtemp(prefix=f"{case}-", dir=spec["workdir"])
        if spec["system"] == "arrangedb":
            out[case] = arrangedb_case(shape, case, spec["src"], spec["budget"],
                                       spec["threads"], workdir)
        else:
            out[case] = duckdb_case(shape, case, spec["src"],
                                    _orders.duckdb_limit(spec["budget"]), spec["threads"],
                                    workdir)
    return out


def row_of(shape: str, case: str, res: dict) -> dict:
    """The figures of one (shape, case): both times, the ratio DuckDB / arrangedb, peaks,
    and the equality check."""
    ad, dk = res["arrangedb"], res["duckdb"]
    problems = compare_results(ad["result"], dk["result"])
    return {"shape": shape, "case": case, "arrangedb_seconds": ad["seconds"],
            "duckdb_seconds": dk["seconds"], "ratio": dk["seconds"] / ad["seconds"],
            "arrangedb_peak_rss": ad["peak_rss"], "duckdb_peak_rss": dk["peak_rss"],
            "arrangedb_engine_peak": ad["engine_peak_over_baseline"],
            "arrangedb_held_before": ad["held_before"], "duckdb_held_before": dk["held_before"],
            "arrangedb_spilled": ad["bytes_spilled"], "equal": not problems,
            "problems": problems}


def format_table(rows: list[dict]) -> str:
    def mib(b):
        return f"{b / (1 << 20):.0f}"

    head = (f"{'shape':<9} {'case':<12} {'arrangedb s':>11} {'duckdb s':>9} {'ratio':>7} "
            f"{'ad peakMiB':>10} {'ad lifeMiB':>10} {'dk peakMiB':>10} {'equal':>5}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['shape']:<9} {r['case']:<12} {r['arrangedb_seconds']:11.3f} "
                     f"{r['duckdb_seconds']:9.3f} {r['ratio']:7.2f} "
                     f"{mib(r['arrangedb_peak_rss']):>10} {mib(r['arrangedb_engine_peak']):>10} "
                     f"{mib(r['duckdb_peak_rss']):>10} {'yes' if r['equal'] else 'NO':>5}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help="JSON spec (internal)")
    ap.add_argument("--scale", type=float, default=_orders.default_scale())
    ap.add_argument("--shape", action="append", choices=list(SHAPES))
    ap.add_argument("--case", action="append", choices=CASES)
    ap.add_argument("--json", default=None, help="also write every figure to this file")
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker_main(json.loads(args.worker))))
        return 0
    src = ensure_data(args.scale)
    rows, raw = [], {}
    for shape in args.shape or list(SHAPES):
        for case in args.case or list(CASES):
            res = measure(shape, [case], src)[case]
            raw[f"{shape}/{case}"] = res
            rows.append(row_of(shape, case, res))
            print(format_table(rows[-1:]).splitlines()[-1], flush=True)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"scale": args.scale, "rows": rows, "raw": raw}, f, indent=1)
    return 0 if all(r["equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
