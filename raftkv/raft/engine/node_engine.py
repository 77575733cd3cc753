"""The node's engine: one turn for every engine-driven group that has something to do, one frame per
peer node per turn, one heartbeat timer for the node (docs/raft-engine.md, "Step 4, as built").

It carries items between the groups (`steady.SteadyGroup`) and the wire, which is the node's Raft hub
(`RaftHub.send_engine`, one hub frame of plain data per peer) or, in the simulation, its `SimHub`:

- items a group emits wait in the peer's outbox until the end of the turn;
- the turn: each ready leader's new entries go into `steps` items, then every group whose log was
  written this turn has it synced (fsync mode, a journal of its own), then each peer's items leave as
  one frame. On the node log in fsync mode (`durability`) the hub holds the frames until the node
  log's sync covers the turn's write, and a leader's `steps` and `beat` leave first, in a frame of
  their own: the leader counts itself toward a quorum only for what a sync covered (`on_synced`);
- every heartbeat period, each engine-driven leader times out, resends and heartbeats (`periodic`).

The engine reads its `Clock` (pysyncobj's, `core/clock.py`) once when a frame arrives, once a turn and
once a heartbeat period, and hands that `now` to the groups.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

from raftkv.core import metrics
from raftkv.core.clock import Clock
from raftkv.core.errors import CorruptData, StorageFull
from raftkv.core.spec import Tuning
from raftkv.raft.engine import items as it
from raftkv.raft.engine.steady import SteadyGroup
from raftkv.raft.hub_frames import ENGINE


class Wire(Protocol):
    """What the engine needs of the node's hub."""

    def send(self, node_id: str, group: int | str, message: object, early: bool = False) -> bool:
        """One frame of `message` to node `node_id`, with the turn's other frames (the engine's: group ENGINE);
        `early`: before the turn's sync of the node log."""

    def engine_peer(self, node_id: str) -> bool:
        """Whether node `node_id` announced the engine (and its connection is up)."""

    def is_up(self, node_id: str) -> bool: ...

    def directory(self): ...


class Durability(Protocol):
    """fsync mode on the node log (`log_turn.LogTurn`): the turn's sync runs while the loop runs on, and the
    leaders send before it, counting themselves toward a quorum only for what it covered."""

    def mark(self) -> int:
        """The write that covers every record made so far."""

    @property
    def synced(self) -> int:
        """The write the last completed sync covered."""

    def sync_now(self) -> None: ...


EARLY = frozenset({it.STEPS, it.BEAT})  # a leader's items: they speak of no record of the sender's as durable


