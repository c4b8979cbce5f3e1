"""No data loss, no silent corruption: regressions through the public API only.

The contract these tests hold the engine to:

- An ``insert``, ``exert``, ``merge_all`` or ``save`` that raises leaves the trace as it
  was, and the trace takes the next insert once the cause (a full disk) is gone: no
  acknowledged insert is ever lost.
- Any number of threads may insert into one trace (they serialize); readers in other
  threads see whole inserts only.
- ``save`` refuses a directory holding a saved trace (``FileExistsError``) or being
  saved into by another writer (``arrangedb.DirectoryLocked``, naming its pid); a failed
  save leaves nothing of its own behind and never touches files another trace reads.
- A damaged saved trace either loads and reads exactly right or raises
  ``arrangedb.CorruptionError`` naming the damaged file -- never another error, never a
  wrong answer.
- Saved files take the umask's permission bits; spill files stay 0600.

Names the contract adds (``CorruptionError``, ``DirectoryLocked``) are looked up when a
test needs them, so that the other tests run on an engine that does not have them yet.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

import arrangedb
from conftest import DATA_DIR, fill_disk


# -- helpers ---------------------------------------------------------------------------

def _keys(n, seed):
    """``n`` distinct random int64 keys (below 2**40) in random order: no codec can store
    them as a formula, so reads really come from the page files."""
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, 1 << 40, n + n // 8 + 16))[:n]
    assert len(keys) == n
    return rng.permutation(keys)


_M = (1 << 31) - 1


def _val(keys):
    # a pseudo-random function of the key: a val moved to another row is a wrong answer
    return (keys % _M) * 48271 % _M


def _table(keys):
    return pa.table({"k": keys, "v": _val(keys)})


class _Model:
    """What a trace must read back: every acknowledged row, count 1 (keys are distinct)."""

    def __init__(self):
        self.parts = []

    def add(self, keys):
        self.parts.append(np.asarray(keys))

    def keys(self):
        return np.sort(np.concatenate(self.parts)) if self.parts else np.empty(0, np.int64)


def _mismatch(table, model_keys):
    """None when ``table`` (a snapshot) holds exactly the model's rows, else why not."""
    if table.column_names != ["k", "v", "count"]:
        return f"columns {table.column_names}"
    k = table["k"].to_numpy()
    v = table["v"].to_numpy()
    c = table["count"].to_numpy()
    if len(k) != len(model_keys):
        return f"{len(k)} rows, expected {len(model_keys)}"
    if not np.array_equal(k, model_keys):
        return f"{int(np.sum(k != model_keys))} keys differ"
    if not np.array_equal(v, _val(k)):
        return f"{int(np.sum(v != _val(k)))} vals differ"
    if not (c == 1).all():
        return f"counts {sorted(set(c.tolist()))[:5]}"
    return None


def _assert_holds(trace, model_keys, when):
    problem = _mismatch(trace.snapshot().read_all(), model_keys)
    assert problem is None, f"{when}: {problem}"


def _error_class(name):
    """A contract exception class, or None while the engine does not have it yet."""
    return getattr(arrangedb, name, None)


# -- 1. a full disk inside an insert's merge -------------------------------------------

def test_disk_full_during_a_merge_loses_no_acknowledged_insert(small_disk):
    disk = small_disk("24m")
    keys = _keys(700_000, seed=1)
    model = _Model()
    with arrangedb.Engine(spill_dir=disk, memory_budget="64MiB") as engine:
        trace = engine.arrange(_table(keys[:300_000]), key=["k"], vals=["v"])
        model.add(keys[:300_000])
        for lo in (300_000, 400_000):
            trace.insert(_table(keys[lo:lo + 100_000]))
            model.add(keys[lo:lo + 100_000])
        _assert_holds(trace, model.keys(), "before the disk filled")

        ballast = disk / "ballast"
        fill_disk(ballast)
        # the next merge work has nowhere to write: the insert, or the merge_all after
        # it, must fail -- and fail whole
        with pytest.raises(arrangedb.SpillError):
            trace.insert(_table(keys[500_000:600_000]))
            model.add(keys[500_000:600_000])     # acknowledged: it must stay
            trace.merge_all()
        _assert_holds(trace, model.keys(), "after the failed write")

        os.remove(ballast)
        # the space is back: the trace takes the next insert and merges everything
        trace.insert(_table(keys[600_000:]))
        model.add(keys[600_000:])
        trace.merge_all()
        _assert_holds(trace, model.keys(), "after the disk was freed")
        assert trace.stats()["updates"] == len(model.keys())


