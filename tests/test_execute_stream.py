"""`KV.ExecuteStream`: the client's requests on one stream per node (raftkv/client/transport.py,
raftkv/node/execute_stream.py; docs/raft-engine.md, "Step 6"). In process: the node's `KVService` over the
twins of tests/test_kv_service.py, real gRPC on loopback, the sync client from threads."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from raftkv import AsyncClient, Client, Undetermined
from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.api.rpc_errors import never_sent
from raftkv.core.spec import build_spec, ports_per_node
from raftkv.dev.local_cluster import free_port_block
from raftkv.meta.bootstrap import spec_meta
from raftkv.node.gatekeeper import Gatekeeper
from raftkv.node.peers import Peers
from raftkv.node.service import KVService
from raftkv.security.tls import Tls, listen
from tests.conftest import until, wait_until
from tests.test_kv_service import PARTITIONS, TwinReads, TwinVoter, key_in


class CountingKV(KVService):
    """The node's service, counting the calls of each method (which path the client took)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.calls = {"Execute": 0, "ExecuteStream": 0}

    async def Execute(self, request, context):
        self.calls["Execute"] += 1
        return await super().Execute(request, context)

    async def ExecuteStream(self, requests, context):
        self.calls["ExecuteStream"] += 1
        async for response in super().ExecuteStream(requests, context):
            yield response


@asynccontextmanager
async def twin_node(tmp_path, unary_only: bool = False, base: int | None = None, tls: Tls | None = None,
                    service_class: type[CountingKV] = CountingKV):
    """(address, voters, service, server): node n1 of a 3-partition cluster leading partition 0. `unary_only`:
    registered as a release without ExecuteStream registers the KV service (an older node's stand-in).
    `tls`: the port serves mutual TLS with it."""
    base = base or free_port_block(3 * ports_per_node(PARTITIONS))
    spec = build_spec(nodes=3, partitions=PARTITIONS, replication=2, base_port=base, data_dir=tmp_path)
    topology = spec_meta(spec)
    voters = {0: TwinVoter(0)}
    peers = Peers(lambda node_id: topology.node(node_id).api_address, tls=None)
    service = service_class(spec, "n1", voters, TwinReads(voters), lambda: topology, peers,
                         Gatekeeper(enforce=False, meta=lambda: topology))
    server = grpc.aio.server()
    if unary_only:
        server.add_generic_rpc_handlers([_unary_only(service)])
    else:
        kv_pb2_grpc.add_KVServicer_to_server(service, server)
    listen(server, spec.nodes[0].api_address, tls)
    await server.start()
    try:
        yield spec.nodes[0].api_address, voters, service, server
    finally:
        await peers.close()
        await server.stop(grace=None)


@contextmanager
def served(tmp_path, unary_only: bool = False,
           base: int | None = None) -> Iterator[tuple[str, dict[int, TwinVoter], CountingKV]]:
    """`twin_node` on a loop thread of its own, for the sync client's threads."""
    loop = asyncio.new_event_loop()
    started, stop = threading.Event(), asyncio.Event()
    holder = {}

    async def run() -> None:
        async with twin_node(tmp_path, unary_only, base) as node:
            holder["node"] = node[:3]
            started.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield holder["node"]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


def _unary_only(service: KVService) -> grpc.GenericRpcHandler:
    """The KV service as a node of 0.1.0 offers it: Execute and Status, no ExecuteStream."""
    handlers = {
        "Execute": grpc.unary_unary_rpc_method_handler(service.Execute, pb.ExecuteRequest.FromString,
                                                       pb.ExecuteResponse.SerializeToString),
        "Status": grpc.unary_unary_rpc_method_handler(service.Status, pb.StatusRequest.FromString,
                                                      pb.StatusResponse.SerializeToString),
    }
    return grpc.method_handlers_generic_handler("raftkv.v1.KV", handlers)


def _keys(n: int) -> list[bytes]:
    return [key_in(0, b"t%d" % i) for i in range(n)]


def test_concurrent_callers_on_one_stream_each_get_their_own_results(tmp_path):
    with served(tmp_path) as (address, voters, service), Client(address, timeout=5) as kv:
        def caller(t: int) -> list[bytes | None]:
            got = []
            for i in range(20):
                key = key_in(0, b"c%d-%d" % (t, i))
                kv.put(key, b"%d:%d" % (t, i))
                got.append(kv.get(key))
            return got

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(caller, range(8)))
        assert results == [[b"%d:%d" % (t, i) for i in range(20)] for t in range(8)]
        assert service.calls == {"Execute": 0, "ExecuteStream": 1}


def test_a_node_without_the_stream_gets_unary_calls_and_each_request_is_applied_once(tmp_path):
    with served(tmp_path, unary_only=True) as (address, voters, service), Client(address, timeout=5) as kv:
        keys = _keys(30)
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda k: kv.put(k, b"v"), keys))
        assert [kv.get(k) for k in keys] == [b"v"] * 30
        assert voters[0].engine.position.index == 30  # each put applied once: none sent twice
        assert service.calls["Execute"] >= 2


