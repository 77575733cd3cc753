"""Hostile input against a live TLS cluster (docs/security.md §7): 3 nodes, a changelog learner.

While an admin writes `acked/` keys, a user who may read everything and write only `fuzz/` sends
hostile request bodies (tests/hostile_messages.py) to every gRPC method of the nodes and the
learner, and raw connections send garbage, replayed client bytes and, holding a learner's
certificate, hostile Raft hub frames. No input may fail a handler (gRPC's UNKNOWN is an
unhandled exception) or hang a unary call. Afterwards: every process is up and answers, no log
has a traceback, every acknowledged write reads back and the replicas are equal.

The inputs are seeded (the seed is in the test's output), not hypothesis-driven: shrinking an
input against a cluster whose state the earlier inputs changed is meaningless, and a seed
replays the whole run. The in-process parsers are fuzzed with hypothesis (test_fuzz_files.py, test_fuzz_frames.py, test_fuzz_cli.py).
"""

from __future__ import annotations

import asyncio
import os
import random
import ssl
import threading
from dataclasses import dataclass

import grpc
import pytest

from raftkv import Client, Tls
from raftkv.api import kv_pb2 as pb
from raftkv.chaos.convergence import replica_differences
from raftkv.core.errors import RaftKVError
from raftkv.core.partitioning import partition_for_key
from raftkv.meta.access import GrantPermission, Permission, PutUser, UserRecord
from raftkv.meta.records import META
from raftkv.raft import hub_frames
from raftkv.security.certs import init_certs
from raftkv.security.tls import open_channel
from tests.fuzzing import inputs, tally
from tests.hostile_messages import hostile_payload, mutate, random_bytes

PARTITIONS = 4
SEED = int(os.environ.get("RAFTKV_FUZZ_SEED", random.randrange(2**32)))
UNARY_DEADLINE = 10.0
STREAM_DEADLINE = 0.5  # Follow never ends by itself; every other stream here is short
IN_FLIGHT = 16
RAW_IN_FLIGHT = 64  # raw connections mostly wait for the peer to give up on them
METHODS = {f"/{s.full_name}/{m.name}": m for s in pb.DESCRIPTOR.services_by_name.values() for m in s.methods}


def _op(key: bytes, **kind) -> pb.Op:
    return pb.Op(partition=partition_for_key(key, PARTITIONS), **kind)


SEEDS: dict[str, list[pb.Message]] = {
    "/raftkv.v1.KV/Execute": [
        pb.ExecuteRequest(ops=[_op(b"fuzz/a", put=pb.Put(key=b"fuzz/a", value=b"v"))]),
        pb.ExecuteRequest(ops=[_op(b"fuzz/a", get=pb.Get(key=b"fuzz/a"))], consistency=pb.FOLLOWER),
        pb.ExecuteRequest(ops=[_op(b"fuzz/b", cas=pb.Cas(key=b"fuzz/b", new=b"1")),
                               _op(b"fuzz/c", delete=pb.Delete(key=b"fuzz/c"))]),
        pb.ExecuteRequest(ops=[pb.Op(partition=1, delete_range=pb.DeleteRange(start=b"fuzz/x", end=b"fuzz/y"))]),
    ],
    "/raftkv.v1.KV/Scan": [pb.ScanRequest(partition=0, start=b"fuzz/", end=b"fuzz0", limit=10),
                           pb.ScanRequest(partition=2, columnar=True, consistency=pb.LEADER)],
    "/raftkv.v1.KV/Status": [pb.StatusRequest()],
    "/raftkv.v1.KV/SplitKeys": [pb.SplitKeysRequest(partition=1, start=b"fuzz/", every=2)],
    "/raftkv.v1.Admin/Topology": [pb.TopologyRequest()],
    "/raftkv.v1.Admin/ChangeTopology": [pb.ChangeTopologyRequest(command=b'{"kind": "drain", "node": "n1"}')],
    "/raftkv.v1.Admin/ChangeMembership": [pb.ChangeMembershipRequest(group=0, action="remove", node="n3")],
}
# Sent as the admin, so that they get past the permission check: none of them can change what the
# cluster holds or where (ChangeTopology and ChangeMembership can, and are sent as the fuzzer only).
ADMIN_SEEDS: dict[str, list[pb.Message]] = {
    "/raftkv.v1.Admin/ReplicaProgress": [pb.ReplicaRequest(group=0, log_index=1)],
    "/raftkv.v1.Admin/TransferLeadership": [pb.TransferLeadershipRequest(group=1, node="n2")],
    "/raftkv.v1.Admin/Compact": [pb.ReplicaRequest(group=0)],
    "/raftkv.v1.Admin/Checkpoint": [pb.ReplicaRequest(group=0)],
    "/raftkv.v1.Admin/CheckpointFiles": [
        pb.CheckpointFilesRequest(replica=pb.ReplicaRequest(group=1, linearizable=True)),
        pb.CheckpointFilesRequest(paths=["CURRENT", "../escaped"]),
    ],
    "/raftkv.v1.Admin/Topology": [pb.TopologyRequest()],
}
LEARNER_SEEDS: dict[str, list[pb.Message]] = {
    "/raftkv.v1.ChangeLog/Offsets": [pb.OffsetsRequest(after={0: 1}, max_rows=10)],
    "/raftkv.v1.ChangeLog/Read": [pb.ChangesRequest(partition=0, after=0, until=5)],
    "/raftkv.v1.ChangeLog/Follow": [pb.FollowRequest(after={1: 0})],
}


