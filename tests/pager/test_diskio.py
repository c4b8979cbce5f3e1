"""The disk seam's composed operations: copies keep a page file's holes and its bytes."""

from __future__ import annotations

import os

import numpy as np
import pytest

from arrangedb.pager import PageFile, PageWriter
from arrangedb.pager.diskio import COPY_CHUNK, DiskIO, data_ranges


def _sparse(path, pieces: dict[int, bytes], size: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for at, data in pieces.items():
            os.pwrite(fd, data, at)
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def _allocated(path) -> int:
    return os.stat(path).st_blocks * 512


@pytest.mark.parametrize("trailing_hole", [False, True])
def test_a_copy_keeps_holes_and_every_byte(tmp_path, trailing_hole):
    rng = np.random.default_rng(1)
    pieces = {0: rng.bytes(5000), 4 << 20: rng.bytes(3 * COPY_CHUNK // 2),
              40 << 20: rng.bytes(70_000)}
    size = (40 << 20) + 70_000 + ((8 << 20) if trailing_hole else 0)
    src, dst = tmp_path / "src", tmp_path / "dst"
    _sparse(src, pieces, size)
    written = DiskIO().copy_file(str(src), str(dst))
    assert os.path.getsize(dst) == size
    assert src.read_bytes() == dst.read_bytes()
    data = sum(e - s for s, e in data_ranges(os.open(src, os.O_RDONLY), size))
    assert written == data
    assert written < size // 2
    # the holes stay holes (blocks round up to the file system's block size)
    assert _allocated(dst) <= _allocated(src) + (64 << 10)


def test_a_copy_refuses_an_existing_target_and_leaves_it(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(b"x" * 100)
    dst.write_bytes(b"mine")
    with pytest.raises(FileExistsError):
        DiskIO().copy_file(str(src), str(dst))
    assert dst.read_bytes() == b"mine"


def test_a_page_files_data_bytes_are_what_a_copy_writes(tmp_path):
    writer = PageWriter(None, path=str(tmp_path / "a.pg"))
    for i, n in enumerate((100, 70_000, 2 << 20, 10)):   # small, page- and MiB-aligned
        writer.add_region(f"r{i}", np.full(n, i, np.uint8))
    pf = writer.finish()
    try:
        assert writer.bytes_written == pf.data_bytes < pf.size
        written = DiskIO().copy_file(pf.path, str(tmp_path / "b.pg"))
        assert pf.data_bytes <= written < pf.data_bytes + (64 << 10)
        copy = PageFile.open(str(tmp_path / "b.pg"))
        assert copy.verify() and bytes(copy.buffer("r2")) == bytes(pf.buffer("r2"))
        copy.close()
    finally:
        pf.close()
