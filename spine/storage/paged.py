"""Parts stored in page files, and their decoding: a :class:`PagedPart` is one region per
buffer of each encoded column, named ``p<index>/<field>.<buffer>``, decoded on demand
through the codecs -- whole for a scan, at the rows taken for a lookup (only the zstd
blocks holding them, through the engine's block cache).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from arrangedb.codecs import (CodecError, decode, decode_dictionary, decodes_fresh, encoded_length,
                              segment_sums, take, take_dictionary, zstd_blocks)
from arrangedb.spine.data.layout import PartLayout, leaf_totals
from arrangedb.spine.data.updates import Updates, all_equal
from arrangedb.spine.storage.blockcache import KeptColumns, kept_key, through_cache
from arrangedb.spine.storage.dictionaries import as_dictionary, dictionary_schema
from arrangedb.spine.storage.keyrank import rank_positions
from arrangedb.spine.storage.keysums import (leaf_counts, run_counts, usual_count, weigh,
                                              weighable)
from arrangedb.spine.storage.part import FIELDS, Part, expand, min_total

def decode_column(pagefile, group: dict, cache=None, dictionary: bool = False):
    """Decode one column of a part, copying its bytes out of the mapping first.

    Decoded arrays may be views of the bytes they were decoded from. Were those the
    mapping itself, every consumer of a view (a merge's builder, a user holding a
    snapshot batch) would fault mapped pages back in after the reader released them,
    out of the budget's sight. One copy per read keeps the mapped pages' lifetime to
    the read itself: the reader releases them right after decoding. Encodings whose
    decode computes every output (for, scaled_float, arrow_decimal) need no copy.

    zstd columns with a ``cache`` (:class:`BlockCache`) decode from cached blocks,
    decompressing (straight out of the mapping: that is the copy) only the missing ones.

    ``dictionary=True``: a dict-coded Arrow column comes back as a dictionary array (its
    codes and stored dictionary, values not gathered); other columns decode as usual.
    """
    if isinstance(cache, KeptColumns):   # a query's read: kept for the next one
        return cache.column(pagefile, group, dictionary,
                            lambda: decode_column(pagefile, group, None, dictionary))
    if cache is not None and group["codec"] == "zstd":
        return through_cache(pagefile, group, cache, zstd_blocks.decode_from_blocks)
    buffers = _mapped(pagefile, group)
    if not decodes_fresh(group["codec"], group["meta"]):
        buffers = [b.copy() for b in buffers]
    if dictionary:
        out = decode_dictionary(group["codec"], group["version"], group["meta"], buffers)
        if out is not None:
            return out
    return decode(group["codec"], group["version"], group["meta"], buffers)


def column_segment_sums(pagefile, group: dict, starts: np.ndarray) -> np.ndarray | None:
    """Per-segment sums of one column of a part, summed on its encoding straight from the
    mapping (the sums are new arrays: nothing to copy out first); None when the codec
    cannot sum without decoding (see ``codecs.segment_sums``)."""
    return segment_sums(group["codec"], group["version"], group["meta"],
                        _mapped(pagefile, group), starts)


def take_column(pagefile, group: dict, rows: np.ndarray, cache=None,
                dictionary: bool = False):
    """Elements ``rows`` of one column of a part (a numpy array or an Arrow array).

    zstd columns of items (numpy, Arrow fixed-width without nulls) with a ``cache``
    decompress only the blocks holding ``rows``; a dictionary column gathers only the
    rows' codes and strings (only their codes, as a dictionary array, with
    ``dictionary=True``); other columns decode whole and take. A column a query kept in
    the ``cache`` is gathered from.
    """
    if cache is not None:   # a column a query kept: gathered, nothing decoded
        column = cache.held(kept_key(pagefile, group, dictionary))
        if column is not None:
            return column.take(pa.array(rows)) if isinstance(column, pa.Array) else column[rows]
    if cache is not None and group["codec"] == "zstd":
        out = through_cache(pagefile, group, cache,
                             lambda meta, fetch: zstd_blocks.take_from_blocks(meta, fetch, rows))
        if out is not None:
            return out
        column = decode_column(pagefile, group, cache)   # whole, from the cached blocks
        return column.take(pa.array(rows)) if isinstance(column, pa.Array) else column[rows]
    # a take gathers into new arrays: no copy out of the mapping needed first
    buffers = _mapped(pagefile, group)
    if dictionary:
        out = take_dictionary(group["codec"], group["version"], group["meta"], buffers, rows)
        if out is not None:
            return out
    return take(group["codec"], group["version"], group["meta"], buffers, rows)


def _mapped(pagefile, group: dict) -> list[np.ndarray]:
    """The column's buffers as views of the mapping."""
    return [np.frombuffer(pagefile.buffer(r), dtype=np.uint8)
            for r in group["regions"][: group["nbuffers"]]]


