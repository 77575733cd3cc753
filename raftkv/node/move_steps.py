"""A replica move's next step: the pure decision the mover (`mover.ReplicaMover`) runs (docs/elasticity.md
§3). It takes the move's record, what the decision remembers of it, what the mover last observed of
the target and the voters, and the time; it returns the actions, and what to remember.

The order: wait until the target runs the group (its copy in; if nothing was copied, the leader
snapshots), wait until the learner is caught up, have the group's leader add it, record `voting`, wait
until it is a caught-up voter, have the leader remove the source, record the end. A dead source is
removed first; a dead target, or one that makes no progress for `move_timeout`, ends the move
without it (abandoned). Every action is idempotent, so the memory may be dropped at any time: a new
metadata leader, or a record changed under a step, starts from the record.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Union

from raftkv.meta.records import META, AdvanceMove, ClusterMeta, EndMove, Move, MoveStep, NodeState, group_name

CATCH_UP_ENTRIES = 64  # a replica this close to the leader's commit index counts as caught up
RESEED_SECONDS = 5.0  # a learner with no progress this long while the leader commits starts afresh
REPORT_SECONDS = 5.0  # how often a wait for a catch-up is logged


@dataclass(frozen=True)
class Progress:
    """A replica as its node reports it: `mode` is "none", "copying", "learner" or "voter"."""

    mode: str
    applied_index: int = 0
    snapshot_bytes: int = 0
    commit_index: int = 0


@dataclass(frozen=True)
class Observed:
    """The target's progress (None: it did not answer) and the highest commit index the group's other
    voters reported (0: none asked, or none answered as a voter)."""

    target: Progress | None = None
    commit: int = 0


class Need(enum.Enum):
    """What the decision needs observed before it can be taken."""

    NOTHING = "nothing"
    TARGET = "target"
    TARGET_AND_VOTERS = "target and voters"


class Verdict(enum.Enum):
    WAIT = "wait"
    RESEED = "reseed"
    STALLED = "stalled"


@dataclass(frozen=True)
class Stall:
    """When the target last made progress (entries applied, checkpoint or snapshot bytes received) and
    the group's commit index then. STALLED once it made none for the move's timeout: a target that is
    up but cannot catch up (a full or failing disk, a process stopped) would otherwise hold its move,
    and the moves queued behind it, forever. Before that, RESEED once it made none for RESEED_SECONDS
    while the group committed more: a learner that hears nothing from its leader (issue 32: a journal
    it replayed had dropped the leader) is started afresh rather than waited for."""

    since: float
    progress: tuple | None = None
    commit: int | None = None

    def check(self, target: Progress | None, commit: int, now: float, timeout: float) -> tuple[Stall, Verdict]:
        progress = None if target is None else (target.mode, target.applied_index, target.snapshot_bytes)
        if progress is not None and progress != self.progress:
            return Stall(now, progress, commit), Verdict.WAIT
        if now - self.since > timeout:
            return self, Verdict.STALLED
        if self.commit is not None and commit > self.commit and now - self.since > RESEED_SECONDS:
            # again at the next poll that finds the group further on, unless the target moved meanwhile
            # (one started afresh reports a new mode, which restarts the clock)
            return replace(self, commit=commit), Verdict.RESEED
        return self, Verdict.WAIT

    def why(self, target: str, timeout: float, commit: int) -> str:
        applied = self.progress[1] if self.progress else "?"
        return f"{target} made no progress for {timeout:g}s (applied index {applied} of {commit})"


@dataclass(frozen=True)
class Memory:
    """What the decision keeps between two observations of one record of a move. `awaiting`: the
    target running the group at all ("open"), or caught up as a "learner" or a "voter"; None once
    the wait is over."""

    move: Move
    awaiting: str | None
    stall: Stall
    reported: float
    source_removed: bool = False


@dataclass(frozen=True)
class ChangeMember:
    """Have the group's leader add or remove `node`, until it is done."""

    add: bool
    node: str


@dataclass(frozen=True)
class Compact:
    """Have the group's leader snapshot its log, so that the target installs checkpoint files (best effort)."""


@dataclass(frozen=True)
class Reseed:
    """Have the target drop its learner and copy a voter's checkpoint again (best effort)."""


@dataclass(frozen=True)
class Record:
    """Propose the move's next step, or its end, to the metadata group."""

    command: Union[AdvanceMove, EndMove]


@dataclass(frozen=True)
class Say:
    message: str
    warning: bool = False


Action = Union[ChangeMember, Compact, Reseed, Record, Say]


@dataclass(frozen=True)
class Step:
    """The actions to take, in order, and the memory for the next decision; `wait`: poll again only
    after a pause (nothing changed yet)."""

    actions: tuple[Action, ...]
    memory: Memory
    wait: bool = False


