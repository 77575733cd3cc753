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
from raftkv.node.replica_copy import checkpoint_chunks, copy_replica
from raftkv.core.commands import Put
from raftkv.raft import snapshot_file
from raftkv.raft.syncobj_snapshots import SNAPSHOT_FILE
from raftkv.storage.engine import Position
from raftkv.storage.rocks_engine import RocksEngine


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


class _Replaying:
    """A voter just restarted and still replaying its journal: its database holds entries up to 6539,
    pysyncobj has applied up to 6438 so far, and its log holds 6400 to 6600 (issue 32)."""

    def __init__(self, folder):
        self.folder = folder
        self.engine = RocksEngine(folder / "db")
        self.engine.write([Put(b"k", b"v")], Position(6539, 3))
        self.group = self

    last_applied = 6438

    def log_base_at(self, index: int):
        return ((b"\x00", index - 1, 3), (b"\x00", index, 3)) if 6400 < index <= 6600 else None


class Voter(kv_pb2_grpc.AdminServicer):
    def __init__(self, replica):
        self.replica = replica

    async def Checkpoint(self, request, context):
        async for chunk in checkpoint_chunks(self.replica):
            yield chunk


class BadBase(kv_pb2_grpc.AdminServicer):
    async def Checkpoint(self, request, context):  # what a replaying voter sent before the fix
        yield pb.CheckpointChunk(index=6539, term=3, path="CURRENT", data=b"x", base=[
            pb.LogEntry(command=b"\x00", index=6437, term=3), pb.LogEntry(command=b"\x00", index=6438, term=3)])


def test_a_voter_replaying_its_journal_sends_the_log_entries_at_its_database_position(tmp_path):
    replica = _Replaying(tmp_path / "voter")
    try:
        position = asyncio.run(_copy({"n1": Voter(replica)}, ["n1"], tmp_path / "data" / "p0000"))
    finally:
        replica.engine.close()
    assert position == Position(6539, 3)
    meta = snapshot_file.read_meta(tmp_path / "data" / "p0000" / SNAPSHOT_FILE)
    assert (meta.prev_entry[1], meta.last_entry[1]) == (6538, 6539)


def test_a_checkpoint_that_cannot_seed_is_refused_and_the_next_voter_is_asked(tmp_path, caplog):
    replica = _Replaying(tmp_path / "voter")
    try:
        position = asyncio.run(_copy({"n1": BadBase(), "n2": Voter(replica)}, ["n1", "n2"],
                                     tmp_path / "data" / "p0000"))
    finally:
        replica.engine.close()
    assert position == Position(6539, 3)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == ["partition 0: no checkpoint from n1 (a seed's base must be two consecutive entries at or "
                        "after 6539, not 6437 and 6438); trying another voter"]


class Leading(Voter, kv_pb2_grpc.KVServicer):
    """A voter that leads the partition: asked for a checkpoint only when no follower sends one."""

    asked = 0

    async def Status(self, request, context):
        return pb.StatusResponse(node_id="n1", hosted=[pb.PartitionStatus(partition=0, role="leader", term=3)])

    async def Checkpoint(self, request, context):
        self.asked += 1
        async for chunk in super().Checkpoint(request, context):
            yield chunk


def test_the_copy_comes_from_a_follower_and_from_the_leader_only_when_none_sends_one(tmp_path):
    """The checkpoint, the read of its every block and the stream take the sender's event loop: on the leader
    they stalled every write of the partition for 100-400 ms (bench_move)."""
    replica = _Replaying(tmp_path / "voter")
    leader = Leading(replica)
    try:
        position = asyncio.run(_copy({"n1": leader, "n2": Voter(replica)}, ["n1", "n2"], tmp_path / "a" / "p0000"))
        assert position == Position(6539, 3) and leader.asked == 0
        position = asyncio.run(_copy({"n1": leader, "n2": BadBase()}, ["n1", "n2"], tmp_path / "b" / "p0000"))
        assert position == Position(6539, 3) and leader.asked == 1
    finally:
        replica.engine.close()


async def _copy(servicers: dict, sources: list[str], folder):
    servers, addresses = [], {}
    for node_id, servicer in servicers.items():
        server = grpc.aio.server()
        kv_pb2_grpc.add_AdminServicer_to_server(servicer, server)
        if isinstance(servicer, kv_pb2_grpc.KVServicer):
            kv_pb2_grpc.add_KVServicer_to_server(servicer, server)
        addresses[node_id] = f"127.0.0.1:{free_port_block(1)}"
        server.add_insecure_port(addresses[node_id])
        await server.start()
        servers.append(server)
    peers = Peers(addresses.__getitem__, None)
    try:
        return await copy_replica(peers, sources, 0, folder, ["127.0.0.1:1"], lambda n: None)
    finally:
        await peers.close()
        for server in servers:
            await server.stop(None)
