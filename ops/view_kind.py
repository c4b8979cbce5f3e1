"""Which refresh a plan's view takes, and what it is keyed by: the policy of
:mod:`arrangedb.ops.view` (whose docstring describes each kind), apart from its
mechanism."""

from __future__ import annotations

from arrangedb.ops import plan as _plan
from arrangedb.ops.aggregate import check_aggs
from arrangedb.ops.common import names
from arrangedb.ops.planner import params
from arrangedb.ops.view_reduce import eligible as stored_eligible
from arrangedb.spine import Trace, roles

PER_KEY_OPS = ("join", "reduce", "distinct", "top_k", "threshold")


def traces_of(node) -> list:
    """The traces a plan reads, each once, in the order the plan names them."""
    out, seen = [], set()

    def walk(n):
        for x in n.inputs():
            if isinstance(x, _plan.Plan):
                walk(x._node)
            elif isinstance(x, Trace) and id(x) not in seen:
                seen.add(id(x))
                out.append(x)
    walk(node)
    return out


def kind_of(node, key: list[str]) -> str:
    """How the view of ``node`` keyed by ``key`` refreshes. The paths that recompute
    keys need the view keyed as the operator's output is (by its input's key, or its
    group columns): another key is refreshed whole."""
    if node.op in PER_KEY_OPS:
        p, direct = params(node), node.inputs()
        if p.get("since") is not None or p.get("at") is not None:
            return "whole"   # an operator's changes, or its output at a fixed time
        if list(key) != default_key(node) or not direct \
                or not all(isinstance(x, Trace) for x in direct):
            return "whole"
        if node.op == "reduce" and stored_eligible(checked_aggs(p), p["trace"].val_schema):
            return "stored aggregates"
        return {"top_k": "stored top k", "distinct": "changed rows"}.get(node.op, "per key")
    if node.op == "group_by" and not node.one_shot:
        g = params(node)
        stream = g["stream"]
        if (isinstance(stream, _plan.Plan) and stream._node.op == "join"
                and g["weight"] in (None, "count")):
            j = params(stream._node)
            aggs = g["aggs"]
            linear = all(fn in ("count", "sum") for fn, _ in aggs.values())
            counted = any(fn == "count" and col is None for fn, col in aggs.values())
            if (j["how"] == "inner" and j["at"] is None and j["since"] is None
                    and isinstance(j["left"], Trace) and isinstance(j["right"], Trace)
                    and linear and counted and sorted(key) == sorted(names(g["by"]))):
                return "linear"
    return "whole"


def checked_aggs(p: dict) -> dict:
    """A reduce's aggregates as it reads them ((function, column) per output)."""
    return check_aggs(p["aggs"], p["trace"].val_schema, "the view's input")


def default_key(node) -> list[str]:
    if node.op == "group_by":
        return names(params(node)["by"])
    direct = [x for x in node.inputs() if isinstance(x, Trace)]
    if node.op in PER_KEY_OPS and direct:
        return list(direct[0].key_names)
    weight = roles.role_column(node.schema, roles.WEIGHT)
    return [f.name for f in node.schema if f.name != weight]
