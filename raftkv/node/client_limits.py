"""What each client may have open on one node at once (docs/security.md §6): calls, scans, and write
operations waiting for their acknowledgement. Over a limit is `ResourceExhausted`, at once; nothing
waits in a queue that one client could grow without bound.

A client is a user (its certificate's or token's name) on a cluster with TLS, else the host its
connection comes from. Nodes, forwarding what their own clients sent, and learners are not limited.
Pure bookkeeping, on the node's event loop only: no locks.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from raftkv.core.errors import ResourceExhausted
from raftkv.security.permissions import Identity


@dataclass(frozen=True)
class ClientLimits:
    calls: int
    scans: int
    writes: int


def client_of(caller: Identity, peer: str, forwarded: bool) -> str | None:
    """The client a call counts against (None: not limited). `peer` is gRPC's "ipv4:127.0.0.1:5000"."""
    if caller.kind == "user":
        return f"user {caller.name}"
    if caller.name or forwarded:  # a node or a learner (its certificate says so), or a forward without TLS
        return None
    return "host " + peer.rsplit(":", 1)[0].split(":", 1)[-1]


class ClientLoad:
    def __init__(self, limits: ClientLimits, node_id: str):
        self._limits = limits
        self._node_id = node_id
        self._calls: Counter[str] = Counter()
        self._scans: Counter[str] = Counter()
        self._writes: Counter[str] = Counter()

    def open(self, client: str | None, scan: bool = False) -> None:
        """One more call of `client` open (a scan: one that reads a range); `close` it when it ends."""
        if client is None:
            return
        self._over(client, self._calls, self._limits.calls, "calls open", "max_calls_per_client")
        if scan:
            self._over(client, self._scans, self._limits.scans, "scans open", "max_scans_per_client")
        self._calls[client] += 1
        self._scans[client] += scan

    @contextmanager
    def call(self, client: str | None, scan: bool = False) -> Iterator[None]:
        """One more call of `client` open for the block (`open` raises at a limit), closed after it."""
        self.open(client, scan)
        try:
            yield
        finally:
            self.close(client, scan)

    def close(self, client: str | None, scan: bool = False) -> None:
        if client is not None:
            _release(self._calls, client, 1)
            _release(self._scans, client, int(scan))

    def take_writes(self, client: str | None, wanted: int) -> int:
        """How many of `wanted` write operations `client` may have in flight now; give them back with
        `return_writes` when they are answered."""
        if client is None:
            return wanted
        granted = max(0, min(wanted, self._limits.writes - self._writes[client]))
        self._writes[client] += granted
        return granted

    def return_writes(self, client: str | None, count: int) -> None:
        if client is not None:
            _release(self._writes, client, count)

    def refusal(self, client: str) -> ResourceExhausted:
        return ResourceExhausted(f"{client} has {self._limits.writes} writes in flight on node {self._node_id} "
                                 f"(tuning.max_writes_per_client); wait for their answers")

    def _over(self, client: str, counts: Counter[str], limit: int, what: str, setting: str) -> None:
        if counts[client] >= limit:
            raise ResourceExhausted(f"{client} has {limit} {what} on node {self._node_id} (tuning.{setting}); "
                                    "wait for some to finish")


def _release(counts: Counter[str], client: str, count: int) -> None:
    counts[client] -= count
    if counts[client] <= 0:
        counts.pop(client, None)
