"""One local Spark session for the whole test run: local[2], no UI, loopback only."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

import spark_connector


def start_spark(warehouse: str) -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors' Python workers run in this venv
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("raftkv-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.warehouse.dir", warehouse)
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark_connector.register(spark)
    return spark
