"""Replica moves, run by the node that leads the metadata group (docs/elasticity.md §3).

A move is recorded in the metadata before anything happens (`BeginMove`), and the
nodes act on the record by themselves: the target opens the partition as a learner
while the step is `catching_up`, as a voter once it is `voting`, and the source
drops its replica when the move has ended without it. What is left to this module
is the order: wait until the learner is caught up, have the group's leader add it,
record `voting`, wait until it is a caught-up voter, have the leader remove the
source (handing leadership on first if the source leads), record the end.

Every step is idempotent (adding a member twice, or removing one that is gone, is
done already), so a new metadata leader picks a move up from its record, and a step
that fails is tried again a second later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.core.errors import Unavailable
from raftkv.meta.records import META, AdvanceMove, ClusterMeta, EndMove, Move, MoveStep, NodeState, group_name
from raftkv.node.meta_replica import MetaReplica
from raftkv.node.peers import Peers, answer
from raftkv.node.tasks import background

log = logging.getLogger(__name__)

POLL_SECONDS = 0.2
CATCH_UP_ENTRIES = 64  # a replica this close to the leader's commit index counts as caught up
RESEED_SECONDS = 5.0  # a learner with no progress this long while the leader commits starts afresh
RPC_TIMEOUT = 5.0
MEMBERSHIP_TIMEOUT = 30.0


class MoveStalled(Exception):
    """The new replica made no progress for `move_timeout`: the move is rolled back."""


class MoveSuperseded(Exception):
    """The move's record changed under a step waiting on it (another node's mover took it further, or
    this node no longer leads the metadata group): the step is dropped and the record read again."""


class _Stall:
    """MoveStalled once the target has made no progress (entries applied, checkpoint or snapshot bytes
    received) for `timeout`: a target that is up but cannot catch up (a full or failing disk, a process
    stopped) would otherwise hold its move, and the moves queued behind it, forever.

    Before that, `check` answers True once the target has made no progress for RESEED_SECONDS while
    the group committed more: a learner that hears nothing from its leader (issue 32: a journal it
    replayed had dropped the leader) is started afresh rather than waited for."""

    def __init__(self, target: str, timeout: float, now: float):
        self._target = target
        self._timeout = timeout
        self._progress = None
        self._since = now
        self._commit = None  # the group's commit index when the target last made progress

    def check(self, state: pb.ReplicaState | None, commit: int, now: float) -> bool:
        progress = None if state is None else (state.mode, state.applied_index, state.snapshot_bytes_received)
        if progress is not None and progress != self._progress:
            self._progress, self._since, self._commit = progress, now, commit
            return False
        if now - self._since > self._timeout:
            applied = self._progress[1] if self._progress else "?"
            raise MoveStalled(f"{self._target} made no progress for {self._timeout:g}s "
                              f"(applied index {applied} of {commit})")
        if self._commit is not None and commit > self._commit and now - self._since > RESEED_SECONDS:
            self._commit = commit  # once more only after another RESEED_SECONDS of the same
            return True
        return False


class ReplicaMover:
    def __init__(self, meta: Callable[[], MetaReplica], topology: Callable[[], ClusterMeta], peers: Peers,
                 move_timeout: float):
        self._meta = meta
        self._move_timeout = move_timeout
        self._topology = topology
        self._peers = peers
        self._tasks: dict[int, asyncio.Task] = {}

    def poke(self) -> None:
        """Run every recorded move that is not running yet (called on each metadata change and once a second)."""
        if not self._meta().is_leader:
            return
        for move in self._topology().moves:
            task = self._tasks.get(move.group)
            if task is None or task.done():
                self._tasks[move.group] = background(self._run(move.group), f"{group_name(move.group)}: the move")

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def _run(self, group: int) -> None:
        try:
            while self._meta().is_leader and (move := self._topology().move_of(group)) is not None:
                if move.target and self._topology().node(move.target).state == NodeState.DEAD:
                    await self._abandon(move, f"{move.target} is dead")
                    continue
                try:
                    await self._step(move)
                except MoveStalled as stalled:
                    await self._abandon(move, str(stalled))
                except MoveSuperseded:
                    continue
        except Exception as exc:  # the next poke, a second later, tries again from the record
            log.warning("%s: move paused: %s", group_name(group), exc)

    async def _step(self, move: Move) -> None:
        """Take the move's next step and record it."""
        group = move.group
        if move.target and move.step == MoveStep.CATCHING_UP:
            if move.source and self._topology().node(move.source).state == NodeState.DEAD:
                # Adding first would leave RF - 1 live voters of RF + 1: no majority to commit the add.
                await self._change_membership(move, "remove", move.source)
            if group != META and not (await self._until_open(move)).applied_index:
                await self._compact(move)  # nothing was copied: the leader snapshots, the learner gets files
            await self._until_caught_up(move, "learner")
            await self._change_membership(move, "add", move.target)
            await self._record(move, AdvanceMove(group, MoveStep.VOTING))
            log.info("%s: %s added to the group", group_name(group), move.target)
            return
        if move.target and move.step == MoveStep.VOTING:
            await self._until_caught_up(move, "voter")
        if group == META and move.source and move.step != MoveStep.LEAVING:
            await self._record(move, AdvanceMove(group, MoveStep.LEAVING))
            return
        if move.source:
            await self._change_membership(move, "remove", move.source)
        voters = _after(self._topology().voters_of(group), move)
        await self._record(move, EndMove(group, voters))
        log.info("%s: moved from %s to %s; voters %s", group_name(group), move.source or "nowhere",
                 move.target or "nowhere", ", ".join(voters))

    async def _abandon(self, move: Move, why: str) -> None:
        """Undo the target's addition if it was added, and end the move with the voters as they were."""
        await self._change_membership(move, "remove", move.target)
        await self._record(move, EndMove(move.group, self._topology().voters_of(move.group)))
        log.warning("%s: move to %s abandoned: %s", group_name(move.group), move.target, why)

    async def _progress(self, node_id: str, group: int) -> pb.ReplicaState | None:
        try:
            return await answer(self._peers.admin(node_id).ReplicaProgress(pb.ReplicaRequest(group=group),
                                                                           timeout=RPC_TIMEOUT))
        except grpc.aio.AioRpcError:  # not this node stopping (Unavailable): that pauses the move, not a stall
            return None

    def _still_current(self, move: Move) -> None:
        """MoveSuperseded unless this node leads the metadata group and `move` is still its record;
        checked before every wait, membership change and proposal of a step.

        When the metadata leadership moves, the old leader's mover is in the middle of a step while
        the new leader's starts from the record: a step that waits on a record the other one has
        since advanced would wait forever (a learner that is a voter by now never reports `learner`),
        and one that goes on would act for a record that is no longer there."""
        if not self._meta().is_leader or self._topology().move_of(move.group) != move:
            raise MoveSuperseded()

    async def _until_open(self, move: Move) -> pb.ReplicaState:
        """Until the target runs the group (its copy of a voter's checkpoint, if any, is in)."""
        stall = _Stall(move.target, self._move_timeout, time.monotonic())
        while True:
            self._still_current(move)
            target = await self._progress(move.target, move.group)
            if target is not None and target.mode in ("learner", "voter"):
                return target
            stall.check(target, 0, time.monotonic())
            await asyncio.sleep(POLL_SECONDS)

    async def _until_caught_up(self, move: Move, mode: str) -> None:
        """Until the target runs the group in `mode`, within CATCH_UP_ENTRIES of the leader's commit index."""
        reported = time.monotonic()
        stall = _Stall(move.target, self._move_timeout, reported)
        while True:
            self._still_current(move)
            voters = [v for v in self._topology().group_voters(move.group) if v != move.target]
            states = await asyncio.gather(self._progress(move.target, move.group),
                                          *(self._progress(v, move.group) for v in voters))
            target, others = states[0], [s for s in states[1:] if s is not None and s.mode == "voter"]
            commit = max((s.commit_index for s in others), default=0)
            if target is not None and target.mode == mode and commit and \
                    target.applied_index + CATCH_UP_ENTRIES >= commit:
                return
            if stall.check(target, commit, time.monotonic()) and mode == "learner" and move.group != META:
                await self._reseed(move)
            if time.monotonic() - reported > 5:
                reported = time.monotonic()
                log.info("%s: %s catching up as %s: %s of %d", group_name(move.group), move.target, mode,
                         target.applied_index if target is not None else "?", commit)
            await asyncio.sleep(POLL_SECONDS)

    async def _reseed(self, move: Move) -> None:
        """Have the target drop its learner and copy a voter's checkpoint again (best effort)."""
        log.warning("%s: %s made no progress as a learner while the group committed on; starting it afresh",
                    group_name(move.group), move.target)
        try:
            await answer(self._peers.admin(move.target).Reseed(pb.ReplicaRequest(group=move.group),
                                                               timeout=RPC_TIMEOUT))
        except grpc.aio.AioRpcError as exc:
            log.info("%s: %s could not start afresh: %s", group_name(move.group), move.target, exc.details())

    async def _compact(self, move: Move) -> None:
        """Have the leader snapshot its log, so that the target installs checkpoint files (best effort)."""
        request = pb.ReplicaRequest(group=move.group)
        try:
            await on_leader(self._peers, lambda: self._topology().group_voters(move.group),
                            lambda admin: admin.Compact(request, timeout=RPC_TIMEOUT),
                            f"{group_name(move.group)}: snapshot", timeout=RPC_TIMEOUT)
        except Unavailable as exc:
            log.info("%s; the target catches up from the log", exc)

    async def _record(self, move: Move, command) -> None:
        """Propose a step of `move` to the metadata group, unless its record changed meanwhile."""
        self._still_current(move)
        await self._meta().propose(command)

    async def _change_membership(self, move: Move, action: str, node_id: str) -> None:
        """Ask the group's leader to add or remove `node_id`, following leader hints, until it is done."""
        self._still_current(move)
        request = pb.ChangeMembershipRequest(group=move.group, action=action, node=node_id)
        await on_leader(self._peers, lambda: self._topology().group_voters(move.group),
                        lambda admin: admin.ChangeMembership(request, timeout=RPC_TIMEOUT),
                        f"{group_name(move.group)}: {action} {node_id}")


async def on_leader(peers: Peers, voters: Callable[[], tuple[str, ...]], call, what: str,
                    timeout: float = MEMBERSHIP_TIMEOUT) -> None:
    """`call(admin stub)` on the group's leader, following leader hints, until it answers done."""
    deadline = time.monotonic() + timeout
    ask = None
    while time.monotonic() < deadline:
        for voter in ([ask] if ask else []) + list(voters()):
            try:
                reply = await answer(call(peers.admin(voter)))
            except grpc.aio.AioRpcError:
                continue
            if reply.done:
                return
            ask = reply.leader or None
            break
        await asyncio.sleep(POLL_SECONDS)
    raise Unavailable(f"{what}: not done within {timeout:.0f}s")


def _after(voters: tuple[str, ...], move: Move) -> tuple[str, ...]:
    """The voters once `move` is done: the target in the source's place (or added, or the source gone)."""
    if move.source and move.target:
        return tuple(move.target if v == move.source else v for v in voters)
    if move.target:
        return voters + (move.target,)
    return tuple(v for v in voters if v != move.source)
