"""Parquet inputs: a file or a directory of files read as a stream of record batches.

Batches are read one at a time, without pyarrow's pre-buffering or read-ahead (which
keep every row group read so far, or many ahead, in Arrow memory out of the budget's
sight), a column chunk a buffer at a time, and sized by the decoded bytes of the columns
read. String columns that a file stores as dictionary codes can be read as codes
(:func:`coded_columns`), for the ``dict`` codec to store as they are.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pyarrow as pa

from arrangedb.codecs.base import binary_offset_dtype

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
    batches; ``columns``: only those decoded; ``coded``: columns of a file read as
    dictionary arrays (:func:`coded_columns`)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"Parquet input {path!r} does not exist")
    if os.path.isdir(path):
        import pyarrow.dataset as ds

        dataset = ds.dataset(path, format="parquet")
        scan = ds.ParquetFragmentScanOptions(pre_buffer=False, use_buffered_stream=True,
                                             buffer_size=PARQUET_READ_BYTES)
        schema = dataset.schema if columns is None else pa.schema(
            [dataset.schema.field(c) for c in columns])
        return schema, iter(dataset.to_batches(
            columns=columns, batch_size=PARQUET_BATCH_ROWS, fragment_scan_options=scan,
            batch_readahead=1, fragment_readahead=1))
    import pyarrow.parquet as pq   # ~10 MiB of code that only file inputs need

    pf = pq.ParquetFile(path, pre_buffer=False, buffer_size=PARQUET_READ_BYTES,
                        read_dictionary=list(coded) or None)
    schema = pf.schema_arrow if columns is None else pa.schema(
        [pf.schema_arrow.field(c) for c in columns])
    return schema, pf.iter_batches(batch_size=_batch_rows(pf, schema.names),
                                   columns=columns)


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


def coded_columns(data, names: list[str]) -> list[str]:
    """The string and binary columns among ``names`` that the Parquet file ``data``
    stores as dictionary codes in every row group: read as dictionary arrays, they reach
    the ``dict`` codec as codes, neither decoded into strings nor hashed again (7.5M
    order priorities decoded in 52 ms instead of 108, stored without 92 ms of hashing).
    A column that fell back to plain pages (many distinct values) is left to decode:
    reading it as a dictionary would hash every value. None for other inputs."""
    if not isinstance(data, (str, os.PathLike)) or not os.path.isfile(data) or not names:
        return []
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(data)
    except (OSError, pa.ArrowException):
        return []   # opening it for its batches says what is wrong
    wanted = [f.name for f in pf.schema_arrow if f.name in names and _is_text(f.type)]
    meta = pf.metadata
    coded = []
    for name in wanted:
        chunks = [meta.row_group(i).column(j) for i in range(meta.num_row_groups)
                  for j in range(meta.num_columns)
                  if meta.row_group(i).column(j).path_in_schema == name]
        if chunks and all(c.has_dictionary_page and c.total_uncompressed_size
                          <= CODED_BYTES_PER_ROW * max(c.num_values, 1) for c in chunks):
            coded.append(name)
    return coded


def _is_text(t: pa.DataType) -> bool:
    """Strings or binaries, or a dictionary of them (a column written from one, as a
    pandas categorical is: pyarrow reads it as codes whatever is asked)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    return binary_offset_dtype(t) is not None
