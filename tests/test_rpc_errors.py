"""Whether a failed gRPC call may have reached the other side."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.api.rpc_errors import error_metadata, error_of, never_sent
from raftkv.core.errors import NotLeader, Unavailable
from raftkv.dev.local_cluster import free_port_block


@pytest.mark.parametrize("code, details, expected", [
    (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:7000: "
                                  "Failed to connect to remote host: Connection refused", True),
    # a node killed while the request was in flight: it may have been delivered, even applied
    (grpc.StatusCode.UNAVAILABLE, "recvmsg:Connection reset by peer", False),
    (grpc.StatusCode.UNAVAILABLE, "Connection reset by peer", False),
    (grpc.StatusCode.UNAVAILABLE, "Stream removed (Socket closed)", False),
    (grpc.StatusCode.UNAVAILABLE, "connection aborted", False),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", False),
])
def test_only_a_channel_that_never_connected_means_the_request_was_never_sent(code, details, expected):
    """Found by the chaos harness: any detail containing "connect" counted as never sent, so a write
    whose leader was killed mid-request ("Connection reset by peer") was retried and applied twice
    (a cas then saw its own effect undone: a register read an older write after a newer one)."""
    assert never_sent(grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)) is expected


def test_grpcs_own_status_for_a_channel_that_cannot_connect_reads_as_never_sent():
    """The text `never_sent` looks for, as this grpcio makes it (a release that rewords it fails here)."""
    async def call() -> grpc.aio.AioRpcError:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{free_port_block(1)}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await kv_pb2_grpc.KVStub(channel).Status(pb.StatusRequest(), timeout=5)
        return failed.value

    exc = asyncio.run(call())
    assert exc.code() == grpc.StatusCode.UNAVAILABLE and never_sent(exc), exc.details()


def test_the_error_a_server_attaches_comes_back_as_the_same_error():
    def failed(error):
        return grpc.aio.AioRpcError(grpc.StatusCode.FAILED_PRECONDITION, grpc.aio.Metadata(),
                                    grpc.aio.Metadata(*error_metadata(error)), str(error))

    back = error_of(failed(NotLeader(3, "n2")), partition=3)
    assert isinstance(back, NotLeader) and back.leader_hint == "n2" and back.partition == 3
    assert isinstance(error_of(failed(Unavailable("no leader yet")), 3), Unavailable)
    assert error_of(grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata()), 3) is None
