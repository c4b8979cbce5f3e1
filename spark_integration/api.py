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

from dataclasses import replace

import pyarrow as pa

from arrangedb.ops.aggregate import check_aggs, output_field
from arrangedb.ops.join import prefixed_names
from arrangedb.spark_integration import config
from arrangedb.spark_integration.metrics import JobMetrics
from arrangedb.spark_integration.partition import SIDE, JoinSpec, ReduceSpec
from arrangedb.spark_integration.arranged import ArrangedDataset
from arrangedb.spark_integration.frames import (active_session, arrow_schema,
                                                default_partitions, on_workers, spark_schema)
from arrangedb.spark_integration.workers import use_driver_python_locally

def _on_workers(function: str, *args):
    return on_workers("partition", function, *args)


HOWS = {"inner": "inner", "left": "left", "left_outer": "left", "leftouter": "left",
        "semi": "semi", "left_semi": "semi", "leftsemi": "semi",
        "anti": "anti", "left_anti": "anti", "leftanti": "anti"}


def _session(*objs):
    for o in objs:
        if not isinstance(o, ArrangedDataset):
            return o.sparkSession
    return active_session()


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
    schema = arrow_schema(source.select(*keys, *cols).schema)
    return pa.schema([f.with_name(n) for f, n in zip(schema, keys + names)])


def snapshot_join(left_df, right_df, on, how: str = "inner", num_partitions: int | None = None,
                  memory_budget=None, spill_dir=None, metrics: JobMetrics | None = None,
                  at: int | None = None, since: int | None = None, upto: int | None = None):
    """Join two DataFrames (or arranged datasets) on ``on`` through arrangedb.

    Same rows as ``left_df.join(right_df, on, how)`` (null keys never match, duplicates
    multiply); columns: the keys, the left's other columns, the right's other columns
    (prefixed ``left_``/``right_`` where names clash). ``how``: inner, left, semi, anti.
    Metrics of the job (rows, bytes spilled, peak RSS per task against its budget) are
    in ``result.arrangedb_metrics.value`` after an action.

    Arranged datasets are read at time ``at`` (None: their latest; each dataset at its
    latest time <= ``at``). With ``since`` (both sides arranged, inner join), the join's
    changes at times ``since <= t < upto`` (default: through the latest time) instead:
    the same columns plus integer ``time`` and ``diff``, computed from the inputs'
    changes and their state (dA x B + A' x dB), never by recomputing the join.
    """
    from pyspark.sql import functions as F

    keys = [on] if isinstance(on, str) else list(on)
    if how not in HOWS:
        raise ValueError(f"unknown how={how!r}; use one of inner, left, semi, anti")
    how = HOWS[how]
    reading = _read_times(left_df, right_df, at, since, upto, how)
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
    if since is not None:
        out_fields += [pa.field("time", pa.int64()), pa.field("diff", pa.int64())]
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
        n = num_partitions or default_partitions(spark)
    spec = JoinSpec(keys=keys, left_cols=[f"__l{i}" for i in range(len(lcols))],
                    left_vals=lcols, right_cols=[f"__r{i}" for i in range(len(rcols))],
                    right_vals=rcols, how=how, out_schema=out_schema,
                    left_schema=lschema, right_schema=rschema, cfg=cfg, metrics=metrics,
                    left=reading.get(0), right=reading.get(1), since=since,
                    upto=reading.get("upto"))
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
    result = shuffled.mapInArrow(_on_workers("join_partition", spec), spark_schema(out_schema))
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
    if since is None:
        # lets snapshot_reduce over this very DataFrame aggregate inside the join's tasks
        result._arrangedb_join = (shuffled, spec, null_rows)
        result._arrangedb_sources = (left_df, right_df)
        result._arrangedb_at = at   # what a snapshot_reduce over it reads at
    return result


def _check_times(**times) -> None:
    for name, value in times.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise ValueError(f"{name}={value!r} must be a time (an int >= 0)")


