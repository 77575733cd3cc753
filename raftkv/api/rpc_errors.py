"""What a failed gRPC call says: whether the other side may have received it, and the error it sent."""

from __future__ import annotations

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.api.convert import error_from_result, result_from_error
from raftkv.core.errors import RaftKVError


def never_sent(exc: grpc.aio.AioRpcError) -> bool:
    """The call failed before the server could have received it: the channel never connected.

    Only gRPC's "failed to connect to all addresses" says so. Other UNAVAILABLE details, such as
    "Connection reset by peer" or "Socket closed" (a node killed mid-request), come after the
    request may have been delivered: a write that failed so must be Undetermined, never retried.

    Why the text and nothing sturdier (docs/architecture.md, "Write path" step 7): that status is made
    by the channel's pick_first picker while the channel is in TRANSIENT_FAILURE, before the call has a
    connection (gRPC's wait-for-ready semantics: such a call fails "without sending"); no field of
    AioRpcError says where a status was made, only its code and texts. Metadata from the server
    cannot stand in: it proves a call was received, never that one was not (a server killed after
    reading the request and before its headers left leaves the client with UNAVAILABLE and no
    metadata). If a gRPC upgrade rewords the text, this answers False: writes become Undetermined
    rather than retried (safe; tests/test_rpc_errors.py reads the real status, and fails).
    """
    return (exc.code() == grpc.StatusCode.UNAVAILABLE
            and "failed to connect to all addresses" in (exc.details() or "").lower())


# A call the server ends with an error carries the error as a `Result` in this trailing
# metadata entry (a streaming call has no response message to hold it), beside the gRPC
# status and a human-readable detail for clients that do not look.
ERROR_KEY = "raftkv-error-bin"


def error_metadata(error: RaftKVError) -> tuple[tuple[str, bytes], ...]:
    return ((ERROR_KEY, result_from_error(error).SerializeToString()),)


def error_of(exc: grpc.aio.AioRpcError, partition: int) -> RaftKVError | None:
    """The error the server attached to a failed call (None: it attached none)."""
    for key, value in exc.trailing_metadata() or ():
        if key == ERROR_KEY:
            return error_from_result(pb.Result.FromString(value), partition)
    return None
