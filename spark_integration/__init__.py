"""arrangedb on Spark: executors mount an engine per partition (see api.py)."""

from arrangedb.spark_integration.api import snapshot_join, snapshot_reduce
from arrangedb.spark_integration.arranged import ArrangedDataset, arrange_df, arrange_parquet
from arrangedb.spark_integration.metrics import JobMetrics
from arrangedb.spark_integration.session import local_session

__all__ = ["ArrangedDataset", "JobMetrics", "arrange_df", "arrange_parquet", "local_session",
           "snapshot_join", "snapshot_reduce"]
