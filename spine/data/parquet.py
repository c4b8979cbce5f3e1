"""Parquet inputs: a file or a directory of files read as a stream of record batches.

Batches are read one at a time, without pyarrow's pre-buffering or read-ahead (which
keep every row group read so far, or many ahead, in Arrow memory out of the budget's
sight), a column chunk a buffer at a time, and sized by the decoded bytes of the columns
read. String columns that the files store as dictionary codes can be read as codes
(:func:`coded_columns`), for the ``dict`` codec to store as they are. A directory's
Parquet files are read one after another (:func:`parquet_files`).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pyarrow as pa

from arrangedb.codecs.base import binary_offset_dtype
from arrangedb.spine.data.errors import SchemaError

# Rows per batch read from Parquet: 256k rows decode ~30% faster than 64k (per-batch
# costs), and ingest slices any batch too big for a run.
PARQUET_BATCH_ROWS = 1 << 18
PARQUET_BATCH_BYTES = 16 << 20   # a Parquet batch's decoded size, at most about
PARQUET_READ_BYTES = 1 << 20     # a column chunk is read this much at a time
# A column chunk of strings stored as dictionary codes holds at most this many bytes a
# row, its dictionary page included; one that fell back to plain pages holds the strings
CODED_BYTES_PER_ROW = 4


def open_parquet(path: str, columns: list[str] | None = None, coded=()
                 ) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The schema of ``path`` (a file, or a directory of them) and a stream of its
    batches; ``columns``: only those decoded; ``coded``: columns read as dictionary
    arrays (:func:`coded_columns`).

    A directory's files are read one after another, each as a file is (pyarrow's
    dataset scanner, its threads beside the engine's, arranged 7.5M rows in 0.55 s
    where the file took 0.37): its schema is its first file's, and a later file lacking
    a column read raises :class:`SchemaError` naming it."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"Parquet input {path!r} does not exist")
    if not os.path.isdir(path):
        return _open_file(path, columns, coded)
    files = parquet_files(path)
    if not files:
        raise FileNotFoundError(f"Parquet input {path!r} is a directory without Parquet "
                                "files")
    schema, first = _open_file(files[0], columns, coded)
    names = columns if columns is not None else schema.names
    rest = (b for f in files[1:] for b in _open_file(f, names, coded, path)[1])
    return schema, itertools.chain(first, rest)


def _open_file(path: str, columns: list[str] | None, coded, directory: str | None = None
               ) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    import pyarrow.parquet as pq   # ~10 MiB of code that only file inputs need

    pf = pq.ParquetFile(path, pre_buffer=False, buffer_size=PARQUET_READ_BYTES,
                        read_dictionary=list(coded) or None)
    have = pf.schema_arrow
    missing = [c for c in columns or () if have.get_field_index(c) < 0]
    if missing:
        where = "" if directory is None else f" of {directory!r}"
        raise SchemaError(f"Parquet file {path!r}{where} lacks column(s) {missing}"
                          + ("" if directory is None else " that its first file holds"))
    schema = have if columns is None else pa.schema([have.field(c) for c in columns])
    # decoded on the reading thread alone: pyarrow's pool decoding the columns side by
    # side ran four threads on two cores beside the sort (dim_dim's cold query took
    # 0.30-0.31 s against 0.28-0.29, fact_dim's 1.68-1.71 s against 1.59-1.62)
    return schema, pf.iter_batches(batch_size=_batch_rows(pf, schema.names),
                                   columns=columns, use_threads=False)


def _batch_rows(pf, names: list[str]) -> int:
    """Rows per batch so that a batch of ``names`` decodes to about PARQUET_BATCH_BYTES
    (the file's uncompressed column sizes tell a row's width), at most
    PARQUET_BATCH_ROWS."""
    meta = pf.metadata
    wanted = set(names)
    width, rows = 0, 0
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        rows += rg.num_rows
        for j in range(rg.num_columns):
            col = rg.column(j)
            if col.path_in_schema.split(".")[0] in wanted:
                width += col.total_uncompressed_size
    if not rows or not width:
        return PARQUET_BATCH_ROWS
    return int(max(1024, min(PARQUET_BATCH_ROWS, PARQUET_BATCH_BYTES * rows // width)))


def parquet_files(directory: str) -> list[str]:
    """The files under ``directory`` as pyarrow's datasets list them: every file of
    its tree, in order, but those whose names start with ``.`` or ``_`` (a writer's
    ``_SUCCESS`` and checksums)."""
    import pyarrow.dataset as ds

    return ds.dataset(directory, format="parquet").files


def footers(path: str) -> list:
    """The footer (``FileMetaData``) of each Parquet file of ``path``."""
    import pyarrow.parquet as pq

    files = parquet_files(path) if os.path.isdir(path) else [path]
    return [pq.read_metadata(f) for f in files]


def parquet_rows(path: str) -> int:
    """The rows of a Parquet file or directory, from the footers."""
    return sum(m.num_rows for m in footers(path))


def coded_columns(data, names: list[str]) -> list[str]:
    """The string and binary columns among ``names`` that the Parquet file or directory
    ``data`` stores as dictionary codes in every row group of every file: read as
    dictionary arrays, they reach the ``dict`` codec as codes, neither decoded into
    strings nor hashed again (7.5M order priorities decoded in 52 ms instead of 108,
    stored without 92 ms of hashing). A column that fell back to plain pages (many
    distinct values) is left to decode: reading it as a dictionary would hash every
    value. None for other inputs."""
    if not isinstance(data, (str, os.PathLike)) or not os.path.exists(data) or not names:
        return []
    try:
        metas = footers(os.fspath(data))
    except (OSError, pa.ArrowException):
        return []   # opening it for its batches says what is wrong
    if not metas:
        return []
    schema = metas[0].schema.to_arrow_schema()
    wanted = [f.name for f in schema if f.name in names and _is_text(f.type)]
    return [name for name in wanted if all(_stored_coded(m, name) for m in metas)]


def _stored_coded(meta, name: str) -> bool:
    """Whether a file (its footer ``meta``) holds column ``name`` and stores it as
    dictionary codes in every row group."""
    chunks = [meta.row_group(i).column(j) for i in range(meta.num_row_groups)
              for j in range(meta.num_columns)
              if meta.row_group(i).column(j).path_in_schema == name]
    return name in meta.schema.names and all(
        c.has_dictionary_page
        and c.total_uncompressed_size <= CODED_BYTES_PER_ROW * max(c.num_values, 1)
        for c in chunks)


def _is_text(t: pa.DataType) -> bool:
    """Strings or binaries, or a dictionary of them (a column written from one, as a
    pandas categorical is: pyarrow reads it as codes whatever is asked)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    return binary_offset_dtype(t) is not None