# -- 2. concurrent writers and readers -------------------------------------------------

def _run_threads(targets, timeout=60.0):
    """Start a daemon thread per target, wait for all (bounded); the errors they raised."""
    errors = []

    def guarded(fn):
        def run():
            try:
                fn()
            except BaseException as e:   # report every failure, not just the first
                errors.append(f"{type(e).__name__}: {e}")
        return run

    threads = [threading.Thread(target=guarded(fn), daemon=True) for fn in targets]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = sum(t.is_alive() for t in threads)
    assert not hung, f"{hung} threads still running after {timeout} s (deadlock?)"
    return errors


def test_threads_inserting_into_one_trace_serialize_and_lose_nothing(tmp_path):
    n_threads, n_inserts = 4, 20
    model = _Model()
    lock = threading.Lock()
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as engine:
        first = _keys(10_000, seed=2) * 8    # thread t inserts 8j + 1 + t: all keys distinct
        trace = engine.arrange(_table(first), key=["k"], vals=["v"])
        model.add(first)

        def writer(tid):
            rng = np.random.default_rng(100 + tid)
            sizes = rng.integers(2_000, 5_001, n_inserts)
            keys = _keys(int(sizes.sum()), seed=200 + tid) * 8 + 1 + tid
            lo = 0
            for n in sizes:
                trace.insert(_table(keys[lo:lo + n]))
                with lock:                       # acknowledged: it must be there
                    model.add(keys[lo:lo + n])
                lo += n

        errors = _run_threads([lambda t=t: writer(t) for t in range(n_threads)])
        assert not errors, f"inserting threads failed: {errors[:3]}"
        _assert_holds(trace, model.keys(), "after the threads' inserts")


def test_readers_see_whole_inserts_while_a_writer_inserts_and_merges(tmp_path):
    initial, batch, n_batches = 20_000, 3_000, 30
    done = threading.Event()
    seen = []
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as engine:
        # keys 0, 1, 2, ... in insert order: a consistent snapshot is a whole prefix
        trace = engine.arrange(_table(np.arange(initial, dtype=np.int64)), key=["k"],
                               vals=["v"])

        def writer():
            try:
                for j in range(n_batches):
                    lo = initial + j * batch
                    trace.insert(_table(np.arange(lo, lo + batch, dtype=np.int64)))
                    if j % 5 == 4:
                        trace.merge_all()        # readers must survive batches retiring
                    else:
                        trace.exert(10_000)
            finally:
                done.set()

        def reader():
            while not done.is_set():
                t = trace.snapshot().read_all()
                n = t.num_rows
                whole = n >= initial and (n - initial) % batch == 0
                problem = _mismatch(t, np.arange(n, dtype=np.int64))
                assert whole and problem is None, \
                    f"torn snapshot: {n} rows ({problem or 'not a whole number of inserts'})"
                seen.append(n)

        errors = _run_threads([writer, reader, reader])
        assert not errors, f"threads failed: {errors[:3]}"
        assert seen, "the readers read nothing"
        _assert_holds(trace, np.arange(initial + n_batches * batch), "after the writer")


# -- 3. saves: a failed save, a second save, concurrent saves --------------------------

def test_save_into_a_directory_holding_a_saved_trace_is_refused(tmp_path):
    ka, kb = _keys(20_000, seed=3), _keys(30_000, seed=4)
    saved = tmp_path / "saved"
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as engine:
        a = engine.arrange(_table(ka), key=["k"], vals=["v"])
        b = engine.arrange(_table(kb), key=["k"], vals=["v"])
        a.save(saved)
        before = sorted(os.listdir(saved))
        with pytest.raises(FileExistsError):
            b.save(saved)
        assert sorted(os.listdir(saved)) == before
        _assert_holds(a, np.sort(ka), "trace a")
        _assert_holds(b, np.sort(kb), "trace b")
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as engine:
        _assert_holds(engine.load(saved), np.sort(ka), "the saved trace")


