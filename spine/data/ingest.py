"""Ingest: user data in (tables, readers, iterables of batches, Parquet), updates out.

Design
------
Everything a user can hand to ``arrange`` or ``insert`` becomes one stream of Arrow
record batches, checked against the arrangement's schema *before* anything is stored:
column names, key types, time/diff types, nulls in keys, negative times. Each checked
batch becomes :class:`Updates` (times u64, diffs i64).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrangedb.codecs.base import binary_offset_dtype
from arrangedb.codecs.choose import dict_fits
from arrangedb.spine.data import roles
from arrangedb.spine.data.errors import SchemaError
from arrangedb.spine.data.parquet import open_parquet, parquet_rows
from arrangedb.spine.data.updates import Updates, constant

def _is_supported_key(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
            or pa.types.is_temporal(t) or pa.types.is_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_string(t) or pa.types.is_large_binary(t)
            or pa.types.is_decimal(t))


def _is_supported_val(t: pa.DataType) -> bool:
    return _is_supported_key(t) or pa.types.is_null(t)


def open_batches(data, columns: list[str] | None = None, batch_rows: int | None = None,
                 coded: list[str] = ()) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The schema and a stream of record batches of any supported input.

    ``columns`` narrows what a Parquet input decodes (other inputs are already decoded).
    ``batch_rows``: the batch size an operator's plan is asked for (``Plan.to_reader``).
    ``coded``: columns of a Parquet file read as dictionary arrays (see
    :mod:`arrangedb.spine.data.parquet`, which reads Parquet).
    """
    if isinstance(data, pa.Table):
        # as its own chunks: a delta of one chunk is one slice, which a run's sort reads
        # as it is instead of concatenating pieces of it again
        return data.schema, iter(data.to_batches())
    if isinstance(data, pa.RecordBatch):
        return data.schema, iter([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.schema, iter(data)
    if is_plan(data):
        reader = data.to_reader(batch_rows)
        return reader.schema, iter(reader)
    if hasattr(data, "__arrow_c_stream__"):   # any Arrow stream: DuckDB, Polars...
        reader = pa.RecordBatchReader.from_stream(data)
        return reader.schema, iter(reader)
    if isinstance(data, (str, os.PathLike)):
        return open_parquet(os.fspath(data), columns, coded)
    if isinstance(data, Iterable):
        it = iter(data)
        first = next(it, None)
        if first is None:
            raise SchemaError("the input iterable yielded no record batch, so it has no schema")
        if isinstance(first, pa.Table):
            first_batches = first.to_batches()
            schema = first.schema

            def gen():
                yield from first_batches
                for t in it:
                    yield from (t.to_batches() if isinstance(t, pa.Table) else [t])
            return schema, gen()
        if not isinstance(first, pa.RecordBatch):
            raise SchemaError(f"expected pyarrow RecordBatches, got {type(first).__name__}")

        def chain():
            yield first
            yield from it
        return first.schema, chain()
    raise SchemaError(
        f"unsupported input {type(data).__name__}: pass a pyarrow Table, RecordBatch, "
        "RecordBatchReader, an iterable of RecordBatches, or a Parquet path")


def known_rows(data) -> int | None:
    """How many rows ``data`` holds, when that is known before reading it: a table, a
    batch, a Parquet file or directory (the footers); None for streams."""
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        return data.num_rows
    if is_file_input(data) and os.path.exists(data):
        try:
            return parquet_rows(os.fspath(data))
        except (OSError, pa.ArrowException):
            return None   # opening it says what is wrong
    return None


def is_plan(data) -> bool:
    """Whether ``data`` is an operator's plan (:class:`arrangedb.ops.plan.Plan`)."""
    return hasattr(data, "to_reader") and hasattr(data, "explain")


def is_file_input(data) -> bool:
    """Whether ``data`` names a Parquet file or directory, which arrangedb opens itself."""
    return isinstance(data, (str, os.PathLike))


def read_ahead(stream: Iterator[pa.RecordBatch], max_bytes: int
               ) -> Iterator[pa.RecordBatch]:
    """``stream``'s batches, the next ones decoded by a background thread meanwhile.

    For a Parquet file the engine opened itself: decoding is pyarrow's C++, which
    releases the GIL, so the thread reads while the caller sorts and encodes the run
    before (on 40M rows, ~0.9 s of decoding hidden behind ~2.2 s of sorting). The thread
    decodes a batch only while less than ``max_bytes`` wait in the queue, so at most
    ``max_bytes`` plus one batch are held ahead. It starts at the first batch asked for
    and is stopped and joined when the caller stops iterating, early or not; an error
    in the stream is raised to the caller after the batches before it.
    """
    cond = threading.Condition()
    queue: deque[pa.RecordBatch] = deque()
    state = {"bytes": 0, "done": False, "stop": False, "error": None}

    def produce():
        try:
            it = iter(stream)
            while True:
                with cond:   # room first: a batch decoded is held until it is queued
                    while queue and state["bytes"] >= max_bytes and not state["stop"]:
                        cond.wait()
                    if state["stop"]:
                        return
                rb = next(it, None)
                if rb is None:
                    return
                with cond:
                    queue.append(rb)
                    state["bytes"] += rb.nbytes
                    cond.notify_all()
                del rb
        except BaseException as e:   # handed to the consumer, raised there
            state["error"] = e
        finally:
            try:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()   # the file is let go of now, not when the stream is collected
            finally:
                with cond:
                    state["done"] = True
                    cond.notify_all()

    thread = threading.Thread(target=produce, name="arrangedb-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            with cond:
                while not queue and not state["done"]:
                    cond.wait()
                if not queue:
                    error = state.pop("error")
                    if error is not None:
                        raise error
                    return
                rb = queue.popleft()
                state["bytes"] -= rb.nbytes
                cond.notify_all()
            yield rb
    finally:
        with cond:
            state["stop"] = True
            queue.clear()
            cond.notify_all()
        thread.join()


@dataclass(frozen=True)
class Columns:
    """Which input columns play which role."""

    def needed(self) -> list[str]:
        """Every input column the arrangement reads, each once."""
        cols = self.key + (self.vals or []) + [c for c in (self.time, self.diff) if c]
        return list(dict.fromkeys(cols))

    key: list[str]
    vals: list[str] | None        # None: key-only arrangement
    time: str | None
    diff: str | None

    @staticmethod
    def resolve(schema: pa.Schema, key, vals, time, diff) -> "Columns":
        """``time``/``diff``: a column name; None: the column the input's schema marks
        as its time / weight (:mod:`arrangedb.spine.data.roles`), if any; False: none (every
        update at time 0 / with diff +1, the marked column dropped)."""
        if isinstance(key, str):
            key = [key]
        key = list(key or [])
        if not key:
            raise SchemaError("an arrangement needs at least one key column")
        names = schema.names
        marked = {roles.role_column(schema, roles.TIME), roles.role_column(schema, roles.WEIGHT)}
        time = roles.resolve_role(schema, time, roles.TIME)
        diff = roles.resolve_role(schema, diff, roles.WEIGHT)
        for role, col in [("key", c) for c in key] + [("time", time), ("diff", diff)]:
            if col is not None and col not in names:
                raise SchemaError(f"{role} column {col!r} is not in the input "
                                  f"(columns: {', '.join(names)})")
        if vals is None:   # every other column, but never a stream's weight or time
            vals = [c for c in names if c not in key and c not in (time, diff)
                    and c not in marked]
        else:
            vals = [vals] if isinstance(vals, str) else list(vals)
            for c in vals:
                if c not in names:
                    raise SchemaError(f"val column {c!r} is not in the input "
                                      f"(columns: {', '.join(names)})")
        for c in key:
            t = schema.field(c).type
            if pa.types.is_dictionary(t):
                t = t.value_type
            if not _is_supported_key(t):
                raise SchemaError(f"key column {c!r} has type {t}, which cannot be a key "
                                  "(use integers, floats, booleans, dates/timestamps, strings, "
                                  "binaries or decimals)")
        for c in vals:
            t = schema.field(c).type
            if pa.types.is_dictionary(t):
                t = t.value_type
            if not _is_supported_val(t):
                raise SchemaError(f"val column {c!r} has type {t}, which arrangedb cannot store")
        if time is not None and not pa.types.is_integer(schema.field(time).type):
            raise SchemaError(f"time column {time!r} must hold integers, not "
                              f"{schema.field(time).type}")
        if diff is not None and not pa.types.is_integer(schema.field(diff).type):
            raise SchemaError(f"diff column {diff!r} must hold integers, not "
                              f"{schema.field(diff).type}")
        overlap = set(key) & set(vals)
        if overlap:
            raise SchemaError(f"columns {sorted(overlap)} cannot be both key and val")
        return Columns(key, vals if vals else None, time, diff)


def _plain(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    return col


def coded_table_columns(data, names: list[str]) -> list[str]:
    """The columns among ``names`` that a table or batch ``data`` holds as dictionaries
    of strings or binaries (pandas categoricals) with few values for their rows in every
    chunk (``codecs.choose.dict_fits``): stored from their codes, as a Parquet file's
    coded columns are (:func:`to_updates`). A large dictionary is decoded instead: its
    chunks' copies of it would be sorted, held and stored beside their rows (2M rows of
    200k categories arranged in 1.0 s from the codes, 0.47 s from the strings)."""
    if not isinstance(data, (pa.Table, pa.RecordBatch)):
        return []
    out = []
    for f in data.schema:
        if f.name not in names or not pa.types.is_dictionary(f.type) \
                or binary_offset_dtype(f.type.value_type) is None:
            continue
        col = data.column(f.name)
        chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
        if all(dict_fits(len(c.dictionary), len(c)) for c in chunks if len(c)):
            out.append(f.name)
    return out


def _coded(col, field: pa.Field) -> pa.DictionaryArray | None:
    """``col`` as a dictionary array over ``field``'s type, when it is one without a
    null in its dictionary; None otherwise."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if not pa.types.is_dictionary(col.type) or col.dictionary.null_count:
        return None
    dictionary = cast_column(col.dictionary, field, "val column")
    if dictionary is not col.dictionary:
        col = pa.DictionaryArray.from_arrays(col.indices, dictionary)
    return col


def target_schemas(schema: pa.Schema, cols: Columns) -> tuple[pa.Schema, pa.Schema | None]:
    def field(c):
        f = schema.field(c)
        t = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
        return pa.field(c, t)

    key_schema = pa.schema([field(c) for c in cols.key])
    val_schema = pa.schema([field(c) for c in cols.vals]) if cols.vals else None
    return key_schema, val_schema


def cast_column(col, field: pa.Field, what: str, whose: str = "the arrangement's"):
    """``col`` as ``field``'s type, or a SchemaError naming the column and both types.
    Only a conversion within one kind of value is made (integers of another width, an
    integer or float into a float, another string, decimal, date or timestamp type),
    and only where every value fits exactly: a string of digits is not an integer, nor
    a bool a string, whatever the values happen to be."""
    if col.type == field.type:
        return col
    mismatch = f"{what} {field.name!r} has type {col.type}, {whose} is {field.type}"
    if not convertible(col.type, field.type):
        raise SchemaError(mismatch)
    try:
        return col.cast(field.type)   # safe: a value that does not fit raises
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise SchemaError(f"{mismatch}, and not all of its values fit that type ({e}); "
                          f"cast the column first") from e


_KINDS = (pa.types.is_integer, pa.types.is_decimal, pa.types.is_date,
          pa.types.is_timestamp, pa.types.is_time, pa.types.is_duration,
          lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
          lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t))


def convertible(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether values of type ``src`` are converted to ``dst`` (one kind of value; the
    values themselves must still fit)."""
    if pa.types.is_null(src):   # a column of nulls only
        return True
    if pa.types.is_floating(dst):
        return pa.types.is_floating(src) or pa.types.is_integer(src)
    return any(kind(src) and kind(dst) for kind in _KINDS)


def to_updates(batch: pa.RecordBatch, cols: Columns, key_schema: pa.Schema,
               val_schema: pa.Schema | None, default_time: int = 0,
               default_diff: int = 1, coded: frozenset = frozenset()) -> Updates:
    """Check one input batch and turn it into updates (not yet sorted). Val columns in
    ``coded`` that come as dictionary arrays stay so (``parquet.coded_columns``,
    :func:`coded_table_columns`): their codes go on to the ``dict`` codec; every other
    dictionary column is decoded."""
    n = batch.num_rows
    missing = [c for c in cols.key + (cols.vals or []) if c not in batch.schema.names]
    if missing:
        raise SchemaError(f"input batch lacks column(s) {missing}")
    keys = []
    for f in key_schema:
        col = _plain(batch.column(f.name))
        if col.null_count:
            raise SchemaError(f"key column {f.name!r} holds {col.null_count} null(s); "
                              "keys may not be null (filter them out, or fill them)")
        keys.append(cast_column(col, f, "key column"))
    vals = None
    if val_schema is not None:
        arrays = []
        for f in val_schema:
            col = batch.column(f.name)
            kept = _coded(col, f) if f.name in coded else None
            arrays.append(kept if kept is not None
                          else cast_column(_plain(col), f, "val column"))
        vals = pa.Table.from_arrays(arrays, schema=pa.schema(
            [f.with_type(a.type) for f, a in zip(val_schema, arrays)]))
    times = _times(batch, cols.time, n, default_time)
    diffs = _diffs(batch, cols.diff, n, default_diff)
    return Updates(pa.Table.from_arrays(keys, schema=key_schema), vals, times, diffs)


LAST_TIME = (1 << 64) - 1   # refused: the upper frontier past it would not fit a time


def _times(batch, name, n, default) -> np.ndarray:
    if name is None:   # one value for every row: a stride-0 view, no 8 bytes a row
        return constant(default, n, np.uint64)
    col = _plain(batch.column(name))
    if not pa.types.is_integer(col.type):
        raise SchemaError(f"time column {name!r} must hold integers, not {col.type}")
    if col.null_count:
        raise SchemaError(f"time column {name!r} holds null(s)")
    if pa.types.is_signed_integer(col.type) and n and pc.min(col).as_py() < 0:
        raise SchemaError(f"time column {name!r} holds negative times "
                          f"(min {pc.min(col).as_py()}); times are unsigned")
    times = col.to_numpy().astype(np.uint64, copy=False)
    if col.type == pa.uint64() and n and int(times.max()) == LAST_TIME:
        raise SchemaError(f"time column {name!r} holds {LAST_TIME}, the largest uint64: "
                          "times go up to 2**64 - 2 (a trace's upper frontier is its last "
                          "time + 1)")
    return times


def _diffs(batch, name, n, default) -> np.ndarray:
    if name is None:
        return constant(default, n, np.int64)
    col = _plain(batch.column(name))
    if not pa.types.is_integer(col.type):
        raise SchemaError(f"diff column {name!r} must hold integers, not {col.type}")
    if col.null_count:
        raise SchemaError(f"diff column {name!r} holds null(s)")
    if col.type == pa.uint64() and n and pc.max(col).as_py() > np.iinfo(np.int64).max:
        raise SchemaError(f"diff column {name!r} holds values beyond int64")
    return col.to_numpy().astype(np.int64, copy=False)
