"""ArrangedDataset and arrange_df: arrangements of a DataFrame's hash partitions that live
on shared storage, with a timeline of committed times.

``arrange_df`` writes time 0 (or the given time); ``insert``, ``upsert`` and ``delete``
each add one time, written by one Spark job and made visible by the driver's commit
when every partition has succeeded (:mod:`.dataset`); ``compact`` folds old times away.
Equal keys land in equal partition numbers (Spark's hash partitioning of the key
columns cast to the dataset's types), so a join reads partition ``i`` of each side.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import pyarrow as pa

from arrangedb.pager import disk
from arrangedb.spine import SchemaError, convertible
from arrangedb.spark_integration import config, dataset, parquet_source
from arrangedb.spark_integration.dataset import Layout
from arrangedb.spark_integration.dataset_tasks import REPORT, WriteSpec
from arrangedb.spark_integration.frames import (arrow_schema, default_partitions,
                                                on_workers, spark_schema)
from arrangedb.spark_integration.metrics import JobMetrics
from arrangedb.spark_integration.task import raise_refusal
from arrangedb.spark_integration.workers import use_driver_python_locally


@dataclass(frozen=True)
class ArrangedDataset:
    """Per-partition arrangements under ``path`` with a timeline. The handle is
    immutable; what it reads is the latest committed time unless a query asks for an
    earlier one (``at=``)."""
    path: str
    key: list[str]
    vals: list[str]
    num_partitions: int
    schema: pa.Schema          # key columns then vals
    unique: bool = False

    @classmethod
    def open(cls, path) -> "ArrangedDataset":
        path = os.path.abspath(os.fspath(path))
        m = dataset.read_manifest(path)
        return cls._of(path, m)

    @classmethod
    def _of(cls, path: str, m: dict) -> "ArrangedDataset":
        schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(m["schema"])))
        return cls(path, m["key"], m["vals"], m["num_partitions"], schema, m["unique"])

    def key_types(self) -> list[pa.DataType]:
        return [self.schema.field(k).type for k in self.key]

    # -- the timeline ----------------------------------------------------------------
    def times(self) -> list[int]:
        """The committed times still readable (at or after the compaction frontier)."""
        m = dataset.read_manifest(self.path)
        return sorted({t for c in m["commits"] for t in c["times"] if t >= m["since"]}
                      | ({m["since"]} if m["since"] else set()))

    def latest(self) -> int:
        return dataset.latest_time(dataset.read_manifest(self.path))

    def since(self) -> int:
        """The compaction frontier: times before it can no longer be read."""
        return dataset.read_manifest(self.path)["since"]

    def check_since(self, since: int) -> None:
        """Changes from ``since`` start from the state at ``since - 1``: refused once a
        compaction has folded that time away."""
        frontier = self.since()
        if since > 0 and since - 1 < frontier:
            raise ValueError(f"{self.path!r}: since={since} reads time {since - 1}, before "
                             f"the compaction frontier {frontier}")

    def layout(self, at: int | None = None) -> Layout:
        """The partitions' directories at ``at`` (None: the latest committed time)."""
        m = dataset.read_manifest(self.path)
        t = dataset.resolve_at(m, at, self.path)
        return Layout(self.path, self.key, self.vals, self.schema, dataset.parts_at(m, t), t)

    # -- writing ---------------------------------------------------------------------
    def insert(self, df, time: int | None = None, diff: str | None = None,
               batch_id=None, memory_budget=None, spill_dir=None,
               metrics: JobMetrics | None = None) -> int:
        """Add ``df``'s rows as updates at a new time (default: the latest + 1) and
        return it. ``diff``: an integer column of multiplicities (default +1 each; -1
        retracts a row). The time becomes visible when every partition has written it.
        ``batch_id``: an idempotency token: a batch already committed adds nothing and
        its time is returned (``foreachBatch`` replays survive)."""
        return self._write(df, "insert", time, diff, batch_id, memory_budget, spill_dir,
                           metrics)

    def upsert(self, df, time: int | None = None, batch_id=None, memory_budget=None,
               spill_dir=None, metrics: JobMetrics | None = None) -> int:
        """For a dataset of unique keys: each row of ``df`` replaces its key's current
        row (or adds it), at a new time, returned."""
        return self._write(df, "upsert", time, None, batch_id, memory_budget, spill_dir,
                           metrics)

    def delete(self, keys_df, time: int | None = None, batch_id=None, memory_budget=None,
               spill_dir=None, metrics: JobMetrics | None = None) -> int:
        """For a dataset of unique keys: retract the current row of each key in
        ``keys_df`` (keys not present are ignored), at a new time, returned."""
        return self._write(keys_df, "delete", time, None, batch_id, memory_budget,
                           spill_dir, metrics)

    def compact(self, before: int, memory_budget=None, spill_dir=None,
                metrics: JobMetrics | None = None) -> None:
        """Fold the history before ``before`` into it (reads at earlier times are then
        refused) and merge each partition into one directory; the directories of the
        commits it replaces are removed."""
        from arrangedb.spark_integration.frames import active_session

        spark = active_session()
        with dataset.writer(self.path) as m:
            latest = dataset.latest_time(m)
            before = int(before)
            if before < m["since"]:
                raise ValueError(f"compact(before={before}): the dataset is already "
                                 f"compacted to {m['since']}")
            if latest is None or before > latest:
                raise ValueError(f"compact(before={before}) is after the latest time "
                                 f"{latest}")
            current = Layout(self.path, self.key, self.vals, self.schema,
                             dataset.parts_at(m, latest), latest)
            spec = self._spec(spark, m, "compact", None, None, memory_budget, spill_dir,
                              metrics, current=current, compact_before=before)
            reports = self._run(spark, None, spec)
            times = sorted({t for c in m["commits"] for t in c["times"] if t >= before}
                           | {before})
            dataset.commit(self.path, m, reports, times, replace=True, since=before)

    def _spec(self, spark, m, mode, time, diff, memory_budget, spill_dir, metrics,
              current=None, compact_before=None) -> WriteSpec:
        cfg = config.resolve(spark, memory_budget, spill_dir)
        use_driver_python_locally(spark)
        return WriteSpec(root=self.path, key=self.key, vals=self.vals, schema=self.schema,
                         version=m["version"] + 1, time=time, diff=diff, cfg=cfg,
                         metrics=metrics or JobMetrics(spark), unique=self.unique,
                         current=current, mode=mode, compact_before=compact_before)

    def _run(self, spark, df, spec: WriteSpec) -> list:
        """Run the writing job; if it fails, remove what its attempts wrote."""
        if df is None:
            n = self.num_partitions
            df = spark.range(0, n, 1, n)
        else:
            df = df.repartition(self.num_partitions, *self.key)
        try:
            rows = df.mapInArrow(on_workers("dataset_tasks", "write_partition", spec),
                                 spark_schema(REPORT)).collect()
        except BaseException as e:
            dataset.remove_attempts(self.path, spec.version, keep=())
            raise_refusal(e)
            raise
        return [r.asDict() for r in rows]   # one small report per partition, never data

    def _route_small_files(self, df, cols, diff, spec: WriteSpec) -> dict | None:
        """A small plain Parquet scan routed to the partitions by the driver (see
        :func:`.parquet_source.route_on_driver`), or None."""
        schema = pa.schema([self.schema.field(c) for c in cols]
                           + ([pa.field(diff, pa.int64())] if diff is not None else []))
        try:
            return parquet_source.route_on_driver(
                df, schema.names, schema, self.key, self.num_partitions, self.path,
                dataset.attempt_prefix(spec.version))
        except BaseException:
            dataset.remove_attempts(self.path, spec.version, keep=())
            raise

    def _write(self, df, mode, time, diff, batch_id, memory_budget, spill_dir, metrics):
        from pyspark.sql import functions as F

        if mode in ("upsert", "delete") and not self.unique:
            raise ValueError(f"{mode} needs a dataset of unique keys: arrange it with "
                             f"arrange_df(..., unique=True)")
        cols = self.key if mode == "delete" else self.key + self.vals
        missing = [c for c in cols + ([diff] if diff else []) if c not in df.columns]
        if missing:
            raise KeyError(f"{mode}: the DataFrame has no column(s) {missing} "
                           f"(columns: {df.columns})")
        if diff is not None and diff in cols:
            raise ValueError(f"{mode}: diff={diff!r} is one of the dataset's columns")
        spark = df.sparkSession
        with dataset.writer(self.path) as m:
            if batch_id is not None and str(batch_id) in m["batch_ids"]:
                return m["batch_ids"][str(batch_id)]   # replayed: committed already
            latest = dataset.latest_time(m)
            t = (latest + 1 if latest is not None else 0) if time is None else int(time)
            if latest is not None and t <= latest:
                raise ValueError(f"{mode} at time {t}: the dataset's latest time is "
                                 f"{latest}; a new time must be later")
            _check_types(mode, df, cols, diff, self.schema)
            types = {f.name: f.dataType for f in spark_schema(self.schema).fields}
            # the dataset's types: Spark hashes an int as it hashes an int, not a long
            sel = [F.col(c).cast(types[c]).alias(c) for c in cols]
            if diff is not None:
                sel.append(F.col(diff).cast("long").alias(diff))
            current = None
            if self.unique:   # upserts and deletes replace its rows, inserts must not repeat them
                current = Layout(self.path, self.key, self.vals, self.schema,
                                 dataset.parts_at(m, latest), latest)
            spec = self._spec(spark, m, mode, t, diff, memory_budget, spill_dir, metrics,
                              current=current)
            routed = self._route_small_files(df, cols, diff, spec)
            if routed is not None:   # the tasks read the routed files, not rows from Spark
                spec = dataclasses.replace(spec, routed=routed)
            source = df.select(*sel) if routed is None else None
            from arrangedb.spark_integration.views import write_and_step

            if not write_and_step(self, source, spec, m, t, batch_id):
                reports = self._run(spark, source, spec)
                dataset.commit(self.path, m, reports, [t], batch_id=batch_id)
        return t