def _read_problem(read, keys):
    """What is wrong with the table ``read()`` gives against ``keys``, or None; an error
    in reading is a problem too (a damaged live trace may fail its read)."""
    try:
        return _mismatch(read(), np.sort(keys))
    except Exception as e:
        return f"{type(e).__name__}: {e}"


@pytest.mark.parametrize("room", [0, 16 << 10], ids=["disk_full", "room_for_small_files"])
def test_a_save_after_a_failed_save_corrupts_no_live_trace(small_disk, tmp_path, room):
    """A save on a (nearly) full disk, then another trace's save into the same directory.
    With no room at all the first save fails wherever it first writes; with room for a
    lock file or a manifest but not a page file it fails part way -- unless it needs no
    room (hard links), when it must simply have saved."""
    disk = small_disk("24m")
    ka, kb = _keys(50_000, seed=5), _keys(60_000, seed=6)
    saved, saved_a = disk / "saved", disk / "saved-a"
    problems = []
    # both traces and the target on one file system: a save may hard-link page files
    with arrangedb.Engine(spill_dir=disk, memory_budget="64MiB") as engine:
        a = engine.arrange(_table(ka), key=["k"], vals=["v"])
        b = engine.arrange(_table(kb), key=["k"], vals=["v"])
        ballast = disk / "ballast"
        fill_disk(ballast)
        os.truncate(ballast, os.path.getsize(ballast) - room)
        try:
            a.save(saved)
            saved_a = saved                      # it fit: the directory is a's now
        except OSError:
            # a writer-lock file may stay (deleting one races; it is hidden or says
            # "lock"); nothing holding data may
            left = sorted(f for f in (os.listdir(saved) if saved.exists() else [])
                          if not f.startswith(".") and "lock" not in f.lower())
            if left:
                problems.append(f"the failed save left {left} behind")
        if room == 0 and saved_a == saved:
            problems.append("a save on a full disk returned")
        os.remove(ballast)

        try:
            b.save(saved)           # over whatever the failed save left
            if saved_a == saved:
                problems.append("b's save over a's saved trace returned")
        except FileExistsError:
            if saved_a != saved:
                problems.append("b's save was refused: the failed save left a manifest")
        except Exception as e:
            problems.append(f"the next save into the directory failed: "
                            f"{type(e).__name__}: {e}")
        for name, trace, keys in (("a", a, ka), ("b", b, kb)):
            problem = _read_problem(lambda: trace.snapshot().read_all(), keys)
            if problem:
                problems.append(f"live trace {name} after the saves: {problem}")
        if saved_a != saved:
            try:
                a.save(saved_a)
            except Exception as e:
                problems.append(f"saving a again failed: {type(e).__name__}: {e}")

    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as engine:
        checks = [("a", saved_a, ka)] + ([("b", saved, kb)] if saved_a != saved else [])
        for name, path, keys in checks:
            if not list(path.glob("manifest*.json")):
                continue                         # its save failed: already a problem
            problem = _read_problem(lambda: engine.load(path).snapshot().read_all(), keys)
            if problem:
                problems.append(f"saved trace {name}: {problem}")
    assert not problems, "; ".join(problems)


def _check_one_save_won(outcomes, pids):
    """Exactly one save returned; the other was refused as locked (naming the winner's
    pid) or as already saved."""
    won = [i for i, o in enumerate(outcomes) if o["kind"] == "ok"]
    assert len(won) == 1, f"exactly one save must succeed: {outcomes}"
    loser = outcomes[1 - won[0]]
    assert loser["kind"] in ("locked", "exists"), f"the other save: {loser}"
    if loser["kind"] == "locked":
        m = re.search(r"pid (\d+)", loser["error"])
        assert m and int(m.group(1)) == pids[won[0]], \
            f"DirectoryLocked must name the other writer's pid {pids[won[0]]}: {loser['error']}"
    return won[0]


def _save_outcome(trace, path):
    locked = _error_class("DirectoryLocked") or ()
    try:
        trace.save(path)
        return {"kind": "ok", "error": ""}
    except BaseException as e:
        kind = ("locked" if isinstance(e, locked) else
                "exists" if isinstance(e, FileExistsError) else "other")
        return {"kind": kind, "error": f"{type(e).__name__}: {e}"}


