"""The ChangeLog gRPC service: a learner's `changelog` sink, read over its --api-port.

Reads run on worker threads (RocksDB releases the GIL) so they never stall
the learner's loop, which keeps streaming entries meanwhile.

`Read` serves a fixed range (Spark's micro-batches); `Follow` tails the log:
it sends what is there, then waits for the sink's next synced flush instead
of making the reader poll, so a follower sees an event one flush after the
pump delivered it. A follower that has everything up to where a flush starts
is sent that flush's changes from memory, on the loop: no worker thread, no
read of the log (docs/learners.md, "Reading the changelog sink").
"""

from __future__ import annotations

import asyncio
from collections import deque
from itertools import islice
from typing import TYPE_CHECKING, Callable, Iterator, Protocol, runtime_checkable

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.core.errors import InvalidRequest
from raftkv.node.gatekeeper import Gatekeeper
from raftkv.security.permissions import Access, Request

if TYPE_CHECKING:
    from learners.sinks.changelog_sink import Flushed

EVERY_KEY = Request(Access.READ, b"", None)

CHUNK_CHANGES = 4096
KEPT_FLUSHES = 64  # flushes whose changes stay in memory for followers still sending an earlier one


@runtime_checkable
class ChangeSource(Protocol):
    """What a sink offers to be read back (learners/sinks/changelog_sink.py)."""

    def offsets(self, after: dict[int, int], max_rows: int) -> list[pb.PartitionOffsets]: ...

    def changes(self, partition: int, after: int, until: int) -> Iterator[pb.Change]: ...

    def on_flush(self, listener: Callable[[Flushed], None]) -> None:
        """Call `listener` (from the flushing thread) after every synced flush, with what it added."""


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


class _Flush:
    """One synced flush, linked to the next: each follower walks the chain from where it is."""

    def __init__(self, flushed: Flushed | None):
        self.flushed = flushed  # None: not kept (or the chain's start); read the log instead
        self.next: _Flush | None = None
        self._followed = asyncio.Event()

    async def arrivals(self) -> tuple[_Flush, list[Flushed | None]]:
        """The flushes after this one so far (waiting for the first), and the last of them."""
        await self._followed.wait()
        flush, flushed = self, []
        while flush.next is not None:
            flush = flush.next
            flushed.append(flush.flushed)
        return flush, flushed

    def follow_with(self, flush: _Flush) -> None:
        self.next = flush
        self._followed.set()


class _Flushes:
    """The chain of the sink's flushes; the sink calls `notify` from its flushing thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self.latest = _Flush(None)
        self._kept: deque[_Flush] = deque()

    def notify(self, flushed: Flushed) -> None:
        self._loop.call_soon_threadsafe(self._append, flushed)

    def _append(self, flushed: Flushed) -> None:
        flush = _Flush(flushed)
        self.latest.follow_with(flush)
        self.latest = flush
        self._kept.append(flush)
        if len(self._kept) > KEPT_FLUSHES:  # a follower that far behind reads the log
            self._kept.popleft().flushed = None


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

    def take(self, flushes: list[Flushed | None]) -> list[pb.ChangesChunk] | None:
        """Consecutive flushes' changes, at most a chunk per partition (unless one holds more than
        CHUNK_CHANGES), if for every partition they moved the tail has sent exactly up to where one starts
        (or past its end: skipped); None otherwise (behind, a new partition, a flush not kept): read the log."""
        sent, changes = dict(self.sent), {}
        for flushed in flushes:
            if flushed is None:
                return None
            for p, through in flushed.through.items():
                if sent.get(p, -1) >= through:
                    continue
                if sent.get(p) != flushed.after[p]:
                    return None
                sent[p] = through
                changes.setdefault(p, []).extend(flushed.changes.get(p, ()))
        out = []
        for p, raw in changes.items():
            for chunk, through in chunks_through(map(pb.Change.FromString, raw), sent[p]):
                if chunk:
                    out.append(pb.ChangesChunk(partition=p, changes=chunk, through=through))
        self.sent = sent
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
            flush = self._flushes.latest  # taken before reading: every later flush follows it
            starts = await asyncio.to_thread(self.source.offsets, {}, 0)
            tail = _Tail(self.source, {**{o.partition: o.latest for o in starts}, **request.after})
            while True:
                for chunk in await asyncio.to_thread(tail.step):  # what the log holds past the tail
                    yield chunk
                if tail.reading:
                    continue
                while True:  # then the flushes, from memory while the tail is where they start
                    flush, flushes = await flush.arrivals()
                    if (chunks := tail.take(flushes)) is None:
                        break
                    for chunk in chunks:
                        yield chunk
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))