def arrange_df(df, key, vals=None, path=None, num_partitions: int | None = None,
               memory_budget=None, spill_dir=None, metrics: JobMetrics | None = None,
               time: int = 0, unique: bool = False) -> ArrangedDataset:
    """Arrange each hash partition of ``df`` on ``key`` and save it under ``path`` as
    the dataset's first time (``time``, default 0).

    Runs a job now; returns the :class:`ArrangedDataset` that ``snapshot_join`` and
    ``snapshot_reduce`` accept in place of a DataFrame and that ``insert`` adds to.
    ``path`` must be reachable from every executor (a local path in local mode, a shared
    file system on a cluster). Key columns must not hold nulls. ``unique=True``: each
    key holds one row (checked), which ``upsert`` and ``delete`` need.
    """
    if path is None:
        raise ValueError("arrange_df needs path=, the directory to write the dataset to")
    keys = [key] if isinstance(key, str) else list(key)
    missing = [k for k in keys if k not in df.columns]
    if missing:
        raise KeyError(f"arrange_df: no column(s) {missing} (columns: {df.columns})")
    vals = [c for c in df.columns if c not in keys] if vals is None else list(vals)
    path = os.path.abspath(os.fspath(path))
    spark = df.sparkSession
    n = num_partitions or default_partitions(spark)
    schema = arrow_schema(df.select(*keys, *vals).schema)
    files = parquet_source.plain_parquet_scan(df)
    ds, m = _new_dataset(path, keys, vals, n, schema, unique)
    spec = ds._spec(spark, m, "arrange", int(time), None, memory_budget, spill_dir, metrics)
    if files is not None:   # read by the tasks themselves, never through the JVM
        reports = _arrange_files(spark, ds, files, spec)
    else:
        reports = ds._run(spark, df.select(*keys, *vals), spec)
    dataset.commit(path, m, reports, [int(time)])
    return ds


