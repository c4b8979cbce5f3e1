"""Operators over arrangements: joins, reductions and stream aggregation, block by block.

The operators here return lazy :class:`~arrangedb.ops.plan.Plan` objects (see
:mod:`arrangedb.ops.plan`); the modules behind them hold the eager forms.
"""

from arrangedb.ops import group_by as _group_by
from arrangedb.ops import join as _join
from arrangedb.ops import join_group_by as _join_group_by
from arrangedb.ops import reduce as _reduce
from arrangedb.ops import planner as _planner  # noqa: F401 - installs the rewrite rules
from arrangedb.ops import view as _view  # noqa: F401 - installs engine.view's maintainer
from arrangedb.ops.plan import Plan, lazy
from arrangedb.ops.view import View

join = lazy("join")(_join.join)
group_by = lazy("group_by")(_group_by.group_by)
join_group_by = lazy("join_group_by")(_join_group_by.join_group_by)
reduce = lazy("reduce")(_reduce.reduce)
distinct = lazy("distinct")(_reduce.distinct)
threshold = lazy("threshold")(_reduce.threshold)
top_k = lazy("top_k")(_reduce.top_k)

__all__ = ["Plan", "View", "distinct", "group_by", "join", "join_group_by", "reduce", "threshold",
           "top_k"]
