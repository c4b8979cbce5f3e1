"""Living arranged datasets on a real local Spark: inserts, upserts and deletes at new
times, queries at a time and between times, exactly-once replays, compaction and
atomic commits -- checked against Spark recomputing from a model of the history."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

pytestmark = pytest.mark.spark

from arrangedb.spark_integration import (  # noqa: E402
    ArrangedDataset, arrange_df, snapshot_join, snapshot_reduce)

AGGS = {"n": ("count", None), "amount": ("sum", "amount"), "avg": ("mean", "amount"),
        "qty": ("sum", "qty")}


def rows(df) -> Counter:
    def norm(v):
        return round(v, 6) if isinstance(v, float) else v
    return Counter(tuple(norm(v) for v in r) for r in df.collect())


class History:
    """The model: each dataset's rows (with multiplicity) at every committed time."""

    def __init__(self, spark):
        self.spark = spark
        self.orders: list[Counter] = []
        self.customers: list[dict] = []

    def orders_at(self, t):
        return self._df(self.orders[t], ["cid", "oid", "amount", "qty"],
                        [pa.int64(), pa.int64(), pa.float64(), pa.int64()])

    def customers_at(self, t):
        c = self.customers[t]
        return self._df(Counter({(k, *v): 1 for k, v in c.items()}), ["cid", "region", "tier"],
                        [pa.int64(), pa.string(), pa.int64()])

    def _df(self, counter, names, types):
        flat = [r for r, m in counter.items() for _ in range(m)]
        cols = list(zip(*flat)) if flat else [[] for _ in names]
        t = pa.table([pa.array(list(c), ty) for c, ty in zip(cols, types)], names=names)
        return self.spark.createDataFrame(t.to_pandas(), schema=", ".join(
            f"{n} {'string' if ty == pa.string() else 'double' if ty == pa.float64() else 'long'}"
            for n, ty in zip(names, types)))

    def joined(self, t):
        return self.orders_at(t).join(self.customers_at(t), "cid")

    def per_region(self, t):
        from pyspark.sql import functions as F

        return (self.joined(t).groupBy("region")
                .agg(F.count("*"), F.sum("amount"), F.avg("amount"), F.sum("qty")))


@pytest.fixture(scope="module")
def living(spark, tmp_path_factory):
    """Orders (duplicates, retractions) and customers (unique: upserts, deletes) through
    five times, with the model beside them."""
    rng = np.random.default_rng(11)
    root = tmp_path_factory.mktemp("living")
    h = History(spark)
    orders = Counter()
    for i in range(600):
        orders[(int(rng.integers(0, 80)), i, float(rng.integers(1, 400)) / 4,
                int(rng.integers(-3, 9)))] += 1
    orders[(5, 0, 1.25, 2)] += 1                 # a duplicate row
    customers = {c: (f"r{c % 5}", int(c % 3)) for c in range(70)}
    h.orders.append(Counter(orders))
    h.customers.append(dict(customers))
    o = arrange_df(h.orders_at(0), "cid", path=root / "orders", num_partitions=3)
    c = arrange_df(h.customers_at(0), "cid", path=root / "customers", num_partitions=3,
                   unique=True)

    # time 1: new orders, two retracted
    new = Counter({(int(rng.integers(0, 90)), 1000 + i, float(rng.integers(1, 400)) / 4,
                    int(rng.integers(0, 9))): 1 for i in range(40)})
    gone = Counter({next(iter(orders)): 1, (5, 0, 1.25, 2): 1})
    delta = [(*r, 1) for r in new] + [(*r, -1) for r in gone]
    t = o.insert(spark.createDataFrame(delta, "cid long, oid long, amount double, qty long, "
                                              "d long"), diff="d")
    assert t == 1
    orders = orders + new - gone
    h.orders.append(Counter(orders))
    h.customers.append(dict(customers))
    assert c.insert(spark.createDataFrame([], "cid long, region string, tier long"),
                    time=1) == 1

    # time 2: customers change region, one is deleted, some arrive
    changed = {3: ("r9", 0), 11: ("r1", 2), 75: ("r7", 1), 80: ("r7", 0)}
    assert c.upsert(spark.createDataFrame([(k, *v) for k, v in changed.items()],
                                          "cid long, region string, tier long")) == 2
    customers.update(changed)
    assert o.insert(spark.createDataFrame([(3, 5000, 2.5, 1)],
                                          "cid long, oid long, amount double, qty long"),
                    time=2) == 2
    orders[(3, 5000, 2.5, 1)] += 1
    h.orders.append(Counter(orders))
    h.customers.append(dict(customers))

    # time 3: a delete and more orders
    assert c.delete(spark.createDataFrame([(4,), (999,)], "cid long")) == 3
    del customers[4]
    more = Counter({(int(rng.integers(0, 90)), 2000 + i, float(rng.integers(1, 40)),
                     int(rng.integers(0, 5))): 1 for i in range(30)})
    assert o.insert(spark.createDataFrame(list(more), "cid long, oid long, amount double, "
                                                      "qty long")) == 3
    orders = orders + more
    h.orders.append(Counter(orders))
    h.customers.append(dict(customers))
    return h, o, c, root


