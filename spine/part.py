"""Parts: the key-range slices a batch is made of, resident or in a page file.

Design
------
A batch is a sequence of parts with increasing, disjoint key ranges; a key never spans
two parts. Each part is one :class:`PartLayout` (the seeds' layout). A part is either
held in memory (``MemoryPart``) or stored as regions of the batch's page file
(``PagedPart``), one region per buffer of each encoded column, named
``p<index>/<field>.<buffer>``. A part keeps its first and last key in memory, so that
searches find the parts to touch without reading any.

Reading a part decodes it into :class:`Updates` plus ``key_starts`` (where each key's
rows begin), which readers use to cut windows at key boundaries. A lookup reads a paged
part through ``lookup_layout``: keys and bounds decoded, vals, times and diffs decoded
only at the rows :func:`select_keys` takes (only the zstd blocks holding them, with the
engine's block cache).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa

from arrangedb.codecs import encoded_length
from arrangedb.spine.layout import PartLayout, expand_singleton, from_layout
from arrangedb.spine.updates import Updates

_FIELDS = ("keys", "key_bounds", "vals", "val_bounds", "times", "diffs")


def payload_bytes(table: pa.Table | None) -> int:
    """Bytes of key/val data proper: values of fixed-width columns, bytes of strings."""
    if table is None:
        return 0
    total = 0
    for col in table.columns:
        t = col.type
        if pa.types.is_binary(t) or pa.types.is_string(t) or \
                pa.types.is_large_binary(t) or pa.types.is_large_string(t):
            total += int(sum(_value_bytes(c) for c in col.chunks))
        elif pa.types.is_boolean(t):
            total += (len(col) + 7) // 8
        elif pa.types.is_null(t):
            continue    # nulls only: no values
        else:
            total += len(col) * (t.bit_width // 8)
    return total


def _value_bytes(chunk: pa.Array) -> int:
    if len(chunk) == 0:
        return 0
    offs = np.frombuffer(chunk.buffers()[1], dtype=np.int64 if chunk.type in
                         (pa.large_binary(), pa.large_string()) else np.int32)
    return int(offs[chunk.offset + len(chunk)] - offs[chunk.offset])


def key_starts_of(layout: PartLayout) -> np.ndarray:
    """Row index (in the expanded updates) where each key starts, plus the end."""
    leaves = layout.val_bounds if layout.vals is not None else layout.key_bounds
    stored = np.diff(leaves.astype(np.int64))
    leaf_counts = np.where(stored == 0, 1, stored)
    leaf_end = np.zeros(len(leaf_counts) + 1, dtype=np.int64)
    np.cumsum(leaf_counts, out=leaf_end[1:])
    if layout.vals is None:
        return leaf_end
    return leaf_end[layout.key_bounds.astype(np.int64)]


def _expand(layout: PartLayout) -> tuple[Updates, np.ndarray]:
    """A layout's updates and key starts; one stored (time, diff) needs no leaf bounds."""
    if len(layout.times) == 1:
        return expand_singleton(layout.keys, layout.key_bounds, layout.vals,
                                layout.times[0], layout.diffs[0])
    return from_layout(layout), key_starts_of(layout)


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


def boundary_key(keys: pa.Table, row: int) -> pa.Table:
    """A one-row copy of ``keys[row]``: a slice would keep the whole part's buffers alive."""
    return keys.take(pa.array([row], pa.int64())).combine_chunks()


