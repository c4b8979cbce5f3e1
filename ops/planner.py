"""The planner: the rewrites a plan gets before it runs, and ``explain``.

Each rule looks at one node (and the plans it reads) and returns a faster node with the
same output -- same rows, same column names and types -- or None when the shape does
not fit. Rules, tried in order:

``eager aggregation``
    ``group_by(join(A, B), by, aggs)`` with count/sum/mean aggregates of one side's
    columns and one or more group columns of the other side (or keys) runs as
    :func:`~arrangedb.ops.join_group_by.join_group_by`: that side is summed per key
    below the join, straight off its stored layout, and the joined rows are never made
    (Yan and Larson's "group-by before join").
``eager aggregation of changes``
    The same shape over a join's changes (``since`` given), counts and sums only, runs
    as :func:`~arrangedb.ops.join_group_by_changes.join_group_by_changes`: where only
    the summed side changed, its changes are summed per key below the join.
``dictionary codes``
    Any other ``group_by`` over a join (snapshot or changes) reads its string and binary
    group columns as dictionary codes (the join's ``read_dictionary``): they are handed
    over as the stored codes, never gathered per row, and grouped with ``bincount``.

A rewritten plan's output is cast back to the written plan's schema (codes come out as
the plain strings they stand for unless the plan asked for codes). Rewrites are checked
against the plan as written by the oracle tests (tests/ops/test_planner.py).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

import pyarrow as pa
import pyarrow.compute as pc

from arrangedb.ops.aggregate import check_aggs
from arrangedb.ops.common import names
from arrangedb.ops.join import dictionary_readable, prefixed_names
from arrangedb.ops.join_group_by import join_group_by, pushdown_side
from arrangedb.ops.join_group_by_changes import changes_pushdown_side, join_group_by_changes
from arrangedb.ops.partials import plain_schema
from arrangedb.ops import plan as _plan
from arrangedb.ops.plan import Node, Plan, describe_input, is_input


@functools.lru_cache(maxsize=None)
def _signature(fn) -> inspect.Signature:
    """``fn``'s signature, read once: every plan asks it of its operators (a change
    query over a few rows took 0.88 ms reading it each time, 0.82 ms so)."""
    return inspect.signature(fn)


def params(node: Node) -> dict:
    """The node's arguments by name, defaults filled in."""
    bound = _signature(node.fn).bind(*node.args, **node.kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _rebuilt(node: Node, notes: list[str], **changes) -> Node:
    """``node``'s operator applied to changed arguments (by name), all as keywords. A
    ``batch_rows`` the plan did not give stays ungiven: the consumer sizes the batches."""
    kwargs = {**params(node), **changes}
    if node.leaves_batch_rows():
        del kwargs["batch_rows"]
    return dataclasses.replace(node, args=(), kwargs=kwargs, notes=notes, first=None)


def _joined(node: Node):
    """(group_by params, join params) when ``node`` groups a join of two traces."""
    if node.op != "group_by" or node.one_shot:
        return None
    g = params(node)
    stream = g["stream"]
    if not isinstance(stream, Plan) or stream._node.op != "join" or g["phase"] != "complete":
        return None
    return g, params(stream._node)


# -- rules ------------------------------------------------------------------------------------

def eager_aggregation(node: Node) -> Node | None:
    found = _joined(node)
    if found is None:
        return None
    g, j = found
    changes = j["since"] is not None   # the join's changes: counted by diff, not count
    if g["weight"] not in (None, "diff" if changes else "count"):
        return None
    left, right, by = j["left"], j["right"], names(g["by"])
    aggs = check_aggs(g["aggs"], plain_schema(g["stream"].schema),
                      "the join's changes" if changes else "the join's output")
    side = (changes_pushdown_side if changes else pushdown_side)(left, right, by, aggs,
                                                                  j["how"])
    if side is None:
        return None
    a = _trace_name((left, right)[side])
    summed = ", ".join(f"{fn}({col or '*'})" for fn, col in aggs.values())
    shape = f"{summed} read only {a}, and the groups [{', '.join(by)}] do not"
    common = dict(engine=g["engine"])
    if not node.leaves_batch_rows():
        common["batch_rows"] = g["batch_rows"]
    if changes:
        note = (f"eager aggregation of changes: {shape}: where only {a} changed, its "
                f"changes are summed per key below the join and meet the other side's "
                f"rows of those keys as one partial row each; the joined change rows are "
                f"never made")
        fused = Node("join_group_by_changes", join_group_by_changes, (left, right, by, aggs),
                     dict(since=j["since"], upto=j["upto"], **common), node.schema,
                     notes=[note])
    else:
        note = (f"eager aggregation: {shape}: {a} is summed per key below the join "
                f"(straight off its stored layout) and the joined rows are never made")
        fused = Node("join_group_by", join_group_by, (left, right, by, aggs),
                     dict(at=j["at"], how=j["how"], **common), node.schema, notes=[note])
    return _conformed(fused, node.schema)


def coded_group_columns(g: dict, j: dict) -> list[str]:
    """The group columns of ``group_by(join(...))`` (their params ``g``, ``j``) that the
    join can hand over as dictionary codes: string and binary vals of either side."""
    left, right = j["left"], j["right"]
    lnames, rnames = prefixed_names(left.key_names, left.val_names, right.val_names)
    vals = {n: f.type for n, f in zip(lnames, left.val_schema or [])}
    if j["how"] in ("inner", "left"):
        vals.update((n, f.type) for n, f in zip(rnames, right.val_schema or []))
    return [b for b in names(g["by"]) if b in vals and dictionary_readable(vals[b])
            and not pa.types.is_integer(vals[b])]


def dictionary_codes(node: Node) -> Node | None:
    found = _joined(node)
    if found is None:
        return None
    g, j = found
    asked = names(j["read_dictionary"] or [])
    wanted = [b for b in coded_group_columns(g, j) if b not in asked]
    if not wanted:
        return None
    note = (f"dictionary codes: the group column{'s' if len(wanted) > 1 else ''} "
            f"[{', '.join(wanted)}] {'are' if len(wanted) > 1 else 'is'} read as "
            f"dictionary codes through the join (as the stored codes, not gathered per "
            f"row) and grouped with bincount; the output has the plain values")
    join_node = g["stream"]._node
    codes = Plan(_rebuilt(join_node, list(join_node.notes), read_dictionary=asked + wanted))
    return _conformed(_rebuilt(node, [note], stream=codes), node.schema)


RULES = (eager_aggregation, dictionary_codes)


def optimize(node: Node) -> Node:
    """The node to run for ``node``: the first rule that applies, else ``node``. (The
    plans a node reads are optimized when it opens them.)"""
    for rule in RULES:
        rewritten = rule(node)
        if rewritten is not None:
            return rewritten
    return node


# -- casting a rewritten plan's output back to the written schema -----------------------------

def _cast(arr: pa.Array, t: pa.DataType) -> pa.Array:
    if arr.type.equals(t):
        return arr
    if pa.types.is_dictionary(t) and not pa.types.is_dictionary(arr.type):
        return pc.dictionary_encode(arr).cast(t)
    return arr.cast(t)


def _conform_reader(plan: Plan, schema: pa.Schema, batch_rows: int | None = None
                    ) -> pa.RecordBatchReader:
    reader = plan.to_reader(batch_rows)
    names = schema.names

    def gen():
        for b in reader:
            yield pa.RecordBatch.from_arrays(
                [_cast(b.column(n), f.type) for n, f in zip(names, schema)], schema=schema)
    return pa.RecordBatchReader.from_batches(schema, gen())


def _conformed(node: Node, schema: pa.Schema) -> Node:
    """``node`` with its output cast to ``schema`` (only where the types differ)."""
    out = node.schema
    if out.equals(schema, check_metadata=True):
        return node
    if out.names != schema.names:   # the rewrite is wrong, not the types: run as written
        raise AssertionError(f"a rewrite changed the output columns: {out.names} vs "
                             f"{schema.names}")
    return Node("cast", _conform_reader, (Plan(node), schema), {}, schema,
                notes=list(node.notes))


# -- explain -----------------------------------------------------------------------------------

def _trace_name(t) -> str:
    name = getattr(t, "name", None)
    return f"{name!r}" if name else "that side"


def _label(node: Node) -> str:
    p = params(node)
    defaults = {k: v.default for k, v in _signature(node.fn).parameters.items()}
    shown = []
    for k, v in p.items():
        if is_input(v) or k == "schema":
            continue
        if k in defaults and defaults[k] is not inspect.Parameter.empty and v == defaults[k]:
            continue
        if k == "aggs":
            v = "{" + ", ".join(f"{n}: {_agg(spec)}" for n, spec in v.items()) + "}"
        elif isinstance(v, pa.Schema):
            v = f"[{', '.join(v.names)}]"
        elif isinstance(v, (list, tuple)):
            v = f"[{', '.join(map(str, v))}]"
        shown.append(f"{k}={v}")
    op = "cast to the plan's types" if node.op == "cast" else node.op
    return f"{op}({', '.join(shown)})" if shown else op


def _agg(spec) -> str:
    if isinstance(spec, (tuple, list)) and len(spec) == 2:
        return f"{spec[0]}({spec[1] or '*'})"
    return str(spec)


def _tree(node: Node, depth: int, deep: bool, notes: list) -> list[str]:
    if deep:
        node = optimize(node)
        notes.extend(n for n in node.notes if n not in notes)
    lines = ["  " * depth + _label(node)]
    for x in node.inputs():
        if isinstance(x, Plan):
            lines += _tree(x._node, depth + 1, deep, notes)
        else:
            lines.append("  " * (depth + 1) + describe_input(x))
    return lines


def explain(node: Node) -> str:
    notes: list[str] = []
    written = _tree(node, 1, False, [])
    runs = _tree(node, 1, True, notes)
    out = ["plan, as written:", *written, "runs as:", *runs]
    if notes:
        out += ["rewrites:", *(f"  - {n}" for n in notes)]
    else:
        out.append("rewrites: none (no rule fits this plan's shape; it runs as written)")
    return "\n".join(out)


class _Rules:
    optimize = staticmethod(optimize)
    explain = staticmethod(explain)


_plan.use_planner(_Rules)
