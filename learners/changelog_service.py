"""The ChangeLog gRPC service: a learner's `changelog` sink, read over its --api-port.

Reads run on worker threads (RocksDB releases the GIL) so they never stall
the learner's loop, which keeps streaming entries meanwhile.

`Read` serves a fixed range (Spark's micro-batches); `Follow` tails the log:
it sends what is there, then waits for the sink's next synced flush instead
of making the reader poll, so a follower sees an event one flush after the
pump delivered it.
"""

from __future__ import annotations

import asyncio
from itertools import islice
from typing import Callable, Iterator, Protocol, runtime_checkable

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.core.errors import InvalidRequest
from raftkv.node.gatekeeper import Gatekeeper
from raftkv.security.permissions import Access, Request

EVERY_KEY = Request(Access.READ, b"", None)

CHUNK_CHANGES = 4096


@runtime_checkable
class ChangeSource(Protocol):
    """What a sink offers to be read back (learners/sinks/changelog_sink.py)."""

    def offsets(self, after: dict[int, int], max_rows: int) -> list[pb.PartitionOffsets]: ...

    def changes(self, partition: int, after: int, until: int) -> Iterator[pb.Change]: ...

    def on_flush(self, listener: Callable[[], None]) -> None:
        """Call `listener` (from the flushing thread) after every synced flush."""


def chunks_through(changes: Iterator[pb.Change], until: int) -> Iterator[tuple[list[pb.Change], int]]:
    """Chunks of at most CHUNK_CHANGES, each with the index through which the range is complete. Pure.

    A chunk that ends inside an entry completes only the entries before it;
    the last chunk completes the range up to `until` (entries without events too).
    """
    chunk: list[pb.Change] = []
    for change in changes:
        if len(chunk) == CHUNK_CHANGES:
            last = chunk[-1].index
            yield chunk, last if change.index > last else last - 1
            chunk = []
        chunk.append(change)
    yield chunk, until


class _Flushes:
    """Wakes every follower after each synced flush; the sink calls `notify` from its flushing thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._next = asyncio.Event()

    def notify(self) -> None:
        self._loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        self._next.set()
        self._next = asyncio.Event()

    def next(self) -> asyncio.Event:
        """Set by the first flush after this call: take it before reading, so no flush slips between."""
        return self._next


class _Tail:
    """One follower's position: per partition, what was sent, and the range being sent."""

    def __init__(self, source: ChangeSource, after: dict[int, int]):
        self.source = source
        self.sent = dict(after)
        self._open: dict[int, tuple[Iterator[tuple[list[pb.Change], int]], int]] = {}  # p -> (chunks, until)

    @property
    def reading(self) -> bool:
        return bool(self._open)

    def step(self) -> list[pb.ChangesChunk]:
        """Up to one chunk per partition that has news (runs on a worker thread)."""
        for offsets in self.source.offsets({}, 0):
            p, latest = offsets.partition, offsets.latest
            start = self.sent.setdefault(p, offsets.earliest)  # appeared since: all of it is new
            if p not in self._open and latest > start:
                self._open[p] = (chunks_through(self.source.changes(p, start, latest), latest), latest)
        out = []
        for p, (chunks, until) in list(self._open.items()):
            changes, through = next(chunks)
            self.sent[p] = max(self.sent[p], through)
            if through == until:
                del self._open[p]
            if changes:
                out.append(pb.ChangesChunk(partition=p, changes=changes, through=through))
        return out


class ChangeLogService(kv_pb2_grpc.ChangeLogServicer):
    """Every partition's changes: each call needs read access to every key."""

    def __init__(self, source: ChangeSource, loop: asyncio.AbstractEventLoop, gate: Gatekeeper):
        self.source = source
        self._gate = gate
        self._flushes = _Flushes(loop)
        source.on_flush(self._flushes.notify)

    async def Offsets(self, request: pb.OffsetsRequest, context) -> pb.OffsetsResponse:
        await self._gate.admit(context, EVERY_KEY)
        partitions = await asyncio.to_thread(self.source.offsets, dict(request.after), request.max_rows)
        return pb.OffsetsResponse(partitions=partitions)

    async def Read(self, request: pb.ChangesRequest, context):
        await self._gate.admit(context, EVERY_KEY)
        try:
            changes = self.source.changes(request.partition, request.after, request.until)
            while chunk := await asyncio.to_thread(lambda: list(islice(changes, CHUNK_CHANGES))):
                yield pb.ChangesChunk(changes=chunk)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))

    async def Follow(self, request: pb.FollowRequest, context):
        await self._gate.admit(context, EVERY_KEY)
        try:
            starts = await asyncio.to_thread(self.source.offsets, {}, 0)
            tail = _Tail(self.source, {**{o.partition: o.latest for o in starts}, **request.after})
            while True:
                flushed = self._flushes.next()
                for chunk in await asyncio.to_thread(tail.step):
                    yield chunk
                if not tail.reading:
                    await flushed.wait()
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))
