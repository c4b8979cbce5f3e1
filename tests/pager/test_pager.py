"""Tests of the pager: sizes, page-file round trips and damage, the budget, spill dirs.

The pager is the layer every other one trusts with bytes and memory, so these tests go
for its observable promises: what is written reads back byte for byte and zero-copy,
any damage surfaces as a PageFileError naming the file (never as wrong data), the budget
holds exactly what was reserved and spills cheapest-first, spill directories are private
and cleaned up after crashes, a full disk is a clear SpillError, and scanning data eight
times the budget keeps RSS within budget + allowance.
"""

from __future__ import annotations

import gc
import json
import os
import stat
import struct
import subprocess
import sys
import tempfile
import time
import zlib

from arrangedb.pager.checksum import checksum64

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from arrangedb.pager import (RSS_ALLOWANCE, BudgetExceeded, MemoryBudget, PageFile,
                             PageFileError, PageWriter, SpillDirectory, SpillError, format_size,
                             parse_size)
from arrangedb.pager.pagefile import HEADER, HEADER_SIZE, VERSION
from arrangedb.pager.spilldir import ENV_VAR, OWNER_FILE, PREFIX

MiB = 1 << 20
PROPERTY = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


# -- helpers -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shared_spill(tmp_path_factory):
    """One spill directory for property tests (hypothesis reruns the body many times)."""
    with SpillDirectory(tmp_path_factory.mktemp("shared-spill")) as spill:
        yield spill


@pytest.fixture
def spill(spill_root):
    with SpillDirectory(spill_root) as s:
        yield s


@pytest.fixture
def flat_budget():
    """Budgets whose RSS reads flat, so only reservations (not test-process noise) spill."""
    made = []

    def make(limit):
        b = MemoryBudget(limit, sample_interval=0)
        b.rss = lambda fast=False: b.baseline_rss
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


def write_page_file(spill, regions: dict, budget=None) -> PageFile:
    w = PageWriter(spill)
    for name, data in regions.items():
        w.add_region(name, data)
    return w.finish(budget=budget)


def raw_bytes(data) -> bytes:
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8).tobytes()
    return bytes(data)


