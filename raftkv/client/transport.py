"""How the client's Execute requests reach one node: on the node's `ExecuteStream`, or as unary calls.

One `NodeTransport` per node address. Requests go on one long-lived stream (a message on an open
stream costs the node far less than a unary call), matched to their responses by id; a node without
the method (a release before it: UNIMPLEMENTED) gets unary `Execute` calls for REPROBE_SECONDS, then
the stream is tried again (docs/raft-engine.md, "Step 6"). Either way a request ends as a unary call
would: its response, a refusal of the caller (`refusal_error`), or a `TransportError` that says whether
the node can have received it. A broken stream fails every request on it so, and the next request
opens a new stream. `reopen` moves the transport to a new channel (renewed TLS files): the old stream
takes no more requests and is half-closed, so the node answers the ones it has and ends it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Callable

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.api.convert import error_from_result
from raftkv.api.rpc_errors import never_sent
from raftkv.core.errors import PermissionDenied, RaftKVError, ResourceExhausted, Unauthenticated

REPROBE_SECONDS = 60.0  # how long a node that lacked ExecuteStream gets unary calls before it is asked again
_MAX_TIMEOUT_MS = 2**32 - 1  # the field's limit (49 days): a longer timeout is as good as none
_DEADLINE = "DEADLINE_EXCEEDED: Deadline Exceeded"  # what grpc says of a unary call past its deadline


class TransportError(Exception):
    """The request got no answer; `never_sent`: the node cannot have received it."""

    def __init__(self, never_sent: bool, detail: str):
        self.never_sent = never_sent
        super().__init__(detail)


def refusal_error(exc: grpc.aio.AioRpcError) -> RaftKVError | None:
    """The final error of a call the node refused for who made it (not retried anywhere else)."""
    if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(exc.details())
    if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated(exc.details())
    if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:  # a limit of the node's, or gRPC's message size
        return ResourceExhausted(exc.details())
    return None


class _NoStream(Exception):
    """The node has no ExecuteStream: it received none of the stream's requests."""


class NodeTransport:
    def __init__(self, stub: kv_pb2_grpc.KVStub, timeout: float):
        self._stub = stub
        self._timeout = timeout
        self._stream: _Stream | None = None
        self._retiring: set[_Stream] = set()  # streams of channels left behind, until the node ends them
        self._unary_until = 0.0  # loop time

    async def execute(self, request: pb.ExecuteRequest) -> pb.ExecuteResponse:
        if asyncio.get_running_loop().time() >= self._unary_until:
            if self._stream is None or self._stream.broken:
                self._stream = _Stream(self._stub, self._timeout)
            try:
                return await self._stream.send(request)
            except _NoStream:
                self._unary_until = asyncio.get_running_loop().time() + REPROBE_SECONDS
        return await self._unary(request)

    async def _unary(self, request: pb.ExecuteRequest) -> pb.ExecuteResponse:
        try:
            return await self._stub.Execute(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            raise refusal_error(exc) or TransportError(never_sent(exc), f"{exc.code().name}: {exc.details()}") from None

    def reopen(self, stub: kv_pb2_grpc.KVStub) -> None:
        """Send from now on through `stub`; the requests in flight are answered on the stream they went on."""
        self._stub = stub
        if self._stream is not None and not self._stream.broken:
            stream = self._stream
            self._retiring.add(stream)
            stream.retire(lambda: self._retiring.discard(stream))
        self._stream = None

    def close(self) -> None:
        for stream in [*self._retiring, *([self._stream] if self._stream is not None else [])]:
            stream.close()
        self._retiring.clear()


@dataclass
class _Pending:
    future: asyncio.Future
    timer: asyncio.TimerHandle
    sent: bool = False  # written to the stream: from then on the node may have it


class _Stream:
    """One ExecuteStream call: a writer sending requests in turn (grpc takes one write at a time), a
    reader matching responses to them by id, and a deadline timer per request."""

    def __init__(self, stub: kv_pb2_grpc.KVStub, timeout: float):
        self._loop = asyncio.get_running_loop()
        self._timeout = timeout
        self._call = stub.ExecuteStream()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._outbox: deque[pb.ExecuteRequest] = deque()
        self._writer: asyncio.Task | None = None  # held: a task nothing references may vanish mid-write
        self._retired = False
        self.broken = False
        self._reader = self._loop.create_task(self._read())

    def send(self, request: pb.ExecuteRequest) -> asyncio.Future:
        request.id = request_id = next(self._ids)
        request.timeout_ms = min(int(self._timeout * 1000), _MAX_TIMEOUT_MS)
        future = self._loop.create_future()
        self._pending[request_id] = _Pending(future, self._loop.call_later(self._timeout, self._expire, request_id))
        self._outbox.append(request)
        self._start_writing()
        return future

    def retire(self, ended: Callable[[], None]) -> None:
        """No more requests: once those queued are written, the stream is half-closed; `ended` when it is over."""
        self._retired = True
        self._reader.add_done_callback(lambda _: ended())
        self._start_writing()

    def _start_writing(self) -> None:
        """A writer, unless one runs (it takes what is queued: it ends only with an empty outbox, no await
        between its last look and its end)."""
        if self._writer is None or self._writer.done():
            self._writer = self._loop.create_task(self._write())

    async def _write(self) -> None:
        try:
            while self._outbox and not self.broken:
                request = self._outbox.popleft()
                await self._call.write(request)
                if (pending := self._pending.get(request.id)) is not None:
                    pending.sent = True
            if self._retired and not self.broken:
                await self._call.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            pass  # the stream ended: the reader fails what is pending

    async def _read(self) -> None:
        try:
            while (response := await self._call.read()) is not grpc.aio.EOF:
                pending = self._pending.pop(response.id, None)
                if pending is None:  # its deadline passed: already failed
                    continue
                pending.timer.cancel()
                if not pending.future.done():
                    _answer(pending.future, response)
            # A stream the node ended with OK answered every request it read (raftkv.node.execute_stream)
            self._fail(lambda sent: TransportError(True, "the node is stopping: it ended the stream"))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._fail(lambda sent: _NoStream())
            else:
                detail = f"{exc.code().name}: {exc.details()}"
                self._fail(lambda sent: TransportError(never_sent(exc) or not sent, detail))
        except asyncio.CancelledError:
            self._fail(lambda sent: TransportError(not sent, "CANCELLED: the client closed"))
            raise
        except Exception as exc:  # a response that does not parse: the stream is of no more use
            self._call.cancel()
            self._fail(lambda sent: TransportError(not sent, f"the stream broke: {exc!r}"))

    def _fail(self, error_for) -> None:
        """The stream is over: every request without an answer fails with `error_for(sent)`."""
        self.broken = True
        pending, self._pending = self._pending, {}
        self._outbox.clear()
        for entry in pending.values():
            entry.timer.cancel()
            if not entry.future.done():
                entry.future.set_exception(error_for(entry.sent))

    def _expire(self, request_id: int) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is not None and not pending.future.done():
            pending.future.set_exception(TransportError(False, _DEADLINE))

    def close(self) -> None:
        self._call.cancel()
        self._reader.cancel()
        if self._writer is not None:
            self._writer.cancel()


def _answer(future: asyncio.Future, response: pb.ExecuteResponse) -> None:
    if not response.HasField("refused"):
        future.set_result(response)
        return
    refused = response.refused
    if refused.code in (pb.UNAUTHENTICATED, pb.RESOURCE_EXHAUSTED):
        future.set_exception(error_from_result(refused, 0))
    else:  # the node failed it, as a unary call ending with UNKNOWN: it may have been applied
        future.set_exception(TransportError(False, refused.message))
