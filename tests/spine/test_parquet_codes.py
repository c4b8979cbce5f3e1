"""Parquet string columns stored as dictionary codes: read as codes, stored from them by
the ``dict`` codec, read back as the strings they are."""

from __future__ import annotations

from collections import Counter

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings

from arrangedb import Engine
from arrangedb.spine.data.parquet import coded_columns

WORDS = st.sampled_from(["", "a", "bb", "AUTOMOBILE", "é", None])


def _rows(table: pa.Table, names: list[str]) -> Counter:
    cols = [table.column(n).to_pylist() for n in names]
    return Counter(zip(*cols))


def _snapshot_rows(trace, names: list[str]) -> Counter:
    snap = trace.snapshot().read_all()
    out: Counter = Counter()
    for row, count in zip(zip(*(snap.column(n).to_pylist() for n in names)),
                          snap.column("count").to_pylist()):
        out[row] += count
    return out


def _val_codecs(trace, column: str) -> set:
    return {g["codec"] for b in trace.batches() for p in b.parts
            for g in getattr(p, "columns", {}).get("vals", [])
            if g["regions"][0].rsplit("/", 1)[-1].startswith(column + ".")}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 30), WORDS, WORDS), min_size=1, max_size=400),
       st.integers(1, 120))
def test_coded_columns_arrange_to_the_rows_of_the_file(tmp_path_factory, rows, group_rows):
    """Row groups with dictionaries of their own, nulls, empty strings and repeated rows:
    the trace holds the file's rows, its string columns as strings."""
    path = tmp_path_factory.mktemp("codes") / "t.parquet"
    table = pa.table({"k": pa.array([r[0] for r in rows], pa.int64()),
                      "s": pa.array([r[1] for r in rows], pa.string()),
                      "b": pa.array([None if r[2] is None else r[2].encode() for r in rows],
                                    pa.binary())})
    pq.write_table(table, path, row_group_size=group_rows)
    with Engine(spill_dir=tmp_path_factory.mktemp("spill"), memory_budget="64MiB") as e:
        t = e.arrange(str(path), key=["k"], vals=["s", "b"])
        snap = t.snapshot().read_all()
        assert snap.schema.field("s").type == pa.string()
        assert snap.schema.field("b").type == pa.binary()
        assert _snapshot_rows(t, ["k", "s", "b"]) == _rows(table, ["k", "s", "b"])


def test_a_large_file_stores_its_coded_column_from_the_codes(tmp_path):
    """Runs sorted and merged under a small budget: the column is stored by ``dict`` and
    reads back as the file's strings, in lookups too."""
    n = 300_000
    rng = np.random.default_rng(5)
    segments = np.array(["AUTOMOBILE", "BUILDING", "FURNITURE", "HOUSEHOLD", "MACHINERY"])
    table = pa.table({"k": rng.integers(0, 50_000, n),
                      "seg": pa.array(segments[rng.integers(0, 5, n)]),
                      "v": rng.integers(0, 1000, n)})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=40_000)
    assert coded_columns(str(path), ["seg", "v"]) == ["seg"]
    with Engine(spill_dir=tmp_path / "spill", memory_budget="16MiB") as e:
        t = e.arrange(str(path), key=["k"], vals=["seg", "v"])
        assert t.stats()["batches"] > 1   # several runs, read as they are or merged
        assert _val_codecs(t, "seg") == {"dict"}
        assert _snapshot_rows(t, ["k", "seg", "v"]) == _rows(table, ["k", "seg", "v"])
        t.merge_all()
        assert _snapshot_rows(t, ["k", "seg", "v"]) == _rows(table, ["k", "seg", "v"])
        as_table = e.arrange(table, key=["k"], vals=["seg", "v"])
        as_table.merge_all()
        # parts are cut by the strings the codes stand for, as from the strings themselves
        assert t.stats()["payload_bytes"] == as_table.stats()["payload_bytes"]
        assert abs(t.stats()["parts"] - as_table.stats()["parts"]) <= 1
        got = t.lookup(pa.table({"k": [7, 7, 123]}))
        assert got.schema.field("seg").type == pa.string()
        want = table.filter(pa.compute.is_in(table["k"], pa.array([7, 123])))
        assert sorted(zip(got["k"].to_pylist(), got["seg"].to_pylist())) == sorted(
            (k, s) for k, s in zip(want["k"].to_pylist(), want["seg"].to_pylist())
            for _ in range(1 + (k == 7)))


