"""gRPC stubs of the other nodes, made on first use; addresses come from the current topology."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import grpc

from raftkv.api import kv_pb2_grpc
from raftkv.security.tls import Tls, open_channel


@dataclass(frozen=True)
class _Peer:
    address: str
    channel: grpc.aio.Channel
    kv: kv_pb2_grpc.KVStub
    admin: kv_pb2_grpc.AdminStub


class Peers:
    def __init__(self, address_of: Callable[[str], str], tls: Tls | None):
        self._address_of = address_of
        self._tls = tls
        self._peers: dict[str, _Peer] = {}
        self._retired: list[grpc.aio.Channel] = []

    def _peer(self, node_id: str) -> _Peer:
        address = self._address_of(node_id)
        peer = self._peers.get(node_id)
        if peer is None or peer.address != address:  # a node that came back elsewhere gets a new channel
            if peer is not None:
                self._retired.append(peer.channel)
            to = open_channel(address, self._tls)
            peer = self._peers[node_id] = _Peer(address, to, kv_pb2_grpc.KVStub(to), kv_pb2_grpc.AdminStub(to))
        return peer

    def stub(self, node_id: str) -> kv_pb2_grpc.KVStub:
        return self._peer(node_id).kv

    def admin(self, node_id: str) -> kv_pb2_grpc.AdminStub:
        return self._peer(node_id).admin

    async def close(self) -> None:
        for channel in self._retired + [p.channel for p in self._peers.values()]:
            await channel.close()