def mapped_path(address: int) -> str | None:
    """The file mapped at ``address`` in this process, from /proc/self/maps."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(None, 5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi:
                return parts[5].strip() if len(parts) == 6 else ""
    return None


def patch_file(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def flip_byte(path, offset: int, mask: int = 0xFF) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ mask]))


# -- sizes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    (0, 0), (1000, 1000), ("1000", 1000), ("512MiB", 512 * MiB), ("2g", 2 << 30),
    ("1GB", 10**9), ("1.5 KiB", 1536), ("64 mb", 64 * 10**6), (" 3k ", 3072), ("7b", 7),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["abc", -1, "12 parsecs", "", "-5MiB", True, None, "1e3"])
def test_parse_size_refuses_with_the_value_named(bad):
    with pytest.raises(ValueError, match="size") as exc:
        parse_size(bad)
    assert repr(bad) in str(exc.value)


@given(st.integers(0, 1 << 50), st.sampled_from(["", "B", "KiB", "k", "MiB", "m", "GiB", "g"]))
def test_parse_size_of_integer_strings(n, unit):
    scale = {"": 1, "B": 1, "KiB": 1 << 10, "k": 1 << 10, "MiB": MiB, "m": MiB,
             "GiB": 1 << 30, "g": 1 << 30}[unit]
    assert parse_size(f"{n}{unit}") == n * scale


def test_format_size():
    assert format_size(1536) == "1.5 KiB"
    assert format_size(100) == "100 B"
    assert format_size(3 * MiB) == "3.0 MiB"


# -- page file round trips -----------------------------------------------------------------

DTYPES = hnp.scalar_dtypes() | hnp.byte_string_dtypes(max_len=5) | st.sampled_from(
    [np.dtype(">i4"), np.dtype("<f2"), np.dtype([("a", "<i4"), ("b", "<f8")])])
ARRAYS = DTYPES.flatmap(lambda dt: hnp.arrays(dt, st.integers(0, 300)))
REGION_DATA = st.one_of(st.binary(max_size=300), ARRAYS,
                        st.binary(max_size=300).map(pa.py_buffer))


@PROPERTY
@given(st.lists(REGION_DATA, max_size=6))
def test_regions_round_trip_zero_copy(shared_spill, datas):
    regions = {f"r{i}/{type(d).__name__}": d for i, d in enumerate(datas)}
    pf = write_page_file(shared_spill, regions)
    try:
        assert set(pf.regions) == set(regions)
        bases = set()
        for name, data in regions.items():
            info = pf.regions[name]
            expected = raw_bytes(data)
            assert info.offset % 64 == 0 and info.offset >= HEADER_SIZE
            assert info.length == len(expected)
            assert info.checksum == checksum64(expected)

            view = pf.buffer(name)
            assert view.readonly and bytes(view) == expected
            arrow = pf.arrow_buffer(name)
            assert arrow.to_pybytes() == expected
            if isinstance(data, np.ndarray):
                arr = pf.numpy(name, data.dtype)
                assert arr.dtype == data.dtype and arr.shape == (data.size,)
                assert not arr.flags.writeable
                assert raw_bytes(arr) == expected
                if data.dtype.kind in "iub":
                    assert np.array_equal(arr, data.reshape(-1))
            if info.length:   # zero-copy: views into the file's one mapping, at its offset
                as_np = np.frombuffer(view, np.uint8)
                assert np.shares_memory(as_np, np.frombuffer(arrow, np.uint8))
                assert mapped_path(arrow.address) == os.path.realpath(pf.path)
                bases.add(arrow.address - info.offset)
        assert len(bases) <= 1
    finally:
        pf.delete()


def test_empty_page_file_and_empty_region(spill):
    pf = write_page_file(spill, {})
    assert pf.regions == {} and pf.verify() == {}
    pf.close()
    pf = write_page_file(spill, {"empty": b"", "one": b"x"})
    assert pf.buffer("empty").nbytes == 0 and len(pf.numpy("empty", np.int64)) == 0
    assert pf.buffer("one") == b"x"
    pf.close()


def test_writer_refuses_duplicates_and_abort_leaves_nothing(spill):
    w = PageWriter(spill)
    w.add_region("a", b"1")
    with pytest.raises(ValueError, match="twice"):
        w.add_region("a", b"2")
    w.abort()
    assert os.listdir(spill.path) == [OWNER_FILE]
    with pytest.raises(ValueError, match="finished"):
        w.add_region("b", b"3")


def test_unknown_region_is_named(spill):
    pf = write_page_file(spill, {"a": b"123"})
    with pytest.raises(PageFileError, match="no region 'nope'") as exc:
        pf.buffer("nope")
    assert pf.path in str(exc.value)
    pf.close()


# -- damage --------------------------------------------------------------------------------

def _sample_file(spill) -> tuple[str, dict]:
    rng = np.random.default_rng(1)
    regions = {"keys": rng.integers(0, 1 << 40, 3000), "vals": rng.random(700),
               "names": b"alpha beta gamma" * 50}
    w = PageWriter(spill)
    for name, data in regions.items():
        w.add_region(name, data, meta={"column": name})
    w.finish().close()
    return w.path, regions


@PROPERTY
@given(data=st.data())
def test_flipped_region_byte_is_caught_on_first_buffer(shared_spill, data):
    path, regions = _sample_file(shared_spill)
    pf = PageFile.open(path)
    victim = data.draw(st.sampled_from(sorted(regions)))
    info = pf.regions[victim]
    pf.close()
    flip_byte(path, info.offset + data.draw(st.integers(0, info.length - 1)),
              data.draw(st.integers(1, 255)))
    pf = PageFile.open(path)   # regions are checked when mapped, not at open
    try:
        for name in regions:
            if name != victim:
                assert bytes(pf.buffer(name)) == raw_bytes(regions[name])
        with pytest.raises(PageFileError, match="checksum mismatch") as exc:
            pf.buffer(victim)
        assert path in str(exc.value) and repr(victim) in str(exc.value)
        assert pf.verify() == {name: name != victim for name in regions}
    finally:
        pf.delete()


def test_a_region_is_checked_again_after_pressure_dropped_its_pages(shared_spill):
    """Pages the budget dropped come back from the file: damage done to the file since
    the first check is caught on the next map, not decoded."""
    from arrangedb.pager.mapped_regions import MappedRegions

    path, regions = _sample_file(shared_spill)
    with MemoryBudget("64MiB") as budget:
        pf = PageFile.open(path, budget=budget)
        try:
            info = pf.regions["keys"]
            assert bytes(pf.buffer("keys")) == raw_bytes(regions["keys"])
            MappedRegions.of(budget).spill(1 << 30)    # memory pressure drops every region
            flip_byte(path, info.offset + 17)
            with pytest.raises(PageFileError, match="checksum mismatch") as exc:
                pf.buffer("keys")
            assert path in str(exc.value) and "'keys'" in str(exc.value)
        finally:
            pf.delete()


@PROPERTY
@given(data=st.data())
def test_flipped_header_or_directory_byte_fails_at_open(shared_spill, data):
    path, _ = _sample_file(shared_spill)
    with open(path, "rb") as f:
        _, _, _, dir_off, dir_len, _ = HEADER.unpack(f.read(HEADER.size))
    where = data.draw(st.one_of(st.integers(0, HEADER_SIZE - 1),
                                st.integers(dir_off, dir_off + dir_len - 1)))
    flip_byte(path, where, data.draw(st.integers(1, 255)))
    try:
        with pytest.raises(PageFileError) as exc:
            PageFile.open(path)
        assert path in str(exc.value)
    finally:
        os.unlink(path)


def test_truncated_file_fails_at_open(spill):
    path, regions = _sample_file(spill)
    size = os.path.getsize(path)
    pf = PageFile.open(path)
    cuts = {0, 1, 10, HEADER_SIZE - 1, HEADER_SIZE, pf.regions["vals"].offset + 5,
            max(r.offset + r.length for r in pf.regions.values()), size - 1}
    pf.close()
    original = open(path, "rb").read()
    for cut in sorted(cuts):
        with open(path, "wb") as f:
            f.write(original[:cut])
        with pytest.raises(PageFileError) as exc:
            PageFile.open(path)
        assert path in str(exc.value), cut
        assert "truncated" in str(exc.value) or "shorter" in str(exc.value), str(exc.value)


@pytest.mark.parametrize("content", [
    b"", b"x", os.urandom(63), os.urandom(64), os.urandom(4096),
    b"key,value\n1,2\n3,4\n" * 20, b"ARNGDBP" + bytes(100)],
    ids=["empty", "one-byte", "random-63", "random-64", "random-4k", "text", "near-magic"])
def test_foreign_file_is_refused_naming_it(tmp_path, content):
    path = tmp_path / "foreign.pg"
    path.write_bytes(content)
    with pytest.raises(PageFileError) as exc:
        PageFile.open(path)
    assert str(path) in str(exc.value)


def test_missing_file_is_a_page_file_error(tmp_path):
    with pytest.raises(PageFileError, match="cannot open page file") as exc:
        PageFile.open(tmp_path / "gone.pg")
    assert str(tmp_path / "gone.pg") in str(exc.value)


def test_other_format_version_is_refused_naming_the_version(spill):
    path, _ = _sample_file(spill)
    header = bytearray(open(path, "rb").read(HEADER_SIZE))
    struct.pack_into("<I", header, 8, VERSION + 1)   # after the 8-byte magic
    struct.pack_into("<I", header, HEADER_SIZE - 4, zlib.crc32(header[:HEADER_SIZE - 4]))
    patch_file(path, 0, bytes(header))
    with pytest.raises(PageFileError, match=f"version {VERSION + 1}") as exc:
        PageFile.open(path)
    assert path in str(exc.value) and f"version {VERSION}" in str(exc.value)


# -- memory budget: model-based -------------------------------------------------------------

class BudgetMachine(RuleBasedStateMachine):
    """Random reserve/release sequences against a dict of what each name holds."""

    LIMIT = 1000
    NAMES = st.sampled_from(["builder", "merge window", "decoded part"])

    def __init__(self):
        super().__init__()
        self.budget = MemoryBudget(self.LIMIT, sample_interval=0)
        self.model: dict[str, int] = {}
        self.peak = 0

    @property
    def total(self) -> int:
        return sum(self.model.values())

    @rule(n=st.integers(-3, 700), what=NAMES)
    def reserve(self, n, what):
        held = self.total
        if n > 0 and held + n > self.LIMIT:
            with pytest.raises(BudgetExceeded) as exc:
                self.budget.reserve(n, what)
            msg = str(exc.value)
            for part in (format_size(self.LIMIT), format_size(n), what,
                         f"{format_size(held)} is held"):
                assert part in msg, (part, msg)
            if held:
                top = max(self.model, key=self.model.get)
                assert f"{top}: {format_size(self.model[top])}" in msg, msg
        else:
            self.budget.reserve(n, what)
            if n > 0:
                self.model[what] = self.model.get(what, 0) + n
                self.peak = max(self.peak, self.total)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def release(self, data):
        what = data.draw(st.sampled_from(sorted(self.model)))
        n = data.draw(st.integers(1, self.model[what]))
        self.budget.release(n, what)
        self.model[what] -= n
        if not self.model[what]:
            del self.model[what]

    @rule(extra=st.integers(0, 50))
    def release_everything_untagged(self, extra):
        self.budget.release(self.total + extra)
        self.model.clear()

    @invariant()
    def held_matches_model(self):
        assert self.budget.held >= 0
        assert self.budget.held == self.total
        assert self.budget.peak_held == self.peak
        assert self.budget.stats()["held_bytes"] == self.total

    def teardown(self):
        self.budget.close()


TestBudgetMachine = BudgetMachine.TestCase
TestBudgetMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_reservation_context_releases_on_error(flat_budget):
    b = flat_budget(100)
    with pytest.raises(RuntimeError):
        with b.reservation(60, "scratch"):
            assert b.held == 60
            raise RuntimeError
    assert b.held == 0 and b.peak_held == 60


def test_untagged_release_comes_off_the_named_holders(flat_budget):
    b = flat_budget(1000)
    b.reserve(700, "builder")
    b.release(700)   # as callers that do not tag their releases do
    b.reserve(400, "decoded part")
    with pytest.raises(BudgetExceeded) as exc:
        b.reserve(700, "merge window")
    assert "builder" not in str(exc.value) and "decoded part: 400 B" in str(exc.value)


def test_budget_rejects_nonsense_limits():
    for bad in (0, "0MiB", -1, "lots"):
        with pytest.raises(ValueError):
            MemoryBudget(bad, sample_interval=0)


# -- memory budget: spillers ----------------------------------------------------------------

def _cache_spiller(budget, calls, name, frees):
    """A spiller dropping one whole cache entry of ``frees`` bytes, whatever is wanted."""
    def spill(wanted):
        calls.append((name, wanted))
        budget.release(frees, "cache")
        return frees
    return spill


def test_spillers_run_cheapest_first_and_only_as_much_as_needed(flat_budget):
    b = flat_budget(1000)
    b.reserve(900, "cache")
    calls = []
    for name, prio, frees in [("c", 5, 300), ("a", 0, 100), ("d", 9, 300), ("b", 2, 150)]:
        b.add_spiller(_cache_spiller(b, calls, name, frees), priority=prio)
    b.reserve(500, "work")                    # 400 over: a, b, c free 550; d is not asked
    assert calls == [("a", 400), ("b", 300), ("c", 150)]
    assert b.held == 900 - 550 + 500 and b.stats()["bytes_freed_by_spillers"] == 550


def test_spiller_freeing_enough_lets_the_reservation_pass(flat_budget):
    b = flat_budget(1000)
    b.reserve(1000, "cache")
    calls = []
    b.add_spiller(_cache_spiller(b, calls, "all", 1000))
    b.reserve(1000, "work")
    assert calls == [("all", 1000)] and b.held == 1000


def test_spillers_freeing_too_little_raise_after_trying_all(flat_budget):
    b = flat_budget(1000)
    b.reserve(900, "cache")
    calls = []
    token = b.add_spiller(_cache_spiller(b, calls, "x", 10))
    b.add_spiller(_cache_spiller(b, calls, "y", 10), priority=1)
    with pytest.raises(BudgetExceeded, match="asked 500 B for work") as exc:
        b.reserve(500, "work")
    assert [c[0] for c in calls] == ["x", "y"] and b.held == 880
    assert "880 B is held" in str(exc.value)
    b.remove_spiller(token)
    calls.clear()
    with pytest.raises(BudgetExceeded):
        b.reserve(500, "work")
    assert [c[0] for c in calls] == ["y"]


def test_reserve_inside_a_spiller_does_not_recurse(flat_budget):
    b = flat_budget(1000)
    b.reserve(800, "cache")
    calls = []

    def spiller(wanted):
        calls.append(wanted)
        with pytest.raises(BudgetExceeded):
            b.reserve(500, "spill scratch")   # would need spilling again: refused, not recursed
        with b.reservation(100, "spill buffer"):   # fits: granted
            pass
        b.release(800, "cache")
        return 800

    b.add_spiller(spiller)
    b.reserve(500, "work")
    assert calls == [300] and b.held == 500


def test_mapped_regions_are_charged_on_buffer_and_uncharged_on_release(spill, flat_budget):
    b = flat_budget("64MiB")
    a, c = np.arange(MiB // 8, dtype=np.int64), np.ones(1000, np.float32)
    pf = write_page_file(spill, {"a": a, "c": c, "empty": b""}, budget=b)
    assert b.held == 0                           # open maps nothing yet
    view = pf.numpy("a", np.int64)
    assert b.held == MiB
    pf.buffer("a")
    assert b.held == MiB                         # a region is charged once while mapped
    pf.buffer("c")
    pf.buffer("empty")
    assert b.held == MiB + c.nbytes
    assert pf.release("a") == MiB and b.held == c.nbytes
    assert pf.release("a") == 0
    assert np.array_equal(view, a)               # a released region refaults from the file
    assert pf.release() == c.nbytes and b.held == 0
    pf.buffer("a")
    assert b.held == MiB
    pf.close()
    assert b.held == 0


def test_release_all_gives_back_several_regions_at_once(spill, flat_budget):
    """A part's regions released together: each charged one uncharged once, regions not
    named stay charged and readable, and the released ones read back from the file."""
    b = flat_budget("64MiB")
    data = {n: np.full(3000 + 5000 * i, i, np.int64) for i, n in enumerate("abcd")}
    pf = write_page_file(spill, data, budget=b)
    views = {n: pf.numpy(n, np.int64) for n in "abcd"}
    size = {n: v.nbytes for n, v in data.items()}
    assert b.held == sum(size.values())
    assert pf.release_all(["c", "a", "b", "a"]) == size["a"] + size["b"] + size["c"]
    assert b.held == size["d"] and pf.release_all(["a", "b"]) == 0
    for n in "abcd":
        assert np.array_equal(views[n], data[n])
    assert pf.release_all([]) == 0 and pf.release() == size["d"] and b.held == 0
    pf.close()


def test_resident_set_releases_least_recently_mapped_regions_for_room(spill, flat_budget):
    b = flat_budget(3 * MiB)
    data = {n: np.full(MiB // 8, i, np.int64) for i, n in enumerate("abcd")}
    pf = write_page_file(spill, data, budget=b)
    arrays = {n: pf.numpy(n, np.int64) for n in "ab"}
    assert b.held == 2 * MiB
    b.reserve(2 * MiB, "work")                   # 1 MiB short: "a" (mapped first) goes
    assert b.held == 3 * MiB
    assert pf.release("a") == 0 and pf.release("b") == MiB
    assert all(np.array_equal(arrays[n], data[n]) for n in "ab")
    pf.numpy("c", np.int64)
    b.release(2 * MiB, "work")
    pf.close()


def test_large_regions_start_on_pages_and_folios(spill):
    from arrangedb.pager.pagefile import FOLIO, PAGE
    data = {"tiny": b"x" * 100, "page": np.ones(70_000, np.uint8), "mid": b"y" * 10,
            "folio": np.arange(3 * MiB // 16, dtype=np.int64), "tail": b"z" * 7}
    pf = write_page_file(spill, data)
    offsets = {n: pf.regions[n].offset for n in data}
    assert all(o % 64 == 0 for o in offsets.values())
    assert offsets["page"] % PAGE == 0 and offsets["folio"] % FOLIO == 0
    assert offsets["tiny"] == 64 and offsets["mid"] < offsets["folio"]   # small ones pack
    for n, d in data.items():
        assert bytes(pf.buffer(n)) == raw_bytes(d)
    # the gap before the folio-aligned region is a hole: counted neither written nor stored
    assert spill.bytes_written < pf.size - (offsets["folio"] - offsets["mid"] - 64)
    assert os.stat(pf.path).st_blocks * 512 < pf.size
    pf.close()


def _mapped_rss(path: str) -> int:
    """Resident bytes of this process's mappings of ``path`` (from /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:
                inside = line.rstrip().endswith(path)
            elif inside and line.startswith("Rss:"):
                total += int(head[1]) * 1024
    return total


