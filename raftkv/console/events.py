"""The console's event log: what happened, newest first, bounded; the events a change of the
metadata means; the merge of several nodes' logs. Pure: time comes in as an argument."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable

from raftkv.meta.records import ClusterMeta, Move, group_name

CAPACITY = 500
SAME_WITHIN = 5.0  # seconds: two nodes' records of one metadata change are one event


@dataclass(frozen=True)
class Event:
    at: float  # unix seconds
    kind: str  # leader | node | move | learner | storage
    subject: str  # "partition 3", "node n2", "learner feed"
    text: str
    node: str = ""  # the node that recorded it

    def as_dict(self) -> dict:
        return {"at": self.at, "kind": self.kind, "subject": self.subject, "text": self.text, "node": self.node}


class EventLog:
    def __init__(self, node: str, capacity: int = CAPACITY):
        self._node = node
        self._events: deque[Event] = deque(maxlen=capacity)

    def record(self, at: float, kind: str, subject: str, text: str) -> None:
        self._events.append(Event(at, kind, subject, text, self._node))

    def extend(self, events: Iterable[Event]) -> None:
        for e in events:
            self._events.append(Event(e.at, e.kind, e.subject, e.text, self._node))

    def newest(self, limit: int = CAPACITY) -> list[Event]:
        return list(reversed(self._events))[:limit]


def topology_events(before: ClusterMeta, after: ClusterMeta, at: float) -> list[Event]:
    """Node state changes, and moves begun, advanced, completed or rolled back, between two topologies."""
    events = []
    old_states = {n.id: n.state for n in before.nodes}
    for n in after.nodes:
        was = old_states.get(n.id)
        if was != n.state:
            text = f"{was.value} → {n.state.value}" if was is not None else f"added ({n.state.value})"
            events.append(Event(at, "node", f"node {n.id}", text))
    old_moves = {m.group: m for m in before.moves}
    new_moves = {m.group: m for m in after.moves}
    for g, m in new_moves.items():
        if g not in old_moves:
            events.append(Event(at, "move", group_name(g), f"move {_route(m)} begun"))
        elif old_moves[g].step != m.step:
            events.append(Event(at, "move", group_name(g), f"move {_route(m)}: {m.step.value}"))
    for g, m in old_moves.items():
        if g not in new_moves:
            done = not m.target or m.target in after.group_voters(g)
            ended = "completed" if done else "rolled back"
            events.append(Event(at, "move", group_name(g), f"move {_route(m)} {ended}"))
    return events


def _route(m: Move) -> str:
    return f"{m.source or '-'} → {m.target or '-'}"


def merge(logs: Iterable[Iterable[Event]], limit: int = CAPACITY) -> list[Event]:
    """Every node's events, newest first; what several nodes recorded of one change (a metadata event
    every node saw) once, with the earliest time."""
    ordered = sorted((e for log in logs for e in log), key=lambda e: e.at)
    kept: list[Event] = []
    last_seen: dict[tuple[str, str, str], float] = {}
    for e in ordered:
        key = (e.kind, e.subject, e.text)
        if e.kind in ("node", "move") and e.at - last_seen.get(key, -SAME_WITHIN - 1) <= SAME_WITHIN:
            continue
        last_seen[key] = e.at
        kept.append(e)
    kept.reverse()
    return kept[:limit]
