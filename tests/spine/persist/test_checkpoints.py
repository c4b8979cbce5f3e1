"""Checkpoints: versioned, differential, durable -- through the public API only.

The contract (see :mod:`arrangedb.spine.persist`) these tests hold the engine to:

- ``trace.checkpoint(path=None, retain=10)`` writes the next version (1 for a new
  directory) and returns its number; ``engine.load(path, version=None)`` gives back
  exactly the trace of that version (at every time from its compaction frontier on), and
  the loaded trace checkpoints the next version into the same directory.
  ``arrangedb.versions(path)`` lists the retained versions; retention keeps the newest
  ``retain``, and a dropped version raises ``FileNotFoundError``.
- A writer killed (SIGKILL) or losing power at any instant leaves the last completed
  version or the new one -- exactly -- never an error, never a mix; the next writer
  cleans up what the dead one left.
- A full disk fails the checkpoint with an OSError, keeps the previous version loadable
  and the trace alive; the next checkpoint after space is freed succeeds.
- One writer per directory (``DirectoryLocked`` naming the holder's pid and host); a
  trace that would fork the history, or of another schema, is refused
  (``CheckpointConflict``).
- Damage is reported as ``CorruptionError`` (``PageFileError``, ``ManifestError``)
  naming the file; older versions that do not use the damaged file still load.
- A reader's lease keeps the files of the version it loaded on disk through retention,
  until it closes or its process dies.
- ``tests/data/checkpoint-v3`` (written by format 3, see :func:`write_compat_data`)
  keeps loading.
"""

from __future__ import annotations

import errno
import functools
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections import Counter, deque
from datetime import timedelta

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule, run_state_machine_as_test)

import arrangedb
import arrangedb.spine.trace as trace_module
from conftest import DATA_DIR, fill_disk
from arrangedb.pager.diskio import using
from faults import PowerLoss, injected

DATA = DATA_DIR


# -- helpers ---------------------------------------------------------------------------

def _as_dict(table: pa.Table, vals=("v",)) -> dict:
    """A snapshot as {(k, *vals): count}."""
    cols = [table.column(c).to_pylist() for c in ("k", *vals)]
    counts = table.column("count").to_pylist()
    return {tuple(r): c for r, c in zip(zip(*cols), counts)}


def _snap(trace, at=None) -> dict:
    return _as_dict(trace.snapshot(at=at).read_all())


def _page_files(path) -> set:
    return {f for f in os.listdir(path) if f.endswith(".page")}


def _manifest(path, version) -> dict:
    with open(os.path.join(path, f"manifest-{version:06d}.json")) as f:
        return json.load(f)


def _named(path, version) -> set:
    """The page files the manifest of ``version`` names."""
    return {b["file"] for b in _manifest(path, version)["batches"]}


def _named_by_retained(path) -> set:
    out = set()
    for v in arrangedb.versions(path):
        out |= _named(path, v["version"])
    return out


def _version_numbers(path) -> list:
    return [v["version"] for v in arrangedb.versions(path)]


def _live_leases(path) -> list:
    folder = os.path.join(path, "leases")
    return sorted(f for f in os.listdir(folder) if f.endswith(".lease")) \
        if os.path.isdir(folder) else []


def _int_table(keys, vals=None, d=1, t=None) -> pa.Table:
    keys = np.asarray(keys, np.int64)
    cols = {"k": keys, "v": keys * 7 % 1009 if vals is None else np.asarray(vals, np.int64),
            "d": np.full(len(keys), d, np.int64)}
    if t is not None:
        cols["t"] = np.full(len(keys), t, np.int64)
    return pa.table(cols)


def _model_of(table: pa.Table, model=None) -> dict:
    model = dict(model or {})
    for k, v, d in zip(*(table.column(c).to_pylist() for c in ("k", "v", "d"))):
        model[(k, v)] = model.get((k, v), 0) + d
        if model[(k, v)] == 0:
            del model[(k, v)]
    return model


# -- 1. the state machine ----------------------------------------------------------------

ROWS = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 3)), min_size=1, max_size=80)
RETAIN = 3


