"""gRPC stubs of the other nodes, made on first use; addresses come from the current topology."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable, Callable, TypeVar

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.api.rpc_errors import never_sent
from raftkv.core.errors import Unavailable, Undetermined
from raftkv.security.tls import Tls, open_channel

T = TypeVar("T")

# How long a call a peer's port refused is sent again: a node starting (its Raft groups may elect it
# before its API listens) or a channel between reconnect attempts (at most a second apart) is a moment.
CONNECT_PATIENCE = 2.0
_RESEND_SECONDS = 0.05
BRIEF_STATUS_TIMEOUT = 1.0


@dataclass(frozen=True)
class _Peer:
    address: str
    generation: int  # of the TLS files its channel presents
    channel: grpc.aio.Channel
    kv: kv_pb2_grpc.KVStub
    admin: kv_pb2_grpc.AdminStub


class Peers:
    def __init__(self, address_of: Callable[[str], str], tls: Tls | None):
        self._address_of = address_of
        self._tls = tls
        self._peers: dict[str, _Peer] = {}
        self._retired: list[grpc.aio.Channel] = []
        self._closed = False

    def _peer(self, node_id: str) -> _Peer:
        if self._closed:  # a call on a closed channel raises grpc's UsageError, which says nothing to callers
            raise Unavailable(f"not sent to {node_id}: this node is stopping")
        address = self._address_of(node_id)
        generation = self._tls.generation if self._tls is not None else 0
        peer = self._peers.get(node_id)
        # A node that came back elsewhere gets a new channel; so does every peer once renewed TLS files were
        # taken up (a channel's reconnections present what it was opened with). Calls in flight finish.
        if peer is None or (peer.address, peer.generation) != (address, generation):
            if peer is not None:
                self._retired.append(peer.channel)
            to = open_channel(address, self._tls)
            peer = self._peers[node_id] = _Peer(address, generation, to, kv_pb2_grpc.KVStub(to),
                                                kv_pb2_grpc.AdminStub(to))
        return peer

    def stub(self, node_id: str) -> kv_pb2_grpc.KVStub:
        return self._peer(node_id).kv

    def admin(self, node_id: str) -> kv_pb2_grpc.AdminStub:
        return self._peer(node_id).admin

    async def close(self) -> None:
        """Cancel the calls in flight (`answer` makes each an Undetermined); later ones raise Unavailable."""
        self._closed = True
        channels = self._retired + [p.channel for p in self._peers.values()]
        self._retired, self._peers = [], {}
        for channel in channels:
            await channel.close()


async def answer(call: Awaitable[T]) -> T:
    """The reply to a call on a peer's channel. A call that `Peers.close` cancelled raises Undetermined, the
    peer may have it, instead of a CancelledError that would end the caller as if it were cancelled (a
    server then leaves its own client waiting for the deadline). The caller's own cancellation goes on."""
    try:
        return await call
    except asyncio.CancelledError:
        if asyncio.current_task().cancelling():
            raise
        raise Undetermined("the call to a peer was cut off: this node is stopping") from None


async def answer_once_connected(send: Callable[[float], Awaitable[T]], timeout: float) -> T:
    """`answer(send(the time left of timeout))`; a call never sent (`never_sent`: nothing reached the peer,
    so sending again is safe for any request) is sent again for up to CONNECT_PATIENCE."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    patience = min(deadline, loop.time() + CONNECT_PATIENCE)
    while True:
        try:
            return await answer(send(deadline - loop.time()))
        except grpc.aio.AioRpcError as exc:
            if not never_sent(exc) or loop.time() + _RESEND_SECONDS >= patience:
                raise
        await asyncio.sleep(_RESEND_SECONDS)


async def brief_status(peers: Peers, node_id: str) -> pb.StatusResponse | None:
    """A node's brief status (the partitions it leads, the learners it hosts), None if it did not answer
    within a second: the metadata leader's poll, and a copier looking for the leader, go on without it."""
    try:
        return await peers.stub(node_id).Status(pb.StatusRequest(brief=True), timeout=BRIEF_STATUS_TIMEOUT)
    except grpc.aio.AioRpcError:
        return None