def test_datasets_read_at_every_time_equal_spark(living):
    h, o, c, _ = living
    assert o.times() == [0, 1, 2, 3] and c.times() == [0, 1, 2, 3]
    assert ArrangedDataset.open(o.path).latest() == 3
    for t in range(4):
        assert rows(snapshot_join(o, c, "cid", at=t)) == rows(h.joined(t)), t
        got = snapshot_reduce(snapshot_join(o, c, "cid"), "region", AGGS, at=t)
        assert rows(got) == rows(h.per_region(t)), t
    assert rows(snapshot_join(o, c, "cid")) == rows(h.joined(3))   # latest by default


def test_a_reduce_over_a_join_at_a_time_groups_the_rows_of_that_time(living):
    """As Spark's groupBy of the same DataFrame: the join's at= is the reduce's."""
    h, o, c, _ = living
    joined = snapshot_join(o, c, "cid", at=1)
    assert rows(snapshot_reduce(joined, "region", AGGS)) == rows(h.per_region(1))
    assert rows(snapshot_reduce(joined, "region", AGGS, at=1)) == rows(h.per_region(1))
    with pytest.raises(ValueError, match="the join reads at=1"):
        snapshot_reduce(joined, "region", AGGS, at=2)
    with pytest.raises(ValueError, match="the join reads at=1"):
        snapshot_reduce(joined, "region", AGGS, since=1)


def test_join_changes_between_times_equal_the_difference_of_snapshots(living):
    h, o, c, _ = living
    got = rows(snapshot_join(o, c, "cid", since=1, upto=4))
    want = Counter()
    for t in (1, 2, 3):
        before, after = rows(h.joined(t - 1)), rows(h.joined(t))
        for r in set(before) | set(after):
            if after[r] != before[r]:
                want[(*r, t, after[r] - before[r])] += 1
    assert got == want


def test_aggregate_changes_come_from_the_maintained_view(living):
    """The result at since - 1 plus the changes is the result at upto - 1; each changed
    group's old row has diff -1, its new row +1."""
    h, o, c, _ = living
    joined = snapshot_join(o, c, "cid")
    got = rows(snapshot_reduce(joined, "region", AGGS, since=2, upto=4))
    want = Counter()
    for t in (2, 3):
        before, after = rows(h.per_region(t - 1)), rows(h.per_region(t))
        for r in before - after:
            want[(*r, t, -1)] += 1
        for r in after - before:
            want[(*r, t, 1)] += 1
    assert got == want
    views = os.listdir(os.path.join(o.path, "_views"))
    assert len(views) == 1
    # an earlier window reads the same view; a later call only steps it
    earlier = rows(snapshot_reduce(joined, "region", AGGS, since=1, upto=2))
    b, a = rows(h.per_region(0)), rows(h.per_region(1))
    assert earlier == Counter({(*r, 1, -1): 1 for r in b - a}) + \
        Counter({(*r, 1, 1): 1 for r in a - b})
    assert os.listdir(os.path.join(o.path, "_views")) == views


