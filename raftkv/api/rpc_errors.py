"""What a failed gRPC call says about whether the other side may have received it."""

from __future__ import annotations

import grpc


def never_sent(exc: grpc.aio.AioRpcError) -> bool:
    """The call failed before the server could have received it: the channel never connected.

    Only gRPC's "failed to connect to all addresses" says so. Other UNAVAILABLE details, such as
    "Connection reset by peer" or "Socket closed" (a node killed mid-request), come after the
    request may have been delivered: a write that failed so must be Undetermined, never retried.
    """
    return (exc.code() == grpc.StatusCode.UNAVAILABLE
            and "failed to connect to all addresses" in (exc.details() or "").lower())
