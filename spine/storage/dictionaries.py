"""Val columns as Arrow dictionary arrays (int32 codes and their dictionary), the form
``read_dictionary`` asks for: kept as the dictionary codec decodes them, else encoded."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def dictionary_schema(schema: pa.Schema | None, names: frozenset) -> pa.Schema | None:
    """``schema`` with the columns ``names`` as dictionaries (int32 codes) of their type."""
    if schema is None or not names:
        return schema
    return pa.schema([f.with_type(pa.dictionary(pa.int32(), f.type))
                      if f.name in names and not pa.types.is_dictionary(f.type) else f
                      for f in schema])


def as_dictionary(arr) -> pa.Array:
    """A column as a dictionary array with int32 codes: kept if it is one (as the codec
    decodes it), else encoded (one hash pass: a part that did not store it dict-coded)."""
    if isinstance(arr, np.ndarray):
        arr = pa.array(arr)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    return arr if pa.types.is_dictionary(arr.type) else arr.dictionary_encode()


def with_dictionaries(table: pa.Table | None, names: frozenset) -> pa.Table | None:
    """``table`` with the columns ``names`` as dictionary arrays (see :func:`as_dictionary`)."""
    if table is None or not names:
        return table
    schema = dictionary_schema(table.schema, names)
    if schema.equals(table.schema):
        return table
    return pa.Table.from_arrays([as_dictionary(c) if f.name in names else c
                                 for f, c in zip(table.schema, table.columns)], schema=schema)
