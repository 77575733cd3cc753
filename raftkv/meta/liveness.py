"""Which nodes change state by themselves (docs/elasticity.md §6). Pure: what the metadata leader
heard in, the commands to propose out."""

from __future__ import annotations

from typing import Mapping

from raftkv.meta.records import ClusterMeta, NodeState, SetNodeState

_CAN_DIE = (NodeState.UP, NodeState.DRAINING, NodeState.JOINING)


def verdicts(meta: ClusterMeta, silent: Mapping[str, float], answered: set[str],
             dead_after: float) -> list[SetNodeState]:
    """`silent`: seconds since each node last answered the metadata leader; `answered`: the nodes that
    answered just now. A node silent longer than `dead_after` is dead; a dead node that answers is up
    again (its old replicas were re-created elsewhere; it deletes them and is given replicas anew); a
    draining node that holds nothing any more is removed. A dead node stays dead until it answers or
    is decommissioned."""
    changes = []
    for node in meta.nodes:
        if node.state in _CAN_DIE and silent.get(node.id, 0.0) > dead_after:
            changes.append(SetNodeState(node.id, NodeState.DEAD))
        elif node.state == NodeState.DEAD and node.id in answered:
            changes.append(SetNodeState(node.id, NodeState.UP))
        elif node.state == NodeState.DRAINING and not meta.holds_anything(node.id):
            changes.append(SetNodeState(node.id, NodeState.REMOVED))
    return changes