def test_a_commit_behind_the_view_lands_at_its_next_time(spark, tmp_path):
    """Each dataset keeps its own times: a commit to one input at a time the view has
    passed is folded at the view's next time, and the view stays equal to the join of
    what both inputs hold."""
    from pyspark.sql import functions as F

    orders = spark.createDataFrame([(k % 7, float(k)) for k in range(60)], "cid long, x double")
    customers = spark.createDataFrame([(k, f"r{k % 3}") for k in range(7)],
                                      "cid long, region string")
    o = arrange_df(orders, "cid", path=tmp_path / "o", num_partitions=2)
    # not unique: the insert below gives customer 1 a second row
    c = arrange_df(customers, "cid", path=tmp_path / "c", num_partitions=2)
    aggs = {"n": ("count", None), "x": ("sum", "x")}
    for t in (1, 2, 3):
        o.insert(spark.createDataFrame([(t, 100.0 * t)], "cid long, x double"))
    view = rows(snapshot_reduce(snapshot_join(o, c, "cid"), "region", aggs, since=0))
    assert c.insert(spark.createDataFrame([(1, "r9")], "cid long, region string")) == 1
    got = rows(snapshot_reduce(snapshot_join(o, c, "cid"), "region", aggs, since=4))
    assert got and all(r[-2] == 4 for r in got)        # at the view's next time
    state = Counter()
    for r, m in (view + got).items():
        state[r[:-2]] += r[-1] * m
    o_all = orders.unionByName(spark.createDataFrame([(t, 100.0 * t) for t in (1, 2, 3)],
                                                     "cid long, x double"))
    c_all = customers.unionByName(spark.createDataFrame([(1, "r9")], "cid long, region string"))
    want = rows(o_all.join(c_all, "cid").groupBy("region").agg(F.count("*"), F.sum("x")))
    assert +state == want


def test_an_insert_steps_an_up_to_date_view_in_its_own_job(spark, tmp_path):
    """Once a view exists, an insert into either input brings it up to date in the
    insert's job; a day's few changes are then read from the view's manifest."""
    from arrangedb.spark_integration.dataset import latest_time, read_manifest

    orders = spark.createDataFrame([(k % 9, float(k)) for k in range(90)], "cid long, x double")
    customers = spark.createDataFrame([(k, f"r{k % 4}") for k in range(9)],
                                      "cid long, region string")
    o = arrange_df(orders, "cid", path=tmp_path / "o", num_partitions=3)
    c = arrange_df(customers, "cid", path=tmp_path / "c", num_partitions=3, unique=True)
    aggs = {"n": ("count", None), "x": ("sum", "x"), "m": ("mean", "x")}
    joined = snapshot_join(o, c, "cid")
    snapshot_reduce(joined, "region", aggs, since=0).collect()      # creates the view
    view = os.path.join(o.path, "_views", os.listdir(os.path.join(o.path, "_views"))[0])
    t = o.insert(spark.createDataFrame([(2, 5.0), (3, -1.0)], "cid long, x double"))
    vm = read_manifest(view)
    assert latest_time(vm) == t and "changes" in vm["commits"][-1]
    got = snapshot_reduce(joined, "region", aggs, since=t, upto=t + 1)
    assert "LocalRelation" in got._jdf.queryExecution().logical().toString()
    before = snapshot_reduce(joined, "region", aggs, at=t - 1)
    after = snapshot_reduce(joined, "region", aggs, at=t)
    b, a = rows(before), rows(after)
    assert rows(got) == Counter({(*r, t, -1): 1 for r in b - a}) + \
        Counter({(*r, t, 1): 1 for r in a - b})
    # customers' own next time is 1, which the view has passed: it lands at t + 1
    assert c.upsert(spark.createDataFrame([(2, "r0")], "cid long, region string")) == 1
    assert latest_time(read_manifest(view)) == t + 1
    b, a = a, rows(snapshot_reduce(joined, "region", aggs))
    assert rows(snapshot_reduce(joined, "region", aggs, since=t + 1)) == \
        Counter({(*r, t + 1, -1): 1 for r in b - a}) + \
        Counter({(*r, t + 1, 1): 1 for r in a - b})


