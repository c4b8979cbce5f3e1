"""Maintained views (``snapshot_reduce(snapshot_join(a, b), ..., since=)``) at their
edges: steps whose join changes nothing, a view commit failing after its input's, --
checked against Spark recomputing the answer."""

from __future__ import annotations

import os
from collections import Counter

import pytest

pytestmark = pytest.mark.spark

from arrangedb.spark_integration import (  # noqa: E402
    ArrangedDataset, arrange_df, snapshot_join, snapshot_reduce)

AGGS = {"n": ("count", None), "s": ("sum", "amount")}
ORDERS, CUSTOMERS = "cid long, amount double", "cid long, region string"


def rows(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def applied(changes: Counter, start: Counter | None = None) -> Counter:
    """A result plus changes (rows with time and diff last)."""
    state = Counter(start or {})
    for r, m in changes.items():
        state[r[:-2]] += r[-1] * m
    return +state


def spark_per_region(orders, customers):
    from pyspark.sql import functions as F

    return rows(orders.join(customers, "cid").groupBy("region")
                .agg(F.count("*"), F.sum("amount")))


@pytest.fixture
def shop(spark, tmp_path):
    orders = spark.createDataFrame([(k % 6, float(k)) for k in range(30)], ORDERS)
    customers = spark.createDataFrame([(k, f"r{k % 2}") for k in range(6)], CUSTOMERS)
    o = arrange_df(orders, "cid", path=tmp_path / "o", num_partitions=2)
    c = arrange_df(customers, "cid", path=tmp_path / "c", num_partitions=2, unique=True)
    return orders, customers, o, c


def test_a_view_over_a_join_that_matches_nothing_has_no_changes(spark, tmp_path):
    o = arrange_df(spark.createDataFrame([(1, 1.0)], ORDERS), "cid", path=tmp_path / "o",
                   num_partitions=2)
    c = arrange_df(spark.createDataFrame([(2, "r")], CUSTOMERS), "cid",
                   path=tmp_path / "c", num_partitions=2)
    assert rows(snapshot_reduce(snapshot_join(o, c, "cid"), "region", AGGS, since=0)) == {}


def test_an_insert_matching_nothing_commits_once_and_steps_the_view(spark, shop):
    """Orders of customers not known yet: the insert's fused view step has no partials."""
    orders, customers, o, c = shop
    joined = snapshot_join(o, c, "cid")
    view = rows(snapshot_reduce(joined, "region", AGGS, since=0))
    new = spark.createDataFrame([(100 + k, 5.0) for k in range(4)], ORDERS)
    t = o.insert(new)
    assert t == 1 and ArrangedDataset.open(o.path).latest() == 1
    assert snapshot_join(o, new.select("cid"), "cid", how="semi").count() == 4
    assert rows(snapshot_reduce(joined, "region", AGGS, since=t)) == {}
    assert applied(view) == spark_per_region(orders.unionByName(new), customers)


def test_a_view_commit_failing_after_the_insert_warns_and_catches_up(spark, shop,
                                                                       monkeypatch):
    """The insert's own commit landed: it returns its time (a retry would write it
    twice); the view, left behind, is stepped by its next read."""
    from arrangedb.spark_integration import dataset

    orders, customers, o, c = shop
    joined = snapshot_join(o, c, "cid")
    view = rows(snapshot_reduce(joined, "region", AGGS, since=0))
    views = os.path.join(o.path, "_views")
    real_commit = dataset.commit

    def failing_for_views(path, *args, **kwargs):
        if path.startswith(views):
            raise OSError("disk full")
        return real_commit(path, *args, **kwargs)

    monkeypatch.setattr(dataset, "commit", failing_for_views)
    new = spark.createDataFrame([(1, 7.0), (2, 9.0)], ORDERS)
    with pytest.warns(RuntimeWarning, match="committed at time 1"):
        assert o.insert(new) == 1
    monkeypatch.setattr(dataset, "commit", real_commit)
    assert o.times() == [0, 1]
    later = rows(snapshot_reduce(joined, "region", AGGS, since=1))
    assert applied(later, applied(view)) == spark_per_region(orders.unionByName(new),
                                                             customers)


def test_changes_from_before_a_compaction_are_refused(spark, shop):
    """As snapshot_join(..., since=) refuses them: a view built over a compacted input
    holds nothing before its frontier. The refused call creates no view."""
    orders, customers, o, c = shop
    new = spark.createDataFrame([(1, 1.0)], ORDERS)
    for _ in (1, 2):
        o.insert(new)
    o.compact(before=2)
    joined = snapshot_join(o, c, "cid")
    for since in (1, 2):
        with pytest.raises(ValueError, match="before the compaction frontier 2"):
            snapshot_reduce(joined, "region", AGGS, since=since)
    assert not os.path.exists(os.path.join(o.path, "_views"))
    everything = orders.unionByName(new).unionByName(new)
    assert applied(rows(snapshot_reduce(joined, "region", AGGS, since=0))) == \
        spark_per_region(everything, customers)


def test_float_sums_of_a_view_stay_within_their_group(spark, tmp_path):
    """A group's 1e17 never absorbs another group's small values, at any time of a step
    (the view is created after the inserts: one step over times 0 to 2)."""
    from pyspark.sql import functions as F

    batches = [[(0, 1e17), (1, 1.0)], [(1, 1.0)], [(0, 1.0), (1, 1.0)]]
    customers = spark.createDataFrame([(0, "a"), (1, "b")], CUSTOMERS)
    o = arrange_df(spark.createDataFrame(batches[0], ORDERS), "cid", path=tmp_path / "o",
                   num_partitions=1)
    c = arrange_df(customers, "cid", path=tmp_path / "c", num_partitions=1)
    for b in batches[1:]:
        o.insert(spark.createDataFrame(b, ORDERS))
    aggs = {"s": ("sum", "amount"), "m": ("mean", "amount")}
    got = rows(snapshot_reduce(snapshot_join(o, c, "cid"), "region", aggs, since=0))
    want, before = Counter(), Counter()
    for t in range(3):
        orders = spark.createDataFrame([r for b in batches[:t + 1] for r in b], ORDERS)
        after = rows(orders.join(customers, "cid").groupBy("region")
                     .agg(F.sum("amount"), F.avg("amount")))
        want += Counter({(*r, t, -1): 1 for r in before - after})
        want += Counter({(*r, t, 1): 1 for r in after - before})
        before = after
    assert got == want


def test_a_view_sum_is_null_once_its_last_value_is_retracted(spark, tmp_path):
    """As Spark's SUM over the rows left: a group holding only nulls sums to NULL."""
    from pyspark.sql import functions as F

    schema = "cid long, q long"
    orders = spark.createDataFrame([(1, 3), (1, None), (2, 5)], schema)
    customers = spark.createDataFrame([(1, "a"), (2, "b")], CUSTOMERS)
    o = arrange_df(orders, "cid", path=tmp_path / "o", num_partitions=2)
    c = arrange_df(customers, "cid", path=tmp_path / "c", num_partitions=2)
    aggs = {"n": ("count", None), "s": ("sum", "q"), "m": ("mean", "q")}
    joined = snapshot_join(o, c, "cid")
    view = rows(snapshot_reduce(joined, "region", aggs, since=0))
    t = o.insert(spark.createDataFrame([(1, 3, -1)], schema + ", d long"), diff="d")
    got = applied(rows(snapshot_reduce(joined, "region", aggs, since=t)), applied(view))
    left = orders.where("q is null or cid = 2")
    assert got == rows(left.join(customers, "cid").groupBy("region")
                       .agg(F.count("*"), F.sum("q"), F.avg("q")))
