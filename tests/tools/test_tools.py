"""Tests of the `arrangedb` command: inspect (good, corrupt and foreign page files) and
the spill demo, run as a user would, through the installed console script."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import io
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from arrangedb.codecs import encode
from arrangedb.pager import PageFile, PageWriter
from arrangedb.tools.cli import main
from arrangedb.tools.inspection import format_inspect, inspect_dir

ARRANGEDB = os.path.join(os.path.dirname(sys.executable), "arrangedb")


def _arrangedb(*args, timeout=120):
    return subprocess.run([ARRANGEDB, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def _write(path, columns: dict) -> None:
    """A page file laid out like the spine's: one region per codec buffer, by column."""
    w = PageWriter(None, path=str(path))
    for column, values in columns.items():
        enc = encode(values, "auto")
        for i, buf in enumerate(enc.buffers or [b""]):
            meta = {"column": column, "buffer": i}
            if i == 0:
                meta["codec_meta"] = enc.meta
            w.add_region(f"{column}.{i}", buf, codec=enc.codec, codec_version=enc.version,
                         meta=meta)
    w.finish().close()


@pytest.fixture
def page_dir(tmp_path):
    d = tmp_path / "spill"
    (d / "sub").mkdir(parents=True)
    columns = {"p0/keys/k": np.cumsum(np.random.default_rng(1).integers(1, 9, 20_000)),
               "p0/keys/ids": np.arange(0, 60_000, 3, dtype=np.int64),   # stride: no bytes
               "p0/vals/v": np.random.default_rng(0).random(5_000)}
    _write(d / "good.pg", columns)
    _write(d / "sub" / "corrupt.pg", columns)
    victim = PageFile.open(d / "sub" / "corrupt.pg")
    info = victim.regions["p0/vals/v.0"]
    victim.close()
    with open(d / "sub" / "corrupt.pg", "r+b") as f:
        f.seek(info.offset + 100)
        byte = f.read(1)
        f.seek(info.offset + 100)
        f.write(bytes([byte[0] ^ 0x01]))
    (d / "notes.pg").write_text("these are notes, not a page file\n" * 5)
    (d / "ignored.txt").write_text("x")
    return d


def test_inspect_rows(page_dir):
    rows = {r["name"]: r for r in inspect_dir(page_dir)}
    assert sorted(rows) == ["good.pg", "notes.pg", os.path.join("sub", "corrupt.pg")]
    good, bad, foreign = rows["good.pg"], rows[os.path.join("sub", "corrupt.pg")], rows["notes.pg"]
    assert good["ok"] and good["error"] is None and good["size"] == os.path.getsize(good["path"])
    assert {r["checksum"] for r in good["regions"]} == {"ok"}
    assert all(r["offset"] % 64 == 0 for r in good["regions"])
    keys = next(r for r in good["regions"] if r["name"] == "p0/keys/k.0")
    assert keys["column"] == "p0/keys/k" and keys["codec"] != "plain"
    assert keys["raw_bytes"] == 20_000 * 8 and keys["ratio"] > 1
    ids = next(r for r in good["regions"] if r["column"] == "p0/keys/ids")
    assert (ids["codec"], ids["length"], ids["ratio"]) == ("for", 0, float("inf"))
    assert not bad["ok"] and bad["error"] is None
    assert [r["name"] for r in bad["regions"] if r["checksum"] == "BAD"] == ["p0/vals/v.0"]
    assert not foreign["ok"] and "not an arrangedb page file" in foreign["error"]
    assert foreign["path"] in foreign["error"]


def test_arrangedb_inspect_names_both_files_and_marks_the_corrupt_one(page_dir):
    out = _arrangedb("inspect", page_dir)
    assert out.returncode == 1, out.stderr
    text = out.stdout
    assert "Traceback" not in text + out.stderr
    lines = text.splitlines()
    good = next(line for line in lines if line.startswith("good.pg"))
    corrupt = next(line for line in lines if line.startswith(os.path.join("sub", "corrupt.pg")))
    foreign = next(line for line in lines if line.startswith("notes.pg"))
    assert good.endswith("ok") and "CORRUPT" not in good
    assert "CORRUPT (1 of" in corrupt
    assert "ERROR" in foreign and "not an arrangedb page file" in foreign
    bad_region = [line for line in lines if "p0/vals/v.0" in line and " BAD " in line + " "]
    assert len(bad_region) == 1
    assert "p0/keys/k" in text and "x" in text.split("p0/keys/k.0")[1].splitlines()[0]
    assert "3 page files" in lines[0] and "2 unreadable or corrupt" in lines[0]


