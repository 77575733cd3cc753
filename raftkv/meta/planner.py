"""Where replicas and leaders should go: the placement planner. Pure (docs/elasticity.md §4).

`plan(meta, leaders)` looks at the nodes' states, each partition's voters, the
moves under way and who leads each partition, and returns what to do next, in
priority order:

0. the metadata group's voters: off draining and dead nodes, and up to five (an odd count) as nodes join;
1. replicas on nodes that are draining or dead move to the least loaded up node;
2. replica counts of up nodes are evened out to within one of each other;
3. leader counts are evened out the same way, by transfers (cheap: no data moves).

Never two replicas of a partition on one node, never a move to a node that is not
up, one move per partition, and at most `max_moves` moves under way in the
cluster and `max_moves_per_node` per node (as source or target), counting the
moves already recorded. Ties break by node id and partition number, so the same
input always gives the same plan.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping, Union

from raftkv.meta.records import META, ClusterMeta, NodeState, meta_voter_count


@dataclass(frozen=True)
class PlannedMove:
    partition: int  # or META
    source: str  # "" to add a voter without removing one (the metadata group grows)
    target: str  # "" to remove one without adding one (the metadata group shrinks)


@dataclass(frozen=True)
class PlannedTransfer:
    partition: int
    source: str
    target: str


Action = Union[PlannedMove, PlannedTransfer]

_LEAVING = (NodeState.DRAINING, NodeState.DEAD, NodeState.REMOVED)


def leaders_from(reports: Iterable[tuple[str, int, str, int]]) -> dict[int, str]:
    """Who leads each partition, from (node, partition, role, term) as the nodes report them: the
    leader with the highest term, when a deposed one has not noticed yet."""
    leaders: dict[int, tuple[int, str]] = {}
    for node_id, partition, role, term in reports:
        if role == "leader" and term >= leaders.get(partition, (-1, ""))[0]:
            leaders[partition] = (term, node_id)
    return {p: node for p, (_, node) in leaders.items()}


def plan(meta: ClusterMeta, leaders: Mapping[int, str], *, max_moves: int = 2,
         max_moves_per_node: int = 1) -> list[Action]:
    up = sorted(n.id for n in meta.nodes if n.state == NodeState.UP)
    if not up:
        return []
    leaving = {n.id for n in meta.nodes if n.state in _LEAVING}
    voters = {p: list(v) for p, v in enumerate(meta.placement)}
    moving = {m.group for m in meta.moves}
    busy = Counter()
    partition_moves = [m for m in meta.moves if m.group != META]
    for m in partition_moves:  # a move under way counts as done for the counts, and against the limits
        busy[m.source] += 1
        busy[m.target] += 1
        voters[m.group] = [m.target if v == m.source else v for v in voters[m.group]]
    actions: list[Action] = _meta_voters(meta, up, leaving)

    def room(node: str) -> bool:
        return busy[node] < max_moves_per_node

    def move(p: int, source: str, target: str) -> None:
        actions.append(PlannedMove(p, source, target))
        voters[p] = [target if v == source else v for v in voters[p]]
        moving.add(p)
        busy[source] += 1
        busy[target] += 1

    def counts() -> Counter:
        held = Counter({n: 0 for n in up})
        for vs in voters.values():
            held.update(v for v in vs if v in held)
        return held

    def moves_left() -> bool:
        planned = sum(isinstance(a, PlannedMove) and a.partition != META for a in actions)
        return len(partition_moves) + planned < max_moves

    # 1. away from draining and dead nodes
    for p in sorted(voters):
        source = next((v for v in voters[p] if v in leaving), None)
        if source is None or p in moving or not moves_left() or not room(source):
            continue
        held = counts()
        targets = sorted((n for n in up if n not in voters[p] and room(n)), key=lambda n: (held[n], n))
        if targets:
            move(p, source, targets[0])

    # 2. even out replica counts
    while moves_left():
        held = counts()
        if max(held.values()) - min(held.values()) <= 1:
            break
        candidate = _balancing_move(voters, moving, held, room)
        if candidate is None:
            break
        move(*candidate)

    # 3. even out leaders, among partitions that are not moving
    led = Counter({n: 0 for n in up})
    led.update(leader for p, leader in leaders.items() if leader in led)
    leaders = dict(leaders)
    for _ in range(len(voters)):
        if max(led.values()) - min(led.values()) <= 1:
            break
        chain = _balancing_transfers(voters, moving, leaders, led)
        if not chain:
            break
        actions.extend(chain)
        led[chain[0].source] -= 1
        led[chain[-1].target] += 1
        leaders.update((t.partition, t.target) for t in chain)
    return actions


def _meta_voters(meta: ClusterMeta, up: list[str], leaving: set[str]) -> list[Action]:
    """One change of the metadata group's voters at a time (it is one group): replace one that is
    leaving, or add one while there are fewer than the up nodes allow."""
    if meta.move_of(META) is not None:
        return []
    candidates = [n for n in up if n not in meta.meta_voters]
    gone = next((v for v in meta.meta_voters if v in leaving), None)
    if gone is not None:
        return [PlannedMove(META, gone, candidates[0] if candidates else "")]
    if candidates and len(meta.meta_voters) < meta_voter_count(len(up)):
        return [PlannedMove(META, "", candidates[0])]
    return []


def _balancing_move(voters: dict[int, list[str]], moving: set[int], held: Counter, room) -> tuple | None:
    """From the most loaded node that can give, to the least loaded that can take, differing by two or more."""
    by_load = sorted(held, key=lambda n: (held[n], n))
    for source in reversed(by_load):
        for target in by_load:
            if held[source] - held[target] <= 1:
                break
            if not (room(source) and room(target)):
                continue
            p = next((p for p in sorted(voters) if p not in moving and source in voters[p]
                      and target not in voters[p]), None)
            if p is not None:
                return p, source, target
    return None


def _balancing_transfers(voters: dict[int, list[str]], moving: set[int], leaders: dict[int, str],
                         led: Counter) -> list[PlannedTransfer]:
    """A chain of transfers from the busiest leader that can give to the least busy node it reaches:
    each hands one partition to a voter of it (A leads p with B, B leads q with C: A to B on p, B to
    C on q), so only the chain's ends change their counts. Empty when no node two below is reachable."""
    for source in sorted(led, key=lambda n: (-led[n], n)):
        paths: dict[str, list[PlannedTransfer]] = {source: []}
        frontier = [source]
        while frontier:
            following = []
            for node in frontier:
                for p in sorted(voters):
                    if p in moving or leaders.get(p) != node:
                        continue
                    for voter in sorted(voters[p]):
                        if voter in led and voter not in paths:
                            paths[voter] = paths[node] + [PlannedTransfer(p, node, voter)]
                            following.append(voter)
            frontier = following
        targets = [n for n in paths if led[source] - led[n] > 1]
        if targets:
            return paths[min(targets, key=lambda n: (led[n], len(paths[n]), n))]
    return []
