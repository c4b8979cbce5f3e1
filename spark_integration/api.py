"""snapshot_join, snapshot_reduce and arrange_df: arrangedb on Spark DataFrames.

Plans
-----
Join: both sides are tagged and unioned, repartitioned by the key (Spark's hash
partitioning), and one ``mapInArrow`` per partition arranges both sides and streams
their merge join (:func:`partition.join_partition`). Rows with a null key never match
(SQL): they are kept out of the shuffle, and a left or anti join adds the left ones
back with null right columns.

Reduce: when every aggregate decomposes (count, sum, min, max, mean), a partial
aggregation runs in each input partition before the shuffle and the partials are
combined after it (as Spark's own aggregation does); with ``count_distinct``, rows are
repartitioned by the group columns and arranged, then reduced.

Arranged datasets: :func:`arrange_df` arranges each hash partition of a DataFrame and
saves it (page files and a manifest) under a directory. A later join repartitions only
its other side with the same number of partitions -- equal keys land in equal partition
numbers -- and each task loads its partition's arrangement instead of re-sorting it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pyarrow as pa

from arrangedb.ops.aggregate import check_aggs, output_field
from arrangedb.ops.join import prefixed_names
from arrangedb.spark_integration import config
from arrangedb.spark_integration.metrics import JobMetrics
from arrangedb.spark_integration.partition import SIDE, JoinSpec, ReduceSpec
from arrangedb.spark_integration.workers import task, use_driver_python_locally

def _on_workers(function: str, *args):
    """``partition.<function>(batches, *args)`` as a task body (see :mod:`.workers`)."""
    return task("arrangedb.spark_integration.partition", function, *args)


HOWS = {"inner": "inner", "left": "left", "left_outer": "left", "leftouter": "left",
        "semi": "semi", "left_semi": "semi", "leftsemi": "semi",
        "anti": "anti", "left_anti": "anti", "leftanti": "anti"}
MANIFEST = "_arrangedb_dataset.json"


def _arrow_schema(spark_schema) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema)


def _spark_schema(arrow_schema: pa.Schema):
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema)


@dataclass(frozen=True)
class ArrangedDataset:
    """Per-partition arrangements saved by :func:`arrange_df` (immutable; reusable)."""
    path: str
    key: list[str]
    vals: list[str]
    num_partitions: int
    schema: pa.Schema          # key columns then vals

    @classmethod
    def open(cls, path) -> "ArrangedDataset":
        path = os.path.abspath(os.fspath(path))
        try:
            with open(os.path.join(path, MANIFEST)) as f:
                m = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"{path!r} is not an arranged dataset (no {MANIFEST}); "
                                    f"write one with arrange_df") from None
        schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(m["schema"])))
        return cls(path, m["key"], m["vals"], m["num_partitions"], schema)

    def key_types(self) -> list[pa.DataType]:
        return [self.schema.field(k).type for k in self.key]


def _session(*objs):
    for o in objs:
        if not isinstance(o, ArrangedDataset):
            return o.sparkSession
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()


def _default_partitions(spark) -> int:
    return max(2, spark.sparkContext.defaultParallelism * 2)


def _not_null(keys):
    from pyspark.sql import functions as F

    cond = None
    for k in keys:
        c = F.col(k).isNotNull()
        cond = c if cond is None else cond & c
    return cond


def _side_schema(source, keys, cols, names) -> pa.Schema:
    if isinstance(source, ArrangedDataset):
        return source.schema
    schema = _arrow_schema(source.select(*keys, *cols).schema)
    return pa.schema([f.with_name(n) for f, n in zip(schema, keys + names)])


def snapshot_join(left_df, right_df, on, how: str = "inner", num_partitions: int | None = None,
                  memory_budget=None, spill_dir=None, metrics: JobMetrics | None = None):
    """Join two DataFrames (or arranged datasets) on ``on`` through arrangedb.

    Same rows as ``left_df.join(right_df, on, how)`` (null keys never match, duplicates
    multiply); columns: the keys, the left's other columns, the right's other columns
    (prefixed ``left_``/``right_`` where names clash). ``how``: inner, left, semi, anti.
    Metrics of the job (rows, bytes spilled, peak RSS per task against its budget) are
    in ``result.arrangedb_metrics.value`` after an action.
    """
    from pyspark.sql import functions as F

    keys = [on] if isinstance(on, str) else list(on)
    if how not in HOWS:
        raise ValueError(f"unknown how={how!r}; use one of inner, left, semi, anti")
    how = HOWS[how]
    spark = _session(left_df, right_df)
    cfg = config.resolve(spark, memory_budget, spill_dir)
    use_driver_python_locally(spark)
    metrics = metrics or JobMetrics(spark)

    def columns(side, name):
        cols = side.schema.names if isinstance(side, ArrangedDataset) else side.columns
        missing = [k for k in keys if k not in cols]
        if missing:
            raise KeyError(f"snapshot_join: {name} side has no column(s) {missing} "
                           f"(columns: {cols})")
        if isinstance(side, ArrangedDataset):
            if side.key != keys:
                raise ValueError(f"snapshot_join: the {name} arranged dataset is keyed on "
                                 f"{side.key}, not {keys}")
            return side.vals
        return [c for c in cols if c not in keys]

    lcols, rcols = columns(left_df, "left"), columns(right_df, "right")
    if how in ("semi", "anti"):
        rcols = [] if not isinstance(right_df, ArrangedDataset) else rcols
    lnames, rnames = prefixed_names(keys, lcols, rcols)
    lschema = _side_schema(left_df, keys, lcols, lcols)
    rschema = _side_schema(right_df, keys, rcols, rcols)
    lkt, rkt = [lschema.field(k).type for k in keys], [rschema.field(k).type for k in keys]
    if lkt != rkt:
        raise TypeError(f"snapshot_join: key types differ: left {list(map(str, lkt))} vs "
                        f"right {list(map(str, rkt))}; cast one side's keys first")
    out_fields = [lschema.field(k) for k in keys]
    out_fields += [lschema.field(c).with_name(n) for c, n in zip(lcols, lnames)]
    if how in ("inner", "left"):
        out_fields += [rschema.field(c).with_name(n).with_nullable(True)
                       for c, n in zip(rcols, rnames)]
    out_schema = pa.schema(out_fields)
    arranged = [s for s in (left_df, right_df) if isinstance(s, ArrangedDataset)]
    if arranged:
        n = arranged[0].num_partitions
        if any(a.num_partitions != n for a in arranged):
            raise ValueError("snapshot_join: both arranged datasets must have the same "
                             "number of partitions")
        if num_partitions not in (None, n):
            raise ValueError(f"snapshot_join: an arranged dataset fixes num_partitions={n}")
    else:
        n = num_partitions or _default_partitions(spark)
    spec = JoinSpec(keys=keys, left_cols=[f"__l{i}" for i in range(len(lcols))],
                    left_vals=lcols, right_cols=[f"__r{i}" for i in range(len(rcols))],
                    right_vals=rcols, how=how, out_schema=out_schema,
                    left_schema=lschema, right_schema=rschema, cfg=cfg, metrics=metrics,
                    left_path=left_df.path if isinstance(left_df, ArrangedDataset) else None,
                    right_path=right_df.path if isinstance(right_df, ArrangedDataset) else None)
    live = []
    for side, cols, alias, tag in ((left_df, lcols, spec.left_cols, 0),
                                   (right_df, rcols, spec.right_cols, 1)):
        if isinstance(side, ArrangedDataset):
            continue
        sel = [F.col(k) for k in keys] + [F.col(c).alias(a) for c, a in zip(cols, alias)]
        live.append((side.where(_not_null(keys)), sel, tag))
    if len(live) == 2:
        (ldf, lsel, _), (rdf, rsel, _) = live
        lnull = [F.lit(None).cast(t).alias(a) for t, a in
                 zip((f.dataType for f in rdf.select(*rsel).schema.fields[len(keys):]),
                     spec.right_cols)]
        rnull = [F.lit(None).cast(t).alias(a) for t, a in
                 zip((f.dataType for f in ldf.select(*lsel).schema.fields[len(keys):]),
                     spec.left_cols)]
        ktypes = [f.dataType for f in ldf.select(*keys).schema.fields]
        shuffled = ldf.select(*lsel, *lnull, F.lit(0).cast("byte").alias(SIDE)).unionByName(
            rdf.select(*[F.col(k).cast(t) for k, t in zip(keys, ktypes)], *rsel[len(keys):],
                       *rnull, F.lit(1).cast("byte").alias(SIDE)))
    elif len(live) == 1:
        df, sel, _ = live[0]
        shuffled = df.select(*sel)
    else:
        shuffled = spark.range(0, n, 1, n)
    if live:
        shuffled = shuffled.repartition(n, *keys)
    result = shuffled.mapInArrow(_on_workers("join_partition", spec), _spark_schema(out_schema))
    null_rows = None
    if how in ("left", "anti") and not isinstance(left_df, ArrangedDataset):
        # SQL: a null key matches nothing, so these rows are unmatched left rows
        null_rows = left_df.where(~_not_null(keys))
        fill = [F.lit(None).cast(f.dataType).alias(f.name)
                for f in result.schema.fields[len(keys) + len(lcols):]]
        null_rows = null_rows.select(
            *keys, *[F.col(c).alias(nm) for c, nm in zip(lcols, lnames)], *fill)
        result = result.unionByName(null_rows)
    result.arrangedb_metrics = metrics
    # lets snapshot_reduce over this very DataFrame aggregate inside the join's tasks
    result._arrangedb_join = (shuffled, spec, null_rows)
    return result


def snapshot_reduce(df, by, aggs: dict, num_partitions: int | None = None, memory_budget=None,
                    spill_dir=None, metrics: JobMetrics | None = None, weight=None):
    """``df.groupBy(by).agg(...)`` through arrangedb; ``aggs`` as in :func:`arrangedb.reduce`.

    ``df`` may be an arranged dataset keyed on ``by``. Results equal Spark's
    (``count`` with column None is count(*); sum of integers is a long; mean a double;
    over decimals, the types of :func:`spark_decimal_result`, means exact).

    ``weight``: a column of row multiplicities. Spark DataFrames carry no Arrow
    metadata, so a change DataFrame's multiplicity is its ``diff`` column by convention:
    None (default) weighs rows by ``diff`` when the DataFrame has one, and count and sum
    are then the net change per group (min, max and mean are refused over negative
    weights, as in :func:`arrangedb.group_by`); False counts every row once.
    """
    by = [by] if isinstance(by, str) else list(by)
    spark = _session(df)
    cfg = config.resolve(spark, memory_budget, spill_dir)
    use_driver_python_locally(spark)
    metrics = metrics or JobMetrics(spark)
    if isinstance(df, ArrangedDataset):
        if df.key != by:
            raise ValueError(f"snapshot_reduce: the arranged dataset is keyed on {df.key}, "
                             f"not {by}")
        source = pa.schema([df.schema.field(c) for c in df.vals])
    else:
        missing = [b for b in by if b not in df.columns]
        if missing:
            raise KeyError(f"snapshot_reduce: no column(s) {missing} (columns: {df.columns})")
        source = _arrow_schema(df.schema)
    aggs = check_aggs(aggs, source, "the DataFrame")
    key_schema = (pa.schema([df.schema.field(k) for k in by]) if isinstance(df, ArrangedDataset)
                  else pa.schema([source.field(b) for b in by]))
    out_schema = pa.schema(list(key_schema) + [_spark_field(n, f, c, source)
                                                for n, (f, c) in aggs.items()])
    spark_out = _spark_schema(out_schema)
    aggs, means = _decimal_means(aggs, source)

    def spec(phase, schema=source, path=None):
        return ReduceSpec(by=by, aggs=aggs, source_schema=schema, out_schema=out_schema,
                          cfg=cfg, metrics=metrics, phase=phase, path=path, means=means,
                          weight=weight if phase == "partial" else None)

    if isinstance(df, ArrangedDataset):
        s = spec("complete", path=df.path)
        result = spark.range(0, df.num_partitions, 1, df.num_partitions).mapInArrow(
            _on_workers("reduce_partition", s), spark_out)
    elif any(f == "count_distinct" for f, _ in aggs.values()):
        n = num_partitions or _default_partitions(spark)
        cols = sorted(set(by) | {c for _, c in aggs.values() if c is not None})
        s = spec("complete", _arrow_schema(df.select(*cols).schema))
        result = df.select(*cols).repartition(n, *by).mapInArrow(
            _on_workers("reduce_partition", s), spark_out)
    else:
        n = num_partitions or _default_partitions(spark)
        cols = list(dict.fromkeys(by + [c for _, c in aggs.values() if c is not None]))
        fused = getattr(df, "_arrangedb_join", None)
        weight = _weight_column(df, weight, by) if fused is None else None
        if weight is not None:
            cols = list(dict.fromkeys(cols + [weight]))
        src = fused[1].out_schema if fused is not None else _arrow_schema(df.select(*cols).schema)
        first, last = spec("partial", src), spec("final", src)
        from arrangedb.spark_integration.partition import partial_schema

        partial_out = _spark_schema(partial_schema(first))
        if fused is not None:
            # the DataFrame is a snapshot_join's output: aggregate in the join's own tasks,
            # so the joined rows never travel back to the JVM and out again
            shuffled, jspec, null_rows = fused
            partials = shuffled.mapInArrow(_on_workers("join_partition", jspec, first),
                                           partial_out)
            if null_rows is not None:
                partials = partials.unionByName(null_rows.mapInArrow(
                    _on_workers("reduce_partition", first), partial_out))
        else:
            partials = df.select(*cols).mapInArrow(_on_workers("reduce_partition", first),
                                                   partial_out)
        result = partials.repartition(n, *by).mapInArrow(
            _on_workers("reduce_partition", last), spark_out)
    result.arrangedb_metrics = metrics
    return result


def _weight_column(df, weight, by: list[str]) -> str | None:
    """The DataFrame's multiplicity column (see :func:`snapshot_reduce`)."""
    if weight is False:
        return None
    name = weight if weight is not None else ("diff" if "diff" in df.columns else None)
    if name is not None and name not in df.columns:
        raise KeyError(f"snapshot_reduce: no weight column {name!r} (columns: {df.columns})")
    if name in by:
        raise ValueError(f"snapshot_reduce: {name!r} is a group column; pass weight=False "
                         f"to count rows, or group by other columns")
    return name