def begin(move: Move, now: float) -> Memory:
    """The memory of a record not seen before."""
    if move.target and move.step == MoveStep.CATCHING_UP:
        awaiting = "learner" if move.group == META else "open"  # the metadata group copies nothing
    elif move.target and move.step == MoveStep.VOTING:
        awaiting = "voter"
    else:
        awaiting = None
    return Memory(move, awaiting, Stall(now), now)


def needs(topology: ClusterMeta, memory: Memory) -> Need:
    move = memory.move
    if _dead(topology, move.target) or _source_to_remove(topology, memory) or memory.awaiting is None:
        return Need.NOTHING
    return Need.TARGET if memory.awaiting == "open" else Need.TARGET_AND_VOTERS


def decide(topology: ClusterMeta, memory: Memory, observed: Observed, now: float, move_timeout: float) -> Step:
    """The next step of `memory.move`, given what was observed as `needs` asked."""
    move = memory.move
    name = group_name(move.group)
    if _dead(topology, move.target):
        return Step(abandon(topology, move, f"{move.target} is dead"), memory)
    if _source_to_remove(topology, memory):
        # Adding first would leave RF - 1 live voters of RF + 1: no majority to commit the add.
        return Step((ChangeMember(False, move.source),), replace(memory, source_removed=True, stall=Stall(now)))
    if memory.awaiting == "open":
        target = observed.target
        if target is not None and target.mode in ("learner", "voter"):
            compact = () if target.applied_index else (Compact(),)  # nothing was copied: the learner gets files
            return Step(compact, replace(memory, awaiting="learner", stall=Stall(now), reported=now))
        stall, verdict = memory.stall.check(target, 0, now, move_timeout)
        if verdict == Verdict.STALLED:
            return Step(abandon(topology, move, stall.why(move.target, move_timeout, 0)), memory)
        return Step((), replace(memory, stall=stall), wait=True)
    if memory.awaiting is not None:
        mode, target, commit = memory.awaiting, observed.target, observed.commit
        if target is not None and target.mode == mode and commit and target.applied_index + CATCH_UP_ENTRIES >= commit:
            if mode == "voter":
                return Step((), replace(memory, awaiting=None))
            return Step((ChangeMember(True, move.target), Record(AdvanceMove(move.group, MoveStep.VOTING)),
                         Say(f"{name}: {move.target} added to the group")), memory)
        stall, verdict = memory.stall.check(target, commit, now, move_timeout)
        if verdict == Verdict.STALLED:
            return Step(abandon(topology, move, stall.why(move.target, move_timeout, commit)), memory)
        actions: tuple[Action, ...] = ()
        if verdict == Verdict.RESEED and mode == "learner" and move.group != META:
            actions += (Say(f"{name}: {move.target} made no progress as a learner while the group committed on; "
                            "starting it afresh", warning=True), Reseed())
        memory = replace(memory, stall=stall)
        if now - memory.reported > REPORT_SECONDS:
            applied = target.applied_index if target is not None else "?"
            actions += (Say(f"{name}: {move.target} catching up as {mode}: {applied} of {commit}"),)
            memory = replace(memory, reported=now)
        return Step(actions, memory, wait=True)
    if move.group == META and move.source and move.step != MoveStep.LEAVING:
        return Step((Record(AdvanceMove(move.group, MoveStep.LEAVING)),), memory)
    voters = _after(topology.voters_of(move.group), move)
    return Step(((ChangeMember(False, move.source),) if move.source else ()) + (
        Record(EndMove(move.group, voters)),
        Say(f"{name}: moved from {move.source or 'nowhere'} to {move.target or 'nowhere'}; voters {', '.join(voters)}"),
    ), memory)


def abandon(topology: ClusterMeta, move: Move, why: str) -> tuple[Action, ...]:
    """Undo the target's addition if it was added, and end the move with the voters as they were."""
    return (ChangeMember(False, move.target), Record(EndMove(move.group, topology.voters_of(move.group))),
            Say(f"{group_name(move.group)}: move to {move.target} abandoned: {why}", warning=True))


def _dead(topology: ClusterMeta, node_id: str) -> bool:
    return bool(node_id) and topology.node(node_id).state == NodeState.DEAD


def _source_to_remove(topology: ClusterMeta, memory: Memory) -> bool:
    move = memory.move
    return (bool(move.target) and move.step == MoveStep.CATCHING_UP and not memory.source_removed
            and _dead(topology, move.source))


def _after(voters: tuple[str, ...], move: Move) -> tuple[str, ...]:
    """The voters once `move` is done: the target in the source's place (or added, or the source gone)."""
    if move.source and move.target:
        return tuple(move.target if v == move.source else v for v in voters)
    if move.target:
        return voters + (move.target,)
    return tuple(v for v in voters if v != move.source)