def test_changes_refuse_what_they_cannot_keep(living, spark):
    h, o, c, _ = living
    joined = snapshot_join(o, c, "cid")
    with pytest.raises(ValueError, match="max"):
        snapshot_reduce(joined, "region", {"hi": ("max", "amount")}, since=1)
    with pytest.raises(ValueError, match="both sides"):
        snapshot_join(h.orders_at(0), c, "cid", since=1)
    with pytest.raises(ValueError, match="upto"):
        snapshot_join(o, c, "cid", since=3, upto=2)
    with pytest.raises(ValueError, match="unique"):
        o.upsert(h.orders_at(0))
    with pytest.raises(ValueError, match="later"):
        o.insert(h.orders_at(0), time=2)
    with pytest.raises(KeyError, match="amount"):
        o.insert(h.customers_at(0))


def test_a_replayed_batch_adds_nothing(spark, tmp_path):
    """foreachBatch replays its last batch after a restart: the batch id is recorded
    with the time it produced."""
    df = spark.createDataFrame([(1, 10), (2, 20)], "k long, v long")
    ds = arrange_df(df, "k", path=tmp_path / "d", num_partitions=2)
    delta = spark.createDataFrame([(1, 11)], "k long, v long")
    assert ds.insert(delta, batch_id=7) == 1
    assert ds.insert(delta, batch_id=7) == 1     # the replay
    assert ds.times() == [0, 1]
    got = snapshot_reduce(ds, "k", {"n": ("count", None), "s": ("sum", "v")})
    assert rows(got) == Counter({(1, 2, 21): 1, (2, 1, 20): 1})


def test_a_failed_insert_leaves_the_dataset_at_its_old_time(spark, tmp_path):
    """Some partitions write their directories, one task fails: nothing is committed,
    and the next writer removes what the failed attempts wrote."""
    df = spark.createDataFrame([(k, k) for k in range(50)], "k long, v long")
    ds = arrange_df(df, "k", path=tmp_path / "d", num_partitions=4)
    before = rows(snapshot_join(ds, ds, "k"))
    bad = spark.createDataFrame([(k, k, None if k == 3 else 1) for k in range(50)],
                                "k long, v long, d long")
    with pytest.raises(Exception, match="holds nulls"):
        ds.insert(bad, diff="d")
    assert ds.times() == [0]
    assert rows(snapshot_join(ds, ds, "k")) == before
    assert _unnamed_directories(ds) == []
    assert ds.insert(spark.createDataFrame([(1, 1)], "k long, v long")) == 1
    assert _unnamed_directories(ds) == []


def _unnamed_directories(ds) -> list[str]:
    """Partition directories no commit of the manifest names."""
    from arrangedb.spark_integration.dataset import read_manifest

    named = {d for c in read_manifest(ds.path)["commits"] for d in c["parts"].values()}
    return [f"{p}/{d}" for p in os.listdir(ds.path) if p.startswith("part-")
            for d in os.listdir(os.path.join(ds.path, p)) if f"{p}/{d}" not in named]


def test_a_query_planned_before_an_insert_reads_its_time(spark, tmp_path):
    df = spark.createDataFrame([(k, k % 3) for k in range(30)], "k long, v long")
    ds = arrange_df(df, "k", path=tmp_path / "d", num_partitions=2)
    planned = snapshot_reduce(ds, "k", {"n": ("count", None)})
    ds.insert(spark.createDataFrame([(1, 5)], "k long, v long"))
    assert rows(planned)[(1, 1)] == 1
    assert rows(snapshot_reduce(ds, "k", {"n": ("count", None)}))[(1, 2)] == 1


def test_compaction_folds_history_and_refuses_earlier_reads(spark, tmp_path):
    df = spark.createDataFrame([(k, k) for k in range(40)], "k long, v long")
    ds = arrange_df(df, "k", path=tmp_path / "d", num_partitions=2)
    for t in (1, 2, 3):
        ds.insert(spark.createDataFrame([(t, 100 + t)], "k long, v long"))
    at3 = rows(snapshot_join(ds, ds, "k"))
    at2 = rows(snapshot_join(ds, ds, "k", at=2))
    planned = {t: snapshot_reduce(ds, "k", {"n": ("count", None)}, at=t) for t in (1, 2, 3)}
    ds.compact(before=2)
    assert ds.times() == [2, 3]
    assert rows(snapshot_join(ds, ds, "k")) == at3
    assert rows(snapshot_join(ds, ds, "k", at=2)) == at2
    with pytest.raises(ValueError, match="compaction frontier"):
        snapshot_join(ds, ds, "k", at=1)
    # planned before the compaction: its directories are gone, its times are not
    assert rows(planned[3])[(3, 2)] == 1 and rows(planned[2])[(3, 1)] == 1
    with pytest.raises(Exception, match="compaction frontier"):
        planned[1].collect()
    dirs = [d for p in os.listdir(ds.path) if p.startswith("part-")
            for d in os.listdir(os.path.join(ds.path, p))]
    assert len(dirs) <= 2     # one merged directory per partition