@dataclass
class Part:
    num_updates: int
    num_keys: int
    first_key: pa.Table
    last_key: pa.Table
    payload: int
    stored: int
    decodes = True   # reading makes new arrays (a reader reserves them); not for resident

    def layout(self) -> PartLayout:
        raise NotImplementedError

    def lookup_layout(self, dictionary: frozenset = frozenset(), dense: bool = False
                      ) -> PartLayout:
        """The layout for ``select_keys``; call ``release()`` once done with it.
        ``dictionary``: val columns to take as dictionary arrays (see :meth:`read`).
        ``dense``: the caller knows the keys are dense (:meth:`dense_first_key`) and
        only takes keys at positions; a paged part then does not read them."""
        return self._coded_layout(dictionary)

    def dense_first_key(self) -> int | None:
        """The first key when the part's keys are every integer from its first to its
        last key (dense ids): key i is then ``first + i``, found without reading the
        keys. None otherwise. Judged from the boundary keys a part keeps in memory."""
        if self.num_keys == 0 or self.first_key.num_columns != 1 \
                or not pa.types.is_integer(self.first_key.schema.field(0).type):
            return None
        lo, hi = self.first_key.column(0)[0].as_py(), self.last_key.column(0)[0].as_py()
        if hi - lo != self.num_keys - 1 or lo < -2**63 or hi >= 2**63:
            return None
        return lo

    def read(self, dictionary: frozenset = frozenset()) -> tuple[Updates, np.ndarray]:
        """The part's updates, one row each, and where each key's rows start.

        ``dictionary``: names of val columns to hand over as dictionary arrays (int32
        codes), their strings not gathered per row."""
        return _expand(self._coded_layout(dictionary))

    def stored_layout(self, dictionary: frozenset = frozenset()) -> PartLayout | None:
        """The layout as stored, every column decoded, keys never expanded to rows (for
        readers that work per key); None when the part holds no layout (a resident
        part: its ``read`` is as cheap). Under one stored (time, diff) the leaf bounds
        may be absent (None): every leaf is then one update of it."""
        return self._coded_layout(dictionary)

    def summed_layout(self, dictionary: frozenset = frozenset(), sums: frozenset = frozenset(),
                      columns: frozenset | None = None) -> tuple[PartLayout | None, dict]:
        """:meth:`stored_layout`, with the val columns named in ``sums`` summed per key
        rather than decoded where the part allows it: ``(layout, {column: per-key sums})``.

        A part can when it holds one stored (time, diff), every val one update of it, and
        the column's encoding sums runs of values without decoding them
        (``codecs.segment_sums``): the layout then lacks that column. ``columns``: the
        other val columns the reader needs (None: all); the layout may hold more."""
        return self.stored_layout(dictionary), {}

    def _coded_layout(self, dictionary: frozenset) -> PartLayout:
        layout = self.layout()
        if not dictionary:
            return layout
        return replace(layout, vals=with_dictionaries(layout.vals, dictionary))

    def release(self) -> None:
        """Let go of resident bytes once a reader has finished with this part."""


@dataclass
class MemoryPart(Part):
    data: PartLayout = field(default=None, repr=False)

    def layout(self) -> PartLayout:
        return self.data


@dataclass
class PagedPart(Part):
    """A part whose columns are regions of a page file, decoded on demand."""

    pagefile: object = field(default=None, repr=False)
    columns: dict = field(default_factory=dict, repr=False)  # field -> list of region names
    schemas: tuple = field(default=(None, None), repr=False)
    cache: object = field(default=None, repr=False)   # the engine's BlockCache, if any

    def read(self, dictionary: frozenset = frozenset()) -> tuple[Updates, np.ndarray]:
        return _expand(self.stored_layout(dictionary))

    def stored_layout(self, dictionary: frozenset = frozenset()) -> PartLayout:
        return self.summed_layout(dictionary)[0]

    def summed_layout(self, dictionary: frozenset = frozenset(), sums: frozenset = frozenset(),
                      columns: frozenset | None = None) -> tuple[PartLayout, dict]:
        val_schema = self.schemas[1]
        names = [] if val_schema is None else [
            f for f in val_schema.names if columns is None or f in columns or f in sums]
        key_sums = {}
        try:
            cols = self._decode(("times", "diffs"), None)
            # under one stored (time, diff) the leaf bounds say nothing: not even decoded
            singleton = len(cols["times"]) == 1
            keyed = not singleton or val_schema is not None
            rest = ("keys",) + (("key_bounds",) if keyed else ()) + \
                (() if singleton else ("val_bounds",))
            cols.update((k, v) for k, v in self._decode(rest, None).items() if k in rest)
            if singleton and sums and val_schema is not None:
                key_sums = self._key_sums(sums, cols["key_bounds"])
                names = [f for f in names if f not in key_sums]
            if val_schema is not None:
                cols["vals"] = self._decode(("vals",), None, dictionary, names)["vals"]
        finally:
            self.release()  # the bytes were copied out (or failed to): let the pages go
        return self._assemble(cols, dictionary=dictionary, val_names=names), key_sums

    def _key_sums(self, sums: frozenset, key_bounds: np.ndarray) -> dict[str, np.ndarray]:
        """Per-key sums of the ``sums`` columns whose encoding can sum its runs."""
        from arrangedb.spine.storage import column_segment_sums  # storage imports part

        starts = key_bounds[:-1].astype(np.int64)
        out = {}
        for f, group in zip(self.schemas[1].names, self.columns["vals"]):
            if f in sums:
                got = column_segment_sums(self.pagefile, group, starts)
                if got is not None:
                    out[f] = got
        return out

    def layout(self) -> PartLayout:
        # a scan reads each block once: through the cache it would only evict the blocks
        # lookups come back for, and pay a copy and a reservation per block
        try:
            cols = self._decode(_FIELDS, None)
        finally:
            self.release()  # the bytes were copied out (or failed to): let the pages go
        return self._assemble(cols)

    def lookup_layout(self, dictionary: frozenset = frozenset(), dense: bool = False
                      ) -> PartLayout:
        # one stored (time, diff): decoded (one element each), and the leaf bounds, which
        # then say nothing, are not
        singleton = _stored_length(self.columns["times"][0]) == 1
        # dense keys are computed, not read; key bounds of one form (a dimension's one
        # val per key: a stride) are computed at the rows indexed, not decoded whole
        bounds = self.columns.get("key_bounds")
        computed = dense and bounds is not None and bounds[0]["meta"].get("form") in (
            "stride", "const")
        cols = self._decode((() if dense else ("keys",)) + (() if computed else ("key_bounds",))
                            + (("times", "diffs") if singleton else ("val_bounds",)),
                            self.cache)
        key_schema, val_schema = self.schemas
        if dense:
            cols["keys"] = _DenseKeys(self.dense_first_key(), key_schema)
        if computed:
            cols["key_bounds"] = _Rows(self, bounds[0])
        if self.columns.get("vals") is not None:
            cols["vals"] = _RowsTable(self, self.columns["vals"], val_schema, dictionary)
        if not singleton:
            for name in ("times", "diffs"):
                cols[name] = _Rows(self, self.columns[name][0])
        return self._assemble(cols, tables=False)

    def _decode(self, names, cache, dictionary: frozenset = frozenset(),
                val_names: list | None = None) -> dict:
        """``val_names``: the val columns to decode (None: all)."""
        from arrangedb.spine.storage import decode_column  # storage imports part

        cols = dict.fromkeys(_FIELDS)
        for name in names:
            groups = self.columns.get(name)
            if groups is None:
                continue
            if name == "vals" and (dictionary or val_names is not None):
                fields = self.schemas[1].names
                arrays = [as_dictionary(decode_column(self.pagefile, g, cache, True))
                          if f in dictionary else decode_column(self.pagefile, g, cache)
                          for f, g in zip(fields, groups)
                          if val_names is None or f in val_names]
            else:
                arrays = [decode_column(self.pagefile, g, cache) for g in groups]
            cols[name] = arrays if name in ("keys", "vals") else arrays[0]
        return cols

    def _assemble(self, cols: dict, tables: bool = True, dictionary: frozenset = frozenset(),
                  val_names: list | None = None) -> PartLayout:
        key_schema, val_schema = self.schemas
        keys = cols["keys"]
        if isinstance(keys, list):   # else computed (_DenseKeys)
            keys = _table(keys, key_schema)
        vals = cols["vals"]
        if tables and val_schema is not None:
            schema = dictionary_schema(val_schema, dictionary)
            if val_names is not None:
                schema = pa.schema([schema.field(f) for f in val_names])
            vals = _table(vals, schema)
        return PartLayout(keys, cols["key_bounds"], vals, cols["val_bounds"],
                          cols["times"], cols["diffs"])

    def release(self) -> None:
        self.pagefile.release_all([r for groups in self.columns.values() for group in groups
                                   for r in group["regions"]])


