"""Plans: operators compose lazily and run when their result is consumed.

An operator (``join``, ``group_by``, ``reduce``...) checks its arguments at once -- a bad
column name fails where it is written -- and returns a :class:`Plan`: a node naming the
operator, its inputs (traces, other plans, streams) and its options. Nothing is read
until the plan is consumed (iterated, ``read_all()``, ``to_pandas()``, read through the
Arrow C stream interface by pyarrow, DuckDB or Polars, or handed to ``engine.arrange``).
Each consumption runs the plan afresh, at the time it is consumed: ``at=None`` means the
latest time then. A plan over a one-shot stream (a ``RecordBatchReader``, a generator)
can be consumed once.

Before a plan runs, :mod:`arrangedb.ops.planner` rewrites it into the fastest form the
engine knows for its shape (eager aggregation below a join, dictionary codes carried
through a grouping); ``explain()`` shows the plan as written, as it runs, and why.

This module is the mechanism; the rules are the planner's.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa


@dataclass(eq=False)
class Node:
    """One operator application: ``fn(*args, **kwargs)`` opens its output stream."""

    op: str
    fn: Callable[..., pa.RecordBatchReader]
    args: tuple
    kwargs: dict
    schema: pa.Schema
    first: pa.RecordBatchReader | None = None   # kept for a plan over a one-shot stream
    one_shot: bool = False
    notes: list = field(default_factory=list)   # why the planner made this node

    def open(self, batch_rows: int | None = None) -> pa.RecordBatchReader:
        """``batch_rows``: the batch size the consumer prefers, used when the operator
        takes one and the plan did not give it."""
        if self.one_shot:
            if self.first is None:
                raise RuntimeError(f"this {self.op} plan reads a one-shot stream (a reader "
                                   f"or an iterator) that was consumed already: pass a "
                                   f"table, a trace or a plan to consume it again")
            reader, self.first = self.first, None
            return reader
        if batch_rows is not None and self.leaves_batch_rows():
            return self.fn(*self.args, **self.kwargs, batch_rows=batch_rows)
        return self.fn(*self.args, **self.kwargs)

    def leaves_batch_rows(self) -> bool:
        """Whether the operator takes ``batch_rows`` and was given none (by name or by
        position)."""
        at = _batch_rows_position(self.fn)
        return at is not None and "batch_rows" not in self.kwargs and len(self.args) <= at

    def inputs(self) -> list:
        """The plans, traces and streams this node reads, in argument order."""
        return [a for a in (*self.args, *self.kwargs.values()) if is_input(a)]


@functools.lru_cache(maxsize=None)
def _batch_rows_position(fn) -> int | None:
    """The position of ``fn``'s ``batch_rows`` parameter, None when it has none."""
    names = list(inspect.signature(fn).parameters)
    return names.index("batch_rows") if "batch_rows" in names else None


def is_input(x) -> bool:
    return isinstance(x, Plan) or _is_trace(x) or isinstance(
        x, (pa.RecordBatchReader, pa.Table, Iterator))


def _is_trace(x) -> bool:
    return hasattr(x, "batches") and hasattr(x, "key_names")


def _one_shot(x) -> bool:
    """Whether reading ``x`` uses it up (so a plan over it runs once)."""
    if isinstance(x, Plan):
        return x._node.one_shot
    return isinstance(x, (pa.RecordBatchReader, Iterator))


