"""A node's side of `KV.ExecuteStream`: many Execute requests on one stream, each served in a task of
its own and answered with its id as soon as it is done, in any order (docs/raft-engine.md, "Step 6").

Each request is what a unary `Execute` call is to the node: `answer` serves it (the servicer's one
path for both), and its `timeout_ms` cancels it as gRPC cancels a unary handler at its deadline (no
answer: the client's own timer has failed it). The stream ends once the client half-closes, or the
node stops (`stopping`: no more requests are read), and every request read is answered: a stream that
ends with OK has answered every request the node took, so the client knows the rest were never run.
Cancelled (the client went away), it cancels the requests still being served.
"""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Awaitable, Callable

import grpc
from google.protobuf.message import DecodeError

from raftkv.api import kv_pb2 as pb

log = logging.getLogger(__name__)


class _Malformed(Exception):
    pass


async def answer_stream(requests: AsyncIterator[pb.ExecuteRequest], context: grpc.aio.ServicerContext,
                        answer: Callable[[pb.ExecuteRequest], Awaitable[pb.ExecuteResponse]],
                        stopping: asyncio.Event) -> AsyncIterator[pb.ExecuteResponse]:
    loop = asyncio.get_running_loop()
    answers: asyncio.Queue[pb.ExecuteResponse | Exception | None] = asyncio.Queue()
    serving: set[asyncio.Task] = set()
    reading = True

    def finished(task: asyncio.Task, request: pb.ExecuteRequest, timer: asyncio.TimerHandle | None) -> None:
        serving.discard(task)
        if timer is not None:
            timer.cancel()
        if not task.cancelled():
            if (error := task.exception()) is None:
                answers.put_nowait(task.result())
            else:  # as a unary handler's unexpected error: the client cannot know whether it was applied
                log.error("ExecuteStream request failed", exc_info=error)
                answers.put_nowait(pb.ExecuteResponse(id=request.id, refused=pb.Result(
                    code=pb.UNDETERMINED, message=f"the node failed the request: {error!r}")))
        if not reading and not serving:
            answers.put_nowait(None)

    def serve(request: pb.ExecuteRequest) -> None:
        task = loop.create_task(answer(request))
        timer = loop.call_later(request.timeout_ms / 1000, task.cancel) if request.timeout_ms else None
        serving.add(task)
        task.add_done_callback(lambda t: finished(t, request, timer))

    async def read() -> None:
        nonlocal reading
        try:
            async for request in requests:
                serve(request)
        except asyncio.CancelledError:
            if not stopping.is_set():
                raise
        except DecodeError as exc:
            answers.put_nowait(_Malformed(f"malformed request: {exc}"))
            return
        except Exception as exc:  # raised where the stream is answered
            answers.put_nowait(exc)
            return
        reading = False
        if not serving:
            answers.put_nowait(None)

    reader = loop.create_task(read())
    stop = loop.create_task(stopping.wait())
    stop.add_done_callback(lambda _: reader.cancel())
    try:
        while (response := await answers.get()) is not None:
            if isinstance(response, _Malformed):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(response))
            if isinstance(response, Exception):
                raise response
            yield response
    finally:
        stop.cancel()
        reader.cancel()
        for task in list(serving):
            task.cancel()
