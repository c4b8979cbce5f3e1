"""Operators over arrangements: joins, reductions and stream aggregation, block by block."""

from arrangedb.ops.group_by import group_by
from arrangedb.ops.join import join
from arrangedb.ops.join_group_by import join_group_by
from arrangedb.ops.reduce import distinct, reduce, threshold, top_k

__all__ = ["distinct", "group_by", "join", "join_group_by", "reduce", "threshold", "top_k"]