class Plan:
    """A lazy query: iterate it, or read it whole; every consumption runs it afresh.

    It reads like a ``pyarrow.RecordBatchReader`` (``schema``, iteration over record
    batches, ``read_all()``) and is an Arrow C stream (``__arrow_c_stream__``), so
    ``pyarrow.table(plan)``, ``duckdb.sql("... FROM plan")`` and ``polars.from_arrow``
    read it directly. Operators and ``engine.arrange`` take it as input.
    """

    __slots__ = ("_node",)

    def __init__(self, node: Node):
        self._node = node

    @property
    def schema(self) -> pa.Schema:
        return self._node.schema

    def to_reader(self, batch_rows: int | None = None) -> pa.RecordBatchReader:
        """Run the plan (as the planner rewrites it): a reader over its output.
        ``batch_rows``: the rows per batch the reader should give, unless the plan's
        last operator was given its own ``batch_rows`` (``engine.arrange`` asks for
        batches as large as its runs take: fewer to join up before sorting)."""
        return _planner.optimize(self._node).open(batch_rows)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return iter(self.to_reader())

    def read_all(self) -> pa.Table:
        return self.to_reader().read_all()

    to_table = read_all

    def to_batches(self) -> list[pa.RecordBatch]:
        return list(self)

    def to_pandas(self, **options):
        return self.read_all().to_pandas(**options)

    read_pandas = to_pandas

    def __arrow_c_stream__(self, requested_schema=None):
        return self.to_reader().__arrow_c_stream__(requested_schema)

    def explain(self) -> str:
        """The plan as written, as it runs (after the planner's rewrites), and why."""
        return _planner.explain(self._node)

    def maintained(self, engine, key=None, name=None, path=None, history="last"):
        """The plan's output as a maintained view in ``engine`` (``engine.view``)."""
        if _maintainer is None:
            raise RuntimeError("views need arrangedb.ops.view, which arrangedb.ops loads")
        return _maintainer(self, engine, key, name, path, history)

    def __repr__(self) -> str:
        return f"<arrangedb plan: {self._node.op}; {len(self.schema)} columns " \
               f"({', '.join(self.schema.names)}); .explain() shows how it runs>"


class _NoPlanner:
    """Until :mod:`arrangedb.ops.planner` registers itself: plans run as written."""

    @staticmethod
    def optimize(node: Node) -> Node:
        return node

    @staticmethod
    def explain(node: Node) -> str:
        return f"{node.op} (no planner loaded)"


_planner = _NoPlanner
_maintainer = None   # makes views: installed by arrangedb.ops.view


def use_planner(planner) -> None:
    """Install the rules plans run by: an object with ``optimize(node) -> node`` and
    ``explain(node) -> str`` (the policy; this module is the mechanism)."""
    global _planner
    _planner = planner


def use_maintainer(maintain) -> None:
    """Install what ``Plan.maintained`` (``engine.view``) calls: ``maintain(plan,
    engine, key, name, path, history) -> trace``."""
    global _maintainer
    _maintainer = maintain


def lazy(op: str):
    """Make an eager operator (returning a reader whose work starts when it is read)
    return a :class:`Plan`. The eager form checks the arguments and gives the schema at
    once; a plan over reusable inputs calls it again each time it is consumed."""
    def wrap(fn):
        @functools.wraps(fn)
        def operator(*args, **kwargs):
            reader = fn(*args, **kwargs)
            one_shot = any(_one_shot(a) for a in (*args, *kwargs.values()))
            node = Node(op, fn, args, kwargs, reader.schema,
                        first=reader if one_shot else None, one_shot=one_shot)
            if not one_shot:
                reader.close()   # its generator never started: nothing was read
            return Plan(node)
        operator.eager = fn
        return operator
    return wrap


def describe_input(x) -> str:
    """One line for a plan's leaf (a trace or a stream), as ``explain`` prints it."""
    if _is_trace(x):
        batches = x.batches()
        updates = sum(len(b) for b in batches)
        vals = f"; vals [{', '.join(x.val_names)}]" if x.val_names else ""
        name = f" {x.name!r}" if getattr(x, "name", None) else ""
        return (f"trace{name}: key [{', '.join(x.key_names)}]{vals}; {updates:,} updates "
                f"in {len(batches)} batch{'es' if len(batches) != 1 else ''}")
    if isinstance(x, pa.Table):
        return f"table: {x.num_rows:,} rows ({', '.join(x.schema.names)})"
    if isinstance(x, pa.RecordBatchReader):
        return f"stream ({', '.join(x.schema.names)}), read once"
    return f"{type(x).__name__} input"