def test_a_column_of_many_distinct_strings_is_read_as_strings(tmp_path):
    """A column whose pages fell back to plain values is not read as codes: that would
    hash every string."""
    n = 50_000
    table = pa.table({"k": np.arange(n), "name": pa.array([f"name-{i}" for i in range(n)])})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    assert coded_columns(str(path), ["name"]) == []
    with Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        t = e.arrange(str(path), key=["k"], vals=["name"])
        assert _snapshot_rows(t, ["k", "name"]) == _rows(table, ["k", "name"])


def test_inserting_a_file_of_coded_strings_keeps_them_strings(tmp_path):
    """An insert's run may stay in memory (resident): it holds the strings, not codes."""
    base = pa.table({"k": [1, 2, 3], "s": ["x", "y", "x"]})
    n = 3000
    delta = pa.table({"k": np.arange(n) % 100, "s": pa.array(["x", "y", None] * (n // 3))})
    path = tmp_path / "delta.parquet"
    pq.write_table(delta, path)
    assert coded_columns(str(path), ["s"]) == ["s"]
    with Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        t = e.arrange(base, key=["k"], vals=["s"])
        t.insert(str(path))
        assert t.snapshot().read_all().schema.field("s").type == pa.string()
        got = t.lookup(pa.table({"k": [2, 4, 5]}))
        assert got.schema.field("s").type == pa.string()
        assert _snapshot_rows(t, ["k", "s"]) == _rows(pa.concat_tables([base, delta]),
                                                      ["k", "s"])


def test_a_large_string_column_keeps_its_type(tmp_path):
    table = pa.table({"k": np.arange(1000) % 7,
                      "s": pa.array(["p", "q"] * 500, pa.large_string())})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    with Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        t = e.arrange(str(path), key=["k"], vals=["s"])
        assert t.snapshot().read_all().schema.field("s").type == pa.large_string()
        assert _snapshot_rows(t, ["k", "s"]) == _rows(table, ["k", "s"])


def test_parts_kept_in_memory_hold_the_strings(tmp_path):
    """Without a spill directory a build keeps its parts in memory, read as they are:
    they hold the strings the codes stand for."""
    from arrangedb.spine.build.runs import RunBuilder
    from arrangedb.spine.data.ingest import Columns
    from arrangedb.spine.data.layout import from_layout
    from arrangedb.spine.storage.context import StorageContext

    n = 3000
    table = pa.table({"k": np.arange(n) % 50, "s": pa.array(["x", "y", None] * (n // 3))})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    assert coded_columns(str(path), ["s"]) == ["s"]
    builder = RunBuilder(StorageContext(), pa.schema([("k", pa.int64())]),
                         pa.schema([("s", pa.string())]), Columns(["k"], ["s"], None, None))
    got: Counter = Counter()
    for batch in builder.build(str(path), None, None):
        for part in batch.parts:
            upd = from_layout(part.data)
            assert upd.vals.schema.field("s").type == pa.string()
            for k, s, d in zip(upd.keys["k"].to_pylist(), upd.vals["s"].to_pylist(),
                               upd.diffs.tolist()):
                got[(k, s)] += d
    assert got == _rows(table, ["k", "s"])


def test_a_column_written_as_a_dictionary_is_stored_from_its_codes(tmp_path):
    """A column written from a dictionary array (a pandas categorical) comes back as
    codes whatever is asked; it is taken as such, and read back as strings."""
    n = 3000
    table = pa.table({"k": np.arange(n) % 40,
                      "s": pa.array(["x", "y", None] * (n // 3)).dictionary_encode()})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    assert coded_columns(str(path), ["s"]) == ["s"]
    with Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        t = e.arrange(str(path), key=["k"], vals=["s"])
        assert t.snapshot().read_all().schema.field("s").type == pa.string()
        plain = table.set_column(1, "s", table["s"].cast(pa.string()))
        assert _snapshot_rows(t, ["k", "s"]) == _rows(plain, ["k", "s"])