@dataclass
class PagedPart(Part):
    """A part whose columns are regions of a page file, decoded on demand."""

    pagefile: object = field(default=None, repr=False)
    columns: dict = field(default_factory=dict, repr=False)  # field -> list of region names
    schemas: tuple = field(default=(None, None), repr=False)
    cache: object = field(default=None, repr=False)   # the engine's BlockCache, if any

    def read(self, dictionary: frozenset = frozenset()) -> tuple[Updates, np.ndarray]:
        return expand(self.stored_layout(dictionary))

    def stored_layout(self, dictionary: frozenset = frozenset()) -> PartLayout:
        return self.summed_layout(dictionary)[0]

    def summed_layout(self, dictionary: frozenset = frozenset(), sums: frozenset = frozenset(),
                      columns: frozenset | None = None, at: int | None = None,
                      linear: bool = False, keep: bool = False, scan: bool = False
                      ) -> tuple[PartLayout, dict, np.ndarray | None]:
        val_schema = self.schemas[1]
        kept = KeptColumns(self.cache, scan) if keep and self.cache is not None else None
        names = [] if val_schema is None else [
            f for f in val_schema.names if columns is None or f in columns or f in sums]
        key_sums, counts = {}, None
        try:
            cols = self._stored_updates()
            times = cols["times"]
            # under one stored (time, diff) the leaf bounds say nothing: not even decoded
            singleton = len(times) == 1
            one_time = not singleton and all_equal(times)
            # a linear reader takes each val's total over times all visible at ``at``
            totals = (linear and not singleton and not one_time
                      and (at is None or int(times.max()) <= at))
            weighed = bool(sums) and val_schema is not None and (one_time or totals)
            if weighed and one_time:   # leaf counts straight from the bounds' runs
                counts = run_counts(self.columns["val_bounds"][0], cols["diffs"])
            keyed = not singleton or val_schema is not None
            rest = ("keys",) + (("key_bounds",) if keyed else ()) + \
                (() if singleton or counts is not None else ("val_bounds",))
            cols.update((k, v) for k, v in self._decode(rest, kept).items() if k in rest)
            if singleton and sums and val_schema is not None:
                key_sums = self._stored_sums(sums, len(cols["key_bounds"]) - 1)
                key_sums.update(self._key_sums(sums - key_sums.keys(), cols["key_bounds"]))
                names = [f for f in names if f not in key_sums]
            elif weighed:
                if counts is None:
                    counts = (leaf_counts(cols["val_bounds"], cols["diffs"]) if one_time
                              else leaf_totals(cols["val_bounds"], times, cols["diffs"]))
                if counts is not None and len(counts) != int(cols["key_bounds"][-1]):
                    raise CodecError(f"corrupt part in {self.pagefile.path}: its leaf bounds "
                                     f"count {len(counts)} vals, its key bounds "
                                     f"{int(cols['key_bounds'][-1])}")
                if counts is not None:
                    key_sums = self._weighted_sums(sums, cols["key_bounds"], counts)
                    names = [f for f in names if f not in key_sums]
            if val_schema is not None:
                cols["vals"] = self._decode(("vals",), kept, dictionary, names)["vals"]
        finally:
            self.release()  # the bytes were copied out (or failed to): let the pages go
        return self._assemble(cols, dictionary=dictionary, val_names=names), key_sums, counts

    def _stored_updates(self) -> dict:
        """The decoded columns with the stored times and diffs. One stored (time, diff) is
        kept once read: every read of the part would map, decode and release two regions
        for two numbers."""
        held = getattr(self, "_one_update", None)
        if held is not None:
            cols = dict.fromkeys(FIELDS)
            cols["times"], cols["diffs"] = held
            return cols
        cols = self._decode(("times", "diffs"), None)
        if len(cols["times"]) == 1:
            self._one_update = (cols["times"], cols["diffs"])
        return cols

    def min_diff(self) -> int:
        try:
            diffs = self._decode(("diffs",), None)["diffs"]
        finally:
            self.release()
        return int(diffs.min()) if len(diffs) else 1

    def min_total(self) -> int:
        try:
            cols = self._decode(("times", "diffs"), None)
            if len(cols["diffs"]) > 1 and cols["diffs"].min() < 0:   # else bounds unneeded
                leaves = "val_bounds" if self.schemas[1] is not None else "key_bounds"
                cols[leaves] = self._decode((leaves,), None)[leaves]
                return min_total(cols[leaves], cols["times"], cols["diffs"])
        finally:
            self.release()
        return min_total(None, cols["times"], cols["diffs"])

    def _key_sums(self, sums: frozenset, key_bounds: np.ndarray) -> dict[str, np.ndarray]:
        """Per-key sums of the ``sums`` columns whose encoding can sum its runs, summed
        on the encoding."""
        out = {}
        starts = key_bounds[:-1].astype(np.int64)
        for f, group in self._val_groups(sums):
            got = column_segment_sums(self.pagefile, group, starts)
            if got is not None:
                out[f] = got
        return out

    def _stored_sums(self, sums: frozenset, num_keys: int) -> dict[str, np.ndarray]:
        """The key sums the part stores of the ``sums`` columns."""
        out = {}
        for group in self.columns.get("key_sums", ()):
            f = group["field"]
            if f in sums:
                out[f] = got = decode_column(self.pagefile, group)
                if len(got) != num_keys:
                    raise CodecError(f"corrupt part in {self.pagefile.path}: {len(got)} key "
                                     f"sums of {f!r} for {num_keys} keys")
        return out

    def val_nulls(self, name: str) -> int | None:
        """From the count the part's writer recorded (parts written before it did: None)."""
        return next((g.get("nulls") for _, g in self._val_groups((name,))), 0)

    def _val_groups(self, names) -> list[tuple[str, dict]]:
        """(name, encoded group) of the val columns among ``names``."""
        if self.schemas[1] is None:   # key-only
            return []
        return [(f, g) for f, g in zip(self.schemas[1].names, self.columns["vals"])
                if f in names]

    def _weighted_sums(self, sums: frozenset, key_bounds: np.ndarray, counts: np.ndarray
                       ) -> dict[str, np.ndarray]:
        """Per-key sums of value x count of the ``sums`` columns, in a part whose rows
        share one time but not one count (:mod:`.keysums`): stored, or summed on the
        encoding and weighed; none when the rows counted otherwise are not few. Decimal
        columns are left out: their sums stay exact as limbs of unweighted sums."""
        groups = dict(self._val_groups(sums))
        summable = frozenset(f for f in groups if weighable(self.schemas[1].field(f).type))
        out = self._stored_sums(summable, len(key_bounds) - 1)
        rest = summable - out.keys()
        usual = usual_count(counts) if rest else None
        if usual is None:
            return out
        for f, got in self._key_sums(rest, key_bounds).items():
            got = weigh(got, key_bounds, counts, *usual,
                        lambda rows, g=groups[f]: take_column(self.pagefile, g, rows))
            if got is not None:   # (else the column is read and weighed row by row)
                out[f] = got
        return out

    def layout(self) -> PartLayout:
        # a scan reads each block once: through the cache it would only evict the blocks
        # lookups come back for, and pay a copy and a reservation per block
        try:
            cols = self._decode(FIELDS, None)
        finally:
            self.release()  # the bytes were copied out (or failed to): let the pages go
        return self._assemble(cols)

    def lookup_layout(self, dictionary: frozenset = frozenset(), dense: bool = False
                      ) -> PartLayout:
        # one stored (time, diff): decoded (one element each), and the leaf bounds, which
        # then say nothing, are not
        singleton = _stored_length(self.columns["times"][0]) == 1
        # dense keys are computed, not read; key bounds stored as offsets are computed
        # (a dimension's one val per key: a stride) or gathered at the rows indexed, not
        # decoded whole: a lookup of a few keys pays for those
        computed = _gathered(self.columns.get("key_bounds"))
        vals_gathered = not singleton and _gathered(self.columns.get("val_bounds"))
        cols = self._decode((() if dense else ("keys",)) + (() if computed else ("key_bounds",))
                            + (() if singleton or vals_gathered else ("val_bounds",)),
                            self.cache)
        if singleton:
            cols.update((k, v) for k, v in self._stored_updates().items() if v is not None)
        key_schema, val_schema = self.schemas
        if dense:
            first = self.dense_first_key()
            cols["keys"] = (_DenseKeys(first, key_schema) if first is not None
                            else _RowsTable(self, self.columns["keys"], key_schema))
        if computed:
            cols["key_bounds"] = _Rows(self, self.columns["key_bounds"][0])
        if vals_gathered:
            cols["val_bounds"] = _Rows(self, self.columns["val_bounds"][0])
        if self.columns.get("vals") is not None:
            cols["vals"] = _RowsTable(self, self.columns["vals"], val_schema, dictionary)
        if not singleton:
            for name in ("times", "diffs"):
                cols[name] = _Rows(self, self.columns[name][0])
        return self._assemble(cols, tables=False)

    def rank_positions(self, queries):
        groups = self.columns.get("key_rank")
        if groups is None:
            return None
        words, ranks = (lambda w, g=g: take_column(self.pagefile, g, w) for g in groups)
        return rank_positions(self.first_key.column(0)[0].as_py(),
                              self.last_key.column(0)[0].as_py(), words, ranks, queries)

    def _decode(self, names, cache, dictionary: frozenset = frozenset(),
                val_names: list | None = None) -> dict:
        """``val_names``: the val columns to decode (None: all)."""
        cols = dict.fromkeys(FIELDS)
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


def _gathered(groups: list | None) -> bool:
    """Whether a bounds column is stored as offsets a lookup reads at its rows (computed
    from a stride or a constant, or gathered from narrow offsets), not decoded whole."""
    return groups is not None and groups[0]["codec"] == "offsets" and groups[0][
        "meta"].get("form") in ("stride", "const", "narrow", "split")


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
        rows = np.asarray(rows, np.int64)
        columns = []
        for f, g in zip(self.schema, self.groups):
            coded = f.name in self.dictionary
            col = take_column(self.part.pagefile, g, rows, self.part.cache, coded)
            columns.append(as_dictionary(col) if coded else col)
        return _table(columns, dictionary_schema(self.schema, self.dictionary))
