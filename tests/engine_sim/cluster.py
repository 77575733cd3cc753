"""N simulated nodes, each hosting its members of M Raft groups: real `SyncObjGroup`s (pysyncobj with
every override of ours) over `SimHub`s, `SimJournal`s and `SimStateMachine`s, ticked by `SimLoop`s.

The cluster carries out what the faults and the client ask (`faults.py`): kill -9 and power cuts of
nodes, restarts, proposals, leadership transfers and membership changes as a node's mover asks them.
After every step it reads the members the step touched and hands what it sees to the `Checker`.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

from raftkv.core.spec import Tuning
from raftkv.raft.engine.node_engine import NodeEngine
from raftkv.raft.group import Outcome, Role
from raftkv.raft.hub import Directory
from raftkv.raft.syncobj_group import GroupConfig, SyncObjGroup
from raftkv.raft.syncobj_journal import membership_change
from raftkv.raft.vote_guard import VoteGuard
from tests.engine_sim.checker import Checker
from tests.engine_sim.clock import Scheduler, SimLoop
from tests.engine_sim.network import ENGINE, SimNetwork
from tests.engine_sim.storage import JournalDisk, SimJournal, SimLogSync, SimStateMachine, StateDisk
from tests.engine_sim.trace import Trace
from tests.engine_sim.wipes import Wipes

TUNING = Tuning()
_LEADER = Role.LEADER.value
LEARNER = "l1"  # a learner process (a change feed): a read-only member of every even group, never crashed


def learns(group: int) -> bool:
    return group % 2 == 0


def address(node: str, group: int) -> str:
    return f"{node}:{group}"


@dataclass
class Member:
    node: str
    group: int
    raft: SyncObjGroup
    loop: SimLoop
    checked_commit: int  # the commit index the checker has seen
    led_term: int = -1  # the last term the checker saw it lead in
    reopened_at: int = 0  # the commit index it opened with: what it applies to there is a replay

    @property
    def journal(self) -> SimJournal:
        return self.raft._journal

    @property
    def state(self) -> int:
        return self.raft._member._SyncObj__raftState


class SimCluster:
    def __init__(self, nodes: int, groups: int, replicas: int, fsync: bool, seed: int, folder: Path,
                 scheduler: Scheduler, network_factory, trace: Trace, checker: Checker, engine: bool = False,
                 learners: bool = False):
        self.nodes = [f"n{i}" for i in range(1, nodes + 1)]
        self.groups = list(range(groups))
        self.fsync = fsync
        self.scheduler = scheduler
        self.trace = trace
        self.checker = checker
        self._folder = folder
        self._rng = random.Random(seed * 7919 + 1)  # what the disks keep at a power cut
        self._sync_rng = random.Random(seed * 7919 + 2)  # how long the node logs' syncs take (fsync mode)
        directory = Directory({}, {address(n, g): (n, g) for n in self.nodes for g in self.groups})
        self.network: SimNetwork = network_factory(directory)
        self.network.engines = engine
        self.engines: dict[str, NodeEngine] = {}  # running nodes' engines (raft_engine = "steady")
        self._engine_loops: dict[str, SimLoop] = {}
        # the cluster metadata's view: each group's voters, placed round the nodes
        self.voters = {g: [self.nodes[(g + i) % nodes] for i in range(min(replicas, nodes))] for g in self.groups}
        self.members: dict[tuple[str, int], Member] = {}
        self.learners: dict[tuple[str, int], Member] = {}  # the learner process's read-only members
        self._with_learners = learners
        self.journals: dict[tuple[str, int], JournalDisk] = {}
        self.states: dict[tuple[str, int], StateDisk] = {}
        self.down: set[str] = set()
        self.wipes = Wipes(self, self._rng)
        self.unsure: set[int] = set()  # groups a membership change may have changed without the answer saying so
        self.lost_acknowledged = 0  # default mode: acknowledged proposals a power cut may have taken
        self._opening: tuple[str, int] | None = None

    def start(self) -> None:
        """Every node up with its members (inside `virtual_time`, whose journal factory is `create_journal`)."""
        for node in self.nodes:
            self._node_up(node)
        for group in self.groups:
            for node in self.voters[group]:
                self._open(node, group, new_cluster=True)
        if self._with_learners:
            self.network.node_up(LEARNER)
            for group in filter(learns, self.groups):
                self._open(LEARNER, group)

    def _node_up(self, node: str) -> None:
        hub = self.network.node_up(node)
        if self.network.engines:
            loop = self._engine_loops[node] = SimLoop(self.scheduler, (node, ENGINE))
            hub.engine = self.engines[node] = NodeEngine(loop, hub, TUNING, clock=self.scheduler.time)
            if self.fsync:
                sync = SimLogSync(self.scheduler, loop, self._sync_rng,
                                  lambda: [m.journal for k, m in self.members.items() if k[0] == node])
                hub.engine.durability, sync.engine = sync, hub.engine

    # -- members ----------------------------------------------------------------

    def create_journal(self, _config) -> SimJournal:
        """pysyncobj's `createJournal` while a member opens: its journal, on its disk."""
        node, group = key = self._opening
        disk = self.journals.setdefault(key, JournalDisk())
        return SimJournal(disk, self.fsync, partial(self.checker.on_append, node, group))

    def _open(self, node: str, group: int, new_cluster: bool = False) -> None:
        key = (node, group)
        folder = self._folder / node / str(group)
        folder.mkdir(parents=True, exist_ok=True)  # make_dirs would fsync its parents
        state = SimStateMachine(self.states.setdefault(key, StateDisk()), partial(self._applied, node, group),
                                partial(self.checker.on_roll_back, node, group))
        voters, learner = self.voters[group], node == LEARNER
        guard = None if learner else VoteGuard(folder, guarded=node in self.wipes.pending)
        config = GroupConfig(
            partition=group, hub=self.network.hubs[node], self_address=None if learner else address(node, group),
            peers=tuple(address(n, group) for n in voters if n != node), folder=folder, fsync=self.fsync,
            tuning=TUNING, membership_changes=True, on_corrupt=partial(self._stopped, node, group),
            engine=self.engines.get(node), clock=self.scheduler.time, new_cluster=new_cluster, guard=guard)
        loop = SimLoop(self.scheduler, key)
        self._opening = key
        try:
            raft = SyncObjGroup(config, state, loop)
        finally:
            self._opening = None
        if not self.fsync:
            raft._journal.sync_elsewhere()  # the node's syncer thread, `sync_node`, as journal_syncer does
        elif key[0] in self.engines:  # the node log's turn syncs (`SimLogSync`), not the apply, as on a node
            raft._stored = partial(_stored_as_on_the_node_log, raft)
        raft.name_members(frozenset(address(n, group) for n in voters))
        # fsync mode: what the log says is committed is checked again; the default mode may have lost it
        checked = 1 if self.fsync else raft.commit_index
        (self.learners if learner else self.members)[key] = Member(node, group, raft, loop, checked,
                                                                   reopened_at=raft.commit_index)
        self.trace.add("open", f"g{group} {node} term {raft.term} log ..{raft.last_log_index} "
                               f"commit {raft.commit_index} state at {state.position.index}"
                               f"{' (guarded)' if guard is not None and guard.waiting else ''}")
        self.wipes.opened(node, group, guard)

    def _close(self, node: str, group: int) -> None:
        member = self.members.pop((node, group), None)
        if member is not None:
            member.raft.close()
            member.loop.dead = True

    def _stopped(self, node: str, group: int, error) -> None:
        self.checker.fail(f"g{group} {node} stopped: {error}")

    def running(self, group: int) -> list[Member]:
        return [m for n in self.voters[group] if (m := self.members.get((n, group))) is not None]

    def leader(self, group: int) -> Member | None:
        leaders = [m for m in self.running(group) if m.state == _LEADER]
        return max(leaders, key=lambda m: m.raft.term) if leaders else None

    def name_members(self, group: int) -> None:
        addresses = frozenset(address(n, group) for n in self.voters[group])
        for member in self.running(group) + self.learning(group):
            member.raft.name_members(addresses)

    def learning(self, group: int) -> list[Member]:
        member = self.learners.get((LEARNER, group))
        return [member] if member is not None else []

    # -- checks -------------------------------------------------------------------

    def check(self, key) -> None:
        """After a step: the member it touched (a tick, a message delivered). The cluster's own events (a
        fault, a client's call) change no member's Raft state until it ticks or handles a message."""
        if key is not None and key[1] == ENGINE:  # the node's engine: any of its members
            for member in [m for k, m in self.members.items() if k[0] == key[0]]:
                self._check(member)
        elif key is not None and (member := self.members.get(key) or self.learners.get(key)) is not None:
            self._check(member)

    def _check(self, member: Member) -> None:
        raft, checker = member.raft, self.checker
        journal = member.journal
        if member.state == _LEADER:
            term = raft.term
            if member.led_term != term and checker.leads(member.node, member.group, term):
                member.led_term = term
                self.trace.add("leader", f"g{member.group} {member.node} term {term}")
                checker.new_leader(member.node, member.group, term, journal)
        commit = min(raft.commit_index, journal[-1][1])
        if commit > member.checked_commit and member.node == LEARNER:
            checker.learned(member.node, member.group, journal, member.checked_commit, commit)
            if (leader := self.leader(member.group)) is not None and leader.raft.steady.leading:
                self.trace.counts["learned"] += commit - member.checked_commit
        elif commit > member.checked_commit:
            checker.committed(member.node, member.group, journal, member.checked_commit, commit, raft.term)
        member.checked_commit = commit

    def _applied(self, node: str, group: int, index: int, term: int, payload: bytes, digest: int) -> None:
        self.checker.on_apply(node, group, index, term, payload, digest)
        member = self.members.get((node, group))
        # not the replay of a member opening: checked when first applied, against the members of that time
        if self.fsync and member is not None and index > member.reopened_at:
            self._check_durable_quorum(member, index, term)

    def _check_durable_quorum(self, member: Member, index: int, term: int) -> None:
        """fsync mode: a member applies only what a majority of the voters of its leader's configuration
        when it was committed have synced (a leader's own sync counted once done, its followers' before they
        answered), or a power cut could take it. That configuration is the one as of the entry, or one a
        membership entry after it made (the member's now): a follower applies an entry committed before a
        change it has appended since."""
        others = [node.address.split(":")[0] for node in member.raft._member._SyncObj__otherNodes]
        now = {member.node, *others}
        then = _voters_before_changes_after(now, member.journal, index)
        holding = {n for n in now | then
                   if any(_holds(log, index, term) for log in self._synced_logs(n, member.group))}
        if all(len(holding & voters) <= len(voters) // 2 for voters in (now, then)):
            self.checker.fail(f"durable quorum: g{member.group} {member.node} applies {index}:{term}, which only "
                              f"{sorted(holding) or 'no member'} of {sorted(now)} synced")

    def _synced_logs(self, node: str, group: int) -> list[list]:
        """What the member's disk holds synced, and what its disks held before a wipe took them (they had
        synced those entries when they were committed)."""
        disk = self.journals.get((node, group))
        return self.wipes.lost_logs(node, group) + ([disk.durable] if disk is not None else [])

    # -- at the end ------------------------------------------------------------------

    def unsettled(self) -> dict[int, str]:
        """The groups that have not settled, and why: no leader, or members behind it."""
        waiting = {}
        for group in self.groups:
            leader = self.leader(group)
            if leader is None:
                waiting[group] = f"g{group}: no leader among {self.voters[group]}"
                continue
            last = leader.raft.last_log_index
            behind = [f"{m.node} applied {m.raft.last_applied}" for m in self.running(group) + self.learning(group)
                      if m.raft.last_applied != last]
            missing = [n for n in self.voters[group] if (n, group) not in self.members]
            if behind or missing or leader.raft.commit_index != last:
                waiting[group] = (f"g{group}: leader {leader.node} at {leader.raft.commit_index}/{last}, "
                                  f"{', '.join(behind) or 'none behind'}{', not open: ' + str(missing) if missing else ''}")
        return waiting

    def check_final(self, groups: list[int]) -> None:
        """Settled groups: one applied history each, holding every acknowledged proposal."""
        for group in groups:
            members = self.running(group)
            states = {m.node: m.raft._sm for m in members + self.learning(group)}
            if len({state.history for state in states.values()}) > 1:
                self.checker.fail(f"g{group}: replicas settled on different histories: "
                                  + "; ".join(f"{n} at {s.position.index}" for n, s in states.items()))
                continue
            applied = {index: payload for index, _, payload, _ in members[0].raft._sm.disk.applied}
            record = self.checker.group(group)
            for payload in record.rejected & set(applied.values()):
                self.checker.fail(f"g{group}: {payload!r} was answered as rejected and is in the settled state")
            for payload, index in record.acked.items():
                if applied.get(index) == payload:
                    continue
                if record.forgotten:
                    self.trace.add("ack-lost", f"g{group} acknowledged {payload.decode()} at {index}: a power cut of a "
                                           "majority took it (default mode)")
                else:
                    self.checker.fail(f"g{group}: acknowledged {payload!r} at {index} is not in the settled state")

    def stats(self) -> dict[str, int]:
        counts = self.trace.counts
        return {
            "leaders": len(self.checker.leaders), "proposals": counts["propose"],
            "acknowledged": sum(len(r.acked) for r in self.checker.groups.values()),
            "messages": counts["recv"], "messages lost": counts["lost"] + counts["cut"],
            "kills": counts["kill"], "power cuts": counts["power"], "restarts": counts["restart"],
            "transfers": counts["transfer"], "members added": counts["added"], "members removed": counts["removed"],
            "wipes": counts["wipe"], "vote floors learned": counts["floor"],
            "vote floors lowered": counts["floor-lowered"],
            "rollbacks": counts["rollback"],
            "committed entries forgotten": sum(r.forgotten for r in self.checker.groups.values()),
            "acknowledged lost": counts["ack-lost"],
            "handler exceptions": len(self.network.errors),
            "engine frames": counts["engine-recv"], "forced handbacks": counts["handback"],
            "engine rests": counts["engine-rest"],
            "learner entries applied": sum(m.raft.last_applied for m in self.learners.values()),
            "learner entries committed while the engine led": counts["learned"],
        }

    # -- faults -------------------------------------------------------------------

    def crash(self, node: str, power: bool) -> None:
        """kill -9 of the node's process; with `power`, a power cut: what was not synced may go."""
        if node not in self.down:
            for key in [k for k in self.members if k[0] == node]:
                self.members.pop(key).loop.dead = True
            if node in self.engines:
                self.engines.pop(node).close()
                self._engine_loops.pop(node).dead = True
            self.network.node_down(node)
            self.down.add(node)
        lost = ""
        if power:
            ops = sum(disk.power_cut(self._rng) for key, disk in self.journals.items() if key[0] == node)
            applied = sum(disk.power_cut(self._rng) for key, disk in self.states.items() if key[0] == node)
            lost = f": {ops} journal writes and {applied} applied entries lost"
        self.trace.add("power" if power else "kill", f"{node}{lost}")

    def after_power_cut(self) -> None:
        """Default mode: committed entries that a majority of their group no longer holds, or that a log a
        majority would vote for lacks, may be replaced. The second: a leader of term 8 committed entries
        53 to 61 of term 5 with its own 63:8, and the cut took 63:8 from every log; a log ending at 53:7
        then had the votes of one holding 53:5 to 61:5, as Raft's rule compares last terms first (seed
        495, `--stale`). Those entries were acknowledged within the last second, as the mode allows."""
        if self.fsync:
            return
        for group in self.groups:
            logs = [self._log(n, group) for n in self.voters[group]]
            majority = len(logs) // 2 + 1
            voting = [log for n, log in zip(self.voters[group], logs) if not self.wipes.guarded(n)]
            electable = [log for log in voting if sum(1 for other in voting if _last(other) <= _last(log)) >= majority]
            self._forget_unless(group, lambda index, term: sum(1 for log in logs if _holds(log, index, term)) >= majority
                                and all(_holds(log, index, term) for log in electable))

    def _forget_unless(self, group: int, survives: Callable[[int, int], bool]) -> None:
        """The group's committed entries from the lowest above the last one that `survives(index, term)` may be
        replaced (`Checker.forget_from`)."""
        record = self.checker.group(group)
        lowest_lost = None
        for index in sorted(record.committed, reverse=True):
            if survives(index, record.committed[index][0]):
                break
            lowest_lost = index
        if lowest_lost is not None:
            self.lost_acknowledged += self.checker.forget_from(group, lowest_lost)
            # a membership change among the entries lost: the metadata names voters the group lacks
            self.unsure.add(group)

    def _log(self, node: str, group: int) -> list:
        member = self.members.get((node, group))
        if member is not None:
            return member.journal._entries
        disk = self.journals.get((node, group))
        return disk.entries() if disk is not None else []

    def restart(self, node: str) -> None:
        if node not in self.down:
            return
        self.down.discard(node)
        self._node_up(node)
        self.trace.add("restart", node)
        for group in self.groups:
            if node in self.voters[group]:
                self._open(node, group)
        self.wipes.pending.discard(node)

    def wipe(self, node: str) -> None:
        """kill -9 of the node, and every member's data deleted (its journal, state and folder)."""
        self.crash(node, power=False)
        self.wipes.took(node, {g: disk.durable for g in self.groups
                               if (disk := self.journals.get((node, g))) is not None})
        for group in self.groups:
            self._delete(node, group)
        self.trace.add("wipe", node)
        self._forget_where_no_log_holds(node)

    def _forget_where_no_log_holds(self, wiped: str) -> None:
        """Committed entries that no other voter's log holds went with the wiped node's disk: a power cut had
        taken them from the others first (default mode; seed 3506, where a stale commit notice had counted
        them on the wiped node since). Nothing can bring them back; the vote guard keeps the rest."""
        for group in self.groups:
            logs = [self._log(n, group) for n in self.voters[group] if n != wiped]
            self._forget_unless(group, lambda index, term: any(_holds(log, index, term) for log in logs))

    def sync_node(self, node: str) -> None:
        """The default mode's once-a-second sync of every journal of a node (journal_syncer)."""
        for key, member in self.members.items():
            if key[0] == node:
                member.journal.sync_in_background()

    # -- what a client and an operator ask --------------------------------------

    def propose(self, group: int, payload: bytes, member: Member) -> None:
        self.trace.add("propose", f"g{group} {payload.decode()} at {member.node}")
        member.raft.propose(payload, partial(self._answered, group, payload))

    def _answered(self, group: int, payload: bytes, result, outcome: Outcome) -> None:
        self.trace.add("answer", f"g{group} {payload.decode()} {outcome.value} {result}")
        if outcome is Outcome.APPLIED:
            if result is None:
                self.checker.fail(f"g{group}: {payload!r} acknowledged, but its state machine skipped it")
            else:
                self.checker.acknowledged(group, payload, result)
        elif outcome is Outcome.REJECTED:
            self.checker.rejected(group, payload)

    def transfer(self, group: int, to: str | None) -> None:
        leader = self.leader(group)
        if leader is not None:
            self.trace.add("transfer", f"g{group} {leader.node} -> {to or 'any'}")
            leader.raft.transfer_leadership(None if to is None else address(to, group))

    def change(self, group: int, action: str, node: str, done) -> bool:
        """Ask the group's leader to add or remove `node`'s member; `done()` when it answered."""
        leader = self.leader(group)
        if leader is None or action == "remove" and node == leader.node:
            return False
        if action == "add":  # a new member starts with no data
            self._close(node, group)  # a removed one the node has not closed yet
            self._delete(node, group)
        self.trace.add(action, f"g{group} {node} asked of {leader.node}")
        ask = leader.raft.add_member if action == "add" else leader.raft.remove_member
        ask(address(node, group), partial(self._changed, group, action, node, done))
        return True

    def _changed(self, group: int, action: str, node: str, done, result, outcome: Outcome) -> None:
        done_kind = {"add": "added", "remove": "removed"}[action]
        self.trace.add(done_kind if outcome is Outcome.APPLIED else action, f"g{group} {node} {outcome.value}")
        if outcome is Outcome.APPLIED:
            if action == "add":
                self.voters[group].append(node)
                if node not in self.down:
                    self._open(node, group)
            else:
                self.voters[group].remove(node)
                # the node closes the replica once its copy of the metadata says so: a moment later
                self.scheduler.after(self._rng.uniform(0.0, 1.0), self._removed, node, group)
            self.name_members(group)
        elif outcome is not Outcome.REJECTED:
            self.unsure.add(group)
        done()

    def hand_back(self, group: int, rng: random.Random) -> None:
        """A hand-over back to pysyncobj forced on a member the engine drives, leader or follower."""
        driven = [m for m in self.running(group) if m.raft.steady is not None and m.raft.steady.mode != "pysyncobj"]
        if driven:
            member = rng.choice(driven)
            self.trace.add("handback", f"g{group} {member.node} ({member.raft.steady.mode}) forced")
            member.raft.steady.handback("forced by the simulation")

    def reconcile(self, group: int) -> None:
        """A change whose answer was lost may have committed anyway: as a node's mover asks again until it
        knows, the metadata takes the voters of a leader whose log holds no uncommitted change."""
        leader = self.leader(group)
        if group not in self.unsure or leader is None or leader.raft._uncommitted_membership():
            return
        self.unsure.discard(group)
        actual = sorted(a.rsplit(":", 1)[0] for a in leader.raft.voters)
        voters = self.voters[group]
        if actual == sorted(voters):
            return
        self.trace.add("reconcile", f"g{group} voters {sorted(voters)} -> {actual} (as {leader.node} has them)")
        for node in [n for n in voters if n not in actual]:
            voters.remove(node)
            self._removed(node, group)
        for node in [n for n in actual if n not in voters]:
            voters.append(node)
            if node not in self.down and (node, group) not in self.members:
                self._open(node, group)
        self.name_members(group)

    def _removed(self, node: str, group: int) -> None:
        if node not in self.voters[group]:
            self._close(node, group)
            self._delete(node, group)

    def _delete(self, node: str, group: int) -> None:
        """A member's data: its journal, its state and its folder (the vote guard's file)."""
        self.journals.pop((node, group), None)
        self.states.pop((node, group), None)
        shutil.rmtree(self._folder / node / str(group), ignore_errors=True)


def _stored_as_on_the_node_log(raft: SyncObjGroup, index: int) -> None:
    """`SyncObjGroup._stored` of a group on the node log: only a single voter syncs before it applies."""
    if not raft._member._SyncObj__otherNodes:
        raft.sync_journal()


def _voters_before_changes_after(voters: set[str], journal, index: int) -> set[str]:
    """`voters` with the membership entries of `journal` after `index` undone, newest first."""
    voters = set(voters)
    for command, _, _ in reversed(journal[max(0, index + 1 - journal[0][1]):]):
        if (change := membership_change(bytes(command))) is not None:
            kind, member = change[0], change[1].split(":")[0]
            voters.discard(member) if kind == "add" else voters.add(member)
    return voters


def _last(log: list) -> tuple[int, int]:
    """A log's last entry as Raft's election rule compares them: term first, then index."""
    return (log[-1][2], log[-1][1]) if log else (0, 0)


def _holds(log: list, index: int, term: int) -> bool:
    if not log:
        return False
    first = log[0][1]
    return first <= index <= log[-1][1] and log[index - first][2] == term