def _table(columns: list | None, schema: pa.Schema) -> pa.Table:
    return pa.Table.from_arrays(columns, schema=schema)


def _stored_length(group: dict) -> int | None:
    """Elements of an encoded column, from its directory entry."""
    return encoded_length(group.get("meta") or {})


class _Rows:
    """A numpy column of a paged part, decoded only at the rows indexed."""

    def __init__(self, part: PagedPart, group: dict):
        self.part, self.group = part, group

    def __len__(self) -> int:
        n = _stored_length(self.group)
        if n is None:
            raise TypeError("the column's directory entry records no length")
        return n

    def __getitem__(self, rows) -> np.ndarray:
        from arrangedb.spine.storage import take_column

        return take_column(self.part.pagefile, self.group, np.asarray(rows, np.int64),
                           self.part.cache)


class _DenseKeys:
    """The keys of a part holding every integer from ``first`` on: key i is first + i."""

    def __init__(self, first: int, schema: pa.Schema):
        self.first, self.schema = first, schema

    def take(self, rows) -> pa.Table:
        values = np.asarray(rows, np.int64) + np.int64(self.first)
        field_ = self.schema.field(0)
        return pa.table([pa.array(values).cast(field_.type)], schema=self.schema)


class _RowsTable:
    """The vals of a paged part, decoded only at the rows taken."""

    def __init__(self, part: PagedPart, groups: list, schema: pa.Schema,
                 dictionary: frozenset = frozenset()):
        self.part, self.groups, self.schema = part, groups, schema
        self.dictionary = dictionary   # columns taken as dictionary arrays

    def take(self, rows) -> pa.Table:
        from arrangedb.spine.storage import take_column

        rows = np.asarray(rows, np.int64)
        columns = []
        for f, g in zip(self.schema, self.groups):
            coded = f.name in self.dictionary
            col = take_column(self.part.pagefile, g, rows, self.part.cache, coded)
            columns.append(as_dictionary(col) if coded else col)
        return _table(columns, dictionary_schema(self.schema, self.dictionary))
