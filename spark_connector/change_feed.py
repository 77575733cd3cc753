"""The change feed as a Spark source: offsets are Raft indices per partition.

It reads a learner that runs the `changelog` sink (option changelog=HOST:PORT,
the learner's --api-port). That log is immutable and ordered by (partition,
index, seq), so re-reading a range after a restart returns the same rows:
with Spark's checkpoint and an idempotent sink every change arrives once.
The same ranges serve a batch read of the retained feed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from learners.changelog_client import ChangeLogClient, optional_bytes
from raftkv.api import kv_pb2 as pb
from spark_connector.columns import to_arrow
from spark_connector.options import ConnectorOptions

Offsets = dict[str, int]  # JSON-able: {"partition": index}


@dataclass(frozen=True)
class ChangeRange(InputPartition):
    partition: int
    after: int
    until: int


def fetch_offsets(options: ConnectorOptions, after: dict[int, int] | None = None,
                  max_rows: int = 0) -> list[pb.PartitionOffsets]:
    with ChangeLogClient(options.changelog, options.timeout, options.tls, options.token) as log:
        return log.offsets(after, max_rows)


def ranges(start: Offsets, end: Offsets) -> list[ChangeRange]:
    return [ChangeRange(int(p), start.get(p, 0), until) for p, until in sorted(end.items(), key=lambda kv: int(kv[0]))
            if until > start.get(p, 0)]


def read_range(options: ConnectorOptions, r: ChangeRange) -> Iterator[pa.RecordBatch]:
    with ChangeLogClient(options.changelog, options.timeout, options.tls, options.token) as log:
        for chunk in log.read(r.partition, r.after, r.until):
            yield _batch(chunk.changes, r.partition, options)


def _batch(changes, partition: int, options: ConnectorOptions) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array([partition] * len(changes), pa.int32()),
            pa.array([c.index for c in changes], pa.int64()),
            pa.array([c.seq for c in changes], pa.int32()),
            pa.array([c.op for c in changes], pa.string()),
            to_arrow([c.key for c in changes], options.key_format),
            to_arrow([optional_bytes(c, "after") for c in changes], options.value_format),
            to_arrow([optional_bytes(c, "before") for c in changes], options.value_format),
            pa.array([c.term for c in changes], pa.int64()),
            pa.array([c.snapshot for c in changes], pa.bool_()),
            pa.array([c.ts_ms for c in changes], pa.int64()),
        ],
        names=["partition", "index", "seq", "op", "key", "value", "before", "term", "snapshot", "ts_ms"],
    )


class ChangeFeedStreamReader(DataSourceStreamReader):
    def __init__(self, options: ConnectorOptions):
        self.options = options

    def initialOffset(self) -> Offsets:
        offsets = fetch_offsets(self.options)
        if self.options.starting_offsets == "earliest":
            return {str(o.partition): o.earliest for o in offsets}
        if self.options.starting_offsets == "latest":
            return {str(o.partition): o.latest for o in offsets}
        return {str(p): i for p, i in self.options.starting_offsets.items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        rows = self.options.max_rows_per_trigger
        return ReadMaxRows(rows) if rows else ReadAllAvailable()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else 0
        offsets = fetch_offsets(self.options, {int(p): i for p, i in start.items()}, max_rows)
        return {**start, **{str(o.partition): o.end for o in offsets}}

    def partitions(self, start: Offsets, end: Offsets) -> list[ChangeRange]:
        return ranges(start, end)

    def read(self, partition: ChangeRange) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, partition)

    def commit(self, end: Offsets) -> None:
        pass  # the changelog keeps its own retention; nothing to release


class ChangeFeedBatchReader(DataSourceReader):
    """The retained feed, earliest to latest, as a batch."""

    def __init__(self, options: ConnectorOptions):
        self.options = options

    def partitions(self) -> list[ChangeRange]:
        offsets = fetch_offsets(self.options)
        return ranges({str(o.partition): o.earliest for o in offsets}, {str(o.partition): o.latest for o in offsets})

    def read(self, partition: ChangeRange) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, partition)