@dataclass(frozen=True)
class Target:
    address: str
    caller: Tls
    method: str
    seeds: tuple[bytes, ...]
    streaming: bool


def _targets(addresses: list[str], caller: Tls, seeds: dict[str, list[pb.Message]]) -> list[Target]:
    return [Target(address, caller, path, tuple(m.SerializeToString() for m in examples),
                   METHODS[path].server_streaming)
            for address in addresses for path, examples in seeds.items()]


@pytest.fixture
def fuzzed_cluster(make_cluster, changelog_learner):
    """(cluster, learner address, the fuzzer's Tls, the admin client)."""
    cluster = make_cluster(nodes=3, partitions=PARTITIONS, tls=True)
    certs = cluster.spec.tls.ca.parent
    init_certs(certs, None, ["fuzzer"], days=30)
    fuzzer = Tls(certs / "ca.pem", certs / "user-fuzzer.pem", certs / "user-fuzzer.key")
    with Client(cluster.endpoints, tls=cluster.tls, timeout=10) as admin:
        admin.change_topology(GrantPermission("fuzz-writer", Permission("write", b"fuzz/".hex())), everywhere=True)
        admin.change_topology(GrantPermission("reader", Permission("read", "")), everywhere=True)
        admin.change_topology(PutUser(UserRecord("fuzzer", ("fuzz-writer", "reader"))), everywhere=True)
        yield cluster, changelog_learner(cluster), fuzzer, admin


class AckedWrites(threading.Thread):
    """An admin writing `acked/<i>` one after another until stopped; what was acknowledged must stay."""

    def __init__(self, client: Client):
        super().__init__(daemon=True)
        self._client = client
        self.acked: dict[bytes, bytes] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            key, value = f"acked/{i:06d}".encode(), str(i).encode()
            try:
                self._client.put(key, value)
                self.acked[key] = value
            except RaftKVError:
                pass  # unknown outcome: not checked either way
            i += 1


def test_hostile_requests_and_bytes_break_nothing(fuzzed_cluster):
    cluster, learner, fuzzer, admin = fuzzed_cluster
    print(f"fuzz seed {SEED} (RAFTKV_FUZZ_SEED={SEED} replays it)")
    writes = AckedWrites(admin)
    writes.start()
    try:
        targets = (_targets(cluster.endpoints, fuzzer, SEEDS) + _targets([learner], fuzzer, LEARNER_SEEDS)
                   + _targets(cluster.endpoints, cluster.tls, ADMIN_SEEDS))
        grpc_findings = asyncio.run(_fuzz_grpc(targets, inputs(4000)))
        port_findings = asyncio.run(_fuzz_ports(cluster, learner, inputs(1000)))
    finally:
        writes.stop.set()
        writes.join(timeout=30)
    assert grpc_findings == [] and port_findings == []
    assert cluster.exited() == {}, "a node exited"
    _assert_no_traceback(cluster)
    assert len(writes.acked) > 10, "the admin's writes did not get through during the fuzzing"
    stored = dict(admin.scan(prefix=b"acked/"))
    assert {key: stored.get(key) for key in writes.acked} == writes.acked
    placement = tuple(tuple(n.id for n in cluster.spec.nodes) for _ in range(PARTITIONS))
    assert replica_differences(cluster.spec, placement, each_round=lambda: None) == []