def spark_decimal_result(fn: str, t: pa.DataType) -> pa.DataType | None:
    """Spark's result type for ``fn`` over a column of type ``t`` where it is not
    arrangedb's (DuckDB's): over ``decimal(p, s)``, SUM is ``decimal(p + 10, s)`` and AVG
    ``decimal(p + 4, s + 4)``, each bounded at 38; None otherwise."""
    if not pa.types.is_decimal(t) or fn not in ("sum", "mean"):
        return None
    p, s = t.precision, t.scale
    if fn == "sum":
        return pa.decimal128(min(38, p + 10), s)
    return pa.decimal128(min(38, p + 4), min(38, s + 4))


def _spark_field(name: str, fn: str, col, source: pa.Schema) -> pa.Field:
    field = output_field(name, fn, col, source)
    typ = spark_decimal_result(fn, source.field(col).type) if col is not None else None
    return field if typ is None else field.with_type(typ)


def _decimal_means(aggs: dict, source: pa.Schema) -> tuple[dict, dict]:
    """Means of decimals computed as their exact sum and count (the tasks divide them
    as Spark does, :func:`partition.spark_result`): the aggregates to run, and each
    such mean's (sum, count) columns."""
    run, means = {}, {}
    for name, (fn, col) in aggs.items():
        if fn == "mean" and pa.types.is_decimal(source.field(col).type):
            means[name] = (f"__{name}__sum", f"__{name}__count")
            run[means[name][0]], run[means[name][1]] = ("sum", col), ("count", col)
        else:
            run[name] = (fn, col)
    return run, means