class CheckpointMachine(RuleBasedStateMachine):
    """A trace against a model of its updates [(k, v, time, diff)], checkpointed with
    retain=3 into one directory; every version's model is recorded (the length of the
    update list then, and the compaction frontier) and compared with its load."""

    root = None          # set by the test: a directory for this run
    _examples = itertools.count()

    def __init__(self):
        super().__init__()
        n = next(self._examples)
        self.dir = os.path.join(self.root, f"ck{n}")
        self.spill = os.path.join(self.root, "spill")
        os.makedirs(self.spill, exist_ok=True)
        # no idle merger: the machine merges through its own rules (exert, merge_all),
        # so a replay is the same run and a checkpoint's batches still match stats()
        self.engine = arrangedb.Engine(spill_dir=self.spill, memory_budget="64MiB",
                                       idle_merge=False)
        self.trace = self.handle = None
        self.updates: list[tuple] = []     # (k, v, time, diff)
        self.now = 0                       # the latest time inserted
        self.since = 0                     # the trace's logical compaction frontier
        self.saved: dict[int, tuple] = {}  # version -> (len(updates), since)
        self.latest = 0
        self.loaded_files: set = set()     # files the writer maps (it was loaded)

    # the model
    def model(self, n=None, at=None) -> dict:
        out: dict = {}
        for k, v, t, d in self.updates[:n]:
            if at is None or t <= at:
                out[(k, v)] = out.get((k, v), 0) + d
        return {kv: c for kv, c in out.items() if c}

    def check_trace(self, trace, n, since, what):
        assert trace.since == since, f"{what}: since {trace.since}, expected {since}"
        assert _snap(trace) == self.model(n), what
        times = sorted({t for *_, t, _ in self.updates[:n] if t >= since} | {since})
        for at in {times[0], times[len(times) // 2], times[-1]}:
            assert _snap(trace, at) == self.model(n, at), f"{what} at {at}"
        if since > 0:
            with pytest.raises(ValueError):
                trace.snapshot(at=since - 1)

    @initialize(rows=ROWS)
    def arrange(self, rows):
        table = pa.table({"k": pa.array([r[0] for r in rows], pa.int64()),
                          "v": pa.array([r[1] for r in rows], pa.int64()),
                          "d": pa.array([1] * len(rows), pa.int64())})
        self.trace = self.engine.arrange(table, key=["k"], vals=["v"], diff="d")
        self.handle = self.trace.handle()
        self.updates += [(k, v, 0, 1) for k, v in rows]

    @rule(rows=ROWS, step=st.integers(0, 3), retract=st.floats(0, 0.6),
          seed=st.integers(0, 2**16), then_checkpoint=st.booleans())
    def insert(self, rows, step, retract, seed, then_checkpoint):
        """New rows and retractions (diff -1) of present rows, at times from now on."""
        rng = random.Random(seed)
        present = sorted(self.model())
        gone = rng.sample(present, int(len(present) * retract))
        t0 = self.now + 1 + step   # at or after the upper frontier
        ups = [(k, v, t0 + rng.randint(0, 2), 1) for k, v in rows] + \
              [(k, v, t0 + rng.randint(0, 2), -1) for k, v in gone]
        table = pa.table({c: pa.array([u[i] for u in ups], pa.int64())
                          for i, c in enumerate(("k", "v", "t", "d"))})
        self.trace.insert(table, time="t", diff="d")
        self.updates += ups
        self.now = max(u[2] for u in ups)
        self.then(then_checkpoint)

    @rule(frac=st.floats(0, 1), then_checkpoint=st.booleans())
    def compact(self, frac, then_checkpoint):
        frontier = self.since + int(frac * (self.now - self.since))
        self.handle.set_logical_compaction(frontier)
        self.since = frontier
        self.then(then_checkpoint)

    @rule(then_checkpoint=st.booleans())
    def merge_all(self, then_checkpoint):
        self.trace.merge_all()
        self.then(then_checkpoint)

    @rule(fuel=st.integers(1, 5000), then_checkpoint=st.booleans())
    def exert(self, fuel, then_checkpoint):
        self.trace.exert(fuel)
        self.then(then_checkpoint)

    def then(self, checkpoint: bool):
        """Rules that change the trace may checkpoint it after (checkpoints are the
        subject: every step may make one)."""
        if checkpoint:
            self.checkpoint(implicit=True)

    @rule(implicit=st.booleans())
    def checkpoint(self, implicit):
        path = None if implicit and self.latest else self.dir
        v = self.trace.checkpoint(path, retain=RETAIN)
        assert v == self.latest + 1
        self.latest = v
        self.saved[v] = (len(self.updates), self.since)
        listed = arrangedb.versions(self.dir)
        assert [x["version"] for x in listed] == list(range(max(1, v - RETAIN + 1), v + 1))
        for x in listed:
            assert set(x) == {"version", "created", "updates", "batches", "bytes",
                              "new_bytes"}
            assert x["created"].utcoffset() == timedelta(0)
            assert 0 <= x["new_bytes"] <= x["bytes"]
        assert [x["created"] for x in listed] == sorted(x["created"] for x in listed)
        stats = self.trace.stats()
        assert (listed[-1]["updates"], listed[-1]["batches"]) == \
            (stats["updates"], stats["batches"])
        # retention left no page file that neither a retained version nor the writer needs
        named = _named_by_retained(self.dir)
        on_disk = _page_files(self.dir)
        assert named <= on_disk, f"files missing: {sorted(named - on_disk)}"
        assert on_disk <= named | self.loaded_files, \
            f"retention left {sorted(on_disk - named - self.loaded_files)}"
        with arrangedb.Engine(spill_dir=self.spill, memory_budget="64MiB") as e:
            self.check_trace(e.load(self.dir), *self.saved[v], f"version {v} (the latest)")
            if v > RETAIN:   # the version retention just dropped
                with pytest.raises(FileNotFoundError):
                    e.load(self.dir, version=v - RETAIN)

    @precondition(lambda self: self.latest)
    @rule()
    def load_latest(self):
        with arrangedb.Engine(spill_dir=self.spill, memory_budget="64MiB") as e:
            self.check_trace(e.load(self.dir), *self.saved[self.latest],
                             f"version {self.latest} (the latest)")

    @precondition(lambda self: self.latest > 1)
    @rule(back=st.integers(1, RETAIN - 1))
    def load_older(self, back):
        v = max(1, self.latest - back)
        with arrangedb.Engine(spill_dir=self.spill, memory_budget="64MiB") as e:
            self.check_trace(e.load(self.dir, version=v), *self.saved[v], f"version {v}")

    @precondition(lambda self: self.latest > RETAIN)
    @rule(data=st.data())
    def load_dropped(self, data):
        v = data.draw(st.integers(1, self.latest - RETAIN))
        with arrangedb.Engine(spill_dir=self.spill, memory_budget="64MiB") as e:
            with pytest.raises(FileNotFoundError):
                e.load(self.dir, version=v)

    @precondition(lambda self: self.latest)
    @rule()
    def reopen(self):
        """The writer goes away (uncheckpointed updates with it); a new engine loads the
        latest version and carries on writing."""
        self.engine.close()
        self.engine = arrangedb.Engine(spill_dir=self.spill, memory_budget="64MiB")
        self.trace = self.engine.load(self.dir)
        n, self.since = self.saved[self.latest]
        del self.updates[n:]
        self.check_trace(self.trace, n, self.since, f"reopened version {self.latest}")
        self.handle = self.trace.handle()
        self.loaded_files = _named(self.dir, self.latest)

    @invariant()
    def trace_matches_model(self):
        if self.trace is not None:
            assert _snap(self.trace) == self.model()

    def teardown(self):
        self.engine.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def test_checkpoints_against_a_model(tmp_path):
    CheckpointMachine.root = str(tmp_path)
    run_state_machine_as_test(CheckpointMachine, settings=settings(
        max_examples=15, stateful_step_count=15, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]))


def test_a_checkpoint_while_a_merge_reads_a_resident_batch(tmp_path):
    """Found by the machine: small inserts left a merge of two resident batches under
    way (it had read one input and held the other's part pinned); the checkpoint could
    not page the pinned batch out and failed with a ValueError."""
    CheckpointMachine.root = str(tmp_path)
    m = CheckpointMachine()
    try:
        m.arrange(rows=[(14, 0)])
        m.insert(rows=[(0, 0)], step=0, retract=0.0, seed=0, then_checkpoint=True)
        m.insert(rows=[(0, 0), (25, 0), (30, 0), (0, 0), (18, 0), (19, 0)], step=0,
                 retract=0.0, seed=0, then_checkpoint=True)
        m.insert(rows=[(0, 0), (0, 0), (0, 0), (26, 0), (29, 0), (37, 0), (30, 0), (33, 0)],
                 step=0, retract=0.5538988968974192, seed=0, then_checkpoint=False)
        m.insert(rows=[(8, 0), (24, 0), (28, 0)], step=0, retract=0.0, seed=0,
                 then_checkpoint=False)
        m.insert(rows=[(0, 0)], step=0, retract=0.5, seed=0, then_checkpoint=False)
        m.insert(rows=[(0, 0)], step=0, retract=0.0, seed=0, then_checkpoint=False)
        m.trace_matches_model()
        m.checkpoint(implicit=True)     # version 3, loaded back and compared
        m.trace_matches_model()
    finally:
        m.teardown()


# A fresh process loads a version and writes what it reads (at the latest time and at
# the frontier) as Parquet.
_LOAD_AND_DUMP = textwrap.dedent("""
    import sys
    import pyarrow.parquet as pq, arrangedb
    ck, spill, version, out = sys.argv[1:]
    with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as engine:
        trace = engine.load(ck, version=int(version))
        pq.write_table(trace.snapshot().read_all(), out + ".latest.parquet")
        pq.write_table(trace.snapshot(at=trace.since).read_all(), out + ".since.parquet")
        print(trace.since)
""")


def test_a_checkpoint_loads_in_a_fresh_process(tmp_path):
    ck, spill = tmp_path / "ck", tmp_path / "spill"
    spill.mkdir()
    rng = np.random.default_rng(11)
    models = {}
    with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as engine:
        base = _int_table(rng.integers(0, 3000, 2000))
        trace = engine.arrange(base, key=["k"], vals=["v"], diff="d")
        handle = trace.handle()
        model = _model_of(base)
        for t in (1, 2, 3, 4):
            present = list(model)
            gone = [present[i] for i in rng.choice(len(present), 150, replace=False)]
            delta = pa.concat_tables([
                _int_table(rng.integers(0, 4000, 500), t=t),
                _int_table([k for k, _ in gone], [v for _, v in gone], d=-1, t=t)])
            trace.insert(delta, time="t", diff="d")
            model = _model_of(delta, model)
            if t == 2:
                handle.set_logical_compaction(2)
                models[trace.checkpoint(ck)] = (model, 2)
        trace.exert(1 << 20)
        models[trace.checkpoint()] = (model, 2)
        assert sorted(models) == [1, 2]
    for v, (model, since) in models.items():
        out = tmp_path / f"v{v}"
        r = subprocess.run([sys.executable, "-c", _LOAD_AND_DUMP, str(ck), str(spill), str(v),
                            str(out)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        assert int(r.stdout.split()[-1]) == since
        assert _as_dict(pq.read_table(f"{out}.latest.parquet")) == model, f"version {v}"
    # version 2 at its frontier: the updates of times 1 and 2
    assert _as_dict(pq.read_table(f"{tmp_path / 'v2'}.since.parquet")) == \
        _as_dict(pq.read_table(f"{tmp_path / 'v1'}.latest.parquet"))


# -- 2. a writer SIGKILLed at random instants -------------------------------------------

# Shared by the parent and the child: version v's content is determined by v alone.
# Version 1 is the base; version v >= 2 inserts adds(v) and retracts retracts(v) (rows of
# version v - 1), so every row has count 1 and content(v) is a set of keys.
# ARRANGEDB_CRASH_SCALE multiplies the sizes: `make bench` runs the test at 300 (2.4M base
# rows, 600k added and 570k retracted per version, all staged in the directory: ~40
# versions, a few hundred MB written in all, in about three minutes).
_CRASH_DATA = textwrap.dedent("""
    import os
    import numpy as np
    import pyarrow as pa
    SCALE = int(os.environ.get("ARRANGEDB_CRASH_SCALE", "1"))
    BASE, ADD, RET = 8000 * SCALE, 2000 * SCALE, 1900 * SCALE

    def val(keys):
        return keys * 2654435761 % 1000003

    def base_keys():
        return np.random.default_rng(0).permutation(np.arange(BASE, dtype=np.int64) * 7 + 3)

    def adds(v):
        return v * 1_000_000_000 + np.random.default_rng(v).permutation(ADD).astype(np.int64)

    def retracts(v):
        return base_keys()[:RET] if v == 2 else adds(v - 1)[:RET]

    def table(keys, d):
        return pa.table({"k": keys, "v": val(keys), "d": np.full(len(keys), d, np.int64)})
""")

# The writer: loads the directory's latest version (or arranges the base), then
# checkpoints version after version (several inserts each: several new page files),
# logging "done N" once checkpoint N returned. It waits for its go file after its imports,
# so that warmed-up children are ready when the last one is killed.
_CRASH_CHILD = _CRASH_DATA + textwrap.dedent("""
    import os, sys, time
    import arrangedb
    import arrangedb.spine.trace
    ck, spill, log, ready, go = sys.argv[1:]
    if SCALE == 1:   # retractions (1900 updates) are staged in the directory, adds not
        arrangedb.spine.trace.DURABLE_RESIDENT_UPDATES = 1000
    with arrangedb.Engine(spill_dir=spill, memory_budget="16MiB") as engine:
        open(ready, "w").close()
        while not os.path.exists(go):
            time.sleep(0.001)
        listed = arrangedb.versions(ck)
        if listed:
            v = listed[-1]["version"]
            trace = engine.load(ck, version=v)
        else:
            v = 0
            trace = engine.arrange(table(base_keys(), 1), key=["k"], vals=["v"], diff="d")
        with open(log, "a") as out:
            out.write(f"loaded {v}\\n")
            out.flush()
            while True:
                if v:
                    for chunk in np.array_split(adds(v + 1), 3):
                        trace.insert(table(chunk, 1), diff="d")
                    trace.insert(table(retracts(v + 1), -1), diff="d")
                got = trace.checkpoint(ck, retain=2)
                if got != v + 1:
                    sys.exit(f"checkpoint returned version {got}, expected {v + 1}")
                v = got
                out.write(f"done {v}\\n")
                out.flush()
""")


class _CrashData:
    def __init__(self):
        self.ns: dict = {}
        exec(_CRASH_DATA, self.ns)
        self.adds = functools.lru_cache(maxsize=None)(self.ns["adds"])
        self.base = self.ns["base_keys"]()

    def keys(self, v: int) -> np.ndarray:
        """The sorted keys of version ``v``."""
        ret = self.ns["RET"]
        parts = [self.base[ret:] if v >= 2 else self.base]
        parts += [self.adds(u)[ret:] if u < v else self.adds(u) for u in range(2, v + 1)]
        return np.sort(np.concatenate(parts))

    def mismatch(self, table: pa.Table, v: int):
        keys = self.keys(v)
        k = table.column("k").to_numpy()
        if len(k) != len(keys):
            return f"{len(k)} rows, version {v} has {len(keys)}"
        if not np.array_equal(k, keys):
            return f"{int(np.sum(k != keys))} keys differ from version {v}"
        if not np.array_equal(table.column("v").to_numpy(), self.ns["val"](keys)):
            return "vals differ"
        if not (table.column("count").to_numpy() == 1).all():
            return "counts other than 1"
        return None


def _log_lines(log, prefix) -> list:
    """The numbers of the writers' log lines starting with ``prefix``."""
    try:
        with open(log) as f:
            return [int(line.split()[1]) for line in f if line.startswith(prefix)]
    except FileNotFoundError:
        return []


def _last_done(log) -> int:
    """The newest version a writer is known to have finished: one it logged as done, or
    one it loaded (a life killed after its checkpoint's rename, before its log line,
    finished a version the next life loads)."""
    return max(_log_lines(log, "done ") + _log_lines(log, "loaded ") + [0])


def test_a_writer_killed_at_any_instant_leaves_a_whole_version(tmp_path):
    data = _CrashData()
    ck, log = tmp_path / "ck", tmp_path / "done.log"
    spill = tmp_path / "spill"
    spill.mkdir()
    rng = random.Random(5)
    started = time.monotonic()
    kills, leftovers = 0, Counter()
    n_children = itertools.count()
    script = tmp_path / "writer.py"
    script.write_text(_CRASH_CHILD)
    # Each life is an interpreter start. pyarrow imports pandas (when installed)
    # on its first array -- 40% of a writer's start-up, for nothing the writer uses: the
    # writers see a pandas that cannot be imported.
    stub = tmp_path / "no-pandas" / "pandas"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('not needed by the writer')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(stub.parent)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                              if p]))

    def spawn():
        i = next(n_children)
        ready, go = tmp_path / f"ready{i}", tmp_path / f"go{i}"
        err = open(tmp_path / f"child{i}.err", "w")
        p = subprocess.Popen([sys.executable, str(script), str(ck), str(spill),
                              str(log), str(ready), str(go)], stdout=err, stderr=err,
                             env=env)
        err.close()
        return p, ready, go, tmp_path / f"child{i}.err"

    def check_directory(when, all_versions=True):
        listed = _version_numbers(ck)
        done = _last_done(log)
        if not listed:
            assert done == 0, f"{when}: no version in the directory, but {done} was done"
            return 0
        v = listed[-1]
        assert v in (done, done + 1), \
            f"{when}: the directory is at version {v}, the writer had finished {done}"
        names = _named_by_retained(ck)
        on_disk = _page_files(ck)
        assert names <= on_disk, f"{when}: missing page files {sorted(names - on_disk)}"
        if on_disk - names:
            leftovers["unnamed page files"] += 1
        if any(f.endswith(".tmp") for f in os.listdir(ck)):
            leftovers["manifest temporaries"] += 1
        if len(listed) > 2:
            leftovers["versions retention had yet to drop"] += 1
        with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as e:
            # the latest loads exactly; so does every other listed version (checked
            # when retention was cut short, and every few kills)
            for u in listed if all_versions or len(listed) > 2 else [v]:
                got = e.load(ck) if u == v else e.load(ck, version=u)
                problem = data.mismatch(got.snapshot().read_all(), u)
                assert problem is None, f"{when}: version {u}: {problem}"
                got.close()
        return v

    procs, warm, lives, at = [], deque(), 20, 0
    stretch = data.ns["SCALE"] ** 0.5   # a version takes longer to write at scale

    try:
        while kills < lives:
            while len(warm) < 2 and len(procs) < lives:   # starting up meanwhile
                procs.append(spawn())
                warm.append(procs[-1])
            child, ready, go, err = warm.popleft()
            loaded = len(_log_lines(log, "loaded "))
            deadline = time.monotonic() + 60 * stretch
            while not ready.exists():
                assert child.poll() is None, open(err).read()[-3000:]
                assert time.monotonic() < deadline, "the writer did not start"
                time.sleep(0.002)
            go.touch()
            if rng.random() < 0.15:   # at any instant from the start: maybe in the load
                time.sleep(rng.uniform(0, 0.15 * stretch))
            else:                     # in the checkpoint loop
                while len(_log_lines(log, "loaded ")) < loaded + 1:
                    assert child.poll() is None, f"the writer died: {open(err).read()[-3000:]}"
                    assert time.monotonic() < deadline, "the writer did not load"
                    time.sleep(0.002)
                time.sleep(rng.uniform(0, 0.3 * stretch))
            assert child.poll() is None, f"the writer died: {open(err).read()[-3000:]}"
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
            kills += 1
            loads = _log_lines(log, "loaded ")
            if len(loads) > loaded:   # it continued the version the last life left
                assert loads[-1] == at, f"life {kills} loaded version {loads[-1]}, not {at}"
            at = check_directory(f"after kill {kills}", all_versions=kills % 5 == 0)
    finally:
        for p, *_ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    elapsed = time.monotonic() - started
    # the directory takes the next version from a clean writer, which collects leftovers
    v = check_directory("at the end")
    assert v >= (10 if stretch == 1 else 3), \
        f"only {v} versions in {kills} lives: the kills came too early"
    with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as e:
        trace = e.load(ck)
        for chunk in np.array_split(data.adds(v + 1), 3):
            trace.insert(data.ns["table"](chunk, 1), diff="d")
        trace.insert(data.ns["table"](data.ns["retracts"](v + 1), -1), diff="d")
        assert trace.checkpoint(retain=2) == v + 1
        assert _page_files(ck) == _named_by_retained(ck), "the next writer left leftovers"
        assert not [f for f in os.listdir(ck) if f.endswith(".tmp")]
        assert data.mismatch(trace.snapshot().read_all(), v + 1) is None
    assert _live_leases(ck) == [], "leases of dead readers stayed"
    print(f"{kills} kills, {v + 1} versions in {elapsed:.1f} s; leftovers seen: "
          f"{dict(leftovers)}")
    assert leftovers["unnamed page files"], \
        f"no kill landed between a page write and its manifest: {dict(leftovers)}"


