"""Units of the manifest format: what ``encode_manifest`` writes reads back checked, every
damaged byte is named, versions list in order, and a manifest naming another version
than its file's is refused."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrangedb.pager import ManifestError
from arrangedb.spine.persist.manifest import (FORMAT, FORMAT_VERSION, encode_manifest,
                                              list_versions, manifest_name, read_manifest)


def _manifest(version: int, **extra) -> dict:
    return {"format": FORMAT, "version": FORMAT_VERSION, "checkpoint": version,
            "since": 0, "batches": [], **extra}


def _write(path, version: int, manifest: dict) -> str:
    p = os.path.join(path, manifest_name(version))
    with open(p, "wb") as f:
        f.write(encode_manifest(manifest)[0])
    return p


def test_a_manifest_reads_back_and_versions_list_in_order(tmp_path):
    for v in (3, 1, 12):
        _write(tmp_path, v, _manifest(v, note=f"v{v}"))
    assert list_versions(str(tmp_path)) == [1, 3, 12]
    assert read_manifest(tmp_path)["note"] == "v12"               # the newest
    assert read_manifest(tmp_path, 3)["note"] == "v3"
    with pytest.raises(FileNotFoundError, match="no version 7"):
        read_manifest(tmp_path, 7)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_any_damaged_byte_is_named(tmp_path_factory, data):
    d = tmp_path_factory.mktemp("m")
    p = _write(d, 1, _manifest(1, note="some text to damage"))
    raw = bytearray(open(p, "rb").read())
    i = data.draw(st.integers(0, len(raw) - 1))
    flip = data.draw(st.integers(1, 255))
    raw[i] ^= flip
    with open(p, "wb") as f:
        f.write(raw)
    try:
        m = read_manifest(d, 1)
    except ManifestError as e:
        assert manifest_name(1) in str(e)
    else:   # a flip that still parses and checks out would be a checksum collision
        pytest.fail(f"damaged byte {i} was not detected: {m}")


def test_a_manifest_under_another_versions_name_is_refused(tmp_path):
    p = _write(tmp_path, 2, _manifest(2))
    os.rename(p, os.path.join(tmp_path, manifest_name(5)))
    with pytest.raises(ManifestError, match="names version 2, not 5"):
        read_manifest(tmp_path, 5)
