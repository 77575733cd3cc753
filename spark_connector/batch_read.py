"""Batch reads: one Spark input partition per Raft partition, each scanned from one snapshot.

A scan's chunks all come from one RocksDB view on one replica, and every
row carries that view's applied index. If the replica goes away mid-scan the
task fails (Spark retries it) rather than finish from another view: the
result of a partition is always one consistent snapshot, never a splice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from raftkv.client import Client
from spark_connector.columns import to_arrow
from spark_connector.key_filters import KeyScope, push_filters
from spark_connector.options import ConnectorOptions

ROWS_PER_BATCH = 65536


@dataclass(frozen=True)
class PartitionRead(InputPartition):
    partition: int
    keys: tuple[bytes, ...] | None  # exact keys (pushed = / IN), else the scope's range


class KVReader(DataSourceReader):
    def __init__(self, options: ConnectorOptions):
        self.options = options
        self.scope = KeyScope(options.start, options.end, partitions=options.partitions)

    def pushFilters(self, filters):
        self.scope, rest = push_filters(self.scope, list(filters), self.options.key_format)
        return iter(rest)

    def partitions(self) -> list[PartitionRead]:
        with Client(list(self.options.endpoints), timeout=self.options.timeout) as client:
            count = client.partitions
        if self.scope.keys is None:
            return [PartitionRead(p, None) for p in self.scope.partitions_to_read(count)]
        by_partition = self.scope.keys_by_partition(count)
        return [PartitionRead(p, tuple(by_partition[p])) for p in self.scope.partitions_to_read(count)]

    def read(self, partition: PartitionRead) -> Iterator[pa.RecordBatch]:
        opts = self.options
        with Client(list(opts.read_endpoints), timeout=opts.timeout, consistency=opts.client_consistency) as client:
            rows = _key_reads(client, partition) if partition.keys is not None else _scan(client, partition, self.scope)
            yield from _batches(rows, partition.partition, opts)


def _scan(client: Client, partition: PartitionRead, scope: KeyScope) -> Iterator[tuple[list, list, int]]:
    for chunk in client.scan_chunks(partition.partition, scope.start, scope.end):
        yield [kv.key for kv in chunk.items], [kv.value for kv in chunk.items], chunk.applied_index


def _key_reads(client: Client, partition: PartitionRead) -> Iterator[tuple[list, list, int]]:
    for key in partition.keys:
        read = client.read(key)
        if read.value is not None:
            yield [key], [read.value], read.applied_index


def _batches(rows: Iterator[tuple[list, list, int]], partition: int, opts: ConnectorOptions) -> Iterator[pa.RecordBatch]:
    keys: list[bytes] = []
    values: list[bytes] = []
    indexes: list[int] = []

    def batch() -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [to_arrow(keys, opts.key_format), to_arrow(values, opts.value_format),
             pa.array([partition] * len(keys), pa.int32()), pa.array(indexes, pa.int64())],
            names=["key", "value", "partition", "index"],
        )

    for chunk_keys, chunk_values, index in rows:
        keys += chunk_keys
        values += chunk_values
        indexes += [index] * len(chunk_keys)
        if len(keys) >= ROWS_PER_BATCH:
            yield batch()
            keys, values, indexes = [], [], []
    if keys:
        yield batch()
