"""What `raftkv dev up` does when one of its node processes exits, and which ports it must find free.

Pure: the node's state as the cluster records it and its recent restarts in, the verdict out. A node
the cluster removed (decommissioned) has left the demo by design; any other exit is a crash, and the
node is started again, unless it keeps exiting.
"""

from __future__ import annotations

import enum
from typing import Sequence

from raftkv.core.spec import ClusterSpec
from raftkv.meta.records import NodeState

RESTART_LIMIT = 3  # restarts within RESTART_WINDOW seconds, after which a node is left down
RESTART_WINDOW = 60.0


class Verdict(enum.Enum):
    LEFT = "left"  # removed from the cluster: not started again
    RESTART = "restart"
    GIVE_UP = "give up"  # it keeps exiting: left down, with its log to read


def after_exit(state: NodeState | None, restarts: Sequence[float], now: float) -> Verdict:
    """`state`: the node's record in the cluster's metadata (None: no node could say); `restarts`:
    when dev up restarted it before (monotonic seconds)."""
    if state == NodeState.REMOVED:
        return Verdict.LEFT
    if sum(1 for t in restarts if now - t < RESTART_WINDOW) >= RESTART_LIMIT:
        return Verdict.GIVE_UP
    return Verdict.RESTART


def demo_ports(spec: ClusterSpec, broker_port: int | None) -> list[tuple[int, str]]:
    """Every port the demo's processes listen on, with whose it is."""
    ports = []
    for n in spec.nodes:
        ports += [(n.api_port, f"{n.id}'s API"), (n.metrics_port, f"{n.id}'s metrics")]
        ports += [(n.raft_port_base + p, f"{n.id}'s Raft port of partition {p}") for p in range(spec.partitions)]
        ports.append((n.meta_port(spec.partitions), f"{n.id}'s metadata Raft port"))
    if broker_port is not None:
        ports.append((broker_port, "the Kafka broker's"))
    return ports
