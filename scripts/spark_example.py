"""An example Spark job on raftkv: read, transform, write back; then stream the change feed to Parquet.

    # a cluster (`make demo` or `raftkv dev up`) and a learner that keeps a changelog:
    raftkv learner add --name changes --sink changelog --sink-option path=raftkv-data/changes --config CLUSTER.toml
    raftkv learner start --name changes --api-port 7600 --config CLUSTER.toml &
    python scripts/spark_example.py --config CLUSTER.toml --changelog 127.0.0.1:7600 --out /tmp/raftkv-feed

The spec gives the nodes and the client certificate of a cluster with TLS (`make demo`'s is
raftkv-data/cluster.toml); `--endpoints HOST:PORT` instead reaches a cluster without TLS.

Step 1 upper-cases the value of every key under `users/` and writes it under
`users_upper/`. Step 2 streams every change into Parquet (restart it with the
same --out and it resumes from its checkpoint: nothing lost, nothing twice).
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import spark_connector


def upper_case_users(spark: SparkSession, cluster: dict[str, str]) -> int:
    """Read users/*, transform, write users_upper/*; returns the rows written. `cluster`: the connector's
    options that name it ({"config": spec path} or {"endpoints": ...})."""
    users = (spark.read.format("raftkv").options(**cluster)
             .option("key_format", "string").option("value_format", "string").load()
             .filter(F.col("key").startswith("users/")))  # pushed down: only that key range is scanned
    upper = users.select(F.concat(F.lit("users_upper/"), F.substring("key", 7, 1 << 20)).alias("key"),
                         F.upper("value").alias("value"))
    (upper.write.format("raftkv").options(**cluster)
     .option("key_format", "string").option("value_format", "string").mode("append").save())
    return upper.count()


def stream_changes_to_parquet(spark: SparkSession, cluster: dict[str, str], changelog: str, out: str) -> None:
    """Every change since the checkpoint (or the feed's start) into Parquet at out/data; returns when caught up."""
    changes: DataFrame = (spark.readStream.format("raftkv").options(**cluster).option("changelog", changelog)
                          .option("key_format", "string").option("value_format", "string")
                          .option("maxRowsPerTrigger", 50_000).load())
    query = (changes.writeStream.format("parquet").option("path", os.path.join(out, "data"))
             .option("checkpointLocation", os.path.join(out, "checkpoint")).start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="raftkv-data/cluster.toml", help="the cluster's spec")
    parser.add_argument("--endpoints", help="instead of --config: HOST:PORT of a node of a cluster without TLS")
    parser.add_argument("--changelog", help="a learner's --api-port running --sink changelog")
    parser.add_argument("--out", default="raftkv-feed-parquet")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark_connector.register(spark)
    cluster = {"endpoints": args.endpoints} if args.endpoints else {"config": args.config}
    print(f"wrote {upper_case_users(spark, cluster)} users_upper/ rows")
    if args.changelog:
        stream_changes_to_parquet(spark, cluster, args.changelog, args.out)
        print(f"{spark.read.parquet(os.path.join(args.out, 'data')).count()} changes in {args.out}/data")
    spark.stop()


if __name__ == "__main__":
    main()
