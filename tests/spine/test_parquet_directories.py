"""A directory of Parquet files (what Spark and pyarrow's datasets write) as an input:
read file after file as one file is, its coded string columns kept as codes, its size
known from the footers."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arrangedb import Engine, SchemaError, group_by, join
from arrangedb.spine.data.ingest import known_rows
from arrangedb.spine.data.parquet import coded_columns
from conftest import snapshot_rows, table_rows

SEGMENTS = np.array(["AUTOMOBILE", "BUILDING", "FURNITURE", "HOUSEHOLD", "MACHINERY"])


def _write_dataset(root, tables: list[pa.Table]) -> None:
    """Files as a Spark job leaves them: parts, a nested one, a marker and a checksum."""
    (root / "nested").mkdir(parents=True)
    for i, t in enumerate(tables):
        where = root / "nested" if i == len(tables) - 1 else root
        pq.write_table(t, where / f"part-{i:05d}.parquet", row_group_size=7_000)
    (root / "_SUCCESS").write_bytes(b"")
    (root / ".part-00000.parquet.crc").write_bytes(b"not parquet")


def _tables(rng, sizes: list[int]) -> list[pa.Table]:
    return [pa.table({"k": rng.integers(0, 2_000, n),
                      "seg": pa.array(np.where(rng.random(n) < 0.05, None,
                                               SEGMENTS[rng.integers(0, 5, n)])),
                      "v": rng.integers(0, 100, n)}) for n in sizes]


def test_a_directory_arranges_to_the_rows_of_its_files(tmp_path):
    rng = np.random.default_rng(11)
    tables = _tables(rng, [20_000, 9_000, 15_000])
    _write_dataset(tmp_path / "d", tables)
    whole = pa.concat_tables(tables)
    assert known_rows(str(tmp_path / "d")) == whole.num_rows
    assert coded_columns(str(tmp_path / "d"), ["seg", "v"]) == ["seg"]
    with Engine(spill_dir=tmp_path / "spill", memory_budget="16MiB") as e:
        t = e.arrange(str(tmp_path / "d"), key=["k"], vals=["seg", "v"])
        assert t.snapshot().read_all().schema.field("seg").type == pa.string()
        assert snapshot_rows(t, ["k", "seg", "v"]) == table_rows(whole, ["k", "seg", "v"])
        dim = e.arrange(pa.table({"k": np.arange(2_000), "w": np.arange(2_000) % 3}),
                        key=["k"], vals=["w"])
        got = group_by(join(dim, t), by="seg", aggs={"n": ("count", None)}).read_all()
        want = Counter(whole.column("seg").to_pylist())
        assert dict(zip(got["seg"].to_pylist(), got["n"].to_pylist())) == want


def test_a_column_one_file_stores_plain_is_read_as_strings(tmp_path):
    """Every file must store a column as codes for it to be read so."""
    rng = np.random.default_rng(12)
    tables = _tables(rng, [5_000, 5_000])
    n = 5_000
    tables.append(pa.table({"k": np.arange(n), "seg": pa.array([f"s{i}" for i in range(n)]),
                            "v": np.zeros(n, np.int64)}))
    _write_dataset(tmp_path / "d", tables)
    assert coded_columns(str(tmp_path / "d"), ["seg"]) == []
    with Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        t = e.arrange(str(tmp_path / "d"), key=["k"], vals=["seg"])
        assert snapshot_rows(t, ["k", "seg"]) == table_rows(pa.concat_tables(tables),
                                                        ["k", "seg"])


def test_a_file_lacking_a_column_is_named_and_nothing_is_kept(tmp_path):
    rng = np.random.default_rng(13)
    good = _tables(rng, [3_000])[0]
    (tmp_path / "d").mkdir()
    pq.write_table(good, tmp_path / "d" / "a.parquet")
    pq.write_table(good.drop_columns(["seg"]), tmp_path / "d" / "b.parquet")
    with Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        t = e.arrange(good, key=["k"], vals=["seg", "v"])
        with pytest.raises(SchemaError, match=r"b\.parquet.*\['seg'\]"):
            t.insert(str(tmp_path / "d"))
        assert snapshot_rows(t, ["k", "seg", "v"]) == table_rows(good, ["k", "seg", "v"])


def test_a_directory_without_parquet_files_is_refused(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "_SUCCESS").write_bytes(b"")
    with Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        with pytest.raises(FileNotFoundError, match="without Parquet files"):
            e.arrange(str(tmp_path / "d"), key=["k"])
