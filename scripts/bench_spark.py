"""Spark through raftkv vs a direct rocksdict fill/scan of the same rows, in one run.

    python scripts/bench_spark.py --rows 1000000 --partitions 8
    python scripts/bench_spark.py --consistency follower --split-rows 62500 --write-option write_batch_rows=20000

Starts a 3-node cluster on loopback and one local[2] Spark session; after a
small warm-up job, writes the rows with Spark (16-byte keys, 100-byte values),
reads them all back three times at `leader` consistency (the `noop` sink forces
every row through; the median counts), and fills/scans one rocksdict with the same rows on the same disk.
Prints rows/s and the raftkv/rocksdict ratios (`--json-out F` also writes them to F), and the JVM's own ceiling: the same read from a
Python data source that yields the same Arrow batches from memory, with no raftkv behind it. `--consistency`, `--split-rows`, `--read-option` and
`--write-option` (connector options), and `--conf` (Spark settings) try the read and write levers of
docs/spark.md one at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rocksdict import Options, Rdict, WriteBatch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_clusters import raftkv_cluster  # noqa: E402
from bench_load import VALUE_BYTES, cpu_seconds, key  # noqa: E402

READS = 3  # the median of three full reads
SCAN_CHUNK_ROWS = (4 << 20) // (16 + VALUE_BYTES)  # the rows of one columnar scan chunk (service.COLUMNS_CHUNK_BYTES)


def rocksdict_rates(folder: Path, rows: int) -> tuple[float, float]:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    db = Rdict(str(folder), options)
    value = b"v" * VALUE_BYTES
    started = time.perf_counter()
    for start in range(0, rows, 2000):
        batch = WriteBatch(raw_mode=True)
        for i in range(start, min(rows, start + 2000)):
            batch.put(key(i), value)
        db.write(batch)
    fill = rows / (time.perf_counter() - started)
    started = time.perf_counter()
    scanned = sum(1 for _ in db.items())
    scan = scanned / (time.perf_counter() - started)
    db.close()
    return fill, scan


def spark_rates(spark, endpoints: str, rows: int, read_options: dict[str, str],
                write_options: dict[str, str], pids: tuple[int, ...]) -> tuple[float, float, float]:
    """Write then read `rows`: rows/s of each, and the nodes' CPU µs a row written. A small job first warms
    up the JVM and the Python workers."""
    warm_up = spark.range(1000).selectExpr("CAST(CAST(id AS STRING) AS BINARY) AS key", "CAST('' AS BINARY) AS value")
    warm_up.write.format("raftkv").option("endpoints", endpoints).mode("append").save()
    spark.read.format("raftkv").option("endpoints", endpoints).load().write.format("noop").mode("overwrite").save()
    df = spark.range(rows).selectExpr("format_string('bench/%010d', id) AS key",  # bench_load.key's keys
                                      f"repeat('v', {VALUE_BYTES}) AS value")
    df = df.selectExpr("CAST(key AS BINARY) AS key", "CAST(value AS BINARY) AS value").cache()
    df.count()  # materialise the input so the timing is the write alone
    started, cpu = time.perf_counter(), cpu_seconds(pids)
    df.write.format("raftkv").option("endpoints", endpoints).options(**write_options).mode("append").save()
    write = rows / (time.perf_counter() - started)
    write_cpu = (cpu_seconds(pids) - cpu) / rows * 1e6
    reads = []
    for _ in range(READS):
        started = time.perf_counter()
        spark.read.format("raftkv").option("endpoints", endpoints).options(**read_options).load() \
            .write.format("noop").mode("overwrite").save()
        reads.append(rows / (time.perf_counter() - started))
    return write, statistics.median(reads), write_cpu


def jvm_ceiling(spark, rows: int, partitions: int) -> float:
    """Rows/s of a full read from a Python data source yielding raftkv's batches (schema, chunk size)
    from memory: what Spark's side of a read costs, with nothing to scan."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from spark_connector.columns import kv_schema

    class InMemory(DataSource, DataSourceReader):
        @classmethod
        def name(cls) -> str:
            return "bench_in_memory"

        def schema(self):
            return kv_schema("binary", "binary")

        def reader(self, schema):
            return self

        def partitions(self):
            return [InputPartition(p) for p in range(partitions)]

        def read(self, partition):
            import pyarrow as pa
            share = rows // partitions
            keys = pa.array([b"bench/%010d" % i for i in range(SCAN_CHUNK_ROWS)], pa.binary())  # bench_load.key's
            values = pa.array([b"v" * VALUE_BYTES] * SCAN_CHUNK_ROWS, pa.binary())
            for start in range(0, share, SCAN_CHUNK_ROWS):
                n = min(SCAN_CHUNK_ROWS, share - start)
                yield pa.RecordBatch.from_arrays(
                    [keys.slice(0, n), values.slice(0, n), pa.array([partition.value] * n, pa.int32()),
                     pa.array([1] * n, pa.int64())], names=["key", "value", "partition", "index"])

    spark.dataSource.register(InMemory)
    reads = []
    for _ in range(READS):
        started = time.perf_counter()
        spark.read.format("bench_in_memory").load().write.format("noop").mode("overwrite").save()
        reads.append(rows // partitions * partitions / (time.perf_counter() - started))
    return statistics.median(reads)


def _pairs(items: list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in items)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--consistency", default="leader", help="of the reads (default leader)")
    parser.add_argument("--split-rows", type=int, help="the connector's split_rows: rows per Spark partition of a read")
    parser.add_argument("--read-option", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--write-option", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting")
    parser.add_argument("--json-out", type=Path, metavar="F", help="also write the rates to F as JSON")
    args = parser.parse_args()
    read_options = {"consistency": args.consistency, **_pairs(args.read_option)}
    if args.split_rows is not None:
        read_options["split_rows"] = str(args.split_rows)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import spark_connector

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").config(map=_pairs(args.conf)).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_connector.register(spark)
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        with raftkv_cluster(Path(tmp) / "raftkv", args.partitions) as cluster:
            write, read, write_cpu = spark_rates(spark, ",".join(cluster.endpoints), args.rows, read_options,
                                                 _pairs(args.write_option), cluster.pids)
        ceiling = jvm_ceiling(spark, args.rows, args.partitions)
        fill, scan = rocksdict_rates(Path(tmp) / "rocksdict", args.rows)
    spark.stop()

    table = Table(title=f"Spark local[2] through raftkv vs rocksdict, {args.rows:,} rows of {VALUE_BYTES} B; "
                        f"read options {read_options}, write options {_pairs(args.write_option)}, "
                        f"Spark settings {_pairs(args.conf)}")
    for column in ("", "raftkv via Spark (rows/s)", "rocksdict direct (rows/s)", "ratio"):
        table.add_column(column, justify="right")
    table.add_row("write", f"{write:,.0f}", f"{fill:,.0f}", f"{write / fill:.2f}")
    table.add_row("read", f"{read:,.0f}", f"{scan:,.0f}", f"{read / scan:.2f}")
    table.add_row("the nodes' CPU (all three) per row written, µs", f"{write_cpu:.2f}", "", "")
    table.add_row("read of the same batches from memory, no raftkv (Spark's ceiling)", f"{ceiling:,.0f}", "", "")
    Console().print(table)
    if args.json_out is not None:
        args.json_out.write_text(json.dumps({"write_rows_per_s": round(write), "read_rows_per_s": round(read),
                                             "write_node_cpu_us_per_row": round(write_cpu, 2),
                                             "rocksdict_fill_rows_per_s": round(fill),
                                             "rocksdict_scan_rows_per_s": round(scan),
                                             "spark_ceiling_rows_per_s": round(ceiling)}) + "\n")


if __name__ == "__main__":
    main()
