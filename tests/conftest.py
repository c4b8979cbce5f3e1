"""Shared fixtures: a spill root per test, an engine without the idle merger, a guard
against leaked page-file handles, and small disks (tmpfs) to fill.

A page file left open keeps its descriptor (mmap dups it) and its mapping alive, and on a
long-running Spark worker that is disk space that never comes back after the file is
deleted. The guard compares the ``.pg`` files this process has open or mapped under the
temp directories before and after each test, so any layer's test catches such a leak.
"""

from __future__ import annotations

import gc
import os
import re
import subprocess
import tempfile

import psutil
import pytest

import arrangedb  # before any test module loads numpy: it tunes numpy's sorts

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
"""Files the compatibility tests load: checkpoints written by earlier formats."""

_PAGE_FILE = re.compile(r"\.pg(\.tmp)?( \(deleted\))?$")


@pytest.fixture
def spill_root(tmp_path):
    """An empty directory to use as a SpillDirectory root."""
    root = tmp_path / "spill"
    root.mkdir()
    return root


@pytest.fixture
def still_engine(tmp_path):
    """An engine without the idle merger, for tests that count batches or merges: its
    background work would change them between two steps of the test."""
    with arrangedb.Engine(spill_dir=tmp_path, memory_budget="64MiB", idle_merge=False) as e:
        yield e


def _open_page_files(roots: tuple[str, ...]) -> set[str]:
    """``.pg`` paths under ``roots`` held open (fd) or mapped by this process."""
    held = set()
    try:
        held.update(f.path for f in psutil.Process().open_files())
    except (psutil.Error, OSError):
        pass
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.rstrip("\n").split(None, 5)
                if len(parts) == 6:
                    held.add(parts[5])
    except OSError:
        pass
    return {p for p in held if _PAGE_FILE.search(p) and p.startswith(roots)}


@pytest.fixture(autouse=True)
def no_leaked_page_files(tmp_path_factory):
    """Fail the test if it leaves page files open or mapped (after a garbage collection)."""
    roots = {os.path.realpath(tempfile.gettempdir()),
             os.path.realpath(str(tmp_path_factory.getbasetemp()))}
    if os.environ.get("ARRANGEDB_SPILL_DIR"):
        roots.add(os.path.realpath(os.environ["ARRANGEDB_SPILL_DIR"]))
    roots = tuple(r.rstrip("/") + "/" for r in roots)
    before = _open_page_files(roots)
    yield
    gc.collect()
    leaked = _open_page_files(roots) - before
    if leaked:
        pytest.fail("test left page files open or mapped (close PageFiles/engines): "
                    + ", ".join(sorted(leaked)[:5])
                    + (f" and {len(leaked) - 5} more" if len(leaked) > 5 else ""),
                    pytrace=False)


# Speed lives in the benchmarks: a per-example deadline only measures how busy the machine
# is (two cores shared with Spark's JVMs), so it is off for every property test.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

# CI runs a fixed sequence of examples (derandomized) so that a landing does not depend on
# luck; ARRANGEDB_HYPOTHESIS_RANDOM=1 explores new examples on every run.
_hypothesis_settings.register_profile(
    "arrangedb", deadline=None,
    derandomize=os.environ.get("ARRANGEDB_HYPOTHESIS_RANDOM") != "1")
_hypothesis_settings.load_profile("arrangedb")


def fill_disk(path, leave: int = 0) -> None:
    """Write ``path`` until its disk is full (ENOSPC, to the last page), then give
    ``leave`` bytes back."""
    import errno

    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (b"\0" * (1 << 20), b"\0" * 4096):
            try:
                while True:
                    os.write(fd, chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    if leave:
        os.truncate(path, max(0, os.path.getsize(path) - leave))


@pytest.fixture
def small_disk(tmp_path):
    """A factory: a fresh tmpfs of the given size under tmp_path (needs root to mount);
    unmounted at teardown, lazily if something still holds it."""
    mounted = []

    def make(size):
        mnt = tmp_path / f"disk{len(mounted)}"
        mnt.mkdir()
        try:
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                str(mnt)], capture_output=True, text=True)
            why = (r.stderr or r.stdout).strip() if r.returncode else None
        except OSError as e:                     # no mount(8) here
            why = str(e)
        if why is not None:
            pytest.skip(f"needs a small disk: cannot mount a tmpfs (root only): {why}")
        mounted.append(mnt)
        return mnt

    yield make
    for mnt in reversed(mounted):
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)




@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """The Spark session of the Spark test modules: one local[2] session, started by the
    first module that needs it and shared by the others (``getOrCreate``: a SparkContext
    costs seconds to start and only one runs per JVM). A module that stops it (a
    benchmark) leaves the next one to start it again; the JVM ends with the process."""
    import shutil

    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17 (see `make java`)")
    from arrangedb.spark_integration import local_session

    # Spark's catalog otherwise makes ./spark-warehouse in whatever folder pytest runs in
    warehouse = str(tmp_path_factory.mktemp("spark-warehouse"))
    return local_session("local[2]", memory_budget="64MiB",
                         extra={"spark.sql.warehouse.dir": warehouse})


def table_rows(table, names: list[str]):
    """The rows of ``names`` in a table, as a multiset."""
    from collections import Counter

    return Counter(zip(*(table.column(n).to_pylist() for n in names)))


def snapshot_rows(trace, names: list[str]):
    """The rows of ``names`` a trace's snapshot holds, each as many times as it counts."""
    from collections import Counter

    snap = trace.snapshot().read_all()
    out: Counter = Counter()
    for row, count in zip(zip(*(snap.column(n).to_pylist() for n in names)),
                          snap.column("count").to_pylist()):
        out[row] += count
    return out