def _read_times(left, right, at, since, upto, how) -> dict:
    """The layouts the arranged sides are read at (keys 0, 1) and, for changes, the
    resolved ``upto``."""
    sides = {i: s for i, s in enumerate((left, right)) if isinstance(s, ArrangedDataset)}
    _check_times(at=at, since=since, upto=upto)
    if since is None:
        if upto is not None:
            raise ValueError("upto= needs since= (the changes between two times)")
        if at is not None and not sides:
            raise ValueError("at= reads arranged datasets; neither side is one")
        out = {}
        for i, ds in sides.items():
            latest = ds.latest()
            out[i] = ds.layout(latest if at is None else min(at, latest))
        return out
    if at is not None:
        raise ValueError("give either at= (a snapshot) or since=/upto= (changes), not both")
    if len(sides) != 2:
        raise ValueError("since=/upto= need both sides to be arranged datasets (arrange_df)")
    if how != "inner":
        raise ValueError(f"since=/upto= give the changes of an inner join, not how={how!r}")
    if upto is None:
        upto = max(ds.latest() for ds in sides.values()) + 1
    if upto <= since:
        raise ValueError(f"upto={upto} must be greater than since={since}")
    out = {i: ds.layout(min(upto - 1, ds.latest())) for i, ds in sides.items()}
    for ds in sides.values():
        ds.check_since(since)
    out["upto"] = upto
    return out