def arrange_parquet(spark, paths, key, vals=None, path=None,
                    num_partitions: int | None = None, memory_budget=None, spill_dir=None,
                    metrics: JobMetrics | None = None, time: int = 0,
                    unique: bool = False) -> ArrangedDataset:
    """``arrange_df(spark.read.parquet(*paths).select(*key, *vals), ...)``, read by the
    tasks with pyarrow (see :mod:`.parquet_source`): ``paths`` are Parquet files or
    directories of them, reachable from every executor."""
    if path is None:
        raise ValueError("arrange_parquet needs path=, the directory to write the "
                         "dataset to")
    files = parquet_source.parquet_files(paths)
    file_schema = parquet_source.file_schema(files)
    keys = [key] if isinstance(key, str) else list(key)
    vals = [c for c in file_schema.names if c not in keys] if vals is None else list(vals)
    missing = [c for c in keys + vals if c not in file_schema.names]
    if missing:
        raise KeyError(f"arrange_parquet: no column(s) {missing} in {files[0]!r} "
                       f"(columns: {file_schema.names})")
    # the types Spark reads the files as, as arrange_df would store them
    schema = arrow_schema(spark_schema(pa.schema([file_schema.field(c) for c in keys + vals])))
    n = num_partitions or default_partitions(spark)
    ds, m = _new_dataset(os.path.abspath(os.fspath(path)), keys, vals, n, schema, unique)
    spec = ds._spec(spark, m, "arrange", int(time), None, memory_budget, spill_dir, metrics)
    reports = _arrange_files(spark, ds, files, spec)
    dataset.commit(ds.path, m, reports, [int(time)])
    return ds