def test_views_survive_compaction_of_their_inputs(spark, tmp_path):
    """One view is stepped by each insert, the other falls behind (an insert steps one
    view in its job); after compaction the first goes on from its state and the second,
    which saw only part of what was folded, is rebuilt. Both equal Spark's answer."""
    from pyspark.sql import functions as F

    orders = spark.createDataFrame([(k % 11, float(k % 7)) for k in range(120)],
                                   "cid long, x double")
    customers = spark.createDataFrame([(k, f"r{k % 3}") for k in range(11)],
                                      "cid long, region string")
    o = arrange_df(orders, "cid", path=tmp_path / "o", num_partitions=2)
    c = arrange_df(customers, "cid", path=tmp_path / "c", num_partitions=2, unique=True)
    joined = snapshot_join(o, c, "cid")
    views = [{"n": ("count", None)}, {"x": ("sum", "x")}]
    for aggs in views:
        snapshot_reduce(joined, "region", aggs, since=0).collect()
    extra = []
    for t in (1, 2):
        rows_t = [(t, 10.0 * t), (t + 3, 1.0)]
        extra += rows_t
        o.insert(spark.createDataFrame(rows_t, "cid long, x double"))
    o.compact(before=2)
    o.insert(spark.createDataFrame([(5, 2.0)], "cid long, x double"))
    extra.append((5, 2.0))
    everything = orders.unionByName(spark.createDataFrame(extra, "cid long, x double"))
    truth = everything.join(customers, "cid").groupBy("region")
    for aggs, want in zip(views, (truth.agg(F.count("*")), truth.agg(F.sum("x")))):
        state = Counter()
        for r, m in rows(snapshot_reduce(joined, "region", aggs, since=0)).items():
            state[r[:-2]] += r[-1] * m
        assert +state == rows(want), aggs
    from arrangedb.spark_integration.dataset import read_manifest

    folder = os.path.join(o.path, "_views")
    commits = sorted(len(read_manifest(os.path.join(folder, v))["commits"])
                     for v in os.listdir(folder))
    assert commits[0] == 1 and commits[1] >= 3   # rebuilt in one step; stepped each time


def test_readers_see_whole_commits_while_a_writer_inserts(spark, tmp_path):
    """Two reading jobs run while a third inserts: every read sees the dataset at one
    committed time -- 100 + 10 t rows after t inserts -- never part of an insert, and a
    reader never goes back in time."""
    import threading

    ds = arrange_df(spark.createDataFrame([(k, 1) for k in range(100)], "k long, v long"),
                    "k", path=tmp_path / "d", num_partitions=3)
    seen: dict[int, list[int]] = {0: [], 1: []}
    done = threading.Event()
    errors = []

    def read(who):
        try:
            while not done.is_set() or len(seen[who]) < 2:
                got = snapshot_reduce(ds, "k", {"n": ("count", None)}).collect()
                seen[who].append(sum(r["n"] for r in got))
        except Exception as e:   # surfaced below: a thread's failure must fail the test
            errors.append(e)

    readers = [threading.Thread(target=read, args=(i,)) for i in (0, 1)]
    for r in readers:
        r.start()
    for t in (1, 2, 3):
        ds.insert(spark.createDataFrame([(1000 * t + i, 1) for i in range(10)],
                                        "k long, v long"))
    done.set()
    for r in readers:
        r.join(timeout=300)
    assert not errors, errors
    for totals in seen.values():
        assert totals and all(n in (100, 110, 120, 130) for n in totals), totals
        assert totals == sorted(totals)
