"""The client's gRPC channels, one per node address, with the stubs and the Execute transport made on
each; all opened anew once renewed TLS files were taken up (docs/security.md §4).

A channel presents the certificate it was opened with at every reconnection, so a client that outlives
its certificate would be refused once the old one expires or its CA is dropped. `look`, once per
LOOK_SECONDS on the operation path (before each attempt the retry loop compares the loop time it
reads anyway with `next_look`: no call per operation), takes up renewed files as a node's timer does
(`Tls.refresh`, a stat of three files) and, when `Tls.generation` moved, opens every channel anew.
What is in flight on the old channels finishes there: each node's ExecuteStream is half-closed, so the
node answers the requests it has and ends it (`transport.NodeTransport.reopen`), and scans and admin
calls keep their call. The old channels are closed with the client (as `node.peers.Peers` does):
closing one sooner would cut a scan still reading from it, and an idle one holds no more than its
connection.
"""

from __future__ import annotations

import asyncio
import math

import grpc

from raftkv.api import kv_pb2_grpc
from raftkv.client.transport import NodeTransport
from raftkv.security.tls import Tls, open_channel

# Columnar scan chunks are up to 4 MiB (server.COLUMNS_CHUNK_BYTES): above gRPC's default receive limit.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 16 * 1024 * 1024)]
LOOK_SECONDS = 1.0  # as a node's timer: renewals come weeks before the expiry


class Channels:
    def __init__(self, tls: Tls | None, token: str | None, timeout: float):
        self._tls = tls
        self._token = token
        self._timeout = timeout
        self._generation = tls.generation if tls is not None else 0
        self.next_look = 0.0 if tls is not None else math.inf  # loop time
        self._open: dict[str, grpc.aio.Channel] = {}
        self._kv: dict[str, kv_pb2_grpc.KVStub] = {}
        self._admin: dict[str, kv_pb2_grpc.AdminStub] = {}
        self._transports: dict[str, NodeTransport] = {}
        self._retired: list[grpc.aio.Channel] = []

    def look(self, now: float) -> None:
        """Open every channel anew if renewed TLS files were taken up. Callers look at `now` >= next_look."""
        self.next_look = now + LOOK_SECONDS
        self._tls.refresh()
        if self._tls.generation != self._generation:
            self._generation = self._tls.generation
            self._retired += self._open.values()
            self._open, self._kv, self._admin = {}, {}, {}
            for address, transport in self._transports.items():
                transport.reopen(self._stub(address))

    def kv(self, address: str) -> kv_pb2_grpc.KVStub:
        self._look_now()
        return self._stub(address)

    def admin(self, address: str) -> kv_pb2_grpc.AdminStub:
        self._look_now()
        if address not in self._admin:
            self._admin[address] = kv_pb2_grpc.AdminStub(self._channel(address))
        return self._admin[address]

    def transport(self, address: str) -> NodeTransport:
        """The node's Execute transport: the same object across renewals (links hold it)."""
        if address not in self._transports:
            self._transports[address] = NodeTransport(self.kv(address), self._timeout)
        return self._transports[address]

    def _look_now(self) -> None:
        if (now := asyncio.get_running_loop().time()) >= self.next_look:
            self.look(now)

    def _stub(self, address: str) -> kv_pb2_grpc.KVStub:
        if address not in self._kv:
            self._kv[address] = kv_pb2_grpc.KVStub(self._channel(address))
        return self._kv[address]

    def _channel(self, address: str) -> grpc.aio.Channel:
        if address not in self._open:
            self._open[address] = open_channel(address, self._tls, CHANNEL_OPTIONS, self._token)
        return self._open[address]

    async def close(self) -> None:
        for transport in self._transports.values():
            transport.close()
        channels, self._open, self._retired = [*self._retired, *self._open.values()], {}, []
        for channel in channels:
            await channel.close()
