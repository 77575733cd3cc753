"""What happens to a simulated cluster, drawn from one seeded generator: a client's proposals, and
faults at random moments of virtual time (each a Poisson process of its own rate per second).

- partitions: the nodes split in two at random; healed a few seconds later;
- a node killed (kill -9: its page cache survives) or cut from power (what was not synced may go),
  restarted a moment later; and now and then a power cut of every node at once;
- leadership transfers, to a chosen member or to whichever pysyncobj picks;
- membership changes, one at a time per group, as a node's mover asks them: a member removed (the node
  closes it and deletes its data a moment later), a member added on a node that has none (it opens
  with no data once the change is applied). Groups keep between 2 and N voters;
- a node wiped (the chaos harness's restart:wipe, a replaced disk): killed, its data deleted, restarted
  a moment later with its voter members guarded (vote_guard) until each learns a floor from a peer that
  kept its data. One node at a time: another is wiped only once every guarded member caught up.
In the default durability mode each node syncs its journals about once a second (journal_syncer).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Callable

from tests.engine_sim.cluster import SimCluster


@dataclass(frozen=True)
class Faults:
    proposals: float = 40.0  # per second of virtual time, over all groups
    to_follower: float = 0.1  # share of proposals made on a member that does not lead (pysyncobj forwards them)
    partition: float = 0.08
    kill: float = 0.08
    power: float = 0.08
    cluster_power: float = 0.03
    transfer: float = 0.15
    membership: float = 0.1
    wipe: float = 0.0  # off by default: the seeds the golden digests pin keep their schedules
    handback: float = 2.0  # forced hand-overs of an engine-driven group back to pysyncobj (with the engine on)
    change_timeout: float = 5.0  # a change not answered by then (its leader went) no longer holds up the next


class Nemesis:
    def __init__(self, cluster: SimCluster, faults: Faults, seed: int):
        self.cluster = cluster
        self.faults = faults
        self.active = True
        self._scheduler = cluster.scheduler
        self._rng = random.Random(seed)
        self._proposals = 0
        self._partition = 0  # which partition a heal is for
        self._changing: dict[int, float] = {}  # group -> until when a change asked of it holds up the next
        self._every(faults.proposals, self._propose)
        self._every(faults.partition, self._split)
        self._every(faults.kill, lambda: self._crash(power=False))
        self._every(faults.power, lambda: self._crash(power=True))
        self._every(faults.cluster_power, self._cluster_power_cut)
        self._every(faults.transfer, self._transfer)
        self._every(faults.membership, self._change)
        self._every(faults.wipe, self._wipe)
        if cluster.network.engines:
            self._every(faults.handback, lambda: cluster.hand_back(self._rng.choice(cluster.groups), self._rng))
        if not cluster.fsync:
            for node in cluster.nodes:
                self._scheduler.after(self._rng.uniform(0.0, 1.0), self._sync, node)

    def _every(self, rate: float, action: Callable[[], None]) -> None:
        if rate <= 0:
            return

        def fire() -> None:
            if self.active:
                action()
                self._scheduler.after(self._rng.expovariate(rate), fire)

        self._scheduler.after(self._rng.expovariate(rate), fire)

    def stop(self) -> None:
        """No more faults or proposals: heal the network and restart every node. Messages are no longer lost
        or duplicated either (TCP's network): a follower whose log diverges from the leader's is walked back
        one entry per round trip, and a message lost on the way sends it back to its log's end."""
        self.active = False
        self.cluster.unsure.update(self._changing)  # asked, not answered yet: the metadata learns from the log
        network = self.cluster.network
        network.faults = dataclasses.replace(network.faults, loss=0.0, duplication=0.0)
        network.heal()
        self.cluster.trace.add("heal", "all (settling)")
        for node in sorted(self.cluster.down):
            self.cluster.restart(node)

    # -- the client ---------------------------------------------------------------

    def _propose(self) -> None:
        cluster, rng = self.cluster, self._rng
        group = rng.choice(cluster.groups)
        members = cluster.running(group)
        if not members:
            return
        leader = cluster.leader(group)
        target = leader if leader is not None and rng.random() >= self.faults.to_follower else rng.choice(members)
        self._proposals += 1
        cluster.propose(group, f"g{group}.{self._proposals}".encode(), target)

    # -- faults -------------------------------------------------------------------

    def _split(self) -> None:
        nodes = self.cluster.nodes
        side = set(self._rng.sample(nodes, self._rng.randint(1, len(nodes) - 1)))
        self._partition += 1
        self.cluster.network.partition({n: 1 if n in side else 0 for n in nodes})
        self.cluster.trace.add("split", f"{sorted(side)} | {sorted(set(nodes) - side)}")
        self._scheduler.after(self._rng.uniform(0.5, 4.0), self._heal, self._partition)

    def _heal(self, partition: int) -> None:
        if self._partition == partition and self.active:
            self.cluster.network.heal()
            self.cluster.trace.add("heal", "")

    def _crash(self, power: bool) -> None:
        up = [n for n in self.cluster.nodes if n not in self.cluster.down]
        if not up:
            return
        node = self._rng.choice(up)
        self.cluster.crash(node, power)
        if power:
            self.cluster.after_power_cut()
        self._scheduler.after(self._rng.uniform(0.2, 3.0), self._restart, node)

    def _cluster_power_cut(self) -> None:
        for node in self.cluster.nodes:
            self.cluster.crash(node, power=True)
        self.cluster.after_power_cut()
        for node in self.cluster.nodes:
            self._scheduler.after(self._rng.uniform(0.2, 2.0), self._restart, node)

    def _wipe(self) -> None:
        if self.cluster.wipes.recovering():
            return
        node = self._rng.choice(self.cluster.nodes)
        self.cluster.wipe(node)
        self._scheduler.after(self._rng.uniform(0.2, 3.0), self._restart, node)

    def _restart(self, node: str) -> None:
        if self.active:
            self.cluster.restart(node)

    def _sync(self, node: str) -> None:
        self.cluster.sync_node(node)
        self._scheduler.after(self._rng.uniform(0.9, 1.1), self._sync, node)

    def _transfer(self) -> None:
        group = self._rng.choice(self.cluster.groups)
        voters = self.cluster.voters[group]
        self.cluster.transfer(group, self._rng.choice(voters + [None]))

    def _change(self) -> None:
        cluster, rng = self.cluster, self._rng
        group = rng.choice(cluster.groups)
        if self._changing.get(group, 0.0) > self._scheduler.now:
            return
        if group in self._changing:  # asked, never answered: its leader went
            del self._changing[group]
            cluster.unsure.add(group)
        cluster.reconcile(group)
        if group in cluster.unsure:
            return
        voters = cluster.voters[group]
        spare = [n for n in cluster.nodes if n not in voters]
        choices = [("add", n) for n in spare]
        if len(voters) > 3 or len(voters) == 3 and not spare:
            choices += [("remove", n) for n in voters]
        if not choices:
            return
        action, node = rng.choice(choices)
        if cluster.change(group, action, node, lambda: self._changing.pop(group, None)):
            self._changing[group] = self._scheduler.now + self.faults.change_timeout