def test_spiller_sweeps_pages_mapped_beside_released_regions(spill, flat_budget):
    """Reading a region maps whole folios around it; the spiller drops what is unused."""
    b = flat_budget("256MiB")
    data = {f"r{i}": np.full(160_000 // 8, i, np.int64) for i in range(64)}
    pf = write_page_file(spill, data, budget=b)
    for i in range(0, 64, 4):                    # every fourth region, like scattered lookups
        assert int(pf.numpy(f"r{i}", np.int64)[-1]) == i
        pf.release(f"r{i}")
    kept = pf.numpy("r5", np.int64)              # one region stays in use
    assert b.held == 160_000
    b.spill(1)                                   # what a budget short of room does
    assert b.held == 0                           # r5 was the least recently mapped...
    assert _mapped_rss(pf.path) == 0             # ...and nothing else stays mapped
    assert int(kept[0]) == 5                     # a view still reads (it refaults)
    pf.buffer("r9")                              # verified: every page read, neighbours too
    assert _mapped_rss(pf.path) > 163_840
    pf.sweep()                                   # drops the neighbours' pages, not r9's
    assert _mapped_rss(pf.path) == 163_840       # r9's 160 000 bytes in whole pages
    assert b.held == 160_000
    del kept
    pf.close()


def test_charge_of_a_page_file_dropped_unclosed_comes_back(spill, flat_budget):
    b = flat_budget(2 * MiB)
    pf = write_page_file(spill, {"a": np.zeros(MiB // 8, np.int64)}, budget=b)
    pf.buffer("a")
    del pf
    gc.collect()
    assert b.held == MiB
    b.reserve(2 * MiB, "work")                   # the dead mapping's charge is spilled
    assert b.held == 2 * MiB


def test_rss_pressure_asks_spillers_at_the_next_reservation():
    b = MemoryBudget(MiB, sample_interval=0)
    calls = []
    b.add_spiller(lambda wanted: calls.append(wanted) or 0)
    b.rss = lambda fast=False: b.baseline_rss + 3 * MiB    # something unreserved grew RSS
    b.reserve(10, "small")
    assert calls and calls[0] >= 2 * MiB - 10 and b.peak_rss == b.baseline_rss + 3 * MiB
    b.close()



def test_rss_pressure_hands_back_kept_memory_before_asking_spillers(monkeypatch):
    """RSS over the limit from memory the allocators only keep: a trim relieves it, and
    no resident data is paged out for it; what the trim does not relieve is spilled."""
    import arrangedb.pager.budget as budget_mod

    for kept, spilled in ((3 * MiB, 0), (MiB, MiB)):
        b = MemoryBudget(MiB, sample_interval=0)
        calls = []
        b.add_spiller(lambda wanted: calls.append(wanted) or 0)
        grown = {"rss": 3 * MiB}                 # over the limit by 2 MiB
        b.rss = lambda fast=False: b.baseline_rss + grown["rss"]
        monkeypatch.setattr(budget_mod, "release_freed_memory",
                            lambda: grown.update(rss=grown["rss"] - kept))
        b.sample()                               # the sampler sees it: pressure
        b.reserve(10, "small")
        assert (calls[0] if calls else 0) == spilled
        assert b.held == 10
        b.close()


def test_rss_pressure_left_unrelieved_is_answered_again_only_a_step_higher(monkeypatch):
    """RSS over the limit that neither a trim nor the spillers bring down (what the
    interpreter keeps) is answered once, not at every reservation: again when RSS grows
    a step (a sixteenth of the limit here) past what the answer left, and at once after
    RSS has been under the limit."""
    import arrangedb.pager.budget as budget_mod

    trims, calls = [], []
    monkeypatch.setattr(budget_mod, "release_freed_memory", lambda: trims.append(1))
    b = MemoryBudget(16 * MiB, sample_interval=0)
    b.add_spiller(lambda wanted: calls.append(wanted) or 0)
    grown = {"rss": 0}
    b.rss = lambda fast=False: b.baseline_rss + grown["rss"]

    def answers_at(rss: int) -> int:
        """Answers to pressure (spiller calls) a reservation makes at ``rss``."""
        grown["rss"] = rss
        time.sleep(0.002)    # past the reservations' millisecond of cached RSS
        b.sample()
        before = len(calls)
        b.reserve(10, "small")
        b.release(10, "small")
        return len(calls) - before

    assert answers_at(18 * MiB) == 1 and trims == [1]
    assert answers_at(18 * MiB) == 0                 # nothing changed: not asked again
    assert answers_at(18 * MiB + MiB // 2) == 0      # less than a step higher
    assert answers_at(19 * MiB + MiB // 2) == 1      # a step higher
    assert answers_at(10 * MiB) == 0                 # under the limit
    assert answers_at(17 * MiB) == 1                 # over it again: answered at once
    assert len(trims) == 3
    b.close()


# -- spill directories ----------------------------------------------------------------------

def test_spill_directory_is_private(spill_root):
    with SpillDirectory(spill_root) as spill:
        name = os.path.basename(spill.path)
        assert os.path.dirname(spill.path) == str(spill_root)
        assert name.startswith(f"{PREFIX}{os.getpid()}-")
        assert os.stat(spill.path).st_mode & 0o777 == 0o700
        pf = write_page_file(spill, {"a": b"abc"})
        assert os.stat(pf.path).st_mode & 0o777 == 0o600
        assert os.stat(os.path.join(spill.path, OWNER_FILE)).st_mode & 0o777 == 0o600
        assert spill.bytes_written == pf.data_bytes <= pf.size   # alignment gaps: not written
        assert spill.bytes_on_disk == os.stat(pf.path).st_blocks * 512 >= pf.data_bytes
        pf.close()
        other = SpillDirectory(spill_root)
        assert other.path != spill.path
        other.close()
    assert not os.path.exists(spill.path)
    spill.close()                                  # idempotent
    with pytest.raises(SpillError, match="closed"):
        spill.new_path()


def test_root_argument_then_environment_then_tempdir(tmp_path, monkeypatch):
    arg, env, tmp = (tmp_path / n for n in ("arg", "env", "tmp"))
    for d in (arg, env, tmp):
        d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv(ENV_VAR, str(env))
    for root, expected in ((arg, arg), (None, env)):
        with SpillDirectory(root) as s:
            assert os.path.dirname(s.path) == str(expected)
    monkeypatch.delenv(ENV_VAR)
    with SpillDirectory() as s:
        assert os.path.dirname(s.path) == str(tmp)


def test_a_missing_root_is_created_with_its_parents_private(tmp_path):
    root = tmp_path / "data" / "tmp" / "arrangedb"
    with SpillDirectory(root) as s:
        assert os.path.dirname(s.path) == str(root)
        assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(root.parent).st_mode) & 0o077 == 0


def test_root_under_a_file_fails_at_construction_naming_it(tmp_path):
    (tmp_path / "plain-file").write_text("x")
    bad = tmp_path / "plain-file" / "spill"       # ENOTDIR whoever we run as
    with pytest.raises(SpillError, match="cannot be created") as exc:
        SpillDirectory(bad)
    assert str(bad) in str(exc.value)


def test_root_that_is_a_file_fails_at_construction_naming_it(tmp_path):
    (tmp_path / "plain-file").write_text("x")
    with pytest.raises(SpillError, match="not a directory") as exc:
        SpillDirectory(tmp_path / "plain-file")
    assert str(tmp_path / "plain-file") in str(exc.value)


def test_unwritable_root_fails_at_construction_naming_it(spill_root):
    if os.geteuid() == 0:
        pytest.skip("running as root: permissions are not enforced for root, so a 0500 "
                    "root stays writable (the ENOTDIR test covers the failure path)")
    os.chmod(spill_root, 0o500)
    try:
        with pytest.raises(SpillError, match="not writable") as exc:
            SpillDirectory(spill_root)
        assert str(spill_root) in str(exc.value)
    finally:
        os.chmod(spill_root, 0o700)


def _python(code: str, *args, **kw):
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                          text=True, timeout=60, **kw)


KILLED_CHILD = """
import os, signal, sys
from arrangedb.pager import PageWriter, SpillDirectory
spill = SpillDirectory(sys.argv[1])
w = PageWriter(spill)
w.add_region("a", b"x" * 1000)
w.finish().close()
print(spill.path, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_directory_of_a_killed_process_is_removed_at_next_start(spill_root):
    out = _python(KILLED_CHILD, spill_root)
    assert out.returncode == -9, out.stderr
    stale = out.stdout.strip()
    assert os.path.isdir(stale) and any(n.endswith(".pg") for n in os.listdir(stale))
    with SpillDirectory(spill_root) as spill:
        assert not os.path.exists(stale)
        assert os.listdir(spill_root) == [os.path.basename(spill.path)]


def test_directory_whose_pid_was_reused_is_removed(spill_root):
    fake = spill_root / f"{PREFIX}{os.getpid()}-deadbeef"
    fake.mkdir(mode=0o700)
    (fake / OWNER_FILE).write_text(f"{os.getpid()} 12345.0\n")   # our pid, another start
    unrelated = spill_root / "not-arrangedb"
    unrelated.mkdir()
    with SpillDirectory(spill_root):
        assert not fake.exists() and unrelated.exists()


LIVE_CHILD = """
import sys
from arrangedb.pager import SpillDirectory
spill = SpillDirectory(sys.argv[1])
print(spill.path, flush=True)
sys.stdin.read()
"""


def test_directory_of_a_live_process_is_kept(spill_root):
    child = subprocess.Popen([sys.executable, "-c", LIVE_CHILD, str(spill_root)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        theirs = child.stdout.readline().strip()
        assert os.path.isdir(theirs)
        with SpillDirectory(spill_root) as ours:
            assert os.path.isdir(theirs) and ours.path != theirs
    finally:
        child.stdin.close()
        assert child.wait(timeout=30) == 0
    assert not os.path.exists(theirs)            # a clean exit removes its own


def test_directory_of_a_live_process_whose_pid_means_nothing_here_is_kept(spill_root):
    """An engine in another PID namespace (a container sharing the spill root) writes a
    pid that is dead, or another process, here: its held lock keeps its directory."""
    child = subprocess.Popen([sys.executable, "-c", LIVE_CHILD, str(spill_root)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        theirs = child.stdout.readline().strip()
        owner = os.path.join(theirs, OWNER_FILE)
        with open(owner, "w") as f:   # as seen from here: a pid no process has
            f.write("4194304 12345.0\n")
        with SpillDirectory(spill_root):
            assert os.path.isdir(theirs)
    finally:
        child.stdin.close()
        assert child.wait(timeout=30) == 0
    assert not os.path.exists(theirs)            # a clean exit removes its own


WRITER_CHILD = """
import json, os, sys, time
import numpy as np
from arrangedb.pager import PageFile, PageWriter, SpillDirectory
root, seed, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
spill = SpillDirectory(root)
print(spill.path, flush=True)
while not os.path.exists(go):
    time.sleep(0.002)
rng = np.random.default_rng(seed)
written = []
for f in range(12):
    w = PageWriter(spill)
    data = {f"r{i}": rng.integers(0, 1 << 60, 8192) for i in range(4)}
    for name, arr in data.items():
        w.add_region(name, arr)
    w.finish().close()
    written.append((w.path, data))
ok = 0
for path, data in written:
    pf = PageFile.open(path)
    ok += all(np.array_equal(pf.numpy(n, np.int64), a) for n, a in data.items())
    pf.close()
print(json.dumps({"ok": ok, "files": sorted(os.listdir(spill.path))}))
spill.close()
"""


def test_two_processes_on_one_root_never_collide(spill_root, tmp_path):
    go = tmp_path / "go"
    children = [subprocess.Popen([sys.executable, "-c", WRITER_CHILD, str(spill_root), str(seed),
                                  str(go)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for seed in (1, 2)]
    dirs = [c.stdout.readline().strip() for c in children]
    go.touch()                                   # both write at the same time from here
    results = []
    for c in children:
        out, err = c.communicate(timeout=60)
        assert c.returncode == 0, err
        results.append(json.loads(out))
    assert len(set(dirs)) == 2 and all(d.startswith(str(spill_root)) for d in dirs)
    for r in results:
        assert r["ok"] == 12 and len([f for f in r["files"] if f.endswith(".pg")]) == 12
    assert os.listdir(spill_root) == []


# -- full disk -------------------------------------------------------------------------------

def test_full_disk_is_a_clear_spill_error_and_finished_files_survive(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a 2 MiB tmpfs for a real ENOSPC")
    mnt = tmp_path / "small"
    mnt.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip() or out.returncode}")
    region = 256 << 10
    finished: list[tuple[PageFile, dict]] = []
    spill = None
    try:
        spill = SpillDirectory(mnt)
        rng = np.random.default_rng(3)
        with pytest.raises(SpillError) as exc:
            for _ in range(20):
                data = {f"r{i}": rng.integers(0, 255, region, dtype=np.uint8) for i in range(2)}
                w = PageWriter(spill)
                for name, arr in data.items():
                    w.add_region(name, arr)
                finished.append((w.finish(), data))
        msg = str(exc.value)
        assert exc.value.errno == 28 and spill.path in msg and "full" in msg, msg
        assert format_size(region) in msg, msg
        assert len(finished) >= 2
        assert not [n for n in os.listdir(spill.path) if n.endswith(".tmp")]
        for pf, data in finished:
            assert all(pf.verify().values())
            assert all(np.array_equal(pf.numpy(n, np.uint8), a) for n, a in data.items())
    finally:
        for pf, _ in finished:
            pf.close()
        finished.clear()
        if spill is not None:
            spill.close()
        gc.collect()
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


# -- RSS under the budget, in a fresh interpreter -----------------------------------------

SCAN_SCRIPT = """
import json, sys, time
import numpy as np
from arrangedb.pager import MemoryBudget, PageFile, PageWriter, SpillDirectory, parse_size
limit, factor, root = parse_size(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
REGION, PER_FILE = 1 << 20, 32
budget = MemoryBudget(limit, sample_interval=0.01)
spill = SpillDirectory(root)
rng = np.random.default_rng(7)
n_regions = limit * factor // REGION
sums, paths, writer = [], [], None
t0 = time.perf_counter()
for i in range(n_regions):
    if writer is None:
        writer = PageWriter(spill, "scan")
    with budget.reservation(REGION, "generator"):
        chunk = rng.integers(-(1 << 40), 1 << 40, REGION // 8)
        sums.append(int(chunk.sum()))
        writer.add_region(f"r{i}", chunk)
        del chunk
    if (i + 1) % PER_FILE == 0 or i == n_regions - 1:
        writer.finish().close()
        paths.append(writer.path)
        writer = None
t1 = time.perf_counter()
scanned = 0
for path in paths:
    pf = PageFile.open(path, budget=budget)
    for name in pf.regions:
        values = pf.numpy(name, np.int64)
        assert int(values.sum()) == sums[int(name[1:])], name
        scanned += values.nbytes
        del values
        pf.release(name)
    pf.close()
t2 = time.perf_counter()
budget.close()
stats = budget.stats()
stats.update(bytes_scanned=scanned, bytes_spilled=spill.bytes_written, files=len(paths),
             write_s=t1 - t0, scan_s=t2 - t1)
spill.close()
print(json.dumps(stats))
"""


@pytest.mark.slow
def test_scanning_eight_times_the_budget_keeps_rss_within_budget(spill_root):
    limit = 32 * MiB
    out = _python(SCAN_SCRIPT, limit, 8, spill_root)
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    over = s["peak_rss_over_baseline_bytes"]
    print(f"\nscanned {format_size(s['bytes_scanned'])} in {s['files']} page files under a "
          f"{format_size(limit)} budget: write {s['write_s']:.2f}s, scan {s['scan_s']:.2f}s, "
          f"peak RSS over baseline {format_size(over)} (bound {format_size(limit)} + "
          f"{format_size(RSS_ALLOWANCE)}), peak held {format_size(s['peak_held_bytes'])}")
    assert s["bytes_scanned"] == 8 * limit
    assert s["peak_held_bytes"] <= limit
    assert over < limit + RSS_ALLOWANCE


@settings(max_examples=60)
@given(st.binary(min_size=1, max_size=20_000), st.data())
def test_checksum_catches_any_flipped_bit_and_any_truncation(data, draw):
    c = checksum64(data)
    pos = draw.draw(st.integers(0, len(data) - 1))
    bit = draw.draw(st.integers(0, 7))
    flipped = bytearray(data)
    flipped[pos] ^= 1 << bit
    assert checksum64(flipped) != c
    cut = draw.draw(st.integers(0, len(data) - 1))
    assert checksum64(data[:cut]) != c


def test_checksum_sees_misplaced_pages():
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 4096 * 4, dtype=np.uint8).tobytes()
    swapped = data[4096:8192] + data[:4096] + data[8192:]
    assert checksum64(swapped) != checksum64(data)


@settings(max_examples=60)
@given(st.binary(min_size=16, max_size=20_000), st.data())
def test_checksum_sees_two_words_swapped(data, draw):
    """Position-sensitive: the v2 sum missed two words swapped within a page."""
    words = len(data) // 8
    i = draw.draw(st.integers(0, words - 1))
    j = draw.draw(st.integers(0, words - 1))
    a, b = data[8 * i: 8 * i + 8], data[8 * j: 8 * j + 8]
    if a == b:
        return
    swapped = bytearray(data)
    swapped[8 * i: 8 * i + 8], swapped[8 * j: 8 * j + 8] = b, a
    assert checksum64(bytes(swapped)) != checksum64(data)


def test_heap_free_bytes_counts_what_malloc_keeps_freed():
    """What a trim could hand back: blocks freed on the heap show in the figure."""
    from arrangedb.pager.process_memory import heap_free_bytes, tune_allocator

    if heap_free_bytes() is None or not tune_allocator():
        pytest.skip("malloc is not glibc's, or is left untuned")
    before = heap_free_bytes()
    blocks = [np.ones(1 << 20) for _ in range(8)]   # 8 MiB each: on the heap once tuned
    del blocks
    assert heap_free_bytes() >= before + (48 << 20)


@pytest.mark.parametrize("over, share, free, trims", [
    (0.6, 0.5, 1.0, True), (0.4, 0.5, 1.0, False), (0.9, 1.0, 1.0, False),
    (1.1, 1.0, 1.0, True),
    (0.6, 0.5, 0.05, False),   # malloc holds little freed: nothing worth a trim
    (0.6, 0.5, None, True),    # malloc does not say: RSS alone decides
    (0.9, 0.75, (1.0, 0.97), False),   # what was freed before the work began stays
    (0.9, 0.75, (1.0, 0.5), True),     # the work itself freed half the budget
])
def test_freed_memory_is_handed_back_only_past_the_share_asked(monkeypatch, over, share,
                                                               free, trims):
    """A trim is faulted back in by the next allocations: a loop that trims as it goes
    (group_by) asks for it only once RSS passes the budget, other callers past half --
    and only when malloc holds a sixteenth of the budget freed, where it tells, beyond
    what it held freed when the caller's work began (given as ``(now, before)``)."""
    import arrangedb.pager.budget as budget_mod

    calls = []
    monkeypatch.setattr(budget_mod, "release_freed_memory", lambda: calls.append(1))
    now, before = free if isinstance(free, tuple) else (free, 0)
    monkeypatch.setattr(budget_mod, "heap_free_bytes",
                        lambda: None if now is None else int((64 << 20) * now))
    b = MemoryBudget("64MiB")
    try:
        monkeypatch.setattr(b, "rss", lambda fast=False: b.baseline_rss + int(b.limit * over))
        assert b.trim_if_high(share=share, free_before=int((64 << 20) * before)) is trims
        assert calls == ([1] if trims else [])
    finally:
        b.close()