def snapshot_reduce(df, by, aggs: dict, num_partitions: int | None = None, memory_budget=None,
                    spill_dir=None, metrics: JobMetrics | None = None, weight=None,
                    at: int | None = None, since: int | None = None, upto: int | None = None):
    """``df.groupBy(by).agg(...)`` through arrangedb; ``aggs`` as in :func:`arrangedb.reduce`.

    ``df`` may be an arranged dataset keyed on ``by``. Results equal Spark's
    (``count`` with column None is count(*); sum of integers is a long; mean a double;
    over decimals, the types of :func:`spark_decimal_result`, means exact).

    ``weight``: a column of row multiplicities. Spark DataFrames carry no Arrow
    metadata, so a change DataFrame's multiplicity is its ``diff`` column by convention:
    None (default) weighs rows by ``diff`` when the DataFrame has one, and count and sum
    are then the net change per group (min, max and mean are refused over negative
    weights, as in :func:`arrangedb.group_by`); False counts every row once.

    Times: over an arranged dataset, or over ``snapshot_join`` of arranged datasets,
    ``at`` reads them at that time (see :func:`snapshot_join`). ``since``/``upto`` give
    the aggregate's changes at times ``since <= t < upto`` instead: for each changed
    group and time, its old row with ``diff`` -1 and its new row with +1 (integer
    ``time`` and ``diff`` columns). Over a join, they come from per-group state kept as
    a maintained view under the left dataset (``_views/``), brought up to date from the
    inputs' changes by the call (one job; count, sum and mean), never by recomputing
    the join (:mod:`.views`).
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
        source = arrow_schema(df.schema)
    aggs = check_aggs(aggs, source, "the DataFrame")
    key_schema = (pa.schema([df.schema.field(k) for k in by]) if isinstance(df, ArrangedDataset)
                  else pa.schema([source.field(b) for b in by]))
    out_schema = pa.schema(list(key_schema) + [_spark_field(n, f, c, source)
                                                for n, (f, c) in aggs.items()])
    spark_out = spark_schema(out_schema)
    aggs, means = _decimal_means(aggs, source)

    def spec(phase, schema=source, layout=None):
        return ReduceSpec(by=by, aggs=aggs, source_schema=schema, out_schema=out_schema,
                          cfg=cfg, metrics=metrics, phase=phase, layout=layout, means=means,
                          weight=weight if phase == "partial" else None)

    fused = getattr(df, "_arrangedb_join", None)
    _check_times(at=at, since=since, upto=upto)
    join_at = getattr(df, "_arrangedb_at", None)   # the join's rows are those at join_at
    if join_at is not None and (since is not None or upto is not None):
        raise ValueError(f"snapshot_reduce: the join reads at={join_at}; since=/upto= "
                         f"need a snapshot_join without at=")
    if join_at is not None and at not in (None, join_at):
        raise ValueError(f"snapshot_reduce: at={at}, but the join reads at={join_at}")
    timed = at is not None or since is not None or upto is not None
    if timed and not isinstance(df, ArrangedDataset):
        sources = getattr(df, "_arrangedb_sources", None)
        if sources is None or not all(isinstance(s, ArrangedDataset) for s in sources):
            raise ValueError("snapshot_reduce: at=/since=/upto= read arranged datasets: "
                             "give an arranged dataset or snapshot_join of two of them")
        if since is not None:
            from arrangedb.spark_integration.views import reduce_changes

            result = reduce_changes(spark, *sources, fused[1], by, dict(aggs), out_schema,
                                    since, upto, cfg, metrics)
            result.arrangedb_metrics = metrics
            return result
        if upto is not None:
            raise ValueError("upto= needs since= (the changes between two times)")
    sources = getattr(df, "_arrangedb_sources", ())
    if fused is not None and any(isinstance(s, ArrangedDataset) for s in sources):
        # a new query: its arranged inputs are read at at= (None: the join's at=, else
        # their latest now)
        reading = _read_times(*sources, join_at if at is None else at, None, None,
                              fused[1].how)
        fused = (fused[0], replace(fused[1], left=reading.get(0), right=reading.get(1)),
                 fused[2])

    if isinstance(df, ArrangedDataset):
        if since is not None:
            out_schema = pa.schema(list(out_schema) + [pa.field("time", pa.int64()),
                                                       pa.field("diff", pa.int64())])
            spark_out = spark_schema(out_schema)
        reading = _read_times(df, None, at, since, upto, "inner") if since is None else \
            _changes_of(df, since, upto)
        s = spec("complete", layout=reading[0])
        s.since, s.upto = since, reading.get("upto")
        result = spark.range(0, df.num_partitions, 1, df.num_partitions).mapInArrow(
            _on_workers("reduce_partition", s), spark_out)
    elif any(f == "count_distinct" for f, _ in aggs.values()):
        n = num_partitions or default_partitions(spark)
        cols = sorted(set(by) | {c for _, c in aggs.values() if c is not None})
        s = spec("complete", arrow_schema(df.select(*cols).schema))
        result = df.select(*cols).repartition(n, *by).mapInArrow(
            _on_workers("reduce_partition", s), spark_out)
    else:
        cols = list(dict.fromkeys(by + [c for _, c in aggs.values() if c is not None]))
        weight = _weight_column(df, weight, by) if fused is None else None
        if weight is not None:
            cols = list(dict.fromkeys(cols + [weight]))
        src = fused[1].out_schema if fused is not None else arrow_schema(df.select(*cols).schema)
        first, last = spec("partial", src), spec("final", src)
        from arrangedb.spark_integration.partition import partial_schema

        partial_out = spark_schema(partial_schema(first))
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
        # partials are few (a row per group per input partition): unless the caller
        # fixed the count, Spark's adaptive execution coalesces their partitions (a
        # query with few groups ends in one task instead of one per partition)
        adaptive = spark.conf.get("spark.sql.adaptive.enabled", "true").lower() == "true"
        shuffled_partials = (partials.repartition(*by) if adaptive and not num_partitions
                             else partials.repartition(
                                 num_partitions or default_partitions(spark), *by))
        result = shuffled_partials.mapInArrow(_on_workers("reduce_partition", last),
                                              spark_out)
    result.arrangedb_metrics = metrics
    return result


def _changes_of(ds: ArrangedDataset, since: int, upto: int | None) -> dict:
    if upto is None:
        upto = ds.latest() + 1
    if upto <= since:
        raise ValueError(f"upto={upto} must be greater than since={since}")
    ds.check_since(since)
    return {0: ds.layout(min(upto - 1, ds.latest())), "upto": upto}


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
