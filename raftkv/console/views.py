"""Each console page's JSON, from what a node gathered of the cluster. Pure.

A node that did not answer is shown as such, and what only it knows is None ("unknown" on the
page), never guessed from an older answer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Mapping

from raftkv.api import kv_pb2 as pb
from raftkv.console.events import Event
from raftkv.meta.planner import PlannedMove, leaders_from, plan
from raftkv.meta.records import ClusterMeta, NodeState, group_name

ENDED = ("completed", "rolled back")


@dataclass(frozen=True)
class Gathered:
    at: float  # unix seconds
    me: str
    partitions: int
    topology: ClusterMeta
    meta_leader: str | None
    statuses: Mapping[str, pb.StatusResponse | None]  # node -> its KV.Status; None: it did not answer
    reports: Mapping[str, pb.NodeReportResponse | None]  # node -> its Admin.NodeReport
    progress: Mapping[int, pb.ReplicaState | None] = field(default_factory=dict)  # a move's target, by group
    scheme: str = "http"

    def members(self) -> list[str]:
        return self.topology.members

    @functools.cached_property
    def _by_partition(self) -> dict[int, dict[str, pb.PartitionStatus]]:
        found: dict[int, dict[str, pb.PartitionStatus]] = {}
        for n, s in self.statuses.items():
            for ps in s.hosted if s is not None else ():
                found.setdefault(ps.partition, {})[n] = ps
        return found

    def hosted(self, partition: int) -> dict[str, pb.PartitionStatus]:
        """What each node that answered says of its replica of `partition`."""
        return self._by_partition.get(partition, {})

    def leaders(self) -> dict[int, str]:
        return leaders_from((n, ps.partition, ps.role, ps.term)
                            for n, s in self.statuses.items() if s is not None for ps in s.hosted)


def health(g: Gathered, leaders: Mapping[int, str], p: int) -> str:
    """ok | leaderless | under-replicated | unknown (none of its voters answered)."""
    voters = g.topology.voters_of(p) if p < len(g.topology.placement) else ()
    hosted = g.hosted(p)
    live = [v for v in voters if v in hosted]
    if not live:
        return "unknown"
    if p not in leaders:
        return "leaderless"
    return "under-replicated" if len(live) < g.topology.replication else "ok"


def overview(g: Gathered) -> dict:
    leaders = g.leaders()
    nodes = []
    for record in g.topology.nodes:
        if record.state == NodeState.REMOVED:
            continue
        status, report = g.statuses.get(record.id), g.reports.get(record.id)
        answered = status is not None
        nodes.append({
            "id": record.id, "host": record.host,
            "console": f"{g.scheme}://{record.host}:{record.metrics_port}/",
            # a node that does not answer is dead to whoever looks; the metadata says so after dead_after
            "state": record.state.value if answered else "dead",
            "recorded_state": record.state.value, "answered": answered,
            "meta_leader": record.id == g.meta_leader,
            "replicas": len(status.hosted) if answered else None,
            "leaders": sum(ps.role == "leader" for ps in status.hosted) if answered else None,
            "uptime_s": g.at - report.started_at if report is not None else None,
            "disk_used_bytes": report.data_bytes if report is not None else None,
            "rss_bytes": report.rss_bytes if report is not None else None,
            "cpu_percent": report.cpu_percent if report is not None else None,
        })
    states = {p: health(g, leaders, p) for p in range(g.partitions)}
    reports = [r for r in g.reports.values() if r is not None]
    complete = len(reports) == len(nodes)
    return {
        "me": g.me, "at": g.at, "epoch": g.topology.epoch, "partitions": g.partitions,
        "replication": g.topology.replication, "meta_leader": g.meta_leader, "nodes": nodes,
        "leaderless": [p for p, s in states.items() if s == "leaderless"],
        "under_replicated": [p for p, s in states.items() if s == "under-replicated"],
        "unknown": [p for p, s in states.items() if s == "unknown"],
        # from the nodes that answered: a rate of a node that did not is unknown, so the sum is a floor
        "writes_per_s": sum(r.write_rate for r in reports), "reads_per_s": sum(r.read_rate for r in reports),
        "rates_complete": complete,
    }


def _cell(ps: pb.PartitionStatus | None, answered: bool, leader_commit: int | None) -> dict:
    if not answered:
        return {"role": "unknown"}
    if ps is None:
        return {"role": ""}
    return {"role": "leader" if ps.role == "leader" else "voter", "term": ps.term, "commit": ps.commit_index,
            "applied": ps.applied_index,
            "lag": max(0, leader_commit - ps.applied_index) if leader_commit is not None else None}


def partition_row(g: Gathered, leaders: Mapping[int, str], p: int) -> dict:
    hosted = g.hosted(p)
    leader = leaders.get(p)
    leader_commit = hosted[leader].commit_index if leader in hosted else None
    voters = g.topology.voters_of(p) if p < len(g.topology.placement) else ()
    move = g.topology.move_of(p)
    cells = {}
    for n in g.members():
        answered = g.statuses.get(n) is not None
        cell = _cell(hosted.get(n), answered, leader_commit)
        if move is not None and n == move.target and n not in hosted:
            cell = {"role": "moving", **_progress(g.progress.get(p), leader_commit)}
        elif answered and n in voters and n not in hosted:
            cell = {"role": "missing"}  # the metadata places a voter here; the node reports none
        if move is not None and n == move.source:
            cell["moving_out"] = True
        cells[n] = cell
    return {"partition": p, "leader": leader, "term": hosted[leader].term if leader in hosted else None,
            "health": health(g, leaders, p), "voters": list(voters), "cells": cells,
            "move": {"source": move.source, "target": move.target, "step": move.step.value} if move else None}


def _progress(state: pb.ReplicaState | None, leader_commit: int | None) -> dict:
    if state is None:
        return {"bytes": None, "applied": None, "fraction": None}
    applied = state.applied_index or None
    fraction = min(1.0, applied / leader_commit) if applied and leader_commit else 0.0
    return {"bytes": state.snapshot_bytes_received, "applied": applied, "fraction": fraction, "mode": state.mode}


def placement(g: Gathered) -> dict:
    leaders = g.leaders()
    return {"nodes": g.members(), "answered": {n: g.statuses.get(n) is not None for n in g.members()},
            "rows": [partition_row(g, leaders, p) for p in range(g.partitions)]}


def partition(g: Gathered, p: int, events: list[Event]) -> dict:
    row = partition_row(g, g.leaders(), p)
    row["leader_changes"] = [e.as_dict() for e in events if e.kind == "leader" and e.subject == f"partition {p}"]
    return row


def learners(g: Gathered) -> dict:
    """Each learner's sink and, per partition, its delivered index and lag behind the leader's last data
    entry (progress reports are entries too, so the commit index alone would never let lag reach 0)."""
    leaders = g.leaders()
    found: dict[str, dict] = {}
    for p in range(g.partitions):
        leader = leaders.get(p)
        ps = g.hosted(p).get(leader) if leader is not None else None
        for info in ps.learners if ps is not None else ():
            entry = found.setdefault(info.name, {"name": info.name, "sink": info.sink, "options": dict(info.options),
                                                 "partitions": {}})
            entry["partitions"][p] = {"delivered": info.progress, "last": ps.last_data_index,
                                      "lag": max(0, ps.last_data_index - info.progress)}
    for entry in found.values():
        known = entry["partitions"]
        entry["unknown"] = [p for p in range(g.partitions) if p not in known]
        entry["max_lag"] = max((c["lag"] for c in known.values()), default=None)
    return {"learners": sorted(found.values(), key=lambda e: e["name"]),
            "unknown_partitions": [p for p in range(g.partitions) if p not in leaders]}


def moves(g: Gathered, events: list[Event]) -> dict:
    leaders = g.leaders()
    under_way = []
    for m in g.topology.moves:
        leader = leaders.get(m.group)
        hosted = g.hosted(m.group) if m.group >= 0 else {}
        commit = hosted[leader].commit_index if leader in hosted else None
        under_way.append({"group": m.group, "name": group_name(m.group), "source": m.source, "target": m.target,
                          "step": m.step.value, **_progress(g.progress.get(m.group), commit), "leader_commit": commit})
    pending = [{"action": "move replica" if isinstance(a, PlannedMove) else "transfer leadership",
                "group": group_name(a.partition), "source": a.source, "target": a.target}
               for a in plan(g.topology, leaders, max_moves=10**6, max_moves_per_node=10**6)]
    recent = [e.as_dict() for e in events if e.kind == "move" and e.text.endswith(ENDED)]
    return {"under_way": under_way, "plan": pending, "plan_complete": len(leaders) == g.partitions,
            "recent": recent}


def events_page(events: list[Event], limit: int, kind: str) -> dict:
    chosen = [e for e in events if not kind or e.kind == kind][:limit]
    return {"events": [e.as_dict() for e in chosen]}


def series(rows: list[tuple], fields: tuple[str, ...]) -> dict:
    return {"fields": list(fields), "rows": [list(r) for r in rows]}
