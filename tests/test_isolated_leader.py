"""pysyncobj's isolated leader keeps believing it leads: `leader` reads from it can be
stale, `linearizable` reads must never be (they go through a barrier it cannot commit)."""

from __future__ import annotations

import os

import grpc

from raftkv import Client
from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.chaos.netcut import NetCut
from tests.conftest import wait_until
from tests.raft_admin import leader_of


def read_at(address: str, key: bytes, consistency: int) -> pb.Result:
    """A read served by exactly this node (forwarded=True: it will not forward it)."""
    with grpc.insecure_channel(address) as channel:
        request = pb.ExecuteRequest(ops=[pb.Op(partition=0, get=pb.Get(key=key))], consistency=consistency,
                                    forwarded=True)
        return kv_pb2_grpc.KVStub(channel).Execute(request, timeout=10).results[0]


def test_isolated_leader_serves_stale_leader_reads_but_never_stale_linearizable_reads(make_cluster):
    # a long fallback keeps the old leader convinced it leads while we look at it
    cluster = make_cluster(nodes=3, partitions=1, leader_fallback_timeout=20.0, request_timeout=2.0, start=False)
    spec = cluster.spec
    net = NetCut(spec, name=f"raftkv_test_isolated_{os.getpid()}")  # each node in a cgroup its rules name
    cluster.wrap_command = net.command_for
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=60)
        address = {n.id: n.api_address for n in spec.nodes}
        with Client(cluster.endpoints) as kv:
            kv.put(b"k", b"old")
        isolated = leader_of(cluster.endpoints)
        majority = [address[n] for n in spec.node_ids if n != isolated]

        net.cut([(isolated,), tuple(n for n in spec.node_ids if n != isolated)])
        new_leader = wait_until(lambda: leader_of(majority), 20, "the majority to elect a new leader")
        assert new_leader != isolated
        with Client(majority) as kv:
            kv.put(b"k", b"new")

        assert leader_of([address[isolated]]) == isolated, "the isolated node should still believe it leads"
        assert read_at(address[isolated], b"k", pb.LEADER).value == b"old"  # stale, as documented
        linearizable = read_at(address[isolated], b"k", pb.LINEARIZABLE)
        assert linearizable.code != pb.OK, "an isolated leader answered a linearizable read"
        with Client(cluster.endpoints) as kv:
            assert kv.get(b"k") == b"new"

        net.heal()
        wait_until(lambda: read_at(address[isolated], b"k", pb.FOLLOWER).value == b"new", 30,
                   "the old leader to rejoin and catch up")
    finally:
        cluster.stop_all()  # a cgroup goes only once its processes have
        net.close()
