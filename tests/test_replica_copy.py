"""`copy_replica` against a real gRPC peer that sends a hostile checkpoint."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.core.errors import Unavailable
from raftkv.dev.local_cluster import free_port_block
from raftkv.node.peers import Peers
from raftkv.node.replica_copy import copy_replica


class Hostile(kv_pb2_grpc.AdminServicer):
    def __init__(self, names):
        self.names = names

    async def Checkpoint(self, request, context):
        for name in self.names:
            yield pb.CheckpointChunk(index=5, term=1, path=name, data=b"x")


@pytest.mark.parametrize("name", ["../escaped", "/etc/escaped", "db/../../escaped", ""])
def test_a_checkpoint_file_named_outside_the_checkpoint_is_refused_and_nothing_lands(tmp_path, name):
    async def scenario():
        server = grpc.aio.server()
        kv_pb2_grpc.add_AdminServicer_to_server(Hostile(["CURRENT", name]), server)
        address = f"127.0.0.1:{free_port_block(1)}"
        server.add_insecure_port(address)
        await server.start()
        peers = Peers(lambda node_id: address, None)
        try:
            with pytest.raises(Unavailable, match="would land outside the checkpoint"):
                await copy_replica(peers, ["n1"], 0, tmp_path / "data" / "p0000", [], lambda n: None)
        finally:
            await peers.close()
            await server.stop(None)

    asyncio.run(scenario())
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["data"]  # no scratch, no replica, nothing escaped
