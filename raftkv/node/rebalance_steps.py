"""What the metadata leader decides by itself from its polls of the nodes (docs/elasticity.md §4, §6).
Pure: the topology, what the polls heard, a memory of when and the time in; the metadata commands and
leader transfers out. `rebalancer.Rebalancer` polls, proposes and transfers.

Liveness is judged only on the metadata leader, from its own polls; a new metadata leader starts
every node's clock afresh (an empty `Watch`), so a leader change can delay a dead verdict but never
hasten one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Union

from raftkv.core.spec import Tuning
from raftkv.meta.liveness import verdicts
from raftkv.meta.planner import PlannedMove, PlannedTransfer, plan
from raftkv.meta.records import BeginMove, ClusterMeta, SetNodeState


@dataclass(frozen=True)
class Watch:
    """When each node last answered the metadata leader's poll (or was first polled), and when each
    partition's leader was last asked to hand leadership on."""

    seen: Mapping[str, float] = field(default_factory=dict)
    transfers: Mapping[int, float] = field(default_factory=dict)


def heard(watch: Watch, polled: Iterable[str], answered: set[str], now: float) -> Watch:
    """`watch` after a poll of `polled` at `now`, of which `answered` answered: a node first heard of
    starts its clock now."""
    seen = dict(watch.seen)
    for node_id in polled:
        seen.setdefault(node_id, now)
        if node_id in answered:
            seen[node_id] = now
    return replace(watch, seen=seen)


def judge(meta: ClusterMeta, watch: Watch, answered: set[str], now: float,
          dead_after: float) -> list[tuple[SetNodeState, float]]:
    """The nodes' state changes (dead, up again, removed), each with how long its node was silent."""
    silent = {node_id: now - seen for node_id, seen in watch.seen.items()}
    return [(change, silent.get(change.node_id, 0.0)) for change in verdicts(meta, silent, answered, dead_after)]


def balance(meta: ClusterMeta, leaders: Mapping[int, str], watch: Watch, now: float,
            tuning: Tuning) -> tuple[list[Union[BeginMove, PlannedTransfer]], Watch]:
    """The planner's moves to begin, and its leader transfers, a partition's at most once in five
    election timeouts (the last may not show in the statuses yet)."""
    actions: list[Union[BeginMove, PlannedTransfer]] = []
    transfers = dict(watch.transfers)
    for action in plan(meta, leaders, max_moves=tuning.max_moves, max_moves_per_node=tuning.max_moves_per_node):
        if isinstance(action, PlannedMove):
            actions.append(BeginMove(action.partition, action.source, action.target))
        elif isinstance(action, PlannedTransfer):
            last = transfers.get(action.partition)
            if last is not None and now - last < 5 * tuning.election_timeout_max:
                continue
            transfers[action.partition] = now
            actions.append(action)
    return actions, replace(watch, transfers=transfers)
