"""A request that is not the protobuf its method takes fails with INVALID_ARGUMENT and one line.

gRPC's asyncio server parses each request before the method sees it; a body that does not parse
ends the call with UNKNOWN and logs a traceback at ERROR, so any client could fill a node's log
with them. `RejectMalformed` (the servers' interceptor) parses the body itself instead.
"""

from __future__ import annotations

from typing import Callable

import grpc
from google.protobuf.message import DecodeError


class RejectMalformed(grpc.aio.ServerInterceptor):
    def __init__(self):
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}  # per method: built once, not per call

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = self._handlers.get(details.method)
        if handler is None:
            handler = await continuation(details)
            if handler is None:  # no such method: gRPC answers UNIMPLEMENTED
                return None
            handler = self._handlers[details.method] = _parsing_itself(handler)
        return handler


def _parsing_itself(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    parse = handler.request_deserializer
    if parse is None or handler.request_streaming:  # a request stream is parsed as its handler reads it
        return handler
    if handler.unary_unary is not None:
        method = handler.unary_unary

        async def unary(body: bytes, context):
            return await method(await _parsed(parse, body, context), context)

        return grpc.unary_unary_rpc_method_handler(unary, response_serializer=handler.response_serializer)
    streaming = handler.unary_stream

    async def stream(body: bytes, context):
        async for reply in streaming(await _parsed(parse, body, context), context):
            yield reply

    return grpc.unary_stream_rpc_method_handler(stream, response_serializer=handler.response_serializer)


async def _parsed(parse: Callable[[bytes], object], body: bytes, context: grpc.aio.ServicerContext):
    try:
        return parse(body)
    except DecodeError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {exc}")
