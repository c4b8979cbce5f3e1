"""An arranged dataset's manifest: damage is detected and named, and a damaged manifest
never leads a writer to remove committed data. (No Spark needed: the manifest is files.)"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest

from arrangedb.pager import ManifestError
from arrangedb.spark_integration import dataset


def _committed(root) -> dict:
    """A dataset manifest of two commits, the directories they name made."""
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    m = dataset.new_manifest(["k"], ["v"], 2, schema, False)
    m = dict(m, version=2, commits=[
        {"lower": 0, "upper": 1, "times": [0], "batch_id": None, "version": 1, "updates": 10,
         "parts": {"0": "part-00000/c000001-a3", "1": "part-00001/c000001-a4"}},
        {"lower": 1, "upper": 2, "times": [1], "batch_id": None, "version": 2, "updates": 5,
         "parts": {"0": "part-00000/c000002-a7"}}])
    for c in m["commits"]:
        for d in c["parts"].values():
            os.makedirs(os.path.join(root, d))
    dataset.write_manifest(str(root), m)
    return m


def test_every_single_bit_flip_of_a_manifest_is_named_as_damage(tmp_path):
    m = _committed(tmp_path)
    path = tmp_path / dataset.MANIFEST
    raw = path.read_bytes()
    assert dataset.read_manifest(str(tmp_path))["commits"] == m["commits"]
    accepted = []
    for i in range(len(raw)):
        for bit in range(8):
            bad = bytearray(raw)
            bad[i] ^= 1 << bit
            path.write_bytes(bytes(bad))
            try:
                dataset.read_manifest(str(tmp_path))
            except ManifestError:
                continue
            accepted.append((i, bit))
    assert not accepted, f"damaged manifests read as valid: {accepted[:5]}"


def test_a_writer_refuses_a_damaged_manifest_and_removes_nothing(tmp_path):
    """A damaged key name (``"commits"`` read as another format) once made the writer take
    the dataset for version 1 and remove commit 2's directories."""
    _committed(tmp_path)
    path = tmp_path / dataset.MANIFEST
    raw = path.read_bytes()
    at = raw.index(b'"commits"') + 5
    path.write_bytes(raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1:])
    with pytest.raises(ManifestError, match="damaged"):
        with dataset.writer(str(tmp_path)):
            pass
    assert sorted(os.listdir(tmp_path / "part-00000")) == ["c000001-a3", "c000002-a7"]


def test_a_manifest_of_the_first_format_reads_as_one_base_commit(tmp_path):
    """Manifests written before datasets had times (no format, no checksum) still load."""
    (tmp_path / dataset.MANIFEST).write_text(json.dumps(
        {"key": ["k"], "vals": ["v"], "num_partitions": 2, "updates": 7,
         "schema": pa.schema([("k", pa.int64())]).serialize().to_pybytes().hex()}))
    m = dataset.read_manifest(str(tmp_path))
    assert m["version"] == 1 and m["commits"][0]["parts"] == {"0": "part-00000",
                                                              "1": "part-00001"}
    (tmp_path / dataset.MANIFEST).write_text(json.dumps({"key": ["k"], "commits": []}))
    with pytest.raises(ManifestError, match="no checksum"):
        dataset.read_manifest(str(tmp_path))


def test_a_writer_removes_what_a_crashed_committer_left_and_nothing_committed(tmp_path):
    m = _committed(tmp_path)
    left = tmp_path / f"{dataset.MANIFEST}.tmp-4242"
    left.write_text("{")                                   # never renamed in
    os.makedirs(tmp_path / "part-00001" / "c000003-a9")    # an attempt of commit 3
    with dataset.writer(str(tmp_path)) as got:
        assert got["commits"] == m["commits"]
    assert not left.exists()
    assert sorted(os.listdir(tmp_path / "part-00001")) == ["c000001-a4"]
    assert sorted(os.listdir(tmp_path / "part-00000")) == ["c000001-a3", "c000002-a7"]


def test_a_compaction_keeps_what_a_reader_holds_until_a_later_writer_finds_it_free(tmp_path):
    """A compacted commit replaces the dataset's directories; those a reader still holds
    (a lease: engine.load's on the files it maps) are removed by a later writer, once
    the reader is gone."""
    from arrangedb.pager.leases import Lease

    m = _committed(tmp_path)
    held = Lease(str(tmp_path / "part-00000" / "c000001-a3"), ["batch-x.page"])
    os.makedirs(tmp_path / "part-00000" / "c000003-a1")
    os.makedirs(tmp_path / "part-00001" / "c000003-a2")
    report = [{"partition": 0, "dir": "part-00000/c000003-a1", "updates": 12},
              {"partition": 1, "dir": "part-00001/c000003-a2", "updates": 3}]
    m = dataset.commit(str(tmp_path), m, report, [0, 1], replace=True)
    assert sorted(os.listdir(tmp_path / "part-00000")) == ["c000001-a3", "c000003-a1"]
    assert sorted(os.listdir(tmp_path / "part-00001")) == ["c000003-a2"]
    with dataset.writer(str(tmp_path)):   # the reader still reads: kept
        pass
    assert (tmp_path / "part-00000" / "c000001-a3").exists()
    held.release()
    with dataset.writer(str(tmp_path)) as got:
        assert got["version"] == 3
    assert sorted(os.listdir(tmp_path / "part-00000")) == ["c000003-a1"]
