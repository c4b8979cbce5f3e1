"""Column roles carried in a stream's Arrow schema: which column is the weight, which
the time, and which engine made the stream.

Design
------
A stream of updates is rows plus a multiplicity: a join's ``count``, a change stream's
``diff`` (beside its ``time``). Every stream the engine produces marks those columns in
their Arrow field metadata (``arrangedb.role``: ``weight`` or ``time``), and every
consumer -- ``arrange``, ``insert``, ``group_by`` -- takes the marked columns as the
update's diff and time unless told otherwise, so that no column name is guessed and a
multiplicity is never dropped silently. Dropping one is explicit: ``diff=False``,
``time=False``, ``weight=False``.

The schema's own metadata names the engine that made the stream
(``arrangedb.engine``), so that an operator fed a stream runs inside that engine (its
budget, its spill directory) rather than a second one.

Metadata survives what keeps a schema (``read_all``, ``select``, slicing, Parquet
files written by pyarrow); it does not survive pandas or Spark, whose users name the
columns (``diff="count"``, ``weight="diff"``).
"""

from __future__ import annotations

import pyarrow as pa

ROLE = b"arrangedb.role"
WEIGHT = b"weight"
TIME = b"time"
ENGINE = b"arrangedb.engine"


def weight_field(name: str = "count") -> pa.Field:
    """An int64 multiplicity column."""
    return pa.field(name, pa.int64(), metadata={ROLE: WEIGHT})


def time_field(name: str = "time") -> pa.Field:
    """A uint64 logical-time column."""
    return pa.field(name, pa.uint64(), metadata={ROLE: TIME})


def role_column(schema: pa.Schema, role: bytes) -> str | None:
    """The name of the column marked with ``role``, if any."""
    for f in schema:
        if f.metadata and f.metadata.get(ROLE) == role:
            return f.name
    return None


def resolve_role(schema: pa.Schema, given, role: bytes, fallback: str | None = None
                 ) -> str | None:
    """The column to use for ``role``: ``given`` when it names one, none when it is
    False, else the column the schema marks, else ``fallback`` when the input has it."""
    if given is False:
        return None
    if given is not None:
        return given
    marked = role_column(schema, role)
    if marked is not None:
        return marked
    return fallback if fallback is not None and fallback in schema.names else None


def without_roles(field: pa.Field) -> pa.Field:
    """``field`` as a plain column (a weight kept as a value is no longer a weight)."""
    if not field.metadata or ROLE not in field.metadata:
        return field
    meta = {k: v for k, v in field.metadata.items() if k != ROLE}
    return field.with_metadata(meta) if meta else field.remove_metadata()


def with_engine(schema: pa.Schema, engine_id: int | None) -> pa.Schema:
    if engine_id is None:
        return schema
    return schema.with_metadata({**(schema.metadata or {}), ENGINE: str(engine_id).encode()})


def engine_id(schema: pa.Schema) -> int | None:
    value = (schema.metadata or {}).get(ENGINE)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