# -- gRPC methods ------------------------------------------------------------------------------


async def _fuzz_grpc(targets: list[Target], count: int) -> list[str]:
    rng = random.Random(SEED)
    channels = {(t.address, t.caller): open_channel(t.address, t.caller, [("grpc.max_send_message_length", -1)])
                for t in targets}
    gate = asyncio.Semaphore(IN_FLIGHT)
    with tally("grpc methods") as counted:
        async def one(target: Target, body: bytes) -> None:
            async with gate:
                outcome, problem = await _call(channels[target.address, target.caller], target, body)
            counted.add(outcome=outcome)
            if problem:
                counted.finding(f"{target.method} at {target.address}: {problem} (input {body[:200]!r})")

        jobs = []
        for _ in range(count):
            target = rng.choice(targets)
            body = hostile_payload(rng, METHODS[target.method].input_type, list(target.seeds), b"fuzz/")
            jobs.append(asyncio.ensure_future(one(target, body)))
        await asyncio.gather(*jobs)
        for channel in channels.values():
            await channel.close()
        return counted.findings


async def _call(channel: grpc.aio.Channel, target: Target, body: bytes) -> tuple[str, str | None]:
    """The call's status, and what went wrong that must not: an unhandled exception, or a unary call
    that hung."""
    try:
        if METHODS[target.method].client_streaming:  # one message, then the stream ends
            async for _ in channel.stream_stream(target.method)(iter([body]), timeout=STREAM_DEADLINE):
                pass
        elif target.streaming:
            async for _ in channel.unary_stream(target.method)(body, timeout=STREAM_DEADLINE):
                pass
        else:
            await channel.unary_unary(target.method)(body, timeout=UNARY_DEADLINE)
    except grpc.aio.AioRpcError as error:
        code = error.code()
        if code == grpc.StatusCode.UNKNOWN:
            return code.name, f"unhandled: {error.details()}"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and not target.streaming:
            return code.name, f"no answer within {UNARY_DEADLINE}s"
        return code.name, None
    return "OK", None


# -- raw connections ---------------------------------------------------------------------------


async def _fuzz_ports(cluster, learner: str, count: int) -> list[str]:
    """Garbage and replayed bytes to every port; hostile hub frames from an authenticated learner."""
    rng = random.Random(SEED + 1)
    spec = cluster.spec
    grpc_ports = [n.api_address for n in spec.nodes] + [learner]
    raft_ports = [f"{n.host}:{n.raft_port_base}" for n in spec.nodes]
    http_ports = [f"{n.host}:{n.metrics_port}" for n in spec.nodes]
    recorded = await _recorded_client_bytes(spec.nodes[0].api_address, cluster.tls)
    learner_tls = Tls(spec.tls.ca, spec.tls.learner_cert, spec.tls.learner_key)
    gate = asyncio.Semaphore(RAW_IN_FLIGHT)
    with tally("raw connections") as counted:
        async def one(address: str, send) -> None:
            async with gate:
                await send(address)
            counted.add()

        jobs = []
        for _ in range(count):
            roll = rng.random()
            if roll < 0.3:
                sends = _garbage(rng, recorded)
                jobs.append(one(rng.choice(grpc_ports + raft_ports + http_ports), sends))
            elif roll < 0.5:
                jobs.append(one(rng.choice(grpc_ports + raft_ports), _replay(rng, recorded)))
            else:
                jobs.append(one(rng.choice(raft_ports), _hostile_frames(rng, learner_tls)))
        await asyncio.gather(*jobs)
        return counted.findings


