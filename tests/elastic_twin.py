"""A cluster in one process for the golden elasticity scripts (tests/testdata/elastic/): the node's three
controllers (`replica_lifecycle`, `move_steps`, `rebalance_steps`) over nodes whose replicas are
in-memory Raft groups (`MemoryGroup`, one `MemoryNetwork` per group), on a fake clock.

The metadata is a plain `ClusterMeta` value that `records.apply` changes at once (what the metadata
group would commit); the metadata group's membership is a `MemoryGroup` of its own on each node,
voter or learner as the lifecycle decides, so its moves run as they do on a node. A copy of a
checkpoint is a voter's Raft disk copied, and it ends at the next round. Every action any controller
takes is printed with the time it took it.

A script is a list of blocks, as in tests/testdata/raft/:

    cluster nodes=4 partitions=2 [rebalance=off]   start n1..n4, bootstrap, elect every group
    put P KEY VALUE                    through partition P's leader
    move P FROM TO                     raftkv replica move
    join N                             raftkv node start --join: added, then up once serving
    decommission N                     raftkv node decommission
    kill N                             the process dies (its groups close, it answers no poll)
    run SECONDS                        the controllers run on their own
    settle                             ... until no move is under way and the planner asks for none
    state                              the metadata and each group's running replicas
    check                              every group's voters hold the same data and every put
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

from raftkv.core.errors import ChangeRefused
from raftkv.core.spec import Tuning, build_spec
from raftkv.meta.bootstrap import bootstrap_command
from raftkv.meta.planner import PlannedTransfer
from raftkv.meta.records import (META, AddNode, AdvanceMove, BeginMove, ClusterMeta, EndMove, NodeState,
                                 SetNodeState, apply, group_name)
from raftkv.node import move_steps, rebalance_steps, replica_lifecycle as lifecycle
from raftkv.raft.group import Outcome, Role
from raftkv.raft.memory_group import Disk, MemoryGroup
from raftkv.raft.memory_network import MemoryNetwork
from tests.raft_scenarios import DictStateMachine

ROUND = 0.2  # seconds of the fake clock per round: the mover's poll
TICKS_PER_ROUND = 2
TUNING = Tuning(dead_after=4.0, move_timeout=20.0, rebalance_interval=1.0, max_moves=2, max_moves_per_node=1,
                election_timeout_max=1.0)
SETTLE_SECONDS = 300.0


class LearnerGroup(MemoryGroup):
    """A member opened as a learner. Like pysyncobj's read-only node it never campaigns nor votes, even
    while its configuration still names it: the metadata group's source, leaving, is a learner before
    it is removed (a `MemoryGroup` would go on as a voter, and lead)."""

    def campaign(self) -> None:
        pass

    def _on_vote(self, src: str, m: dict) -> None:
        pass


@dataclass
class TwinNode:
    id: str
    alive: bool = True
    groups: dict[int, MemoryGroup] = field(default_factory=dict)  # partitions and META, open here
    machines: dict[int, DictStateMachine] = field(default_factory=dict)  # ... and what each applied
    voting: dict[int, bool] = field(default_factory=dict)  # ... as a voter or a learner
    disks: dict[int, Disk] = field(default_factory=dict)  # a folder that holds data
    copying: set[int] = field(default_factory=set)
    copied: set[int] = field(default_factory=set)

    def local(self, learners: frozenset[int]) -> lifecycle.Local:
        partitions = {g: v for g, v in self.voting.items() if g != META}
        return lifecycle.Local(frozenset(g for g, v in partitions.items() if v),
                               frozenset(g for g, v in partitions.items() if not v), frozenset(self.copying),
                               frozenset(self.copied), frozenset(p for p in learners if p not in self.disks),
                               self.voting.get(META))


class Twin:
    def __init__(self, folder: Path):
        self.folder = folder
        self.meta = ClusterMeta()
        self.nodes: dict[str, TwinNode] = {}
        self.nets: dict[int, MemoryNetwork] = {}
        self.now = 0.0
        self.out: list[str] = []
        self.moves: dict[int, move_steps.Memory] = {}
        self.watch = rebalance_steps.Watch()
        self.next_rebalance = 0.0
        self.puts: dict[int, dict[str, str]] = {}
        self.rebalance = True  # else liveness only (`rebalance_interval = 0`)

    def say(self, who: str, what: str) -> None:
        self.out.append(f"{self.now:5.1f} {who}: {what}")

    # -- the metadata ------------------------------------------------------

    def change(self, command) -> bool:
        try:
            self.meta = apply(self.meta, command)
        except ChangeRefused as refused:
            self.say("meta", f"refused {_describe(command)}: {refused}")
            return False
        self.say("meta", _describe(command))
        for node in self._alive():
            self.reconcile(node)
        return True

    # -- a node's replicas: the lifecycle's actions run --------------------

    def reconcile(self, node: TwinNode) -> None:
        if not self.meta.has_node(node.id):
            return
        desired = lifecycle.Desired.of(self.meta, node.id)
        for action in lifecycle.reconcile(desired, node.local(desired.learners)):
            self.say(node.id, _describe(action))
            self._run(node, action)
        if self.meta.node(node.id).state == NodeState.REMOVED:
            self.say(node.id, "removed from the cluster: the process exits")
            self._stop(node)

    def _run(self, node: TwinNode, action) -> None:
        if isinstance(action, lifecycle.ReopenMeta):
            self._close(node, META)
            self._open(node, META, action.voting)
            return
        p = action.partition
        if isinstance(action, (lifecycle.OpenVoter, lifecycle.Promote)):
            self._close(node, p)
            self._open(node, p, voting=True)
        elif isinstance(action, lifecycle.StartCopy):
            node.copying.add(p)
            node.copied.add(p)
        elif isinstance(action, lifecycle.CancelCopy):
            node.copying.discard(p)
        elif isinstance(action, lifecycle.ForgetCopy):
            node.copied.discard(p)
            if action.delete:
                self._delete(node, p)
        elif isinstance(action, lifecycle.OpenLearner):
            node.copied.discard(p)
            self._open(node, p, voting=False)
        elif isinstance(action, (lifecycle.RemoveVoter, lifecycle.RemoveLearner)):
            self._close(node, p)
            self._delete(node, p)

    def _open(self, node: TwinNode, g: int, voting: bool) -> None:
        if g not in node.disks:
            folder = self.folder / node.id / f"g{g}"
            folder.mkdir(parents=True, exist_ok=True)
            node.disks[g] = Disk(folder, voters=frozenset(self.meta.group_voters(g)))
        machine = node.machines[g] = DictStateMachine()
        node.groups[g] = (MemoryGroup if voting else LearnerGroup)(node.id, node.disks[g], machine, self.nets[g],
                                                                   partition=g)
        node.voting[g] = voting

    def _close(self, node: TwinNode, g: int) -> None:
        group = node.groups.pop(g, None)
        node.voting.pop(g, None)
        if group is not None:
            group.close()

    def _delete(self, node: TwinNode, p: int) -> None:
        disk = node.disks.pop(p, None)
        if disk is not None:
            shutil.rmtree(disk.folder, ignore_errors=True)

    def _stop(self, node: TwinNode) -> None:
        node.alive = False
        for g in list(node.groups):
            self._close(node, g)
        node.copying.clear()

    def _end_copies(self) -> None:
        """A copy started in one round ends in the next: a live voter's disk, as a checkpoint would be."""
        for node in self._alive():
            for p in sorted(node.copying):
                node.copying.discard(p)
                source = next((n for n in self._alive() if n.id != node.id and n.voting.get(p)), None)
                if source is None:
                    self.say(node.id, f"no checkpoint of p{p} copied (no live voter): catching up from the leader")
                else:
                    node.disks[p] = _copy_disk(source.disks[p], self.folder / node.id / f"g{p}")
                    self.say(node.id, f"copied p{p}'s checkpoint from {source.id}")
                self.reconcile(node)

    # -- the mover: move_steps' actions run --------------------------------

    def _progress(self, node_id: str, g: int) -> move_steps.Progress | None:
        node = self.nodes.get(node_id)
        if node is None or not node.alive:
            return None
        if g in node.copying:
            return move_steps.Progress("copying")
        group = node.groups.get(g)
        if group is None:
            return move_steps.Progress("none")
        mode = "voter" if node.voting[g] else "learner"
        return move_steps.Progress(mode, group.last_applied, 0, group.commit_index)

    def _observe(self, memory: move_steps.Memory) -> move_steps.Observed:
        move, need = memory.move, move_steps.needs(self.meta, memory)
        if need == move_steps.Need.NOTHING:
            return move_steps.Observed()
        target = self._progress(move.target, move.group)
        if need == move_steps.Need.TARGET:
            return move_steps.Observed(target)
        voters = [self._progress(v, move.group) for v in self.meta.group_voters(move.group) if v != move.target]
        return move_steps.Observed(target, max((s.commit_index for s in voters if s and s.mode == "voter"),
                                               default=0))

    def _move(self, group: int) -> None:
        for _ in range(5):  # without a pause while a decision does not wait
            move = self.meta.move_of(group)
            if move is None:
                self.moves.pop(group, None)
                return
            memory = self.moves.get(group)
            if memory is None or memory.move != move:
                memory = move_steps.begin(move, self.now)
            step = move_steps.decide(self.meta, memory, self._observe(memory), self.now, TUNING.move_timeout)
            self.moves[group] = step.memory
            for action in step.actions:
                if not self._act(move, action):
                    self.say("mover", f"{group_name(group)}: move paused")
                    self.moves.pop(group, None)
                    return
            if step.wait:
                return

    def _act(self, move, action) -> bool:
        name = "meta" if move.group == META else f"p{move.group}"
        if isinstance(action, move_steps.Say):
            self.say("mover", action.message)
            return True
        if isinstance(action, move_steps.Record):
            return self.change(action.command)
        if isinstance(action, move_steps.Reseed):
            self.say("mover", f"{name}: reseed {move.target}")
            node = self.nodes[move.target]
            if node.voting.get(move.group) is False:
                self._close(node, move.group)
                self._delete(node, move.group)
                self.reconcile(node)
            return True
        leader = self._leader(move.group)
        if isinstance(action, move_steps.Compact):
            self.say("mover", f"{name}: compact on the leader ({leader or 'none'})")
            if leader is not None:
                self.nodes[leader].groups[move.group].compact()
            return True
        verb = "add" if action.add else "remove"
        self.say("mover", f"{name}: {verb} {action.node}")
        return self._change_member(move.group, action.add, action.node)

    def _change_member(self, g: int, add: bool, node_id: str) -> bool:
        """As `on_leader` and `ReplicaAdmin.change_membership`: asked of the group's leader until its
        configuration is as wanted and committed (a leader to be removed hands leadership on first)."""
        for _ in range(60):
            leader = self._leader(g)
            if leader is not None:
                group = self.nodes[leader].groups[g]
                if (node_id in group.voters) == add:
                    if group.commit_index == group.last_log_index:
                        return True
                elif not add and node_id == leader:
                    group.transfer_leadership()
                else:  # refused while another change is pending: asked again
                    (group.add_member if add else group.remove_member)(node_id, lambda result, outcome: None)
            self.nets[g].tick()
        return False

    def _leader(self, g: int) -> str | None:
        leaders = [(n.groups[g].term, n.id) for n in self._alive()
                   if g in n.groups and n.voting[g] and n.groups[g].role == Role.LEADER]
        return max(leaders)[1] if leaders else None

    # -- the rebalancer: rebalance_steps' decisions run --------------------

    def _rebalance(self) -> None:
        polled = [n.id for n in self.meta.nodes if n.state != NodeState.REMOVED]
        answered = {n for n in polled if self.nodes[n].alive}
        self.watch = rebalance_steps.heard(self.watch, polled, answered, self.now)
        for change, silent in rebalance_steps.judge(self.meta, self.watch, answered, self.now, TUNING.dead_after):
            self.say("rebalancer", f"{change.node_id} silent for {silent:.1f}s" if change.state == NodeState.DEAD
                     else f"{change.node_id}: {change.state.value}")
            self.change(change)
        if not self.rebalance:
            return
        leaders = {p: leader for p in range(len(self.meta.placement)) if (leader := self._leader(p))}
        actions, self.watch = rebalance_steps.balance(self.meta, leaders, self.watch, self.now, TUNING)
        for action in actions:
            if isinstance(action, PlannedTransfer):
                self.say("rebalancer", f"p{action.partition}: leadership {action.source} -> {action.target}")
                self.nodes[action.source].groups[action.partition].transfer_leadership(action.target)
            else:
                self.change(action)

    # -- time --------------------------------------------------------------

    def round(self) -> bool:
        """One poll of the fake clock; whether anything may be left to do (always, but in a round of
        the rebalancer that found nothing to do)."""
        self.now = round(self.now + ROUND, 1)
        for net in self.nets.values():
            net.tick(TICKS_PER_ROUND)
        self._end_copies()
        for node in self._alive():
            self.reconcile(node)
        for group in sorted(m.group for m in self.meta.moves):
            self._move(group)
        if self.now < self.next_rebalance:
            return True
        self.next_rebalance = round(self.now + TUNING.rebalance_interval, 1)
        before = len(self.out)
        self._rebalance()
        planned = len(self.out) > before
        return bool(self.meta.moves) or planned or any(self._leader(g) is None for g in self.meta.groups)

    def _alive(self) -> list[TwinNode]:
        return [n for _, n in sorted(self.nodes.items()) if n.alive]

    # -- script commands ---------------------------------------------------

    def cluster(self, nodes: int, partitions: int, rebalance: bool) -> None:
        self.rebalance = rebalance
        spec = build_spec(nodes=nodes, partitions=partitions, replication=3, base_port=20000, data_dir=self.folder)
        self.nets = {g: MemoryNetwork(seed=g + 2) for g in [META, *range(partitions)]}
        self.nodes = {n.id: TwinNode(n.id) for n in spec.nodes}
        self.meta = apply(self.meta, bootstrap_command(spec))
        self.say("meta", f"bootstrap: {nodes} nodes, {partitions} partitions")
        for node in self._alive():
            self._start(node)
        self.settle()

    def _start(self, node: TwinNode) -> None:
        """A node process starts: its metadata replica (`Node.start`), then what the metadata gives it."""
        self._open(node, META, voting=node.id in self.meta.group_voters(META))
        self.reconcile(node)

    def join(self, node_id: str) -> None:
        number = int(node_id.lstrip("n"))
        spec = build_spec(nodes=number, partitions=len(self.meta.placement), replication=3, base_port=20000,
                          data_dir=self.folder)
        self.nodes[node_id] = TwinNode(node_id)
        self.change(AddNode(bootstrap_command(spec).nodes[-1]))
        self._start(self.nodes[node_id])
        self.change(SetNodeState(node_id, NodeState.UP))

    def kill(self, node_id: str) -> None:
        self.say(node_id, "killed")
        self._stop(self.nodes[node_id])

    def put(self, p: int, key: str, value: str) -> str:
        for _ in range(100):
            leader = self._leader(p)
            if leader is not None:
                outcome: list[Outcome] = []
                self.nodes[leader].groups[p].propose(f"{key}={value}".encode(), lambda r, o: outcome.append(o))
                self.nets[p].stabilize()
                for _ in range(20):
                    if outcome:
                        break
                    self.nets[p].tick()
                if outcome == [Outcome.APPLIED]:
                    self.puts.setdefault(p, {})[key] = value
                    return "applied"
            self.nets[p].tick()
        return "no leader"

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.round()

    def settle(self) -> None:
        start = self.now
        while self.round():
            if self.now - start > SETTLE_SECONDS:
                self.say("twin", "not settled")
                return

    def state(self) -> list[str]:
        lines = [" ".join(f"{n.id}={n.state.value}" for n in self.meta.nodes),
                 "meta voters " + " ".join(self.meta.meta_voters)]
        for g in self.meta.groups:
            replicas = [f"{n.id}:{'voter' if n.voting[g] else 'learner'}" for n in self._alive() if g in n.groups]
            line = f"{group_name(g)}: voters {' '.join(self.meta.voters_of(g))}; running {' '.join(replicas)}"
            if g != META:
                leader = self._leader(g)
                data = self.nodes[leader].machines[g].data if leader else {}
                line += "; " + " ".join(f"{k}={v}" for k, v in sorted(data.items()))
            lines.append(line)
        return lines

    def check(self) -> list[str]:
        for net in self.nets.values():  # the followers hear of the last commit (no time passes)
            net.tick(3)
        problems = []
        for p in range(len(self.meta.placement)):
            running = {n.id: n.machines[p].data for n in self._alive() if n.voting.get(p)}
            if set(running) != {v for v in self.meta.voters_of(p) if self.nodes[v].alive}:
                problems.append(f"p{p}: voters {sorted(running)} run, the metadata has {self.meta.voters_of(p)}")
            for node_id, data in running.items():
                for key, value in self.puts.get(p, {}).items():
                    if data.get(key) != value:
                        problems.append(f"p{p}: {node_id} lost {key}={value}")
        return problems or ["ok"]


