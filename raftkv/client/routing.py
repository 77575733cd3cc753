"""Where the client sends a partition's operations. Pure: what the nodes said in, addresses out.

The table starts from the endpoints it was given, learns every node's address
and every partition's replicas and leader from `Status` replies (the highest
term wins when nodes disagree), takes a `NotLeader` hint at once, and forgets
a leader that failed so the next attempt tries the partition's replicas in turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from raftkv.api import kv_pb2 as pb


@dataclass
class RoutingTable:
    endpoints: list[str]
    partitions: int = 0
    addresses: dict[str, str] = field(default_factory=dict)  # node id -> API address
    leaders: dict[int, str] = field(default_factory=dict)  # partition -> node id
    replicas: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def known_addresses(self) -> list[str]:
        """Every address worth asking for the cluster's state: the nodes learned, then the endpoints."""
        return list(dict.fromkeys(list(self.addresses.values()) + self.endpoints))

    def learn(self, replies: Iterable[pb.StatusResponse]) -> None:
        """One round of Status replies: the partition count, the nodes, each partition's replicas
        and leader (the one reported with the highest term, when nodes disagree)."""
        best_term: dict[int, int] = {}
        for reply in replies:
            self.partitions = reply.partitions
            self.addresses.update({n.id: n.api_address for n in reply.nodes})
            for ps in reply.hosted:
                self.replicas[ps.partition] = tuple(ps.replicas)
                if ps.leader and ps.term >= best_term.get(ps.partition, -1):
                    best_term[ps.partition] = ps.term
                    self.leaders[ps.partition] = ps.leader

    def target(self, partition: int, attempt: int, follower_read: bool = False) -> str:
        """The address for a partition's operation, attempt 1, 2, ...

        A follower read first goes to the first endpoint given (a nearby replica or a learner; it
        forwards what it cannot serve); the rest go to the leader, or else to the replicas in turn.
        """
        if follower_read and attempt == 1:
            return self.endpoints[0]
        leader = self.leaders.get(partition)
        if leader in self.addresses:
            return self.addresses[leader]
        candidates = [self.addresses[n] for n in self.replicas.get(partition, ()) if n in self.addresses]
        candidates = candidates or list(self.addresses.values()) or self.endpoints
        return candidates[attempt % len(candidates)]

    def hinted(self, partition: int, leader: str | None) -> bool:
        """Take a NotLeader hint; True if it names a leader other than the one just tried."""
        if leader and leader != self.leaders.get(partition):
            self.leaders[partition] = leader
            return True
        return False

    def forget_leader(self, partition: int) -> None:
        self.leaders.pop(partition, None)

    def node_of(self, address: str) -> str:
        return next((node for node, a in self.addresses.items() if a == address), "?")