# -- 3. power loss ---------------------------------------------------------------------

class _PowerScene:
    """A trace with version 1 in ``path``, and deltas that :meth:`run` inserts before it
    checkpoints version 2 (several new batches). ``staged``: the inserts are written into
    the directory as they arrive (a writer's large inserts), so that the power may also
    go while an insert writes."""

    def __init__(self, spill, path, seed=3, staged=False):
        rng = np.random.default_rng(seed)
        self.engine = arrangedb.Engine(spill_dir=spill, memory_budget="64MiB")
        self.staged = staged
        ctx = self.engine.ctx
        ctx.part_bytes, ctx.window_rows = 16 << 10, 512
        base = _int_table(rng.integers(0, 5000, 3000))
        self.trace = self.engine.arrange(base, key=["k"], vals=["v"], diff="d")
        self.v1 = _model_of(base)
        assert self.trace.checkpoint(path, retain=1) == 1
        model, self.deltas = self.v1, []
        for _ in range(3):
            present = list(model)
            gone = [present[i] for i in rng.choice(len(present), 300, replace=False)]
            delta = pa.concat_tables([
                _int_table(rng.integers(0, 6000, 800)),
                _int_table([k for k, _ in gone], [v for _, v in gone], d=-1)])
            self.deltas.append(delta)
            model = _model_of(delta, model)
        self.v2 = model

    def run(self, monkeypatch) -> int:
        with monkeypatch.context() as m:
            if self.staged:
                m.setattr(trace_module, "DURABLE_RESIDENT_UPDATES", 0)
            for delta in self.deltas:
                self.trace.insert(delta, diff="d")
        return self.trace.checkpoint(retain=1)

    def close(self):
        self.engine.close()