def _copy_disk(disk: Disk, folder: Path) -> Disk:
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(disk.folder, folder)
    snapshot = disk.snapshot and replace(disk.snapshot, path=folder / disk.snapshot.path.name)
    return Disk(folder, disk.voters, disk.term, None, list(disk.log), snapshot, disk.commit)


def _describe(what) -> str:
    name = type(what).__name__
    if isinstance(what, (lifecycle.OpenVoter, lifecycle.Promote, lifecycle.StartCopy, lifecycle.CancelCopy,
                         lifecycle.OpenLearner, lifecycle.RemoveVoter, lifecycle.RemoveLearner)):
        return f"{_WORDS[name]} p{what.partition}"
    if isinstance(what, lifecycle.ForgetCopy):
        return f"copy of p{what.partition} forgotten" + (", its data deleted" if what.delete else "")
    if isinstance(what, lifecycle.ReopenMeta):
        return f"metadata replica reopened as a {'voter' if what.voting else 'learner'}"
    if isinstance(what, BeginMove):
        return f"begin move of {group_name(what.group)}: {what.source or 'nowhere'} -> {what.target or 'nowhere'}"
    if isinstance(what, AdvanceMove):
        return f"{group_name(what.group)}: {what.step.value}"
    if isinstance(what, EndMove):
        return f"{group_name(what.group)}: move ended; voters {' '.join(what.voters)}"
    if isinstance(what, SetNodeState):
        return f"{what.node_id} is {what.state.value}"
    if isinstance(what, AddNode):
        return f"{what.node.id} added"
    return name


_WORDS = {"OpenVoter": "open voter", "Promote": "promote learner to voter", "StartCopy": "start copy of",
          "CancelCopy": "cancel copy of", "OpenLearner": "open learner", "RemoveVoter": "close and delete voter",
          "RemoveLearner": "close and delete learner"}

