"""Forwarding through a node's peer channels once it closed them (it is stopping: decommissioned, or
told to): real gRPC servers and channels on loopback, one event loop, no node processes."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.core.spec import build_spec, ports_per_node
from raftkv.dev.local_cluster import free_port_block
from raftkv.meta.bootstrap import spec_meta
from raftkv.node.gatekeeper import Gatekeeper
from raftkv.node.peers import CONNECT_PATIENCE, Peers
from raftkv.node.reads import LocalReads
from raftkv.node.service import KVService

PUT = pb.Op(partition=0, put=pb.Put(key=b"k", value=b"v"))
GET = pb.Op(partition=0, get=pb.Get(key=b"k"))


class _Peer(kv_pb2_grpc.KVServicer):
    """Answers forwarded requests with success until told to go silent; counts what it received."""

    def __init__(self):
        self.received = 0
        self.silent = False
        self.arrived = asyncio.Event()

    async def Execute(self, request, context):
        self.received += 1
        self.arrived.set()
        if self.silent:
            await asyncio.Event().wait()
        return pb.ExecuteResponse(results=[pb.Result()] * len(request.ops))


async def _forwarding(tmp_path, scenario) -> None:
    """`scenario(client stub, the forwarding node's Peers, the peer, its server)` with a node that holds no
    partition and forwards everything to the peer."""
    base = free_port_block(2 * ports_per_node(1) + 1)
    spec = build_spec(nodes=2, partitions=1, replication=1, base_port=base, data_dir=tmp_path)
    peer_address = f"127.0.0.1:{base + 2 * ports_per_node(1)}"
    peers = Peers(lambda node_id: peer_address, tls=None)
    peer, servers = _Peer(), [grpc.aio.server(), grpc.aio.server()]
    kv_pb2_grpc.add_KVServicer_to_server(peer, servers[0])
    servers[0].add_insecure_port(peer_address)
    topology = spec_meta(spec)
    kv_pb2_grpc.add_KVServicer_to_server(
        KVService(spec, "n1", {}, LocalReads({}), lambda: topology, peers, Gatekeeper(enforce=False, meta=lambda: topology)),
        servers[1])
    servers[1].add_insecure_port(spec.nodes[0].api_address)
    for server in servers:
        await server.start()
    try:
        async with grpc.aio.insecure_channel(spec.nodes[0].api_address) as channel:
            client = kv_pb2_grpc.KVStub(channel)
            response = await client.Execute(pb.ExecuteRequest(ops=[GET]), timeout=10)  # the peer's channel is open
            assert [r.code for r in response.results] == [pb.OK] and peer.received == 1
            await scenario(client, peers, peer, servers[0])
    finally:
        await peers.close()
        for server in servers:
            await server.stop(grace=None)


@pytest.mark.parametrize("op", [PUT, GET], ids=["write", "read"])
def test_a_request_forwarded_after_the_channels_closed_is_unavailable(tmp_path, op):
    """Found on a decommissioned node on its way out: grpc.aio raised UsageError("Channel is closed")
    and the client got UNKNOWN for a request that was never sent, and may be retried anywhere."""
    async def scenario(client, peers, peer, _):
        await peers.close()
        response = await client.Execute(pb.ExecuteRequest(ops=[op]), timeout=10)
        assert [r.code for r in response.results] == [pb.UNAVAILABLE], response
        assert peer.received == 1

    asyncio.run(_forwarding(tmp_path, scenario))


@pytest.mark.parametrize("op, code", [(PUT, pb.UNDETERMINED), (GET, pb.UNAVAILABLE)], ids=["write", "read"])
def test_a_request_in_flight_when_the_channels_close_is_undetermined_if_a_write(tmp_path, op, code):
    """Closing a channel cancels its calls: the CancelledError ended the client's call as CANCELLED,
    although the peer had the write and may apply it."""
    async def scenario(client, peers, peer, _):
        peer.silent = True
        peer.arrived.clear()
        call = client.Execute(pb.ExecuteRequest(ops=[op]), timeout=10)
        await asyncio.wait_for(peer.arrived.wait(), 10)
        await peers.close()
        response = await call
        assert [r.code for r in response.results] == [code], response

    asyncio.run(_forwarding(tmp_path, scenario))


def test_a_request_forwarded_while_the_peer_does_not_listen_yet_waits_for_it_to_listen(tmp_path):
    """Found in CI: a node elected leader of a partition before its API listened, and a request a
    follower forwarded to it in that moment was UNAVAILABLE ("failed to connect ... Connection
    refused"), a request never sent. It is sent again until the peer listens (a moment: the
    reconnect pauses are at most a second), within the request's deadline."""
    async def scenario(client, peers, peer, server):
        address = peers._address_of("n2")
        await server.stop(grace=None)
        call = client.Execute(pb.ExecuteRequest(ops=[PUT]), timeout=10)
        await asyncio.sleep(0.3)  # the forward's first attempts find the port closed
        assert peer.received == 1
        again = grpc.aio.server()
        kv_pb2_grpc.add_KVServicer_to_server(peer, again)
        again.add_insecure_port(address)
        await again.start()
        try:
            response = await call
            assert [r.code for r in response.results] == [pb.OK], response
            assert peer.received == 2
        finally:
            await again.stop(grace=None)

    asyncio.run(_forwarding(tmp_path, scenario))


def test_a_request_forwarded_to_a_peer_that_never_listens_is_unavailable_within_the_patience(tmp_path):
    async def scenario(client, peers, peer, server):
        await server.stop(grace=None)
        loop = asyncio.get_running_loop()
        started = loop.time()
        response = await client.Execute(pb.ExecuteRequest(ops=[PUT]), timeout=10)
        assert [r.code for r in response.results] == [pb.UNAVAILABLE], response
        assert "failed to connect" in response.results[0].message
        assert loop.time() - started < CONNECT_PATIENCE + 2

    asyncio.run(_forwarding(tmp_path, scenario))