@pytest.mark.parametrize("staged", [False, True], ids=["resident_inserts", "staged_inserts"])
def test_a_checkpoint_cut_by_power_loss_leaves_version_1_or_2(tmp_path, staged, monkeypatch):
    spill = tmp_path / "spill"
    spill.mkdir()
    s = _PowerScene(spill, tmp_path / "count", staged=staged)
    try:
        counter = PowerLoss()
        with using(counter):
            assert s.run(monkeypatch) == 2
        if staged:   # the inserts' files were named, not copied
            named = _named(tmp_path / "count", 2)
            assert any(re.search(r"-i\d+\.page$", f) for f in named), named
    finally:
        s.close()
    assert counter.ops > 15, counter.ops
    n = counter.ops
    cuts = list(range(1, n + 1)) if n <= 40 else \
        sorted(set(np.linspace(1, n, 30).astype(int).tolist()) | {1, 2, n - 1, n})
    seen = Counter()
    for k in cuts:
        path = tmp_path / f"cut{k}"
        s = _PowerScene(spill, path, staged=staged)
        disk = PowerLoss(cut_at=k)
        try:
            with using(disk):
                s.run(monkeypatch)
        except OSError as cut:
            assert injected(cut), f"power lost at operation {k}: {cut!r}"
        finally:
            s.close()     # the process is gone ...
        disk.restore()   # ... and the power comes back
        models = {1: s.v1, 2: s.v2}
        with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as e:
            trace = e.load(path)
            v = _version_numbers(path)[-1]
            seen[v] += 1
            assert v in models, f"power lost at operation {k}: version {v}"
            assert _snap(trace) == models[v], f"power lost at operation {k}: version {v}"
            extra = _int_table([10**6 + k])
            trace.insert(extra, diff="d")
            assert trace.checkpoint(retain=1) == v + 1, f"power lost at operation {k}"
            trace.close()
            after = e.load(path)
            assert _snap(after) == _model_of(extra, models[v])
            after.close()
        assert not [f for f in os.listdir(path) if f.endswith(".tmp")]
        assert _page_files(path) == _named_by_retained(path), \
            f"power lost at operation {k}: leftovers stayed"
    assert seen[1] and seen[2], f"versions after the cuts: {dict(seen)}"


@pytest.mark.parametrize("how", ["checkpoint", "save"])
def test_a_first_version_in_new_directories_survives_power_loss_once_reported(tmp_path, how):
    """The directories a first checkpoint (or save) makes are durable entries of their
    parents before it returns: power lost right after it, or at any step of it, leaves
    version 1 whole or nothing -- never a version reported written and then gone."""
    table = _int_table(np.arange(500))
    counter = PowerLoss()
    with arrangedb.Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        trace = e.arrange(table, key=["k"], vals=["v"], diff="d")
        for k in itertools.count(1):
            path = tmp_path / f"cut{k}" / "a" / "b" / "ck"
            disk = PowerLoss(cut_at=k, watch=tmp_path)
            reported = False
            try:
                with using(disk):
                    if how == "save":
                        trace.save(path)
                    else:
                        reported = trace.checkpoint(path) == 1
                        trace._checkpoint.close()   # the process is gone: its lock too
                        trace._checkpoint = None
                    reported = True
            except OSError as cut:
                assert injected(cut), f"power lost at operation {k}: {cut!r}"
            disk.restore()
            if reported:
                assert _snap(e.load(path)) == _model_of(table), "a reported version is gone"
                break
            assert not os.path.exists(path) or not _version_numbers(path), \
                f"power lost at operation {k}: a version nobody was told of"
    assert k > 5, k


# -- 4. a directory written by format 3 --------------------------------------------------

def write_compat_data(dst: str, expected: str) -> None:
    """Writes ``tests/data/checkpoint-v3`` (``dst``, which must not exist) and its
    expected rows (``expected``). Run once; the files are kept as written:

        .venv/bin/python -c "import sys; sys.path[:0] = ['tests', 'tests/spine/persist']; \\
            import test_checkpoints as t; t.write_compat_data('tests/data/checkpoint-v3', \\
            'tests/data/checkpoint-v3.expected.json')"
    """
    import tempfile

    def table(ks, t, d=1):
        return pa.table({"k": pa.array(ks, pa.int64()),
                         "name": pa.array([f"n{k % 7}" for k in ks], pa.string()),
                         "amount": pa.array([k * 0.25 for k in ks], pa.float64()),
                         "t": pa.array([t] * len(ks), pa.int64()),
                         "d": pa.array([d] * len(ks), pa.int64())})

    def rows(trace, at=None):
        t = trace.snapshot(at=at).read_all()
        return [list(r) for r in zip(*(t.column(c).to_pylist()
                                       for c in ("k", "name", "amount", "count")))]

    out = {}
    with tempfile.TemporaryDirectory() as spill, \
            arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as engine:
        trace = engine.arrange(table(list(range(0, 60)), 0).drop_columns(["t"]),
                               key=["k"], vals=["name", "amount"], diff="d")
        handle = trace.handle()
        trace.insert(pa.concat_tables([table(list(range(50, 80)), 1),
                                       table(list(range(0, 10)), 1, -1)]),
                     time="t", diff="d")
        assert trace.checkpoint(dst) == 1
        out["1"] = {"since": trace.since, "rows": rows(trace), "rows_at_0": rows(trace, 0)}
        trace.insert(pa.concat_tables([table(list(range(100, 120)), 2),
                                       table(list(range(50, 55)), 3, -1)]),
                     time="t", diff="d")
        handle.set_logical_compaction(2)
        trace.exert(1 << 20)
        assert trace.checkpoint() == 2
        out["2"] = {"since": trace.since, "rows": rows(trace), "rows_at_2": rows(trace, 2)}
    shutil.rmtree(os.path.join(dst, "leases"), ignore_errors=True)
    os.remove(os.path.join(dst, ".arrangedb-writer"))
    with open(expected, "w") as f:   # a row a line
        f.write("{\n" + ",\n".join(
            f'"{v}": {{' + ",\n ".join(
                f'"{key}": ' + (json.dumps(x) if not isinstance(x, list) else
                                "[\n  " + ",\n  ".join(map(json.dumps, x)) + "]")
                for key, x in entry.items()) + "}"
            for v, entry in out.items()) + "\n}\n")