def _new_dataset(path, keys, vals, n, schema, unique):
    if os.path.exists(os.path.join(path, dataset.MANIFEST)):
        raise FileExistsError(f"{path!r} already holds an arranged dataset")
    disk().make_dirs(path)   # durable: the manifest's directory must outlive power loss
    with open(os.path.join(path, dataset.LOCK), "a"):
        pass
    ds = ArrangedDataset(path, keys, vals, n, schema, bool(unique))
    return ds, dataset.new_manifest(keys, vals, n, schema, bool(unique))


def _arrange_files(spark, ds: ArrangedDataset, files: list[str], spec: WriteSpec) -> list:
    """The two jobs of the cold path: route the files' rows to files per partition,
    then arrange each partition's rows; the second job's reports, to commit."""
    splits = parquet_source.plan_splits(files, ds.schema.names,
                                        spec.cfg.budget_bytes // parquet_source.SPLIT_SHARE)
    spec = dataclasses.replace(spec, num_partitions=ds.num_partitions)
    try:
        routed: dict[int, list[str]] = {}
        for r in _on_each(spark, len(splits), "route_split", spec, splits):
            routed.setdefault(r["partition"], []).append(r["dir"])
        return _on_each(spark, ds.num_partitions, "arrange_routed", spec, routed)
    except BaseException as e:
        dataset.remove_attempts(ds.path, spec.version, keep=())
        raise_refusal(e)
        raise


def _on_each(spark, n: int, function: str, *args) -> list:
    """One task per index 0..n-1 running ``dataset_tasks.function``; its report rows."""
    rows = spark.range(0, n, 1, max(n, 1)).mapInArrow(
        on_workers("dataset_tasks", function, *args), spark_schema(REPORT)).collect()
    return [r.asDict() for r in rows]


def _check_types(mode: str, df, cols: list[str], diff: str | None, schema: pa.Schema) -> None:
    """A column of another kind of value than the dataset's is refused, as an insert into
    a trace refuses it (Spark's cast would turn '3' into 3 and 0.5 into 0)."""
    given = arrow_schema(df.select(*cols + ([diff] if diff else [])).schema)
    for c in cols:
        if not convertible(given.field(c).type, schema.field(c).type):
            raise SchemaError(f"{mode}: column {c!r} has type {given.field(c).type}, the "
                              f"dataset's is {schema.field(c).type}")
    if diff is not None and not pa.types.is_integer(given.field(diff).type):
        raise SchemaError(f"{mode}: diff column {diff!r} must hold integers, not "
                          f"{given.field(diff).type}")