def _garbage(rng: random.Random, recorded: bytes):
    data = random_bytes(rng) if rng.random() < 0.5 else mutate(rng, recorded[:rng.randint(1, 600)], [recorded])
    return lambda address: _exchange(address, None, [data])


def _replay(rng: random.Random, recorded: bytes):
    """A real client's bytes (its TLS handshake, then its encrypted calls) sent again: the server's new
    handshake makes them worthless."""
    cut = rng.randint(1, len(recorded))
    return lambda address: _exchange(address, None, [recorded[:cut]])


def _hostile_frames(rng: random.Random, tls: Tls):
    hello = hub_frames.encode((hub_frames.CONTROL, "hello", None))
    frames = [hello] + [_hostile_frame(rng) for _ in range(rng.randint(1, 8))]
    return lambda address: _exchange(address, tls, frames)


def _hostile_frame(rng: random.Random) -> bytes:
    group = rng.choice((META, 0, 1, 2, 3, 99, -5, 2**40))
    roll = rng.random()
    if roll < 0.3:
        verb = rng.choice(("join", "leave", "ping", "pong", "hello", "nonsense"))
        return hub_frames.encode((hub_frames.CONTROL, verb, rng.choice((group, None, "x", b"y", [1]))))
    if roll < 0.7:  # the one message a learner may send, with hostile values
        value = lambda: rng.choice((0, -1, 1, 2**63, 10**30, None, "1", 1.5, True))  # noqa: E731
        answer = {"type": "next_node_idx", "next_node_idx": value(), "reset": value(), "success": value()}
        return hub_frames.encode((group, answer))
    if roll < 0.9:
        return hub_frames.encode((group, {"type": rng.choice(("append_entries", "request_vote", "x")),
                                          "term": rng.choice((0, 2**62)), "entries": [(b"x", 1, 1)]}))
    body = mutate(rng, hub_frames.encode((group, {"type": "next_node_idx"})), [])
    return body


async def _exchange(address: str, tls: Tls | None, sends: list[bytes]) -> None:
    """Connect, send, read what comes back until the peer closes or a second passes, close."""
    host, port = address.rsplit(":", 1)
    context = tls.client_context() if tls else None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(
            host, int(port), ssl=context, server_hostname=host if context else None), 5)
    except (OSError, ssl.SSLError, asyncio.TimeoutError) as error:
        raise AssertionError(f"{address} refused a connection: {error}") from None
    try:
        for data in sends:
            writer.write(data)
        await writer.drain()
        await asyncio.wait_for(reader.read(1 << 20), 1.0)
    except (OSError, ssl.SSLError, asyncio.TimeoutError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), 1.0)
        except (OSError, ssl.SSLError, asyncio.TimeoutError):
            pass


async def _recorded_client_bytes(address: str, tls: Tls) -> bytes:
    """What a real client sends to a node for a Status call: recorded by a relay between the two."""
    host, port = address.rsplit(":", 1)
    recorded = bytearray()

    async def relay(client_reader, client_writer):
        node_reader, node_writer = await asyncio.open_connection(host, int(port))

        async def pipe(reader, writer, keep: bool):
            while data := await reader.read(65536):
                if keep:
                    recorded.extend(data)
                writer.write(data)
                await writer.drain()
            writer.close()

        await asyncio.gather(pipe(client_reader, node_writer, True), pipe(node_reader, client_writer, False),
                             return_exceptions=True)

    server = await asyncio.start_server(relay, host, 0)
    relay_port = server.sockets[0].getsockname()[1]
    async with open_channel(f"{host}:{relay_port}", tls) as channel:
        await channel.unary_unary("/raftkv.v1.KV/Status")(pb.StatusRequest().SerializeToString(), timeout=10)
    server.close()
    await server.wait_closed()
    assert recorded, "the relay recorded nothing"
    return bytes(recorded)


def _assert_no_traceback(cluster) -> None:
    for node in cluster.spec.nodes:
        text = cluster.log_path(node.id).read_text(errors="replace")
        assert "Traceback" not in text, f"{node.id}'s log has a traceback:\n{text[text.index('Traceback') - 500:][:4000]}"
