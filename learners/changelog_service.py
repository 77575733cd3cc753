"""The ChangeLog gRPC service: a learner's `changelog` sink, read over its --api-port.

Reads run on worker threads (RocksDB releases the GIL) so they never stall
the learner's loop, which keeps streaming entries meanwhile.
"""

from __future__ import annotations

import asyncio
from itertools import islice
from typing import Iterator, Protocol, runtime_checkable

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.errors import InvalidRequest

CHUNK_CHANGES = 4096


@runtime_checkable
class ChangeSource(Protocol):
    """What a sink offers to be read back (learners/sinks/changelog_sink.py)."""

    def offsets(self, after: dict[int, int], max_rows: int) -> list[pb.PartitionOffsets]: ...

    def changes(self, partition: int, after: int, until: int) -> Iterator[pb.Change]: ...


class ChangeLogService(kv_pb2_grpc.ChangeLogServicer):
    def __init__(self, source: ChangeSource):
        self.source = source

    async def Offsets(self, request: pb.OffsetsRequest, context) -> pb.OffsetsResponse:
        partitions = await asyncio.to_thread(self.source.offsets, dict(request.after), request.max_rows)
        return pb.OffsetsResponse(partitions=partitions)

    async def Read(self, request: pb.ChangesRequest, context):
        try:
            changes = self.source.changes(request.partition, request.after, request.until)
            while chunk := await asyncio.to_thread(lambda: list(islice(changes, CHUNK_CHANGES))):
                yield pb.ChangesChunk(changes=chunk)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))