class NodeEngine:
    def __init__(self, loop, wire: Wire, tuning: Tuning, request_turn: Callable[[], None] | None = None,
                 offering: bool = True, rests: bool = True, clock: Clock = time.monotonic):
        """`request_turn()`: `turn()` soon, once (the hub's `flush_soon`: its flush runs the turn first, so the
        turn's frames leave after that flush's write and sync of the node log); by default on the loop.
        `offering`: whether this node's leaders offer their groups to the engine; the node turns it on once the
        cluster version says every member runs the engine (`raft_engine = "auto"`). Its followers take groups
        their leaders offer either way. `rests`: whether its idle leaders rest their groups in the engine (an
        older member drops the `rest` item); the node turns it on by the cluster version too."""
        self.offering = offering
        self.rests = rests
        self._loop = loop
        self._clock = clock
        self._wire = wire
        self._tuning = tuning
        self._request_turn = request_turn or (lambda: loop.call_soon(self.turn))
        self._groups: dict[int, SteadyGroup] = {}
        self._driven: set[SteadyGroup] = set()  # not handed back: leading or following
        self._ready: list[SteadyGroup] = []
        self._wrote: list[SteadyGroup] = []  # appended this turn: synced before the frames leave (own journals)
        self.durability: Durability | None = None
        self._unsynced: set[SteadyGroup] = set()  # leaders with entries their node log's sync has not covered
        self._outbox: dict[str, list[tuple]] = {}
        self._turn_scheduled = False
        self._epoch = 0
        self._heard: dict[str, float] = {}  # node id -> when its last frame arrived
        self._timer = None
        self._closed = False

    # -- groups ---------------------------------------------------------------------

    def attach(self, group: SteadyGroup) -> None:
        self._groups[group.partition] = group

    def detach(self, group: SteadyGroup) -> None:
        if self._groups.get(group.partition) is group:
            del self._groups[group.partition]
        self._driven.discard(group)

    def next_epoch(self) -> int:
        self._epoch += 1
        return self._epoch

    def node_of(self, address: str) -> str | None:
        where = self._wire.directory().locate(address)
        return where[0] if where is not None else None

    def heard_from(self, node_id: str) -> float:
        """When the last frame from node `node_id` arrived (0: never)."""
        return self._heard.get(node_id, 0.0)

    def supports(self, node_id: str) -> bool:
        return self._wire.engine_peer(node_id)

    def reaches(self, node_id: str) -> bool:
        return self._wire.is_up(node_id)

    # -- what groups call -------------------------------------------------------------

    def emit(self, peer: str, item: tuple) -> None:
        group = self._groups.get(item[1])
        if group is not None and group.mode != "pysyncobj":
            self._driven.add(group)
        self._outbox.setdefault(peer, []).append(item)
        self._schedule()

    def ready(self, group: SteadyGroup) -> None:
        self._driven.add(group)
        self._ready.append(group)
        self._schedule()

    def wrote(self, group: SteadyGroup) -> None:
        self._wrote.append(group)

    def handed_back(self, group: SteadyGroup) -> None:
        self._driven.discard(group)
        self._unsynced.discard(group)

    def mark(self, group: SteadyGroup) -> int | None:
        if self.durability is None:
            return None
        self._unsynced.add(group)
        return self.durability.mark()

    def synced(self) -> int | None:
        return self.durability.synced if self.durability is not None else None

    def sync_now(self) -> None:
        if self.durability is not None:
            self.durability.sync_now()

    def on_synced(self) -> None:
        """The node log's sync completed: leaders count themselves for what it covered, and commit."""
        for group in list(self._unsynced):
            try:
                waiting = group.synced()
            except (StorageFull, CorruptData) as exc:
                group.failed(exc)
                waiting = False
            if not waiting:
                self._unsynced.discard(group)

    # -- the wire ------------------------------------------------------------------------

    def receive(self, peer: str, items: object) -> None:
        """A frame of items from node `peer`."""
        metrics.ENGINE_FRAMES.labels("received").inc()
        metrics.RAFT_MESSAGES_RECEIVED.inc()
        now = self._heard[peer] = self._clock()
        if not isinstance(items, list):
            metrics.ENGINE_STALE.inc()
            return
        for item in items:
            group = self._groups.get(item[1]) if it.well_formed(item) else None
            if group is None:
                metrics.ENGINE_STALE.inc()  # malformed, or a group this node does not host
                continue
            _guarded(group, group.on_item, peer, item, now)
            if group.mode != "pysyncobj":
                self._driven.add(group)

    def links_changed(self) -> None:
        for group in list(self._driven):
            group.links_changed()

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- the turn -------------------------------------------------------------------------

    def _schedule(self) -> None:
        if not self._turn_scheduled and not self._closed:
            self._turn_scheduled = True
            self._request_turn()
        if self._timer is None and not self._closed:  # runs while a group is driven
            self._timer = self._loop.call_later(self._tuning.heartbeat_period, self._periodic)

    def turn(self) -> None:
        if not self._turn_scheduled:
            return
        self._turn_scheduled = False
        ready, self._ready = self._ready, []
        now = self._clock() if ready else 0.0
        for group in dict.fromkeys(ready):
            _guarded(group, group.send_steps, now)
        wrote, self._wrote = self._wrote, []
        for group in dict.fromkeys(wrote):
            if self.durability is None or not group.leading:  # a leader's sync need not come before its frames
                _guarded(group, group.sync_journal)
        outbox, self._outbox = self._outbox, {}
        for peer, items in outbox.items():
            if self.durability is None:
                self._send(peer, items)
                continue
            late = {item[1] for item in items if item[0] not in EARLY}  # a group's items keep their order
            early = [item for item in items if item[1] not in late]
            if early:
                self._send(peer, early, early=True)
            if len(early) < len(items):
                self._send(peer, [item for item in items if item[1] in late])

    def _send(self, peer: str, items: list[tuple], early: bool = False) -> None:
        if self._wire.send(peer, ENGINE, items, early):
            metrics.ENGINE_FRAMES.labels("sent").inc()

    def _periodic(self) -> None:
        self._timer = None
        if self._closed:
            return
        now, tuning = self._clock(), self._tuning
        for group in [g for g in self._driven if g.leading and not g.resting]:
            _guarded(group, group.periodic, now, tuning.heartbeat_period, tuning.election_timeout_max)
        if self._timer is None and not all(g.resting for g in self._driven):
            self._timer = self._loop.call_later(tuning.heartbeat_period, self._periodic)


def _guarded(group: SteadyGroup, action: Callable[..., None], *args) -> None:
    """`action(*args)` of one group: a log it could not write (a full disk) or found corrupt is that group's
    failure, not the frame's or the turn's (the hub would drop the connection, the other groups' items)."""
    try:
        action(*args)
    except (StorageFull, CorruptData) as exc:
        group.failed(exc)
