"""The `KV` service over in-memory twins of its ports (`raftkv/node/ports.py`): real gRPC on loopback, one
event loop, no node process and no Raft. A partition's twin applies each write at once to a
`MemoryEngine`, as a leader that never loses one would."""

from __future__ import annotations

import asyncio
from typing import Iterator

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.core.commands import Command, Put, RegisterLearner
from raftkv.core.errors import NotLeader
from raftkv.core.learner_registry import learner_names, register_updates
from raftkv.core.partitioning import partition_for_key
from raftkv.core.release import VERSION
from raftkv.core.spec import build_spec, ports_per_node
from raftkv.core.state_machine import apply_proposal
from raftkv.dev.local_cluster import free_port_block
from raftkv.meta.bootstrap import spec_meta
from raftkv.node.gatekeeper import Gatekeeper
from raftkv.node.peers import Peers
from raftkv.node.ports import VoterStatus
from raftkv.node.service import SCAN_CHUNK_ITEMS, KVService
from raftkv.storage.engine import KeyRange, MemoryEngine, Position

TERM = 3
PARTITIONS = 3


def key_in(partition: int, name: bytes) -> bytes:
    """A key named `name` that belongs to `partition`."""
    return next(k for i in range(100) if partition_for_key(k := b"%s-%d" % (name, i), PARTITIONS) == partition)


class TwinVoter:
    """`ports.Proposals` of one partition: a leader (or a follower naming `leader`) over a MemoryEngine."""

    def __init__(self, partition: int, leader: str | None = None):
        self.partition = partition
        self.engine = MemoryEngine()
        self.leader = leader  # None: this voter leads
        self.barriers = 0

    @property
    def is_leader(self) -> bool:
        return self.leader is None

    def not_leader(self) -> NotLeader:
        return NotLeader(self.partition, self.leader)

    def submit(self, command: Command) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        if not self.is_leader:
            future.set_exception(self.not_leader())
            return future
        applied = apply_proposal(self.engine.get, [command], self.engine.meta_get)
        self.engine.write(applied.mutations, Position(self.engine.position.index + 1, TERM), applied.meta)
        future.set_result(applied.results[0])
        return future

    def barrier(self) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        if not self.is_leader:
            future.set_exception(self.not_leader())
        else:
            self.barriers += 1
            future.set_result(None)
        return future


class TwinReads:
    """`ports.ReadPort` over the twins: a follower answers follower reads, a leader every level."""

    def __init__(self, voters: dict[int, TwinVoter]):
        self._voters = voters

    def holds(self, partition: int) -> bool:
        return partition in self._voters

    def serves(self, partition: int, consistency: int) -> bool:
        return self.holds(partition) and (self._voters[partition].is_leader or consistency == pb.FOLLOWER)

    async def _ready(self, voter: TwinVoter, consistency: int) -> None:
        if consistency != pb.FOLLOWER:
            await voter.barrier()

    async def get(self, partition: int, key: bytes, consistency: int) -> tuple[bytes | None, int]:
        voter = self._voters[partition]
        await self._ready(voter, consistency)
        return voter.engine.get(key), voter.engine.position.index

    async def scan(self, partition: int, key_range: KeyRange,
                   consistency: int) -> tuple[Position, Iterator[tuple[bytes, bytes]]]:
        voter = self._voters[partition]
        await self._ready(voter, consistency)
        return voter.engine.scan(key_range)

    def statuses(self) -> list[VoterStatus]:
        return [VoterStatus(p, "leader" if v.is_leader else "follower", v.leader or "n1", TERM,
                            v.engine.position.index, v.engine.position.index, v.engine.position.index, True,
                            v.engine.position.index, (), ("n1",))
                for p, v in sorted(self._voters.items())]

    def leaderships(self) -> list[tuple[int, int]]:
        return [(p, TERM) for p, v in sorted(self._voters.items()) if v.is_leader]

    def learner_names(self) -> set[str]:
        return set().union(*(learner_names(v.engine.meta_items()) for v in self._voters.values()))


async def serving(tmp_path, scenario) -> None:
    """`scenario(stub, voters)` against node n1 of a 3-node, 3-partition cluster that holds a leader of
    partition 0, a follower of partition 1 (n2 leads it) and nothing of partition 2."""
    base = free_port_block(3 * ports_per_node(PARTITIONS))
    spec = build_spec(nodes=3, partitions=PARTITIONS, replication=2, base_port=base, data_dir=tmp_path)
    topology = spec_meta(spec)
    voters = {0: TwinVoter(0), 1: TwinVoter(1, leader="n2")}
    peers = Peers(lambda node_id: topology.node(node_id).api_address, tls=None)
    service = KVService(spec, "n1", voters, TwinReads(voters), lambda: topology, peers,
                        Gatekeeper(enforce=False, meta=lambda: topology))
    server = grpc.aio.server()
    kv_pb2_grpc.add_KVServicer_to_server(service, server)
    server.add_insecure_port(spec.nodes[0].api_address)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(spec.nodes[0].api_address) as channel:
            await scenario(kv_pb2_grpc.KVStub(channel), voters, topology)
    finally:
        await peers.close()
        await server.stop(grace=None)