def test_a_checkpoint_written_by_format_3_still_loads(tmp_path):
    src = os.path.join(DATA, "checkpoint-v3")
    with open(os.path.join(DATA, "checkpoint-v3.expected.json")) as f:
        expected = json.load(f)
    assert _manifest(src, 2)["version"] == 3, "the data must stay as format 3 wrote it"
    copy = tmp_path / "checkpoint-v3"
    shutil.copytree(src, copy)
    spill = tmp_path / "spill"
    spill.mkdir()

    def rows(trace, at=None):
        t = trace.snapshot(at=at).read_all()
        return [list(r) for r in zip(*(t.column(c).to_pylist()
                                       for c in ("k", "name", "amount", "count")))]

    assert _version_numbers(copy) == [1, 2]
    with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as engine:
        for v in ("1", "2"):
            trace = engine.load(copy, version=int(v))
            assert trace.since == expected[v]["since"]
            assert rows(trace) == expected[v]["rows"], f"version {v}"
            for key, want in expected[v].items():
                if key.startswith("rows_at_"):
                    assert rows(trace, int(key[8:])) == want, f"version {v} {key}"
            trace.close()
        trace = engine.load(copy)
        trace.insert(pa.table({"k": pa.array([1000], pa.int64()), "name": ["new"],
                               "amount": [2.5], "t": pa.array([5], pa.int64()),
                               "d": pa.array([1], pa.int64())}), time="t", diff="d")
        trace.merge_all()
        assert trace.checkpoint() == 3
        trace.close()
        again = engine.load(copy)
        assert rows(again) == sorted(expected["2"]["rows"] + [[1000, "new", 2.5, 1]])
    assert _version_numbers(copy) == [1, 2, 3]


# -- 5. corruption -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_versions(tmp_path_factory):
    """A 2-version checkpoint whose version 2 has page files version 1 does not use; the
    models of both versions."""
    root = tmp_path_factory.mktemp("two-versions")
    ck = root / "ck"
    rng = np.random.default_rng(21)
    keys = rng.permutation(np.unique(rng.integers(0, 1 << 40, 12000))[:10000])
    with arrangedb.Engine(spill_dir=root, memory_budget="16MiB") as engine:
        trace = engine.arrange(_int_table(keys[:6000]), key=["k"], vals=["v"], diff="d")
        trace.checkpoint(ck)
        m1 = _snap(trace)
        trace.insert(_int_table(keys[6000:8000]), diff="d")
        trace.insert(_int_table(keys[8000:]), diff="d")
        trace.insert(_int_table(keys[:500], d=-1), diff="d")
        trace.checkpoint()
        m2 = _snap(trace)
    only2 = sorted(_named(ck, 2) - _named(ck, 1))
    assert only2, "version 2 must write page files of its own"
    return ck, only2, {1: m1, 2: m2}


def _newest_outcome(path, spill):
    """('ok', rows) or ('error', exception) of loading and reading the newest version."""
    try:
        with arrangedb.Engine(spill_dir=spill, memory_budget="16MiB") as e:
            return "ok", _snap(e.load(path))
    except Exception as err:
        return "error", err


def _flip(path, offset, mask=0xFF):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ mask]))


def _check_version_1_loads(path, spill, model):
    with arrangedb.Engine(spill_dir=spill, memory_budget="16MiB") as e:
        assert _snap(e.load(path, version=1)) == model