def test_a_request_past_its_deadline_fails_as_a_unary_call_would_and_the_stream_goes_on(tmp_path):
    with served(tmp_path) as (address, voters, service), Client(address, timeout=0.5) as kv:
        kv.put(key_in(0, b"before"), b"1")
        stuck = voters[0].submit
        voters[0].submit = lambda command: asyncio.get_running_loop().create_future()  # never answered
        started = time.monotonic()
        with pytest.raises(Undetermined, match="DEADLINE_EXCEEDED"):
            kv.put(key_in(0, b"stuck"), b"1")
        assert 0.4 < time.monotonic() - started < 2
        voters[0].submit = stuck
        kv.put(key_in(0, b"after"), b"1")
        assert kv.get(key_in(0, b"after")) == b"1"
        assert service.calls == {"Execute": 0, "ExecuteStream": 1}


def test_a_stopping_node_ends_its_streams_so_its_grace_does_not_wait_for_them(tmp_path):
    async def scenario() -> None:
        async with twin_node(tmp_path) as (address, voters, service, server):
            async with AsyncClient(address, timeout=5) as kv:
                await kv.put(key_in(0, b"k"), b"1")  # the client's stream is open, and stays so
                stream = kv._core._channels._transports[address]._stream
                service.end_streams()  # as the node's stop does first
                started = time.monotonic()
                await server.stop(grace=5)
                assert time.monotonic() - started < 1
                await until(lambda: stream.broken, timeout=1, what="the client to see its stream end")

    asyncio.run(scenario())


def test_a_message_that_does_not_parse_ends_the_stream_with_invalid_argument_and_one_line(tmp_path):
    async def scenario() -> None:
        async with twin_node(tmp_path) as (address, _voters, _service, _server):
            async with grpc.aio.insecure_channel(address) as channel:
                call = channel.stream_stream("/raftkv.v1.KV/ExecuteStream")()  # bytes as they are
                await call.write(b"\x0a\xff")  # field 1, a length past the end
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call.read()
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert refused.value.details().startswith("malformed request: ") and "\n" not in refused.value.details()

    asyncio.run(scenario())


def test_requests_in_flight_when_the_node_dies_fail_as_unary_calls_do_and_the_next_opens_a_stream(tmp_path):
    """A node process (this module's twin-backed KVService: the Raft behind it plays no part here) is
    SIGSTOPped with a put on its stream and a unary put beside it, then killed: both writes may have been
    applied, so both are Undetermined. Started again, the client's next put goes on a new stream."""
    base = free_port_block(3 * ports_per_node(PARTITIONS))
    address = f"127.0.0.1:{base}"
    node = _twin_node(tmp_path, base)
    try:
        with Client(address, timeout=5) as kv, grpc.insecure_channel(address) as channel:
            kv.put(key_in(0, b"before"), b"1")
            kv_pb2_grpc.KVStub(channel).Status(pb.StatusRequest(), timeout=5)  # the unary call's connection is up
            transport = kv._async._core._channels._transports[address]
            first = transport._stream
            node.send_signal(signal.SIGSTOP)
            with ThreadPoolExecutor(1) as pool:
                on_stream = pool.submit(kv.put, key_in(0, b"in-flight"), b"1")
                unary = kv_pb2_grpc.KVStub(channel).Execute.future(pb.ExecuteRequest(
                    ops=[pb.Op(partition=0, put=pb.Put(key=key_in(0, b"unary"), value=b"1"))]), timeout=5)
                wait_until(lambda: first._pending and all(p.sent for p in first._pending.values()), 5,
                           "the put to be written to the stream")
                node.kill()
                node.wait()
                with pytest.raises(Undetermined, match="UNAVAILABLE"):
                    on_stream.result(10)
            with pytest.raises(grpc.RpcError) as failed:
                unary.result()
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE and not never_sent(failed.value)
            assert first.broken
            node = _twin_node(tmp_path, base)
            kv.put(key_in(0, b"after"), b"1")
            assert kv.get(key_in(0, b"after")) == b"1"
            assert transport._stream is not first and not transport._stream.broken
    finally:
        node.kill()
        node.wait()


def _twin_node(tmp_path, base: int) -> subprocess.Popen:
    node = subprocess.Popen([sys.executable, "-m", "tests.test_execute_stream", str(tmp_path), str(base)],
                            stdout=subprocess.PIPE, cwd=Path(__file__).parent.parent)
    assert node.stdout.readline() == b"serving\n"
    return node


if __name__ == "__main__":  # _twin_node's process
    with served(Path(sys.argv[1]), base=int(sys.argv[2])):
        print("serving", flush=True)
        threading.Event().wait()