def test_arrangedb_inspect_of_an_intact_directory_succeeds(tmp_path):
    _write(tmp_path / "a.pg", {"c": np.arange(100)})
    out = _arrangedb("inspect", tmp_path)
    assert out.returncode == 0 and "all checksums ok" in out.stdout


def test_arrangedb_inspect_shows_a_checkpoints_versions(tmp_path):
    import pyarrow as pa

    import arrangedb

    with arrangedb.Engine(spill_dir=tmp_path) as engine:
        t = engine.arrange(pa.table({"k": np.arange(1000), "v": np.arange(1000) % 7}), key=["k"])
        t.checkpoint(tmp_path / "ck")
        t.insert(pa.table({"k": [5], "v": [3]}))
        t.checkpoint()
    out = _arrangedb("inspect", tmp_path / "ck")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "2 versions"
    assert lines[1].split()[:2] == ["version", "1"] and "1,000 updates" in lines[1]
    assert lines[2].split()[:2] == ["version", "2"] and "1,001 updates" in lines[2]
    assert "2 page files" in out.stdout and "all checksums ok" in out.stdout
    manifest = sorted((tmp_path / "ck").glob("manifest-*.json"))[-1]
    manifest.write_text(manifest.read_text().replace('"since":0', '"since":1'))
    out = _arrangedb("inspect", tmp_path / "ck")
    assert out.returncode == 1 and "version 2  ERROR" in out.stdout and "checksum" in out.stdout


def test_arrangedb_inspect_of_a_missing_directory_is_a_clear_error(tmp_path):
    out = _arrangedb("inspect", tmp_path / "nope")
    assert out.returncode == 2
    assert "no such spill directory" in out.stderr and "Traceback" not in out.stderr


def test_format_inspect_aligns_columns(page_dir):
    text = format_inspect(inspect_dir(page_dir))
    header_lines = [line for line in text.splitlines() if line.strip().startswith("region")]
    assert len(set(header_lines)) == 1   # one width for every file's table
    assert format_inspect([]) == "no page files found"


def test_arrangedb_spill_demo_at_a_tiny_size(tmp_path):
    out = _arrangedb("spill-demo", "--budget", "8MiB", "--factor", "2", "--spill-dir", tmp_path)
    assert out.returncode == 0, out.stderr
    err = out.stderr
    assert "16.0 MiB (2x a 8.0 MiB budget)" in err
    assert "scanned 16.0 MiB" in err and "MB/s" in err
    assert "within" in err and "100%" in err
    assert os.listdir(tmp_path) == []   # the spill directory went with the demo


def test_spill_demo_run_returns_the_figures(tmp_path):
    from arrangedb.tools.spill_demo import run

    log = io.StringIO()
    result = run(budget="8MiB", factor=1, spill_dir=tmp_path, out=log)
    assert result["bytes_scanned"] == result["bytes_generated"] == 8 << 20
    assert result["bytes_spilled"] >= 8 << 20 and result["page_files"] == 1
    assert result["write_MBps"] > 0 and result["scan_MBps"] > 0 and result["within_budget"]
    assert "\r" not in log.getvalue()   # no in-place redraws off a terminal


def test_cli_refuses_bad_arguments(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["spill-demo", "--budget", "lots"])
    assert exc.value.code == 2 and "not a size: 'lots'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["inspect", "a", "--bogus"])


def test_demo_passes_its_arguments_through(monkeypatch):
    seen = []
    fake = types.ModuleType("arrangedb.tools.demo")
    fake.__spec__ = importlib.machinery.ModuleSpec("arrangedb.tools.demo", None)
    fake.main = lambda argv: seen.append(argv) or 0
    monkeypatch.setitem(sys.modules, "arrangedb.tools.demo", fake)
    assert main(["demo", "--rows", "10", "--whatever"]) == 0
    assert seen == [["--rows", "10", "--whatever"]]


def test_demo_falls_back_to_the_spill_demo_without_a_demo_module(tmp_path, capsys,
                                                                monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None
                        if name == "arrangedb.tools.demo" else find_spec(name, *a))
    assert main(["demo", "--budget", "8MiB", "--factor", "1", "--spill-dir", str(tmp_path)]) == 0
    assert "spill demo" in capsys.readouterr().err
