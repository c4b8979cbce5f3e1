"""Plumbing shared by the driver-side functions: Arrow and Spark schemas, task bodies,
the session and the default number of partitions."""

from __future__ import annotations

import pyarrow as pa

from arrangedb.spark_integration.workers import task


def on_workers(module: str, function: str, *args):
    """``arrangedb.spark_integration.<module>.<function>(batches, *args)`` as a task body
    (see :mod:`.workers`)."""
    return task(f"arrangedb.spark_integration.{module}", function, *args)


def arrow_schema(spark_schema) -> pa.Schema:
    """A Spark schema as the Arrow schema of the batches ``mapInArrow`` hands over:
    timestamps in the session's time zone (pyspark refuses a timestamp without one)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    zone = active_session().conf.get("spark.sql.session.timeZone", None) or "UTC"
    return to_arrow_schema(spark_schema, timezone=zone)


def spark_schema(arrow_schema: pa.Schema):
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema)


def default_partitions(spark) -> int:
    return max(2, spark.sparkContext.defaultParallelism * 2)


def active_session():
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
