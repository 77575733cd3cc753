"""The membership faults: replicas moved and leaderships handed on, and nodes joined, decommissioned
and replaced (docs/chaos.md, "The cluster changing shape under faults"). A part of `FaultInjector`
(raftkv/chaos/faults.py), whose state and node verbs (`_kill`, `_start`, `_wipe`, `_serves_or_exits`)
it uses.
"""

from __future__ import annotations

import os
import random
import subprocess
import time

from raftkv.chaos.nemesis import FaultStep
from raftkv.chaos.timeline import FaultRecord
from raftkv.client.sync_client import Client
from raftkv.core.errors import RaftKVError
from raftkv.meta.records import NodeState

MOVE_TIMEOUT = 60.0  # for a replica move to finish once the faults are healed
DRAIN_TIMEOUT = 120.0  # for a decommissioned node to be removed, or a dead one's replicas re-created
EXIT_TIMEOUT = 30.0  # for a removed node's process to exit by itself
MIN_LIVE = 3  # a decommission or replace leaves at least this many live members


class MembershipFaults:
    # a replica of the step's partition moves to a node without one (and back, with a kill on the way),
    # or its leadership to a follower
    def _inject_membership(self, step: FaultStep, record: FaultRecord) -> None:
        pick = random.Random(step.seed)
        p = step.partition
        voters = self.placement()[p]
        try:
            with Client(self.cluster.endpoints, timeout=10.0) as kv:
                if step.variant in ("join", "decommission", "replace") and self._reshape(kv, step.variant, pick, record):
                    return
                spare = [n for n in self.spec.node_ids if n not in voters and n not in self.down | self.paused]
                if step.variant in ("kill-source", "stale-return") and spare:
                    self._move_and_return(kv, p, pick.choice(list(voters)), pick.choice(spare),
                                          step.variant == "stale-return", pick, record)
                    return
                if step.variant == "move" and spare:
                    source, target = pick.choice(list(voters)), pick.choice(spare)
                    kv.move_replica(p, source, target)
                    record.notes.append(f"partition {p}: moving {source} -> {target}")
                    return
                leader = self.leaders().get(p)
                followers = [n for n in voters if n != leader and n not in self.down | self.paused]
                if followers:
                    target = pick.choice(followers)
                    kv.transfer_leadership(p, target)
                    record.notes.append(f"partition {p}: leadership {leader or '?'} -> {target}"
                                        + ("" if step.variant == "transfer" else " (no node without a replica)"))
        except RaftKVError as exc:  # refused (a move under way) or unavailable (other faults): noted, not a bug
            record.notes.append(f"partition {p}: {exc}")

    def _move_and_return(self, kv: Client, p: int, a: str, b: str, stale: bool, pick: random.Random,
                         record: FaultRecord) -> None:
        """kill-source: partition p moves from a to b and a is killed at once; the move ends without it,
        a restarts on its old folder and the partition moves back to it.

        stale-return (issue 32's six steps): p moves from a to b, then back, and b is killed while a
        catches up, so b's journal keeps the entry that removed a but not the one that added a back;
        leadership goes to a; b restarts on that journal and p moves to it again. The moves back must
        finish (the heal waits for them)."""
        source, target = a, b
        if stale:
            kv.move_replica(p, a, b)
            record.notes.append(f"partition {p}: moving {a} -> {b}")
            if not self._moves_done(record, (p, a, b)):
                return
            source, target = b, a
        kv.move_replica(p, source, target)
        self._kill(source)
        record.notes.append(f"partition {p}: moving {source} -> {target}; killed {source}")
        try:
            if not self._moves_done(record, (p, source, target)):  # the rebalancer may start others, even
                return  # to the killed node: they wait for the heal
            if stale:
                kv.transfer_leadership(p, target)
        finally:
            self._start(source)
        back_from = pick.choice([v for v in self.placement()[p] if v != target]) if stale else target
        kv.move_replica(p, back_from, source)
        record.notes.append(f"partition {p}: {source} restarted on its old folder; moving {back_from} -> {source}")

    def _reshape(self, kv: Client, variant: str, pick: random.Random, record: FaultRecord) -> bool:
        """join: a spare node joins. decommission: a live member holding replicas is drained and removed,
        while more than MIN_LIVE members are live. replace: a live member is killed and its data deleted
        (its replicas re-created elsewhere once it is dead), and a spare joins. Whether it did (else the
        step moves a replica instead)."""
        live, spares = self.live(), self.cluster.unused_spares()
        candidates = [n for n in live if n != self.disk_node and n not in {**self.leaving, **self.joining}]
        if variant == "join" and spares:
            self._join(spares[0], record)
            return True
        # One change of shape at a time: a second node gone before the first's replicas are back may take a
        # majority. The moves a join sets off (the rebalancer's) end first, up to MOVE_TIMEOUT.
        self._meta_says(lambda meta: not meta.moves, MOVE_TIMEOUT, record)
        meta = kv.topology().meta
        if meta.moves or any(n.state == NodeState.DEAD and meta.holds_anything(n.id) for n in meta.nodes):
            record.notes.append(f"no {variant}: a move or a dead node's replicas are not done")
            return False
        if variant == "decommission" and len(live) > MIN_LIVE and candidates:
            node_id = self._holder(kv, candidates, pick)
            kv.decommission(node_id)
            self.leaving[node_id] = record
            record.notes.append(f"decommissioning {node_id}")
            return True
        if variant != "replace" or not spares or not candidates:
            return False
        node_id = self._holder(kv, candidates, pick)
        if len(live) <= MIN_LIVE:  # the new node comes first: the cluster may not fall below MIN_LIVE
            self._join(spares[0], record)
            if self._serves_or_exits(spares[0], record) != "served":  # it joins through a member that may be this
                return True  # the heal says it did not join
        self._kill(node_id)
        self._wipe(node_id, record)
        self._unmount(node_id, record)
        self.cluster.remove(node_id)
        self.cluster.forget(node_id)
        self.down.discard(node_id)
        for held in (self.armed, self.failing, self.damaged):
            held.pop(node_id, None)
        self.replaced[node_id] = record
        record.notes.append(f"{node_id} killed and its data deleted: to be marked dead and replaced")
        return True

    @staticmethod
    def _holder(kv: Client, candidates: list[str], pick: random.Random) -> str:
        """One of `candidates`, one holding replicas if any does."""
        meta = kv.topology().meta
        return pick.choice([n for n in candidates if meta.voter_partitions(n)] or candidates)

    def _join(self, node_id: str, record: FaultRecord) -> None:
        if (disk := self.spare_disks.pop(node_id, None)) is not None:
            disk.mount()
            self.power_loss_disks[node_id] = disk
        self.logs.mark(node_id)
        self.cluster.join(node_id)
        record.notes.append(f"{node_id} joins")
        self.joining[node_id] = record

    def _heal_membership(self, record: FaultRecord) -> None:
        for node_id in [n for n, r in self.replaced.items() if r is record]:
            self._replaced(node_id, record)
        for node_id in [n for n, r in self.leaving.items() if r is record]:
            self._left(node_id, record)
        for node_id in [n for n, r in self.joining.items() if r is record]:
            if self._serves_or_exits(node_id, record) != "served":
                record.problems.append(f"{node_id} did not join: see {self.cluster.log_path(node_id)}")
            del self.joining[node_id]
        self._moves_done(record)

    def _left(self, node_id: str, record: FaultRecord) -> None:
        """Until the decommissioned node is removed and its process has exited by itself (leaving till then:
        its exit is no crash)."""
        removed = self._meta_says(lambda meta: meta.node(node_id).state == NodeState.REMOVED, DRAIN_TIMEOUT, record)
        del self.leaving[node_id]
        if not removed:
            record.problems.append(f"{node_id} was not removed within {DRAIN_TIMEOUT:.0f}s of its decommission")
            return
        proc = self.cluster.procs[node_id]
        try:
            proc.wait(EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            record.problems.append(f"{node_id} was removed but its process did not exit within {EXIT_TIMEOUT:.0f}s")
            proc.kill()
            proc.wait()
        self._unmount(node_id, record)
        self.cluster.remove(node_id)
        self.cluster.forget(node_id)

    def _unmount(self, node_id: str, record: FaultRecord) -> None:
        """A node gone for good: its power-loss disk is unmounted, its FUSE process and the two threads
        that read it end (they stayed to the end of the run, two threads and 20 MB for each node gone)."""
        disk = self.power_loss_disks.pop(node_id, None)
        if disk is None:
            return
        disk.close()
        if os.path.ismount(disk.mount_point):
            record.problems.append(f"{node_id}'s power-loss disk is still mounted on {disk.mount_point}")

    def _replaced(self, node_id: str, record: FaultRecord) -> None:
        """A spare joins in the dead node's place (unless one joined first); then, until the dead node holds
        no replica."""
        del self.replaced[node_id]
        if (spares := self.cluster.unused_spares()) and not any(r is record for r in self.joining.values()):
            self._join(spares[0], record)
        if not self._meta_says(lambda meta: meta.node(node_id).state == NodeState.DEAD
                               and not meta.holds_anything(node_id), DRAIN_TIMEOUT + self.spec.tuning.dead_after,
                               record):
            record.problems.append(f"{node_id}'s replicas were not re-created elsewhere within "
                                   f"{DRAIN_TIMEOUT + self.spec.tuning.dead_after:.0f}s of its death")

    def _meta_says(self, holds, timeout: float, record: FaultRecord) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._tend(record)
            try:
                with Client(self.cluster.endpoints, timeout=5.0) as kv:
                    if holds(kv.topology().meta):
                        return True
            except RaftKVError:
                pass
            time.sleep(0.5)
        return False

    def _tend(self, record: FaultRecord) -> None:
        """While a change of shape is waited on (minutes, at most): a node that stopped meanwhile starts
        again, as after every heal. A node an earlier corrupt fault left on damaged files stopped on them
        during a replace (fsync sweep, seed 504); down until the replace's heal ended, 165 s, it was marked
        dead, and two live nodes could not take the replaced node's replicas."""
        for node_id, code in self.restart_crashed().items():
            record.problems.append(f"{node_id} exited with code {code} during {record.name}; "
                                   f"see {self.cluster.log_path(node_id)}")

    def _moves_done(self, record: FaultRecord, move: tuple[int, str, str] | None = None) -> bool:
        """Until no move is under way, or this one (partition, source, target) is not (a move that never
        ends is a problem)."""
        deadline = time.monotonic() + MOVE_TIMEOUT
        while time.monotonic() < deadline:
            self._tend(record)
            try:
                with Client(self.cluster.endpoints, timeout=5.0) as kv:
                    moves = kv.topology().meta.moves
                    if not any(move is None or (m.group, m.source, m.target) == move for m in moves):
                        return True
            except RaftKVError:
                pass
            time.sleep(0.5)
        record.problems.append(f"a replica move did not finish within {MOVE_TIMEOUT:.0f}s")
        return False
