"""TPC-H-like ``orders`` and ``customers`` as Parquet, generated in chunks with a fixed seed.

Scale 1 is 40M orders (order_id, customer_id in [0, 4M), amount, status) and 4M
customers (customer_id, name, region among 20). Generation is vectorized and chunked
(1M rows per row group), so any scale is written with bounded memory; files already
written for the same scale and seed are reused.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ORDERS_PER_SCALE = 40_000_000
CUSTOMERS_PER_SCALE = 4_000_000
CHUNK = 1 << 20
REGIONS = ["ALGERIA", "ARGENTINA", "BRAZIL", "CANADA", "CHINA", "EGYPT", "ETHIOPIA", "FRANCE",
           "GERMANY", "INDIA", "INDONESIA", "IRAN", "IRAQ", "JAPAN", "JORDAN", "KENYA",
           "MOROCCO", "PERU", "ROMANIA", "VIETNAM"]
STATUSES = ["F", "O", "P"]


def sizes(scale: float) -> tuple[int, int]:
    return max(1, int(ORDERS_PER_SCALE * scale)), max(1, int(CUSTOMERS_PER_SCALE * scale))


def _orders_chunk(rng, start: int, n: int, customers: int) -> pa.Table:
    status = pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 3, n).astype(np.int8)),
                                            pa.array(STATUSES)).cast(pa.string())
    return pa.table({
        "order_id": np.arange(start, start + n, dtype=np.int64),
        "customer_id": rng.integers(0, customers, n, dtype=np.int64),
        "amount": np.round(rng.uniform(1.0, 500_000.0, n), 2),
        "status": status,
    })


def _customers_chunk(rng, start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    digits = pc.utf8_lpad(pc.cast(pa.array(ids), pa.string()), 9, "0")
    name = pc.binary_join_element_wise("Customer#", digits, "")
    region = pa.DictionaryArray.from_arrays(
        pa.array(rng.integers(0, len(REGIONS), n).astype(np.int8)),
        pa.array(REGIONS)).cast(pa.string())
    return pa.table({"customer_id": ids, "name": name, "region": region})


def generate(path, scale: float = 1.0, seed: int = 42, progress=None) -> dict:
    """Write ``path/orders.parquet`` and ``path/customers.parquet``; return their sizes."""
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    n_orders, n_customers = sizes(scale)
    meta_path = os.path.join(path, "datagen.json")
    meta = {"scale": scale, "seed": seed, "orders": n_orders, "customers": n_customers}
    files = {"orders": os.path.join(path, "orders.parquet"),
             "customers": os.path.join(path, "customers.parquet")}
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            if json.load(f) == meta and all(os.path.exists(p) for p in files.values()):
                return {**meta, **files}
    rng = np.random.default_rng(seed)
    total = n_orders + n_customers
    done = 0
    for name, count, make in (("customers", n_customers,
                               lambda s, n: _customers_chunk(rng, s, n)),
                              ("orders", n_orders,
                               lambda s, n: _orders_chunk(rng, s, n, n_customers))):
        tmp = files[name] + ".tmp"
        writer = None
        for start in range(0, count, CHUNK):
            t = make(start, min(CHUNK, count - start))
            if writer is None:
                writer = pq.ParquetWriter(tmp, t.schema, compression="snappy")
            writer.write_table(t)
            done += t.num_rows
            if progress:
                progress(done, total)
        writer.close()
        os.replace(tmp, files[name])
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    return {**meta, **files}


def daily_deltas(files: dict, scale: float, days: int, path, seed: int = 7) -> list[str]:
    """``days`` Parquet files of 1% of the orders each, as changes (customer_id, amount,
    diff): 0.8% new orders (diff +1), and 0.2% changed amounts -- an existing order
    retracted (diff -1) and added back with a new amount (+1); each day changes
    different orders. Written once per (scale, days, seed) under ``path``."""
    n_orders, n_customers = sizes(scale)
    rng = np.random.default_rng(seed)
    base = pq.ParquetFile(files["orders"])
    new, changed = int(n_orders * 0.008), int(n_orders * 0.002)
    out = []
    os.makedirs(path, exist_ok=True)
    for day in range(1, days + 1):
        p = os.path.join(path, f"delta-{scale:g}-{seed}-{day}.parquet")
        out.append(p)
        old = base.read_row_group(0, columns=["customer_id", "amount"]).slice(
            day * changed, changed)
        oc, oa = old.column("customer_id").to_numpy(), old.column("amount").to_numpy()
        cid = np.concatenate([rng.integers(0, n_customers, new), oc, oc])
        amount = np.concatenate([np.round(rng.uniform(1.0, 500_000.0, new), 2), oa,
                                 np.round(rng.uniform(1.0, 500_000.0, len(oc)), 2)])
        diff = np.concatenate([np.ones(new, np.int64), -np.ones(len(oc), np.int64),
                               np.ones(len(oc), np.int64)])
        if not os.path.exists(p):
            pq.write_table(pa.table({"customer_id": cid.astype(np.int64), "amount": amount,
                                     "diff": diff}), p + ".tmp")
            os.replace(p + ".tmp", p)
    return out
