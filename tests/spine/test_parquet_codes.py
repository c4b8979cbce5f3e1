"""String columns that come as dictionary codes -- a Parquet file's dictionary pages, a
table's dictionary arrays -- stored from their codes by the ``dict`` codec, read back as
the strings they are."""

from __future__ import annotations

from collections import Counter

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings

from arrangedb import Engine
from arrangedb.spine.data.parquet import coded_columns
from conftest import snapshot_rows, table_rows

WORDS = st.sampled_from(["", "a", "bb", "AUTOMOBILE", "é", None])


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
        assert snapshot_rows(t, ["k", "s", "b"]) == table_rows(table, ["k", "s", "b"])


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
        assert snapshot_rows(t, ["k", "seg", "v"]) == table_rows(table, ["k", "seg", "v"])
        t.merge_all()
        assert snapshot_rows(t, ["k", "seg", "v"]) == table_rows(table, ["k", "seg", "v"])
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
        assert snapshot_rows(t, ["k", "name"]) == table_rows(table, ["k", "name"])


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
        assert snapshot_rows(t, ["k", "s"]) == table_rows(pa.concat_tables([base, delta]),
                                                      ["k", "s"])


def test_a_large_string_column_keeps_its_type(tmp_path):
    table = pa.table({"k": np.arange(1000) % 7,
                      "s": pa.array(["p", "q"] * 500, pa.large_string())})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    with Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        t = e.arrange(str(path), key=["k"], vals=["s"])
        assert t.snapshot().read_all().schema.field("s").type == pa.large_string()
        assert snapshot_rows(t, ["k", "s"]) == table_rows(table, ["k", "s"])


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
    assert got == table_rows(table, ["k", "s"])


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
        assert snapshot_rows(t, ["k", "s"]) == table_rows(plain, ["k", "s"])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.lists(WORDS.filter(lambda w: w is not None), min_size=1,
                                   max_size=6),
                          st.lists(st.tuples(st.integers(0, 200), st.integers(0, 7)),
                                   min_size=1, max_size=200)),
                min_size=1, max_size=4))
def test_dictionary_arrays_of_a_table_are_stored_from_their_codes(tmp_path_factory, chunks):
    """Chunks with dictionaries of their own, values repeated in a dictionary, unused
    values and null codes: arranged from the codes (no decode, no hashing), the trace
    holds the table's rows as strings, and a join grouped by the column counts them as
    the strings' own arrangement does."""
    import arrangedb.spine.storage.encode as encode
    from arrangedb import group_by, join

    batches = []
    for words, rows in chunks:
        codes = pa.array([c if c < len(words) else None for _, c in rows], pa.int32())
        batches.append(pa.record_batch(
            [pa.array([k for k, _ in rows], pa.int64()),
             pa.DictionaryArray.from_arrays(codes, pa.array(words))], names=["k", "s"]))
    table = pa.Table.from_batches(batches)
    plain = table.set_column(1, "s", table["s"].cast(pa.string()))
    with Engine(spill_dir=tmp_path_factory.mktemp("spill"), memory_budget="64MiB") as e:
        t = e.arrange(table, key=["k"], vals=["s"])
        assert t.snapshot().read_all().schema.field("s").type == pa.string()
        assert snapshot_rows(t, ["k", "s"]) == table_rows(plain, ["k", "s"])
        dim = e.arrange(pa.table({"k": np.arange(201), "w": np.arange(201)}), key=["k"],
                        vals=["w"])
        strings = e.arrange(plain, key=["k"], vals=["s"])

        def counts(trace):
            got = group_by(join(dim, trace), by="s", aggs={"n": ("count", None)}).read_all()
            return Counter(dict(zip(got["s"].to_pylist(), got["n"].to_pylist())))

        assert counts(t) == counts(strings) == Counter(plain["s"].to_pylist())


def test_a_categorical_column_of_a_table_is_encoded_from_its_codes(monkeypatch, tmp_path):
    """Neither decoded into strings nor hashed again: its codes reach the codec. A value
    its dictionary holds twice is one value (one row per key, one group)."""
    import arrangedb.spine.storage.encode as encode
    from arrangedb import group_by, join

    n = 20_000
    rng = np.random.default_rng(3)
    codes = pa.array(np.where(rng.random(n) < 0.1, None, rng.integers(0, 5, n)), pa.int32())
    seg = pa.DictionaryArray.from_arrays(codes, pa.array(["A", "B", "A", "C", "D"]))
    table = pa.Table.from_batches(pa.table({"k": rng.integers(0, 3_000, n), "seg": seg})
                                  .to_batches(max_chunksize=4_000))
    plain = table.set_column(1, "seg", table["seg"].cast(pa.string()))
    calls = []
    real = encode.encode_codes
    monkeypatch.setattr(encode, "encode_codes", lambda v: calls.append(len(v)) or real(v))
    with Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        t = e.arrange(table, key=["k"], vals=["seg"])
        assert sum(calls) == t.stats()["updates"]   # every stored row from its code
        assert snapshot_rows(t, ["k", "seg"]) == table_rows(plain, ["k", "seg"])
        dim = e.arrange(pa.table({"k": np.arange(3_000)}), key=["k"])
        got = group_by(join(dim, t), by="seg", aggs={"n": ("count", None)}).read_all()
        assert dict(zip(got["seg"].to_pylist(), got["n"].to_pylist())) == Counter(
            plain["seg"].to_pylist())


def test_a_table_of_many_categories_is_stored_from_its_strings(monkeypatch, tmp_path):
    """A dictionary with more values than an eighth of its chunk's rows is decoded: each
    chunk would carry a copy of it through the sort and into its parts."""
    import arrangedb.spine.storage.encode as encode
    from arrangedb.spine.data.ingest import coded_table_columns

    n = 4_000
    seg = pa.DictionaryArray.from_arrays(pa.array(np.arange(n) % 1_000, pa.int32()),
                                         pa.array([f"c{i}" for i in range(1_000)]))
    table = pa.table({"k": np.arange(n) % 97, "seg": seg})
    assert coded_table_columns(table, ["seg"]) == []
    calls = []
    real = encode.encode_codes
    monkeypatch.setattr(encode, "encode_codes", lambda v: calls.append(len(v)) or real(v))
    with Engine(spill_dir=tmp_path / "spill", memory_budget="64MiB") as e:
        t = e.arrange(table, key=["k"], vals=["seg"])
        assert not calls
        plain = table.set_column(1, "seg", table["seg"].cast(pa.string()))
        assert snapshot_rows(t, ["k", "seg"]) == table_rows(plain, ["k", "seg"])
