"""The simulated network: one `SimHub` per running node, in place of `raftkv.raft.hub.RaftHub`, and
links between nodes that the faults cut and heal.

As with the real hub, node A's groups see node B as reachable while A's connection to B is up: it
goes down at once when B's process dies (a reset), only after a while when the network between them
is cut (the hub's pings time out), and comes up again a little after both are back (the dialer's
retry). A message on a connection that went down is lost. A message whose handling raises closes its
connection, as `RaftHub`'s reader does (`errors` keeps what was raised). On top of that, each message may be lost,
duplicated or delayed past later ones (`NetFaults`), which TCP would not do but Raft must survive. And with
`stale`, a message may wait seconds in the receiver's socket and still be handled, after messages of a
connection dialed since: a node whose loop a slow fsync blocked for 10 s read its old connection's
frames and its new one's interleaved (docs/chaos.md, "Bugs it found").
Each link draws from a random generator of its own, so the schedule does not depend on the order in
which pysyncobj walks its sets of peers (string hashes differ between processes).
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

from raftkv.raft.engine.node_engine import NodeEngine
from raftkv.raft.hub import Directory
from raftkv.raft.hub_frames import ENGINE  # the engine's frames travel as the messages of this "group"
from tests.engine_sim.clock import Scheduler
from tests.engine_sim.trace import Trace, describe


@dataclass(frozen=True)
class NetFaults:
    loss: float = 0.02  # per message
    duplication: float = 0.02
    reorder: bool = True  # delays drawn independently: a message may overtake an earlier one
    delay: float = 0.002  # the least a message takes, seconds
    jitter: float = 0.010
    detect: float = 2.0  # at most this long before a cut connection is noticed (the hub's pings)
    reconnect: float = 0.5  # at most this long before a connection is made again (the hub's retry)
    stale: float = 0.0  # per message: held up to `stale_delay` s, handled while its receiver's process lives
    stale_delay: float = 4.0




class _Connection:
    joined: frozenset = frozenset()  # a node's connection: it joined no group read-only


CONNECTION = _Connection()


class _Subscription:
    """A learner process's connection as a node's hub accepted it: the groups it joined read-only there.
    A new one after every reconnect, as a new TCP connection is (pysyncobj sees a new read-only node)."""

    def __init__(self, learner: str):
        self.learner = learner
        self.joined: set[int] = set()


class SimNetwork:
    def __init__(self, scheduler: Scheduler, seed: int, faults: NetFaults, directory: Directory, trace: Trace):
        self._scheduler = scheduler
        self._seed = seed
        self.faults = faults
        self.directory = directory
        self._trace = trace
        self.hubs: dict[str, SimHub] = {}  # running nodes, and learner processes
        self.engines = False  # every node runs the node engine (raft_engine = "steady")
        self._side: dict[str, int] = {}  # partition: nodes on different sides cannot talk
        self._up: dict[tuple[str, str], bool] = {}  # A's connection to B, as A's hub sees it
        self._epoch: dict[tuple[str, str], int] = {}
        self._fifo: dict[tuple[str, str], float] = {}
        self._rngs: dict[tuple[str, str, int], random.Random] = {}
        self.errors: list[str] = []  # exceptions a delivered message raised (the hub logs them, drops the link)

    # -- faults -------------------------------------------------------------

    def node_up(self, node: str) -> SimHub:
        hub = self.hubs[node] = SimHub(self, node)
        self._refresh()
        return hub

    def node_down(self, node: str) -> None:
        self.hubs.pop(node, None)
        self._refresh()

    def partition(self, sides: dict[str, int]) -> None:
        self._side = dict(sides)
        self._refresh()

    def heal(self) -> None:
        self.partition({})

    def _reachable(self, a: str, b: str) -> bool:
        return a in self.hubs and b in self.hubs and self._side.get(a, 0) == self._side.get(b, 0)

    def _refresh(self) -> None:
        nodes = sorted(set(self.hubs) | {a for a, _ in self._up})
        for a in nodes:
            for b in nodes:
                if a == b:
                    continue
                want, now = self._reachable(a, b), self._up.get((a, b), False)
                if want == now:
                    continue
                if not want and (a not in self.hubs or b not in self.hubs):
                    self._set_link(a, b, False)  # a process died: its connections reset now
                else:
                    rng = self._rng(a, b, -1)
                    wait = self.faults.detect if not want else self.faults.reconnect
                    self._scheduler.after(rng.uniform(0.05, wait), self._settle_link, a, b)

    def _settle_link(self, a: str, b: str) -> None:
        want = self._reachable(a, b)
        if want != self._up.get((a, b), False):
            self._set_link(a, b, want)

    def _set_link(self, a: str, b: str, up: bool) -> None:
        self._up[(a, b)] = up
        if not up:
            self._epoch[(a, b)] = self._epoch.get((a, b), 0) + 1
        self._trace.add("link", f"{a}->{b} {'up' if up else 'down'}")
        hub = self.hubs.get(a)
        if hub is not None:
            hub.links_changed()
        learner = self.hubs.get(b)
        if hub is not None and learner is not None and learner.joins:  # b's dialer joins again at a reconnect
            hub.subscriptions_changed(b, learner.joins if up else {})

    def joined(self, learner: str, joins: dict[int, frozenset[str]]) -> None:
        """A learner process's joins changed: each node's hub it reaches takes them (its `join` control frame)."""
        for node, hub in self.hubs.items():
            if node != learner and self.is_up(node, learner):
                hub.subscriptions_changed(learner, joins)

    # -- messages -----------------------------------------------------------

    def _rng(self, a: str, b: str, group: int) -> random.Random:
        key = (a, b, group)
        rng = self._rngs.get(key)
        if rng is None:
            rng = self._rngs[key] = random.Random(zlib.crc32(f"{self._seed}/{a}/{b}/{group}".encode()))
        return rng

    def is_up(self, a: str, b: str) -> bool:
        return self._up.get((a, b), False)

    def send(self, a: str, b: str, group: int, message: object) -> bool:
        if not self._up.get((a, b), False):
            return False
        faults, rng = self.faults, self._rng(a, b, group)
        if rng.random() < faults.loss:
            self._trace.message("lost", a, b, group, message)
            return True
        copies = 2 if rng.random() < faults.duplication and _idempotent(message) else 1
        epoch = self._epoch.get((a, b), 0)
        # the receiver's process, for a message held in its socket: handled if that process still runs
        held = self.hubs.get(b) if faults.stale and rng.random() < faults.stale else None
        for _ in range(copies):
            when = self._scheduler.now + faults.delay + rng.random() * faults.jitter
            if held is not None:
                when += rng.random() * faults.stale_delay
            elif not faults.reorder:
                when = self._fifo[(a, b)] = max(when, self._fifo.get((a, b), 0.0))
            self._scheduler.at(when, self._deliver, a, b, group, message, epoch, held, member=(b, group))
        return True

    def _deliver(self, a: str, b: str, group: int, message: object, epoch: int, held: SimHub | None) -> None:
        if held is not None:
            if self.hubs.get(b) is not held:
                self._trace.message("cut", a, b, group, message)
                return
        elif self._epoch.get((a, b), 0) != epoch or not self._reachable(a, b):
            self._trace.message("cut", a, b, group, message)
            return
        self._trace.message("recv", a, b, group, message)
        if group == ENGINE:
            self._trace.counts["engine-recv"] += 1
            self._trace.counts["engine-rest"] += sum(1 for item in message if isinstance(item, tuple) and item[:1] == ("rest",))
        try:
            self.hubs[b].deliver(a, group, message)
        except Exception as exc:  # noqa: BLE001 - what the hub does with it: log it, close the connection
            self.errors.append(f"g{group} {a}->{b} {describe(message)}: {type(exc).__name__}: {exc}")
            self._trace.add("error", f"delivering to {b} raised {type(exc).__name__}: {exc}; the connection "
                                     f"{a}->{b} closes (RaftHub's read_frames)")
            self._set_link(a, b, False)
            self._refresh()


def _idempotent(message: object) -> bool:
    """Raft's messages may arrive twice; a proposal forwarded to the leader (pysyncobj's `apply_command`)
    is a client's request, appended once per delivery: TCP never delivers it twice, and neither does this."""
    return not (isinstance(message, dict) and message.get("type") == "apply_command")