def arrange_df(df, key, vals=None, path=None, num_partitions: int | None = None,
               memory_budget=None, spill_dir=None,
               metrics: JobMetrics | None = None) -> ArrangedDataset:
    """Arrange each hash partition of ``df`` on ``key`` and save it under ``path``.

    Runs a job now; returns the :class:`ArrangedDataset` that ``snapshot_join`` and
    ``snapshot_reduce`` accept in place of a DataFrame. ``path`` must be reachable from
    every executor (a local path in local mode, a shared file system on a cluster). Key
    columns must not hold nulls.
    """
    if path is None:
        raise ValueError("arrange_df needs path=, the directory to write the dataset to")
    keys = [key] if isinstance(key, str) else list(key)
    missing = [k for k in keys if k not in df.columns]
    if missing:
        raise KeyError(f"arrange_df: no column(s) {missing} (columns: {df.columns})")
    vals = [c for c in df.columns if c not in keys] if vals is None else list(vals)
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(os.path.join(path, MANIFEST)):
        raise FileExistsError(f"{path!r} already holds an arranged dataset")
    os.makedirs(path, exist_ok=True)
    spark = df.sparkSession
    cfg = config.resolve(spark, memory_budget, spill_dir)
    use_driver_python_locally(spark)
    metrics = metrics or JobMetrics(spark)
    n = num_partitions or _default_partitions(spark)
    schema = _arrow_schema(df.select(*keys, *vals).schema)
    summary_schema = _spark_schema(pa.schema([("partition", pa.int64()),
                                              ("updates", pa.int64()), ("bytes", pa.int64())]))
    rows = (df.select(*keys, *vals).repartition(n, *keys)
            .mapInArrow(_on_workers("arrange_partition", keys, vals, schema, path,
                             cfg, metrics), summary_schema)
            .collect())   # one small summary row per partition, never data
    with open(os.path.join(path, MANIFEST), "w") as f:
        json.dump({"key": keys, "vals": vals, "num_partitions": n,
                   "schema": schema.serialize().to_pybytes().hex(),
                   "partitioning": "Spark hash partitioning (murmur3) of the key columns",
                   "updates": sum(r["updates"] for r in rows),
                   "bytes": sum(r["bytes"] for r in rows)}, f, indent=1)
    return ArrangedDataset(path, keys, vals, n, schema)