def execute(stub, *ops: pb.Op, consistency=pb.LINEARIZABLE):
    return stub.Execute(pb.ExecuteRequest(ops=ops, consistency=consistency, forwarded=True), timeout=10)


def test_writes_and_reads_go_through_the_ports_each_level_waiting_as_it_should(tmp_path):
    async def scenario(stub, voters, _topology):
        k, f, g = key_in(0, b"k"), key_in(1, b"f"), key_in(2, b"g")
        put = pb.Op(partition=0, put=pb.Put(key=k, value=b"v1"))
        cas = pb.Op(partition=0, cas=pb.Cas(key=k, expected=b"v1", new=b"v2"))
        response = await execute(stub, put, cas, pb.Op(partition=0, get=pb.Get(key=k)))
        assert [r.code for r in response.results] == [pb.OK] * 3
        assert response.results[1].cas_succeeded
        assert (response.results[2].value, response.results[2].applied_index) == (b"v2", 2)
        assert voters[0].barriers == 1 and voters[0].engine.get(k) == b"v2"

        voters[1].engine.write([Put(f, b"here")], Position(7, TERM))
        follower_read = pb.Op(partition=1, get=pb.Get(key=f))
        response = await execute(stub, follower_read, consistency=pb.FOLLOWER)
        assert (response.results[0].value, response.results[0].applied_index) == (b"here", 7)

        refused = await execute(stub, follower_read, pb.Op(partition=1, put=pb.Put(key=f, value=b"x")),
                                pb.Op(partition=2, get=pb.Get(key=g)), pb.Op(partition=3, get=pb.Get(key=g)))
        assert [(r.code, r.leader_hint) for r in refused.results] == [
            (pb.NOT_LEADER, "n2"), (pb.NOT_LEADER, "n2"), (pb.NOT_LEADER, "n3"), (pb.INVALID, "")]
        assert voters[1].engine.get(f) == b"here"

    asyncio.run(serving(tmp_path, scenario))


def test_a_scan_reports_the_position_of_the_view_it_read_in_every_chunk(tmp_path):
    async def scenario(stub, voters, _topology):
        keys = [b"k%05d" % i for i in range(SCAN_CHUNK_ITEMS + 10)]
        voters[0].engine.write([Put(k, b"v") for k in keys], Position(41, TERM))
        chunks = [c async for c in stub.Scan(pb.ScanRequest(partition=0, start=b"k"), timeout=10)]
        assert [len(c.items) for c in chunks] == [SCAN_CHUNK_ITEMS, 10]
        assert {(c.applied_index, c.applied_term) for c in chunks} == {(41, TERM)}
        assert [kv.key for c in chunks for kv in c.items] == keys and voters[0].barriers == 1

        empty = [c async for c in stub.Scan(pb.ScanRequest(partition=0, start=b"z"), timeout=10)]
        assert [(len(c.items), c.applied_index) for c in empty] == [(0, 41)]
        try:
            await stub.Scan(pb.ScanRequest(partition=2), timeout=10).read()
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION and "leader is n3" in exc.details()
        else:
            raise AssertionError("a scan of a partition held elsewhere was answered here")

    asyncio.run(serving(tmp_path, scenario))


def test_status_tells_where_each_voter_here_stands_and_the_placement(tmp_path):
    async def scenario(stub, voters, topology):
        await execute(stub, pb.Op(partition=0, put=pb.Put(key=key_in(0, b"k"), value=b"v")))
        status = await stub.Status(pb.StatusRequest(), timeout=10)
        assert [(h.partition, h.role, h.leader, h.applied_index, list(h.replicas)) for h in status.hosted] == [
            (0, "leader", "n1", 1, list(topology.placement[0])), (1, "follower", "n2", 0, list(topology.placement[1]))]
        assert status.node_id == "n1" and [n.id for n in status.nodes] == ["n1", "n2", "n3"]

    asyncio.run(serving(tmp_path, scenario))


def test_a_brief_status_names_the_partitions_led_here_and_every_learner_registered_here(tmp_path):
    async def scenario(stub, voters, _topology):
        voters[1].engine.write([], Position(5, TERM), register_updates(RegisterLearner("feed", "kafka")))
        brief = await stub.Status(pb.StatusRequest(brief=True), timeout=10)
        assert [(h.partition, h.role, h.term) for h in brief.hosted] == [(0, "leader", TERM)]
        assert list(brief.learners) == ["feed"] and brief.version == VERSION and brief.node_id == "n1"
        full = await stub.Status(pb.StatusRequest(), timeout=10)
        assert [h.partition for h in full.hosted] == [0, 1] and not full.learners

    asyncio.run(serving(tmp_path, scenario))
