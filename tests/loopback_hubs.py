"""Raft hubs for tests that open pysyncobj groups themselves: one per member, as if each member of a
group were a node of its own, named by its Raft address and listening on it."""

from __future__ import annotations

import asyncio

from raftkv.core.spec import Tuning
from raftkv.raft.hub import Directory, RaftHub


class LoopbackHubs:
    def __init__(self, group: int = 0, tuning: Tuning = Tuning()):
        self.group = group
        self._tuning = tuning
        self._hubs: dict[str | None, list[RaftHub]] = {}
        self._directory = Directory()

    def directory(self) -> Directory:
        return self._directory

    def know(self, *addresses: str) -> None:
        """Members that may not have a hub yet, but are named as peers."""
        endpoints = dict(self._directory.endpoints)
        for address in addresses:
            host, port = address.rsplit(":", 1)
            endpoints[address] = (host, int(port))
        self._directory = Directory(endpoints, {a: (a, self.group) for a in endpoints})

    def hub(self, address: str | None) -> RaftHub:
        """The hub of the member at `address` (made, and listening there, on first use); a new one
        for each learner (None)."""
        if address is not None and address in self._hubs:
            return self._hubs[address][0]
        hub = RaftHub(asyncio.get_running_loop(), address, self.directory, None,
                      retry_seconds=self._tuning.connection_retry_seconds, dead_after=3.5)
        if address is not None:
            self.know(address)
            hub.listen(*self._directory.endpoints[address])
        hub.start()
        self._hubs.setdefault(address, []).append(hub)
        return hub

    async def close(self) -> None:
        for hubs in self._hubs.values():
            for hub in hubs:
                await hub.close()


def unconnected_hub() -> RaftHub:
    """For a group without peers: nothing to send, nothing to listen for, nothing to close."""
    return RaftHub(asyncio.get_running_loop(), "solo", Directory, None, retry_seconds=0.5, dead_after=3.5)
