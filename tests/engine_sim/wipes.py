"""Wiped nodes in the simulation (`Faults.wipe`): which members open guarded (vote_guard), what their
disks had synced before the wipe, and the floor each guarded member learns, asked of its peers as
`LostData._learn_vote_floor` asks them over the Admin API."""

from __future__ import annotations

import random

from raftkv.raft.vote_guard import VoteGuard, VoterAnswer, floor_from

ASK_AGAIN = 1.0  # seconds between asks while too few answer
RELEARN = 5.0  # seconds between asks once a floor is known, until the member caught up (lost_data)


class Wipes:
    def __init__(self, cluster, rng: random.Random):
        """`cluster`: the `SimCluster`; `rng`: its generator, which times the first ask."""
        self._cluster = cluster
        self._rng = rng
        self.pending: set[str] = set()  # wiped, not started since: their voter members open guarded
        self._recovering: set[str] = set()  # wiped nodes until each voter member caught up with its floor
        self._lost_logs: dict[tuple[str, int], list[list]] = {}

    def took(self, node: str, durable: dict[int, list]) -> None:
        """`node` is wiped: `durable` is each group's synced log its disk held."""
        for group, log in durable.items():
            self._lost_logs.setdefault((node, group), []).append(list(log))
        self.pending.add(node)
        self._recovering.add(node)

    def lost_logs(self, node: str, group: int) -> list[list]:
        """The synced logs wipes took from the member: it had synced those entries when they were committed."""
        return self._lost_logs.get((node, group), [])

    def opened(self, node: str, group: int, guard: VoteGuard | None) -> None:
        if guard is not None and guard.recovering:
            self._cluster.scheduler.after(self._rng.uniform(0.2, 1.0), self._ask, node, group, guard)

    def recovering(self) -> bool:
        """A wiped node is down, or one of its voter members has not caught up with its floor yet."""
        cluster = self._cluster
        for node in sorted(self._recovering):
            if node in cluster.down:
                return True
            for group in cluster.groups:
                member = cluster.members.get((node, group))
                if member is not None and member.raft.config.guard.recovering:
                    return True
            self._recovering.discard(node)
        return False

    def guarded(self, node: str) -> bool:
        """`node` was wiped and may still have guarded members (whose votes go only to logs at their floor)."""
        return node in self._recovering

    def _ask(self, node: str, group: int, guard: VoteGuard) -> None:
        cluster = self._cluster
        member = cluster.members.get((node, group))
        if member is None or member.raft.config.guard is not guard or not guard.recovering:
            return
        answers = [VoterAnswer(m.raft.term, m.raft.commit_index, (m.raft.term_at(m.raft.last_log_index) or 0,
                                                                   m.raft.last_log_index), m.raft.config.guard.recovering)
                   for m in cluster.running(group) if m.node != node]
        floor = floor_from(answers, len(cluster.voters[group]))
        if floor is None:
            cluster.scheduler.after(ASK_AGAIN, self._ask, node, group, guard)
            return
        was = guard.floor
        if guard.learn(floor):
            kind, text = ("floor", f"terms after {floor.term}, logs up to") if was is None else (
                "floor-lowered", f"from {was.describe()} to")
            cluster.trace.add(kind, f"g{group} {node} {text} {guard.floor.describe()}")
        cluster.scheduler.after(RELEARN, self._ask, node, group, guard)