def test_two_engines_saving_into_one_directory_at_once(tmp_path):
    saved = tmp_path / "saved"
    keys = [_keys(40_000, seed=7), _keys(40_000, seed=8)]
    engines = [arrangedb.Engine(spill_dir=tmp_path, memory_budget="32MiB") for _ in keys]
    try:
        traces = []
        for engine, k in zip(engines, keys):
            t = engine.arrange(_table(k[:30_000]), key=["k"], vals=["v"])
            for lo in range(30_000, 40_000, 2_500):    # resident batches: a longer save
                t.insert(_table(k[lo:lo + 2_500]))
            traces.append(t)
        outcomes = [None, None]
        start = threading.Barrier(2)

        def saver(i):
            start.wait()
            outcomes[i] = _save_outcome(traces[i], saved)

        errors = _run_threads([lambda i=i: saver(i) for i in range(2)])
        assert not errors, errors
        winner = _check_one_save_won(outcomes, [os.getpid()] * 2)
        for t, k in zip(traces, keys):
            _assert_holds(t, np.sort(k), "a live trace after the saves")
    finally:
        for e in engines:
            e.close()
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as engine:
        _assert_holds(engine.load(saved), np.sort(keys[winner]), "the saved trace")


# A process that arranges its own trace, waits for the go file, saves into the shared
# directory, and reports how the save went and whether its live trace stayed whole.
_SAVER = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np, pyarrow as pa, arrangedb
    seed, spill, saved, ready, go, expected = sys.argv[1:]
    rng = np.random.default_rng(int(seed))
    keys = rng.permutation(np.unique(rng.integers(0, 1 << 40, 41_000))[:40_000])
    table = lambda k: pa.table({"k": k, "v": rng.integers(0, 1 << 40, len(k))})
    with arrangedb.Engine(spill_dir=spill, memory_budget="32MiB") as engine:
        trace = engine.arrange(table(keys[:30_000]), key=["k"], vals=["v"])
        for lo in range(30_000, 40_000, 2_500):   # resident batches: a longer save
            trace.insert(table(keys[lo:lo + 2_500]))
        before = trace.snapshot().read_all()
        with pa.OSFile(expected, "wb") as f, pa.ipc.new_file(f, before.schema) as w:
            w.write_table(before)
        open(ready, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.0005)
        locked = getattr(arrangedb, "DirectoryLocked", ())
        try:
            trace.save(saved)
            kind, error = "ok", ""
        except BaseException as e:
            kind = ("locked" if isinstance(e, locked) else
                    "exists" if isinstance(e, FileExistsError) else "other")
            error = f"{type(e).__name__}: {e}"
        try:
            unchanged = trace.snapshot().read_all().equals(before)
        except Exception as e:    # a damaged live trace may fail its read
            unchanged = f"{type(e).__name__}: {e}"
    print(json.dumps({"pid": os.getpid(), "kind": kind, "error": error,
                      "unchanged": unchanged}))