@pytest.mark.parametrize("damage", ["flip_many", "flip_one_each", "truncate", "delete"])
def test_a_damaged_page_file_of_the_newest_version(two_versions, tmp_path, damage):
    src, only2, models = two_versions
    spill = tmp_path / "spill"
    spill.mkdir()
    cases = []   # (copy, damaged file, must it fail)
    for i, name in enumerate(only2):
        size = os.path.getsize(src / name)
        if damage == "flip_one_each":   # single bytes spread over the file: right or error
            offsets = np.unique(np.linspace(0, size - 1, 12).astype(int)).tolist()
        else:
            offsets = [None]
        for j, off in enumerate(offsets):
            copy = tmp_path / f"copy{i}-{j}"
            shutil.copytree(src, copy)
            target = copy / name
            if damage == "flip_many":
                for o in range(0, size, 97):
                    _flip(target, o)
            elif damage == "flip_one_each":
                _flip(target, off, 1 << (j % 8))
            elif damage == "truncate":
                os.truncate(target, size // 2)
            else:
                os.remove(target)
            cases.append((copy, name, damage != "flip_one_each"))
    errors = 0
    for copy, name, must_fail in cases:
        kind, got = _newest_outcome(copy, spill)
        if kind == "ok":
            assert not must_fail, f"{name} ({damage}) read without an error"
            assert got == models[2], f"{name} ({damage}): WRONG ANSWER without an error"
        else:
            errors += 1
            assert isinstance(got, arrangedb.CorruptionError), \
                f"{name} ({damage}): {type(got).__name__}: {got}"
            assert isinstance(got, arrangedb.PageFileError), f"{type(got).__name__}: {got}"
            assert name in str(got), f"the error does not name {name}: {got}"
        _check_version_1_loads(copy, spill, models[1])
    assert errors, f"no damage of {damage} was noticed"


@pytest.mark.parametrize("damage", ["flip", "truncate", "not_json", "delete_field"])
def test_a_damaged_manifest_is_refused_and_the_version_before_loads(two_versions, tmp_path,
                                                                    damage):
    src, _, models = two_versions
    spill = tmp_path / "spill"
    spill.mkdir()
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    name = "manifest-000002.json"
    mpath = copy / name
    text = mpath.read_bytes()
    if damage == "flip":
        _flip(mpath, len(text) // 2, 0x01)
    elif damage == "truncate":
        os.truncate(mpath, len(text) // 2)
    elif damage == "not_json":
        mpath.write_bytes(b"\x00" * len(text))
    else:
        m = json.loads(text)
        del m["batches"][0]["parts"]
        mpath.write_text(json.dumps(m))
    kind, got = _newest_outcome(copy, spill)
    assert kind == "error", f"a damaged manifest ({damage}) loaded"
    assert isinstance(got, arrangedb.ManifestError), f"{type(got).__name__}: {got}"
    assert name in str(got), got
    _check_version_1_loads(copy, spill, models[1])


def test_a_manifest_of_an_unknown_format_version_is_refused(two_versions, tmp_path):
    src, _, models = two_versions
    spill = tmp_path / "spill"
    spill.mkdir()
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    mpath = copy / "manifest-000002.json"
    m = json.loads(mpath.read_text())
    assert m["version"] == 3
    m["version"] = 99        # the checksum is left as it was
    mpath.write_text(json.dumps(m, separators=(",", ":")))
    kind, got = _newest_outcome(copy, spill)
    assert kind == "error"
    assert isinstance(got, arrangedb.ManifestError), f"{type(got).__name__}: {got}"
    assert "manifest-000002.json" in str(got) and "99" in str(got) and \
        "format" in str(got), got
    _check_version_1_loads(copy, spill, models[1])


# -- 6. a full disk, an unwritable directory -------------------------------------------

def _enospc(err) -> bool:
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return True
        err = err.__cause__ or err.__context__
    return False


@pytest.mark.parametrize("room", [0, 1 << 20], ids=["no_room", "room_for_some_pages"])
def test_a_checkpoint_on_a_full_disk(small_disk, tmp_path, room, monkeypatch):
    # the delta stays in memory, so that the checkpoint has pages to write (a larger
    # insert is staged in the directory as it arrives: see the next test)
    monkeypatch.setattr(trace_module, "DURABLE_RESIDENT_UPDATES", 1 << 30)
    disk = small_disk("16m")
    ck = disk / "ck"
    spill = tmp_path / "spill"
    spill.mkdir()
    rng = np.random.default_rng(31)
    keys = rng.permutation(np.unique(rng.integers(0, 1 << 40, 330_000))[:300_000])
    with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as engine:
        trace = engine.arrange(_int_table(keys[:30_000]), key=["k"], vals=["v"], diff="d")
        assert trace.checkpoint(ck, retain=2) == 1
        m1 = _snap(trace)
        files1 = set(os.listdir(ck))
        delta = pa.concat_tables([_int_table(keys[30_000:250_000]),
                                  _int_table(keys[:1000], d=-1)])
        trace.insert(delta, diff="d")
        m2 = _model_of(delta, m1)
        ballast = disk / "ballast"
        fill_disk(ballast, leave=room)
        try:
            trace.checkpoint()
        except OSError as e:
            # (its traceback is not kept: it holds the batches, which hold page files)
            assert isinstance(e, arrangedb.SpillError) or _enospc(e), repr(e)
        else:
            pytest.fail("a checkpoint on a full disk returned")
        # nothing of the failed version stays; version 1 loads exactly
        assert _version_numbers(ck) == [1]
        assert set(os.listdir(ck)) == files1, "the failed checkpoint left files behind"
        problems = []
        with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as other:
            try:   # a reader on the full disk
                if _snap(other.load(ck)) != m1:
                    problems.append("version 1 loaded on the full disk: WRONG ANSWER")
            except Exception as e:
                problems.append(f"version 1 does not load while the disk is full: "
                                f"{type(e).__name__}: {e}")
        # the trace answers and takes inserts
        assert _snap(trace) == m2
        more = _int_table(keys[250_000:])
        trace.insert(more, diff="d")
        m3 = _model_of(more, m2)
        assert _snap(trace) == m3
        os.remove(ballast)
        with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as other:
            assert _snap(other.load(ck)) == m1
        assert trace.checkpoint() == 2
        assert _snap(trace) == m3
    with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as engine:
        assert _snap(engine.load(ck)) == m3
        assert _snap(engine.load(ck, version=1)) == m1
    assert not problems, "; ".join(problems)


def test_a_checkpoint_into_an_unusable_directory_says_so(tmp_path):
    spill = tmp_path / "spill"
    spill.mkdir()
    afile = tmp_path / "a-file"
    afile.write_text("not a directory")
    with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as engine:
        trace = engine.arrange(_int_table(np.arange(1000)), key=["k"], vals=["v"], diff="d")
        model = _snap(trace)
        for bad in (afile / "ck", afile):
            with pytest.raises(OSError) as failed:
                trace.checkpoint(bad)
            assert str(afile) in str(failed.value), failed.value
            assert failed.value.errno in (errno.ENOTDIR, errno.EEXIST), failed.value
        if os.geteuid() != 0:   # root writes into a read-only directory all the same
            ro = tmp_path / "read-only"
            ro.mkdir()
            os.chmod(ro, 0o500)
            try:
                with pytest.raises(PermissionError) as failed:
                    trace.checkpoint(ro)
                assert str(ro) in str(failed.value) or failed.value.filename, failed.value
                assert os.listdir(ro) == []
            finally:
                os.chmod(ro, 0o700)
        # the trace is as it was and checkpoints elsewhere
        assert _snap(trace) == model
        assert trace.checkpoint(tmp_path / "ck") == 1
    with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as engine:
        assert _snap(engine.load(tmp_path / "ck")) == model


def test_a_checkpoint_into_a_folder_of_other_files_touches_none_of_them(tmp_path):
    """Files a checkpoint did not name itself -- even ``*.page`` and ``*.tmp`` ones --
    are neither removed as a killed writer's temporaries nor collected by retention."""
    work = tmp_path / "work"
    work.mkdir()
    theirs = {"report.page": "user data", "draft.tmp": "user data", "data.csv": "x",
              "manifest.json.tmp": "user data", "batch-final.page": "user data"}
    for name, text in theirs.items():
        (work / name).write_text(text)
    with arrangedb.Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        trace = e.arrange(_int_table(np.arange(1000)), key=["k"], vals=["v"], diff="d")
        assert trace.checkpoint(work, retain=1) == 1
        trace.insert(_int_table(np.arange(900), d=-1), diff="d")
        trace.merge_all()
        assert trace.checkpoint(retain=1) == 2   # retention drops version 1's files
        model = _snap(trace)
    assert {n: (work / n).read_text() for n in theirs} == theirs
    with arrangedb.Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        assert _snap(e.load(work)) == model


def test_a_page_file_name_taken_already_fails_the_checkpoint_and_keeps_the_file(
        tmp_path, monkeypatch):
    """Were a new page file's name taken (a repeated random token), the checkpoint fails
    without writing over, or removing, the file there, which an older version names."""
    import arrangedb.spine.persist.write as write_module

    monkeypatch.setattr(write_module, "_new_token", lambda: "0123456789abcdef")
    ck = tmp_path / "ck"
    with arrangedb.Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        trace = e.arrange(_int_table(np.arange(20000)), key=["k"], vals=["v"], diff="d")
        assert trace.checkpoint(ck, retain=5) == 1
        v1 = _snap(trace)
        trace.insert(_int_table(np.arange(19000), d=-1), diff="d")
        trace.merge_all()   # one batch again: written under version 1's file name
        with pytest.raises(FileExistsError, match="exists already"):
            trace.checkpoint(retain=5)
        assert _version_numbers(ck) == [1]
    with arrangedb.Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        assert _snap(e.load(ck, version=1)) == v1


def test_retention_failing_after_the_version_is_durable_leaves_the_trace_on_it(
        tmp_path, monkeypatch):
    """Retention runs once the trace has taken the new version as its own: an interrupt
    there, or a live lease that cannot be read, never makes the next checkpoint a fork."""
    import arrangedb.spine.persist.write as write_module

    ck = tmp_path / "ck"
    real_retain, real_leased = write_module._retain, write_module.leased
    with arrangedb.Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        trace = e.arrange(_int_table(np.arange(1000)), key=["k"], vals=["v"], diff="d")
        assert trace.checkpoint(ck, retain=1) == 1

        def interrupted(*args):
            raise KeyboardInterrupt
        monkeypatch.setattr(write_module, "_retain", interrupted)
        trace.insert(_int_table(np.arange(10)), diff="d")
        with pytest.raises(KeyboardInterrupt):
            trace.checkpoint(retain=1)
        monkeypatch.setattr(write_module, "_retain", real_retain)

        def unreadable(path):
            raise ValueError("a live lease holds no JSON")
        monkeypatch.setattr(write_module, "leased", unreadable)
        trace.insert(_int_table(np.arange(10, 20)), diff="d")
        assert trace.checkpoint(retain=1) == 3   # nothing collected: a lease unread
        monkeypatch.setattr(write_module, "leased", real_leased)
        trace.insert(_int_table(np.arange(20, 30)), diff="d")
        assert trace.checkpoint(retain=1) == 4
        assert _version_numbers(ck) == [4] and _page_files(ck) == _named(ck, 4)
        model = _snap(trace)
    with arrangedb.Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        assert _snap(e.load(ck)) == model


def test_checkpoint_arguments_and_save(tmp_path):
    spill = tmp_path / "spill"
    spill.mkdir()
    with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as engine:
        trace = engine.arrange(_int_table(np.arange(500)), key=["k"], vals=["v"], diff="d")
        with pytest.raises(ValueError):
            trace.checkpoint()            # no directory yet
        with pytest.raises(ValueError):
            trace.checkpoint(tmp_path / "ck", retain=0)
        assert not (tmp_path / "ck").exists() or not _version_numbers(tmp_path / "ck")
        trace.save(tmp_path / "saved")
        assert _version_numbers(tmp_path / "saved") == [1]
        with pytest.raises(FileExistsError):
            trace.save(tmp_path / "saved")
        other = engine.arrange(_int_table(np.arange(10)), key=["k"], vals=["v"], diff="d")
        with pytest.raises(FileExistsError):
            other.save(tmp_path / "saved")
        with pytest.raises(FileNotFoundError):
            engine.load(tmp_path / "saved", version=2)
        with pytest.raises(FileNotFoundError):
            engine.load(tmp_path / "nothing-here")
        assert arrangedb.versions(tmp_path / "nothing-here") == []


def test_an_insert_staged_on_a_full_disk_fails_clearly_and_loses_nothing(small_disk, tmp_path):
    disk = small_disk("16m")
    ck = disk / "ck"
    spill = tmp_path / "spill"
    spill.mkdir()
    keys = np.random.default_rng(5).permutation(1 << 20)
    with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as engine:
        trace = engine.arrange(_int_table(keys[:30_000]), key=["k"], vals=["v"], diff="d")
        assert trace.checkpoint(ck) == 1
        m1, files1 = _snap(trace), set(os.listdir(ck))
        ballast = disk / "ballast"
        fill_disk(ballast, leave=0)
        with pytest.raises(arrangedb.SpillError) as failed:
            trace.insert(_int_table(keys[30_000:600_000]), diff="d")
        assert "full" in str(failed.value) and str(ck) in str(failed.value), failed.value
        assert set(os.listdir(ck)) == files1, "the failed insert left files behind"
        assert _snap(trace) == m1
        os.remove(ballast)
        delta = _int_table(keys[30_000:100_000])
        trace.insert(delta, diff="d")
        assert trace.checkpoint() == 2
        with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as other:
            assert _snap(other.load(ck)) == _model_of(delta, m1)


# -- 6b. inserts staged in the writer's directory -----------------------------------------

def test_a_writers_large_insert_is_staged_in_its_directory_and_named_by_the_next_checkpoint(
        tmp_path):
    ck, spill = tmp_path / "ck", tmp_path / "spill"
    spill.mkdir()
    n = trace_module.DURABLE_RESIDENT_UPDATES
    keys = np.random.default_rng(8).permutation(10 * n)
    with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as engine:
        trace = engine.arrange(_int_table(keys[:n]), key=["k"], vals=["v"], diff="d")
        assert trace.checkpoint(ck) == 1
        model, files1 = _snap(trace), _page_files(ck)
        # a small insert stays in memory; a large one is a page file in the directory,
        # which no version names yet
        small = _int_table(keys[n:n + 100])
        trace.insert(small, diff="d")
        assert _page_files(ck) == files1
        large = _int_table(keys[2 * n:4 * n])
        trace.insert(large, diff="d")
        staged = _page_files(ck) - files1
        assert len(staged) == 1, staged
        staged = staged.pop()
        assert re.search(r"-i\d+\.page$", staged), staged
        inode = os.stat(ck / staged).st_ino
        assert _version_numbers(ck) == [1]
        model = _model_of(large, _model_of(small, model))
        assert trace.checkpoint() == 2
        # named where it is, not copied; its bytes count as this version's new bytes
        assert staged in _named(ck, 2) and os.stat(ck / staged).st_ino == inode
        entry = next(b for b in _manifest(ck, 2)["batches"] if b["file"] == staged)
        assert 0 < entry["written"] <= arrangedb.versions(ck)[-1]["new_bytes"]
        with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as other:
            assert _snap(other.load(ck)) == model
        # a staged file merged away before any checkpoint named it is deleted
        again = _int_table(keys[4 * n:6 * n])
        trace.insert(again, diff="d")
        unnamed = _page_files(ck) - _named_by_retained(ck)
        assert len(unnamed) == 1, unnamed
        trace.merge_all()
        import gc
        gc.collect()
        assert not (_page_files(ck) - _named_by_retained(ck)), "a staged file outlived its batch"
        model = _model_of(again, model)
        assert _snap(trace) == model
        assert trace.checkpoint() == 3
        # files named by a version stay after the merge replaced their batches
        assert _page_files(ck) >= _named(ck, 3)
    with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as engine:
        assert _snap(engine.load(ck)) == model
        assert _snap(engine.load(ck, version=2)) == _model_of(large, _model_of(
            small, _as_dict(engine.load(ck, version=1).snapshot().read_all())))


def _with_a_staged_insert(engine, path):
    """A trace checkpointed into ``path`` and then given an insert large enough to be
    staged there; the staged file's name."""
    trace = engine.arrange(_int_table(np.arange(1000)), key=["k"], vals=["v"], diff="d")
    assert trace.checkpoint(path) == 1
    n = trace_module.DURABLE_RESIDENT_UPDATES
    trace.insert(_int_table(np.arange(10**6, 10**6 + 2 * n)), diff="d")
    staged = {f for f in _page_files(path) if re.search(r"-i\d+\.page$", f)}
    assert len(staged) == 1
    return trace, staged


def test_a_staged_file_whose_fsync_failed_is_copied_not_trusted_on_retry(tmp_path):
    """Linux reports a failed write-back once: a second fsync of the same file succeeds
    whatever reached the disk. A staged insert whose fsync failed is written to a new,
    fsync'd file by the retried checkpoint, never named as it is."""
    from arrangedb.pager.diskio import DiskIO

    class StagedWriteBackFails(DiskIO):
        failed = False

        def fsync_path(self, path):
            if re.search(r"-i\d+\.page$", path) and not self.failed:
                self.failed = True
                raise OSError(errno.EIO, "injected: the staged file's write-back failed")
            super().fsync_path(path)

    ck = tmp_path / "ck"
    with arrangedb.Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as engine:
        trace, staged = _with_a_staged_insert(engine, ck)
        model = _snap(trace)
        disk_io = StagedWriteBackFails()
        with using(disk_io):
            with pytest.raises(OSError, match="write-back failed"):
                trace.checkpoint()
            assert trace.checkpoint() == 2
        assert disk_io.failed and not staged & _named(ck, 2)
    with arrangedb.Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as engine:
        assert _snap(engine.load(ck)) == model


def test_files_a_trace_staged_stay_while_it_reads_them_from_another_directory(tmp_path):
    """A trace that staged an insert in directory A and then checkpoints into B still
    reads the staged file in A: another writer's retention in A leaves it, and the
    trace checkpoints into a third directory (copying it by path) all the same."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    with arrangedb.Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as engine:
        trace, staged = _with_a_staged_insert(engine, a)
        assert trace.checkpoint(b) == 1   # a's writer role goes; its staged file is read
        model = _snap(trace)
        with arrangedb.Engine(spill_dir=tmp_path / "spill2", memory_budget="64MiB") as other:
            again = other.load(a)
            again.insert(_int_table(np.arange(5)), diff="d")
            assert again.checkpoint(retain=1) == 2   # retention in a
            again.close()
        assert staged <= _page_files(a)
        assert trace.checkpoint(c) == 1
    with arrangedb.Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as engine:
        assert _snap(engine.load(c)) == model


_STAGE_AND_DIE = textwrap.dedent("""
    import os, signal, sys
    import numpy as np, pyarrow as pa
    import arrangedb
    ck, spill = sys.argv[1:3]
    k = np.arange(200_000, dtype=np.int64)
    t = pa.table({"k": k, "v": k, "d": np.ones(len(k), np.int64)})
    engine = arrangedb.Engine(spill_dir=spill, memory_budget="64MiB")
    trace = engine.arrange(t.slice(0, 1000), key=["k"], vals=["v"], diff="d")
    trace.checkpoint(ck)
    trace.insert(t.slice(1000), diff="d")
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_the_files_a_killed_writer_staged_are_collected_by_the_next_writer(tmp_path):
    ck, spill = tmp_path / "ck", tmp_path / "spill"
    spill.mkdir()
    r = subprocess.run([sys.executable, "-c", _STAGE_AND_DIE, str(ck), str(spill)],
                       capture_output=True, text=True)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert _page_files(ck) - _named(ck, 1), "the child staged nothing"
    with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as engine:
        trace = engine.load(ck)
        assert len(_snap(trace)) == 1000
        trace.insert(_int_table([10**7]), diff="d")
        assert trace.checkpoint() == 2
        assert _page_files(ck) == _named_by_retained(ck)


# -- 7. the writer role, forks, schemas --------------------------------------------------

# Another process loads the directory and checkpoints it; prints how that went.
_OTHER_WRITER = textwrap.dedent("""
    import json, sys
    import pyarrow as pa, arrangedb
    ck, spill = sys.argv[1:]
    with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as engine:
        trace = engine.load(ck)
        trace.insert(pa.table({"k": pa.array([-5], pa.int64()), "v": pa.array([1], pa.int64()),
                               "d": pa.array([1], pa.int64())}), diff="d")
        try:
            out = {"kind": "ok", "version": trace.checkpoint()}
        except arrangedb.DirectoryLocked as e:
            out = {"kind": "locked", "error": str(e)}
        except Exception as e:
            out = {"kind": "other", "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out))
""")


def _other_process(ck, spill):
    r = subprocess.run([sys.executable, "-c", _OTHER_WRITER, str(ck), str(spill)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _names_holder(message: str) -> bool:
    m = re.search(r"pid (\d+)", message)
    return bool(m) and int(m.group(1)) == os.getpid() and socket.gethostname() in message


def test_one_writer_per_directory(tmp_path):
    ck, spill = tmp_path / "ck", tmp_path / "spill"
    spill.mkdir()
    a_engine = arrangedb.Engine(spill_dir=spill, memory_budget="64MiB")
    b_engine = arrangedb.Engine(spill_dir=spill, memory_budget="64MiB")
    try:
        a = a_engine.arrange(_int_table(np.arange(2000)), key=["k"], vals=["v"], diff="d")
        assert a.checkpoint(ck) == 1
        m1 = _snap(a)
        b = b_engine.arrange(_int_table(np.arange(100)), key=["k"], vals=["v"], diff="d")
        with pytest.raises(arrangedb.DirectoryLocked) as locked:
            b.checkpoint(ck)
        assert _names_holder(str(locked.value)), str(locked.value)
        loaded = b_engine.load(ck)
        loaded.insert(_int_table([-1]), diff="d")
        with pytest.raises(arrangedb.DirectoryLocked) as locked:
            loaded.checkpoint()
        assert _names_holder(str(locked.value)), str(locked.value)
        with pytest.raises(FileExistsError):
            b.save(ck)                  # it holds a checkpoint already
        out = _other_process(ck, spill)
        assert out["kind"] == "locked" and _names_holder(out["error"]), out
        assert _version_numbers(ck) == [1]
        # the writer goes on while the others wait
        a.insert(_int_table([-2]), diff="d")
        assert a.checkpoint() == 2
        m2 = _snap(a)
        a.close()                       # the writer role is free
        loaded.close()
        out = _other_process(ck, spill)
        assert out == {"kind": "ok", "version": 3}, out
        c = b_engine.load(ck)
        assert _snap(c) == _model_of(_int_table([-5], [1]), m2)
        c.insert(_int_table([-3]), diff="d")
        assert c.checkpoint() == 4
        assert _snap(b_engine.load(ck, version=1)) == m1
    finally:
        a_engine.close()
        b_engine.close()


def test_a_fork_or_another_schema_is_refused(tmp_path):
    ck, spill = tmp_path / "ck", tmp_path / "spill"
    spill.mkdir()
    with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as ea, \
            arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as eb:
        a = ea.arrange(_int_table(np.arange(1000)), key=["k"], vals=["v"], diff="d")
        assert a.checkpoint(ck) == 1
        m1 = _snap(a)
        b = eb.load(ck, version=1)
        a.insert(_int_table([5000]), diff="d")
        assert a.checkpoint() == 2
        m2 = _snap(a)
        a.close()
        b.insert(_int_table([6000]), diff="d")
        files = sorted(os.listdir(ck))
        with pytest.raises(arrangedb.CheckpointConflict) as fork:
            b.checkpoint()
        assert "version 2" in str(fork.value) and "version 1" in str(fork.value), fork.value
        assert sorted(os.listdir(ck)) == files and _version_numbers(ck) == [1, 2]
        assert _snap(b) == _model_of(_int_table([6000]), m1)   # b is unharmed
        b.close()
        # a loaded older version forks as well, even with retain=1
        old = eb.load(ck, version=1)
        with pytest.raises(arrangedb.CheckpointConflict):
            old.checkpoint(retain=1)
        old.close()
        # another schema: string vals, or another key
        strings = pa.table({"k": pa.array([1, 2], pa.int64()), "v": ["x", "y"]})
        s = eb.arrange(strings, key=["k"], vals=["v"])
        with pytest.raises(arrangedb.CheckpointConflict):
            s.checkpoint(ck)
        s.close()
        s2 = eb.arrange(_int_table(np.arange(10)), key=["v"], vals=["k"], diff="d")
        with pytest.raises(arrangedb.CheckpointConflict):
            s2.checkpoint(ck)
        s2.close()
        # a new trace of the same schema does not continue version 2 either
        fresh = eb.arrange(_int_table(np.arange(10)), key=["k"], vals=["v"], diff="d")
        with pytest.raises(arrangedb.CheckpointConflict):
            fresh.checkpoint(ck)
        fresh.close()
        assert _version_numbers(ck) == [1, 2]
        assert _snap(eb.load(ck)) == m2


def test_a_trace_continuing_a_version_of_another_schema_is_refused(tmp_path):
    """The directory was replaced by a checkpoint of another schema at the same version
    number as the one a loaded trace continues: refused as another schema."""
    ck, spill = tmp_path / "ck", tmp_path / "spill"
    spill.mkdir()
    with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as engine:
        a = engine.arrange(_int_table(np.arange(100)), key=["k"], vals=["v"], diff="d")
        assert a.checkpoint(ck) == 1
        a.close()
        reader = engine.load(ck)
        shutil.rmtree(ck)
        strings = pa.table({"k": pa.array([1, 2], pa.int64()), "v": ["x", "y"]})
        s = engine.arrange(strings, key=["k"], vals=["v"])
        assert s.checkpoint(ck) == 1
        s.close()
        reader.insert(_int_table([500]), diff="d")
        with pytest.raises(arrangedb.CheckpointConflict) as schema:
            reader.checkpoint()
        assert "schema" in str(schema.value), schema.value
        assert _version_numbers(ck) == [1]
        assert _as_dict(engine.load(ck).snapshot().read_all()) == {(1, "x"): 1, (2, "y"): 1}


# -- 8. readers keep their files through retention ---------------------------------------

_READER = textwrap.dedent("""
    import os, sys, time
    import pyarrow.parquet as pq, arrangedb
    ck, spill, version, out, ready, go = sys.argv[1:]
    with arrangedb.Engine(spill_dir=spill, memory_budget="64MiB") as engine:
        trace = engine.load(ck, version=int(version))
        open(ready, "w").close()
        while not os.path.exists(go):
            time.sleep(0.005)
        pq.write_table(trace.snapshot().read_all(), out + ".tmp")
        os.rename(out + ".tmp", out)
        time.sleep(600)
""")


def _wait_for(path, proc, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None, f"{what}: the process died ({proc.stderr.read()[-3000:]})"
        assert time.monotonic() < deadline, f"{what}: timed out"
        time.sleep(0.005)


def test_readers_keep_their_files_through_retention(tmp_path):
    ck, spill = tmp_path / "ck", tmp_path / "spill"
    spill.mkdir()
    rng = np.random.default_rng(41)
    keys = rng.permutation(np.unique(rng.integers(0, 1 << 40, 60_000))[:50_000])
    next_key = iter(range(10_000, 50_000, 2_000))

    with arrangedb.Engine(spill_dir=spill, memory_budget="32MiB") as w_engine:
        w = w_engine.arrange(_int_table(keys[:10_000]), key=["k"], vals=["v"], diff="d")
        model = {1: _snap(w)}
        assert w.checkpoint(ck, retain=1) == 1
        files1 = _named(ck, 1)

        def step():
            lo = next(next_key)
            w.insert(_int_table(keys[lo:lo + 2_000]), diff="d")
            w.merge_all()       # one new batch: new files replace the old ones
            v = w.checkpoint(retain=1)
            model[v] = _snap(w)
            assert _version_numbers(ck) == [v]
            return v

        # a reader in this process
        with arrangedb.Engine(spill_dir=spill, memory_budget="32MiB") as r_engine:
            r = r_engine.load(ck, version=1)
            for _ in range(3):
                v = step()
                assert files1 <= _page_files(ck), "retention took files a reader reads"
                assert not (files1 & _named(ck, v))
                assert _snap(r) == model[1], "the reader's version 1 changed"
                with arrangedb.Engine(spill_dir=spill) as third:
                    with pytest.raises(FileNotFoundError):
                        third.load(ck, version=1)      # dropped, if still on disk
        # the reader closed: the next retention collects version 1's files
        v = step()
        assert _page_files(ck) == _named(ck, v)
        assert not (files1 & _page_files(ck))

        # a reader process, then SIGKILLed
        held = _named(ck, v)
        out, ready, go = tmp_path / "read.parquet", tmp_path / "ready", tmp_path / "go"
        reader = subprocess.Popen([sys.executable, "-c", _READER, str(ck), str(spill),
                                   str(v), str(out), str(ready), str(go)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for(ready, reader, "the reader's load")
            for _ in range(2):
                newer = step()
                assert held <= _page_files(ck), "retention took a reader process's files"
            go.touch()
            _wait_for(out, reader, "the reader's snapshot")
            assert _as_dict(pq.read_table(out)) == model[v], "the reader process misread"
        finally:
            reader.kill()
            reader.wait()
            reader.stderr.close()
        assert held <= _page_files(ck)
        last = step()
        assert _page_files(ck) == _named(ck, last), \
            f"a SIGKILLed reader's files stayed: {sorted(_page_files(ck) - _named(ck, last))}"
        assert not (held & _page_files(ck)) and newer < last
        assert _live_leases(ck) == [], "a dead reader's lease stayed"
    with arrangedb.Engine(spill_dir=spill, memory_budget="32MiB") as engine:
        assert _snap(engine.load(ck)) == model[last]


def test_a_lease_left_half_made_by_a_killed_reader_is_collected(tmp_path):
    """A reader killed between creating its lease and renaming it in leaves a .tmp."""
    from arrangedb.pager.leases import LEASES, leased

    folder = tmp_path / LEASES
    folder.mkdir()
    stale, fresh = folder / "123-dead.tmp", folder / "456-busy.tmp"
    stale.write_text("[]")
    fresh.write_text("[]")
    old = os.path.getmtime(stale) - 3600
    os.utime(stale, (old, old))
    assert leased(str(tmp_path)) == set()
    assert not stale.exists() and fresh.exists()