class SimHub:
    """What `GroupTransport` uses of a node's `RaftHub`."""

    def __init__(self, network: SimNetwork, node: str):
        self._network = network
        self.node_id = node
        self._groups: dict[int, object] = {}
        self.joins: dict[int, frozenset[str]] = {}  # a learner process: the nodes it joined each group at
        self._subscriptions: dict[str, _Subscription] = {}  # a node: learner process -> its connection's joins

    def directory(self) -> Directory:
        return self._network.directory

    def attach(self, group: int, endpoint) -> None:
        self._groups[group] = endpoint
        endpoint.links_changed()

    def detach(self, group: int) -> None:
        self._groups.pop(group, None)

    def subscribers(self, group: int) -> frozenset:
        return frozenset(s for s in self._subscriptions.values() if group in s.joined)

    def is_up(self, node_id: str) -> bool:
        return self._network.is_up(self.node_id, node_id)

    def send(self, node_id: str, group: int, message: object, early: bool = False) -> bool:
        """`early` aside (each message travels on its own here), the hub's."""
        return self._network.send(self.node_id, node_id, group, message)

    def reply(self, connection: _Subscription, group: int, message: object) -> bool:
        return self._subscriptions.get(connection.learner) is connection and self.send(connection.learner, group,
                                                                                     message)

    def join(self, group: int, node_ids: frozenset[str]) -> None:
        """A learner process: be a read-only member of `group` at these nodes."""
        if self.joins.get(group) != node_ids:
            self.joins[group] = node_ids
            self._network.joined(self.node_id, self.joins)

    def subscriptions_changed(self, learner: str, joins: dict[int, frozenset[str]]) -> None:
        """A node's hub: the learner process's connection now joins these groups here ({}: it closed)."""
        groups = {g for g, nodes in joins.items() if self.node_id in nodes}
        subscription = self._subscriptions.get(learner)
        before = subscription.joined if subscription is not None else set()
        if groups == before:
            return
        if not groups:
            del self._subscriptions[learner]
        else:
            if subscription is None:
                subscription = self._subscriptions[learner] = _Subscription(learner)
            subscription.joined = groups
        for group in before | groups:
            if (endpoint := self._groups.get(group)) is not None:
                endpoint.links_changed()

    def links_changed(self) -> None:
        for endpoint in list(self._groups.values()):
            endpoint.links_changed()

    # -- the node engine's wire ---------------------------------------------

    engine: NodeEngine | None = None

    def engine_peer(self, node_id: str) -> bool:
        return self._network.engines and self.is_up(node_id)

    def deliver(self, sender: str, group: int, message: object) -> None:
        if group == ENGINE:
            if self.engine is not None:
                self.engine.receive(sender, message)
            return
        endpoint = self._groups.get(group)
        subscription = self._subscriptions.get(sender)
        if subscription is not None:  # from a learner process, over the connection it joined on
            if group in subscription.joined and endpoint is not None:
                endpoint.deliver(None, subscription, message)
        elif endpoint is not None:
            endpoint.deliver(sender, CONNECTION, message)