""")


def test_two_processes_saving_into_one_directory_at_once(tmp_path):
    saved, go = tmp_path / "saved", tmp_path / "go"
    procs = []
    for i in range(2):
        spill = tmp_path / f"spill{i}"
        spill.mkdir()
        args = [str(i + 1), spill, saved, tmp_path / f"ready{i}", go, tmp_path / f"expected{i}"]
        procs.append(subprocess.Popen([sys.executable, "-c", _SAVER, *map(str, args)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
            dead = [p for p in procs if p.poll() is not None]
            assert not dead, f"a saving process died early: {dead[0].stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "the saving processes did not get ready"
            time.sleep(0.005)
        go.touch()                               # both save at the same moment
        results = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    outcomes = []
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, f"a saving process failed: {err[-2000:]}"
        outcomes.append(json.loads(out.strip().splitlines()[-1]))
    winner = _check_one_save_won(outcomes, [o["pid"] for o in outcomes])
    assert all(o["unchanged"] is True for o in outcomes), f"a live trace changed: {outcomes}"
    expected = pa.ipc.open_file(str(tmp_path / f"expected{winner}")).read_all()
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as engine:
        got = engine.load(saved).snapshot().read_all()
        assert got.equals(expected), "the saved directory does not hold the winner's trace"


# -- 4. corruption sweeps over a saved trace -------------------------------------------

@pytest.fixture(scope="module")
def saved_trace(tmp_path_factory):
    """A saved trace of several batches (arrange, then inserts left unmerged) and parts
    (a small budget), and the keys it holds."""
    root = tmp_path_factory.mktemp("corruption")
    keys = _keys(26_000, seed=9)
    with arrangedb.Engine(spill_dir=root, memory_budget="16MiB") as engine:
        trace = engine.arrange(_table(keys[:20_000]), key=["k"], vals=["v"])
        for lo in range(20_000, 26_000, 2_000):
            trace.insert(_table(keys[lo:lo + 2_000]))
        trace.save(root / "saved")
    pages = sorted(f for f in os.listdir(root / "saved") if f.endswith(".page"))
    assert len(pages) >= 2, f"want several batches to swap, got {pages}"
    model = np.sort(keys)
    with arrangedb.Engine(spill_dir=root, memory_budget="16MiB") as engine:
        _assert_holds(engine.load(root / "saved"), model, "the undamaged copy")
    return root / "saved", pages, model


def _damaged_outcome(path, damaged, model, spill):
    """None when loading and reading ``path`` is exactly right or raises a
    CorruptionError naming one of ``damaged`` (basenames); else what went wrong."""
    corruption = _error_class("CorruptionError")
    try:
        with arrangedb.Engine(spill_dir=spill, memory_budget="16MiB") as engine:
            got = engine.load(path).snapshot().read_all()
    except Exception as e:
        what = f"{type(e).__name__}: {str(e)[:160]}"
        if corruption is None:
            return f"not a CorruptionError (arrangedb has none yet): {what}"
        if not isinstance(e, corruption):
            return f"not a CorruptionError: {what}"
        if not any(name in str(e) for name in damaged):
            return f"CorruptionError not naming {sorted(damaged)}: {what}"
        return None
    problem = _mismatch(got, model)
    return None if problem is None else f"WRONG ANSWER, no error: {problem}"


def _flip(path, offset, mask):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))


def _swap_words(path, fraction):
    """Swap two adjacent, different 8-byte words from ``fraction`` into the file (64-byte
    aligned, so both are in one 4 KiB page of any region); False if none found."""
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        o = int(len(data) * fraction) // 64 * 64
        while o + 16 <= len(data) * 0.9:
            if data[o:o + 8] != data[o + 8:o + 16]:
                data[o:o + 8], data[o + 8:o + 16] = data[o + 8:o + 16], data[o:o + 8]
                f.seek(0)
                f.write(data)
                return True
            o += 64
    return False


def _truncate(path):
    os.truncate(path, os.path.getsize(path) // 2)


def _damage_cases(kind, src, pages):
    """(label, damaged basenames, damage(dir)) for each case of a sweep over ``src``."""
    cases = []
    if kind in ("page_byte_flips", "manifest_byte_flips"):
        names = pages if kind == "page_byte_flips" else ["manifest-000001.json"]
        for name in names:
            # ~60 offsets evenly spread, each flipping one bit (a different one in turn)
            offsets = np.unique(np.linspace(0, os.path.getsize(src / name) - 1, 60).astype(int))
            cases += [(f"{name}@{off} ^{1 << (i % 8):#x}", {name},
                       lambda d, name=name, off=int(off), i=i: _flip(d / name, off, 1 << (i % 8)))
                      for i, off in enumerate(offsets)]
    elif kind == "page_word_swaps":
        cases += [(f"{name} words at {frac:.0%}", {name},
                   lambda d, name=name, frac=frac: _swap_words(d / name, frac))
                  for name in pages for frac in (0.3, 0.45, 0.6)]
    elif kind == "truncation":
        cases += [(f"{name} cut to half", {name}, lambda d, name=name: _truncate(d / name))
                  for name in [*pages, "manifest-000001.json"]]
    elif kind == "deletion":
        cases += [(f"{name} deleted", {name}, lambda d, name=name: os.remove(d / name))
                  for name in pages]
    elif kind == "renamed_swaps":
        for i, a in enumerate(pages):
            for b in pages[i + 1:]:
                def swap(d, a=a, b=b):
                    os.rename(d / a, d / "swap.tmp")
                    os.rename(d / b, d / a)
                    os.rename(d / "swap.tmp", d / b)
                cases.append((f"{a} <-> {b}", {a, b}, swap))
    return cases


@pytest.mark.parametrize("kind", ["page_byte_flips", "page_word_swaps", "truncation",
                                  "deletion", "renamed_swaps", "manifest_byte_flips"])
def test_a_damaged_saved_trace_reads_right_or_raises_corruption_error(saved_trace, tmp_path,
                                                                      kind):
    src, pages, model = saved_trace
    spill = tmp_path / "spill"
    spill.mkdir()
    failures = []
    cases = _damage_cases(kind, src, pages)
    for n, (label, damaged, damage) in enumerate(cases):
        copy = tmp_path / f"copy{n}"
        shutil.copytree(src, copy)               # every case damages a fresh copy
        if damage(copy) is False:
            continue                             # nothing to damage there (all padding)
        outcome = _damaged_outcome(copy, damaged, model, spill)
        if outcome is not None:
            failures.append(f"{label}: {outcome}")
        shutil.rmtree(copy)
    # wrong answers first: they are the worst failure, and the rarest
    failures.sort(key=lambda f: "WRONG ANSWER" not in f)
    wrong = sum("WRONG ANSWER" in f for f in failures)
    assert not failures, (f"{len(failures)} of {len(cases)} damaged copies misread, "
                          f"{wrong} of them as a wrong answer:\n  " + "\n  ".join(failures[:12]))


# -- 5. permissions --------------------------------------------------------------------

def test_saved_files_take_the_umask_and_spill_files_stay_private(tmp_path):
    old = os.umask(0o027)
    try:
        with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB") as engine:
            keys = _keys(20_000, seed=10)
            trace = engine.arrange(_table(keys[:15_000]), key=["k"], vals=["v"])
            trace.insert(_table(keys[15_000:]))   # a resident batch: paged out by save
            trace.save(tmp_path / "saved")
            modes = {f: stat.S_IMODE(os.stat(tmp_path / "saved" / f).st_mode)
                     for f in os.listdir(tmp_path / "saved")}
            spill = engine.stats()["spill_dir"]
            spill_modes = {f: stat.S_IMODE(os.stat(os.path.join(spill, f)).st_mode)
                           for f in os.listdir(spill) if f.endswith(".pg")}
    finally:
        os.umask(old)
    assert "manifest-000001.json" in modes and any(f.endswith(".page") for f in modes)
    wrong = {f: oct(m) for f, m in modes.items() if m != 0o640}
    assert not wrong, f"saved files must be 0o640 under umask 0o027: {wrong}"
    assert spill_modes, "no spill files to check"
    wrong = {f: oct(m) for f, m in spill_modes.items() if m != 0o600}
    assert not wrong, f"spill files must stay 0o600: {wrong}"


def test_a_trace_saved_by_an_earlier_format_still_loads(tmp_path):
    """tests/data/save-v1: manifest format 1 (no checksum) over page files of format 2
    (wsum64 region checksums), kept as written by the version that made them."""
    import pyarrow.parquet as pq

    data = DATA_DIR
    expected = pq.read_table(os.path.join(data, "save-v1.expected.parquet"))
    copy = tmp_path / "save-v1"
    shutil.copytree(os.path.join(data, "save-v1"), copy)
    with arrangedb.Engine(spill_dir=tmp_path) as engine:
        trace = engine.load(copy)
        assert trace.snapshot().read_all().equals(expected)
        trace.insert(pa.table({"k": pa.array([7], pa.int64()), "name": ["z"],
                               "amount": [1.5]}))
        trace.merge_all()
        assert trace.stats()["updates"] == expected.num_rows + 1


def test_a_trace_of_the_earlier_format_missing_its_batches_is_named_damaged(tmp_path):
    """Format 1 has no checksum: a manifest missing what every manifest holds is named
    as damaged (ManifestError naming the file), not a KeyError from deep in the load."""
    copy = tmp_path / "save-v1"
    shutil.copytree(os.path.join(DATA_DIR, "save-v1"), copy)
    m = json.loads((copy / "manifest.json").read_text())
    del m["batches"]
    (copy / "manifest.json").write_text(json.dumps(m))
    with arrangedb.Engine(spill_dir=tmp_path) as engine:
        with pytest.raises(arrangedb.ManifestError, match="manifest.json.*lacks batches"):
            engine.load(copy)
