"""The driver's side of the views of :mod:`.view_tasks`: creating a view over two
arranged datasets, stepping it by the inputs' unseen commits, stepping it inside a
write's own job, and reading its changes (from the manifest when few)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import warnings
from dataclasses import replace

import pyarrow as pa

from arrangedb.pager import disk
from arrangedb.spark_integration import dataset
from arrangedb.spark_integration.dataset import Layout
from arrangedb.spark_integration.task import raise_refusal
from arrangedb.spark_integration.view_tasks import (INLINE_ROWS, ROUTE, VIEW_REPORT, ViewSpec,
                                                    definition, delta_schema, state_aggs,
                                                    view_spec, view_tasks)

DEPENDENTS = "_dependents"


def view_path(left, right, on, by, aggs) -> str:
    ident = json.dumps({"left": left.path, "right": right.path, "on": list(on),
                        "by": by, "aggs": {k: list(v) for k, v in sorted(aggs.items())}},
                       sort_keys=True)
    return os.path.join(left.path, "_views", hashlib.sha1(ident.encode()).hexdigest()[:16])


def dependent_views(path: str) -> list[str]:
    """The views registered over the dataset at ``path``."""
    folder = os.path.join(path, DEPENDENTS)
    out = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith(".tmp"):   # a registration cut short: its view registers again
            continue
        with open(os.path.join(folder, name)) as f:
            view = f.read().strip()
        if os.path.exists(os.path.join(view, dataset.MANIFEST)):
            out.append(view)
    return out


def _register(path: str, inputs) -> None:
    """Name the view in each input's ``_dependents`` (one small file each, written before
    the view's first commit: an input's writer may find a view with no state yet),
    durably: written whole under a temporary name, fsync'd, renamed, the folder fsync'd."""
    for ds in inputs:
        folder = os.path.join(ds.path, DEPENDENTS)
        disk().make_dirs(folder)
        target = os.path.join(folder, os.path.basename(path))
        tmp = f"{target}.{os.getpid()}.tmp"
        disk().unlink_quietly(tmp)
        disk().write_file(tmp, path.encode())
        disk().rename(tmp, target)
        disk().fsync_dir(folder)


def reduce_changes(spark, left, right, jspec, by, aggs, out_schema, since, upto, cfg,
                   metrics):
    """The aggregate's changes in [since, upto) as a DataFrame (by, aggregates, time,
    diff); brings the view up to date with its inputs first (one job, committed).

    A step folds the inputs' commits the view has not seen, counted by version: the
    state seen before is read as of the view's time ``v``, the new commits' updates at
    their times, or at ``v + 1`` if earlier (a commit to one input at a time the view
    has passed lands at the view's next time; its history is not rewritten)."""
    from arrangedb.spark_integration.frames import on_workers, spark_schema

    if upto is not None and upto <= since:
        raise ValueError(f"upto={upto} must be greater than since={since}")
    state_aggs(aggs, jspec.out_schema, "snapshot_reduce")   # refused before any write
    for ds in (left, right):   # a view (re)built after a compaction starts at its frontier
        ds.check_since(since)
    path = view_path(left, right, jspec.keys, by, aggs)
    defn = definition(left, right, jspec.keys, by, aggs, jspec.out_schema, out_schema)
    spec = view_spec(defn, path, cfg, metrics)
    if not os.path.exists(os.path.join(path, dataset.MANIFEST)):
        disk().make_dirs(path)
        dataset.write_manifest(path, dataset.new_manifest(
            spec.key_schema.names, spec.val_schema.names, left.num_partitions,
            pa.schema(list(spec.key_schema) + list(spec.val_schema)), True,
            inputs={"left": 0, "right": 0}, definition=defn))
        _register(path, (left, right))
    n = left.num_partitions
    with dataset.writer(path) as m:
        m = _step(spark, spec, m, left, right, n)
        v = dataset.latest_time(m)
        upto = v + 1 if upto is None else upto
        if since > v:
            raise ValueError(f"since={since} is after the view's latest time {v}")
        inline = _inline(m, since, upto)
        if inline is not None:   # a day's few changes: from the manifest, no job
            return spark.createDataFrame(inline)
        spec.since, spec.upto = since, upto
        spec.view = _view_layout(path, m, min(upto - 1, v), spec)
    return spark.range(0, n, 1, n).mapInArrow(on_workers("view_tasks", "view_changes", spec),
                                              spark_schema(spec.out_schema))


def _inline(m: dict, since: int, upto: int) -> pa.Table | None:
    """The changes in [since, upto) from the commits' kept changes, if every commit with
    times there kept them and lies inside."""
    tables = []
    for c in m["commits"]:
        if c["upper"] <= since or c["lower"] >= upto:
            continue
        if "changes" not in c or c["lower"] < since or c["upper"] > upto:
            return None
        tables.append(pa.ipc.open_stream(base64.b64decode(c["changes"])).read_all())
    # one chunk: Spark's createDataFrame drops the rows after an empty record batch
    return pa.concat_tables(tables).combine_chunks() if tables else None


def _kept_changes(reports, schema: pa.Schema) -> str | None:
    """The view tasks' finished changes, for the manifest, when every task kept them.
    No reports (a step whose join changed nothing: no task got a partial) keep none."""
    blobs = [r["changes"] for r in reports]
    if any(b is None for b in blobs):
        return None
    table = pa.concat_tables([schema.empty_table()]
                             + [pa.ipc.open_stream(b).read_all() for b in blobs]).combine_chunks()
    if table.num_rows > INLINE_ROWS:
        return None
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return base64.b64encode(sink.getvalue().to_pybytes()).decode()


def _sides(spec: ViewSpec, m: dict, ml: dict, mr: dict, left, right):
    """The step's inputs and time range, or None when the view has seen everything.
    A compacted commit the view has not fully seen cannot be split: the view is
    rebuilt from nothing."""
    v = dataset.latest_time(m)
    seen = m["inputs"]
    lold, lnew = dataset.split_seen(ml, seen["left"])
    rold, rnew = dataset.split_seen(mr, seen["right"])
    if v is not None and not lnew and not rnew:
        return None
    floor = 0 if v is None else v + 1
    upto = max([floor] + [t for t, _ in lnew + rnew]) + 1
    return floor, upto, [Layout(ds.path, ds.key, ds.vals, ds.schema, old, upto - 1,
                                tuple(new), floor)
                         for ds, old, new in ((left, lold, lnew), (right, rold, rnew))]


def _rebuild_if_compacted(spec: ViewSpec, m: dict, ml: dict, mr: dict) -> dict:
    seen = m["inputs"]
    if any(c.get("compacted_from", c["version"]) <= s < c["version"]
           for mm, s in ((ml, seen["left"]), (mr, seen["right"])) for c in mm["commits"]):
        m = dict(m, commits=[], inputs={"left": 0, "right": 0}, batch_ids={})
        dataset.write_manifest(spec.root, m)
        for part in os.listdir(spec.root):
            if part.startswith("part-"):
                shutil.rmtree(os.path.join(spec.root, part), ignore_errors=True)
    return m


def _step(spark, spec: ViewSpec, m: dict, left, right, n: int) -> dict:
    """Fold the inputs' unseen commits into the view; returns its new manifest."""
    from arrangedb.spark_integration.frames import on_workers, spark_schema

    ml, mr = dataset.read_manifest(left.path), dataset.read_manifest(right.path)
    m = _rebuild_if_compacted(spec, m, ml, mr)
    sides = _sides(spec, m, ml, mr, left, right)
    if sides is None:
        return m
    floor, upto, (lside, rside) = sides
    v = dataset.latest_time(m)
    step = replace(spec, left=lside, right=rside, step_since=floor, step_upto=upto,
                   version=m["version"] + 1,
                   view=None if v is None else _view_layout(spec.root, m, v, spec))
    try:
        reports = (spark.range(0, n, 1, n)
                   .mapInArrow(on_workers("view_tasks", "join_deltas", step),
                               spark_schema(delta_schema(step)))
                   .repartition(view_tasks(step, n), ROUTE)
                   .mapInArrow(on_workers("view_tasks", "apply_deltas", step),
                               spark_schema(VIEW_REPORT))
                   .collect())
    except BaseException:
        dataset.remove_attempts(spec.root, step.version, keep=())
        raise
    reports = [r.asDict() for r in reports]
    return dataset.commit(spec.root, m, reports, sorted({floor, upto - 1}),
                          entry={"changes": _kept_changes(reports, spec.out_schema)},
                          inputs={"left": dataset.through(ml), "right": dataset.through(mr)})


def fusable(ds, m: dict, path: str, vm: dict, time: int, cfg, metrics):
    """For a write at ``time`` into ``ds`` (manifest ``m``): whether the view at ``path``
    (manifest ``vm``, its writer role held) has seen every commit of both inputs; if so,
    the spec of its step and which side ``ds`` is, else None."""
    defn = vm.get("definition")
    if defn is None or dataset.latest_time(vm) is None:
        return None
    side = "left" if defn["left"] == ds.path else "right"
    other_path = defn["right"] if side == "left" else defn["left"]
    if other_path == ds.path:
        return None   # a self-join: its step needs both sides' new commits
    other_m = dataset.read_manifest(other_path)
    inputs = {side: (ds.path, m), ("right" if side == "left" else "left"): (other_path, other_m)}
    if vm["inputs"] != {k: dataset.through(mm) for k, (_, mm) in inputs.items()}:
        return None   # behind: its next read steps it
    v = dataset.latest_time(vm)
    floor, upto = v + 1, max(v + 1, time) + 1
    layouts = {k: Layout(p, mm["key"], mm["vals"], dataset.schema_of(mm),
                         dataset.split_seen(mm, dataset.through(mm))[0], upto - 1, (), floor)
               for k, (p, mm) in inputs.items()}
    spec = view_spec(defn, path, cfg, metrics)
    spec = replace(spec, left=layouts["left"], right=layouts["right"], step_since=floor,
                   step_upto=upto, version=vm["version"] + 1,
                   view=_view_layout(path, vm, v, spec))
    return spec, side


def commit_fused(ds_path: str, m: dict, path: str, vm: dict, spec: ViewSpec, side: str,
                 rows, times, batch_id) -> dict:
    """Commit the dataset's write, then the view's step (its inputs: the new version of
    the written side, the other as it was).

    Once the dataset's commit has landed the write is done: raising then would tell the
    caller it failed, and a retry would write it twice. So the view's entry is prepared
    before it, and a view commit that still fails only leaves the view behind (its next
    read steps it), with a warning."""
    written = [r for r in rows if r["target"] == "dataset"]
    stepped = [r for r in rows if r["target"] == "view"]
    entry = {"changes": _kept_changes(stepped, spec.out_schema)}
    new_m = dataset.commit(ds_path, m, written, times, batch_id=batch_id)
    inputs = dict(vm["inputs"], **{side: dataset.through(new_m)})
    try:
        dataset.commit(path, vm, stepped, sorted({spec.step_since, spec.step_upto - 1}),
                       entry=entry, inputs=inputs)
    except Exception as e:   # noqa: BLE001 -- the write is committed whatever this was
        warnings.warn(f"the write into {ds_path!r} is committed at time {max(times)}, but "
                      f"the view {path!r} could not record its step ({type(e).__name__}: "
                      f"{e}); its next read brings it up to date", RuntimeWarning,
                      stacklevel=2)
    return new_m


def _view_layout(path: str, m: dict, at: int, spec: ViewSpec) -> Layout:
    return Layout(path, spec.key_schema.names, spec.val_schema.names,
                  pa.schema(list(spec.key_schema) + list(spec.val_schema)),
                  dataset.parts_at(m, at), at)


def write_and_step(ds, df, spec, m: dict, t: int, batch_id) -> bool:
    """Write ``df`` into ``ds`` (the write ``spec`` at time ``t``) and step an up-to-date
    view over it in the same job: the writing tasks join their new directories with the
    other input, the view's tasks apply the partials. False if no view can be stepped
    so (the caller writes alone)."""
    from arrangedb.spark_integration.frames import (active_session, on_workers,
                                                    spark_schema)
    from arrangedb.spark_integration.view_tasks import fused_report_schema, fused_schema

    for path in dependent_views(ds.path):
        with dataset.writer(path) as vm:
            found = fusable(ds, m, path, vm, t, spec.cfg, spec.metrics)
            if found is None:
                continue
            view, side = found
            n = ds.num_partitions
            try:
                # df None: the driver routed the rows to files the writing tasks read
                source = (df.repartition(n, *ds.key) if df is not None
                          else active_session().range(0, n, 1, n))
                rows = (source
                        .mapInArrow(on_workers("view_tasks", "fused_write", spec, view, side),
                                    spark_schema(fused_schema(view)))
                        .repartition(view_tasks(view, n), ROUTE)
                        .mapInArrow(on_workers("view_tasks", "fused_apply", view),
                                    spark_schema(fused_report_schema()))
                        .collect())
            except BaseException as e:
                dataset.remove_attempts(ds.path, spec.version, keep=())
                dataset.remove_attempts(path, view.version, keep=())
                raise_refusal(e)
                raise
            rows = [{k.removeprefix("__report_"): v for k, v in r.asDict().items()}
                    for r in rows]
            commit_fused(ds.path, m, path, vm, view, side, rows, [t], batch_id)
            return True
    return False
