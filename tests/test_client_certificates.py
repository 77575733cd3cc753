"""The client library takes up renewed TLS files without a restart (raftkv/client/channels.py,
docs/security.md §4). In process: the node's `KVService` over the twins of tests/test_kv_service.py
behind a real mutual-TLS port, the asyncio client on the same loop."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from raftkv import AsyncClient
from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.core.durable import replace_file
from raftkv.security.certs import init_certs
from raftkv.security.tls import Tls
from tests.test_execute_stream import CountingKV, twin_node
from tests.test_kv_service import key_in


class WhoKV(CountingKV):
    """Records, per ExecuteStream, the common name of the certificate the client presented, and whether
    the stream ended of itself (the client half-closed it) rather than by a cancellation."""

    def __init__(self, *args):
        super().__init__(*args)
        self.streams: list[list[str]] = []  # [common name, "open" | "ended"]

    async def ExecuteStream(self, requests, context):
        names = context.auth_context().get("x509_common_name") or [b"?"]
        stream = [names[0].decode(), "open"]
        self.streams.append(stream)
        async for response in super().ExecuteStream(requests, context):
            yield response
        stream[1] = "ended"


def _files(folder: Path, ca: bytes, cert: Path, key: Path) -> Tls:
    folder.mkdir()
    (folder / "ca.pem").write_bytes(ca)
    (folder / "cert.pem").write_bytes(cert.read_bytes())
    (folder / "key.pem").write_bytes(key.read_bytes())
    return Tls(folder / "ca.pem", folder / "cert.pem", folder / "key.pem")


def _renew(tls: Tls, ca: bytes, cert: Path, key: Path) -> None:
    replace_file(tls.key, key.read_bytes())
    replace_file(tls.cert, cert.read_bytes())
    replace_file(tls.ca, ca)


async def _status_with(address: str, ca: Path, cert: Path, key: Path) -> grpc.StatusCode | None:
    """A new channel's first call with these files, made without raftkv's checks."""
    credentials = grpc.ssl_channel_credentials(ca.read_bytes(), key.read_bytes(), cert.read_bytes())
    async with grpc.aio.secure_channel(address, credentials) as channel:
        try:
            await kv_pb2_grpc.KVStub(channel).Status(pb.StatusRequest(), timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return None


def test_a_client_presents_its_renewed_certificate_once_the_node_accepts_only_the_new_ca(tmp_path):
    """Certificate A (alice, CA A) renewed to B (bob, CA B) while writers keep the client busy; the node
    meanwhile drops CA A. The client's new stream presents B, the old stream is half-closed and ends once
    answered, and no operation fails."""
    a, b = tmp_path / "a", tmp_path / "b"
    init_certs(a, None, ["alice"], 30, [("n1", "127.0.0.1")])
    init_certs(b, None, ["bob"], 30, [("n1", "127.0.0.1")])
    both = (a / "ca.pem").read_bytes() + (b / "ca.pem").read_bytes()
    node = _files(tmp_path / "node", both, a / "node-n1.pem", a / "node-n1.key")
    user = _files(tmp_path / "user", both, a / "user-alice.pem", a / "user-alice.key")

    async def scenario() -> None:
        async with twin_node(tmp_path, tls=node, service_class=WhoKV) as (address, voters, service, server):
            async with AsyncClient(address, timeout=5, tls=user) as kv:
                done, failures, stop = [0], [], asyncio.Event()

                async def writer(w: int) -> None:
                    while not stop.is_set():
                        try:
                            await kv.put(key_in(0, b"w%d-%d" % (w, done[0])), b"v")
                            done[0] += 1
                        except Exception as exc:  # noqa: BLE001 - the test reports it
                            failures.append(exc)
                            return

                writers = [asyncio.ensure_future(writer(w)) for w in range(8)]
                try:
                    await _until(lambda: done[0] > 50 and service.streams, "writes on alice's stream")
                    assert service.streams == [["alice", "open"]]

                    _renew(user, (b / "ca.pem").read_bytes(), b / "user-bob.pem", b / "user-bob.key")
                    _renew(node, (b / "ca.pem").read_bytes(), b / "node-n1.pem", b / "node-n1.key")
                    node.refresh()  # as the node's timer does
                    assert node.generation == 2
                    assert await _status_with(address, node.ca, a / "user-alice.pem",
                                              a / "user-alice.key") == grpc.StatusCode.UNAVAILABLE

                    await _until(lambda: any(who == "bob" for who, _ in service.streams), "the client to present bob")
                    await _until(lambda: service.streams[0][1] == "ended", "alice's stream to end")
                    before = done[0]
                    await _until(lambda: done[0] > before + 50, "writes on bob's stream")
                finally:
                    stop.set()
                    await asyncio.gather(*writers)
                assert not failures, failures[:3]
                assert service.streams == [["alice", "ended"], ["bob", "open"]]
                assert service.calls["Execute"] == 0
                assert voters[0].engine.position.index == done[0]  # each acknowledged put applied once

    asyncio.run(scenario())


async def _until(predicate, what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
