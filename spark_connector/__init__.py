"""raftkv for Spark (PySpark 4.x Python data source `raftkv`); see docs/spark.md."""

from __future__ import annotations

from spark_connector.datasource import RaftKVDataSource

__all__ = ["RaftKVDataSource", "register"]


def register(spark) -> None:
    """Register the `raftkv` format with this session and let it receive pushed-down filters."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(RaftKVDataSource)
