"""Batch reads: one Spark input partition per Raft partition (or per key range of a large one).

A partition with more than `split_rows` keys is split at every
`split_rows`-th key. Each input partition is one scan: its chunks all come
from one RocksDB view on one replica, and every row carries that view's
applied index. If the replica goes away mid-scan the
task fails (Spark retries it) rather than finish from another view: the
result of a partition is always one consistent snapshot, never a splice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from raftkv.client.sync_client import Client
from spark_connector.columns import binary_column, to_arrow
from spark_connector.key_filters import KeyScope, push_filters
from spark_connector.options import ConnectorOptions


@dataclass(frozen=True)
class PartitionRead(InputPartition):
    partition: int
    keys: tuple[bytes, ...] | None = None  # exact keys (pushed = / IN); else the range [start, end)
    start: bytes = b""
    end: bytes | None = None


class KVReader(DataSourceReader):
    def __init__(self, options: ConnectorOptions):
        self.options = options
        self.scope = KeyScope(options.start, options.end, partitions=options.partitions)

    def pushFilters(self, filters):
        self.scope, rest = push_filters(self.scope, list(filters), self.options.key_format)
        return iter(rest)

    def partitions(self) -> list[PartitionRead]:
        scope, split_rows = self.scope, self.options.split_rows
        with Client(list(self.options.endpoints), timeout=self.options.timeout, tls=self.options.tls,
                    token=self.options.token) as client:
            chosen = scope.partitions_to_read(client.partitions)
            if scope.keys is not None:
                by_partition = scope.keys_by_partition(client.partitions)
                return [PartitionRead(p, keys=tuple(by_partition[p])) for p in chosen]
            reads = []
            for p in chosen:
                splits = client.split_keys(p, scope.start, scope.end, every=split_rows) if split_rows else []
                bounds = [scope.start, *splits, scope.end]
                reads += [PartitionRead(p, start=lo, end=hi) for lo, hi in zip(bounds, bounds[1:])]
            return reads

    def read(self, partition: PartitionRead) -> Iterator[pa.RecordBatch]:
        opts = self.options
        with Client(list(opts.read_endpoints), timeout=opts.timeout, consistency=opts.client_consistency,
                    tls=opts.tls, token=opts.token) as client:
            if partition.keys is not None:
                yield from _key_reads(client, partition, opts)
                return
            chunks = client.scan_chunks(partition.partition, partition.start, partition.end, columnar=True)
            for chunk in chunks:
                columns = chunk.columns
                if columns.count:
                    yield _batch(partition.partition, chunk.applied_index, columns.count, opts,
                                 binary_column(columns.count, columns.key_offsets, columns.keys, opts.key_format),
                                 binary_column(columns.count, columns.value_offsets, columns.values,
                                               opts.value_format))


def _key_reads(client: Client, partition: PartitionRead, opts: ConnectorOptions) -> Iterator[pa.RecordBatch]:
    for key in partition.keys:
        read = client.read(key)
        if read.value is not None:
            yield _batch(partition.partition, read.applied_index, 1, opts,
                         to_arrow([key], opts.key_format), to_arrow([read.value], opts.value_format))


def _batch(partition: int, index: int, rows: int, opts: ConnectorOptions, keys: pa.Array,
           values: pa.Array) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [keys, values, pa.array([partition] * rows, pa.int32()), pa.array([index] * rows, pa.int64())],
        names=["key", "value", "partition", "index"],
    )
