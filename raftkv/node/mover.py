"""Replica moves, run by the node that leads the metadata group (docs/elasticity.md §3).

A move is recorded in the metadata before anything happens (`BeginMove`), and the
nodes act on the record by themselves: the target opens the partition as a learner
while the step is `catching_up`, as a voter once it is `voting`, and the source
drops its replica when the move has ended without it. What is left is the order,
which `move_steps.decide` works out from the record, what it observed and the time;
this module observes (the replicas' progress), acts (membership changes, proposals)
and reads the clock, one poll every POLL_SECONDS while a step waits.

Every action is idempotent (adding a member twice, or removing one that is gone, is
done already), so a new metadata leader picks a move up from its record, and a move
whose action failed is tried again a second later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.core.errors import Unavailable
from raftkv.meta.records import ClusterMeta, Move, group_name
from raftkv.node import move_steps
from raftkv.node.meta_replica import MetaReplica
from raftkv.node.move_steps import ChangeMember, Compact, Need, Observed, Progress, Record, Reseed, Say
from raftkv.node.peers import Peers, answer
from raftkv.node.tasks import background

log = logging.getLogger(__name__)

POLL_SECONDS = 0.2
RPC_TIMEOUT = 5.0
MEMBERSHIP_TIMEOUT = 30.0


class MoveSuperseded(Exception):
    """The move's record changed under a step waiting on it (another node's mover took it further, or
    this node no longer leads the metadata group): the step is dropped and the record read again."""


class ReplicaMover:
    def __init__(self, meta: Callable[[], MetaReplica], topology: Callable[[], ClusterMeta], peers: Peers,
                 move_timeout: float, clock: Callable[[], float] = time.monotonic):
        self._meta = meta
        self._move_timeout = move_timeout
        self._topology = topology
        self._peers = peers
        self._clock = clock
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
        memory = None
        try:
            while self._meta().is_leader and (move := self._topology().move_of(group)) is not None:
                if memory is None or memory.move != move:
                    memory = move_steps.begin(move, self._clock())
                try:
                    memory = await self._step(memory)
                except MoveSuperseded:
                    memory = None
        except Exception as exc:  # the next poke, a second later, tries again from the record
            log.warning("%s: move paused: %s", group_name(group), exc)

    async def _step(self, memory: move_steps.Memory) -> move_steps.Memory:
        """Observe what the move's next decision needs, decide at this moment, act; the memory after."""
        move = memory.move
        self._still_current(move)
        observed = await self._observe(move, move_steps.needs(self._topology(), memory))
        step = move_steps.decide(self._topology(), memory, observed, self._clock(), self._move_timeout)
        for action in step.actions:
            await self._act(move, action)
        if step.wait:
            await asyncio.sleep(POLL_SECONDS)
        return step.memory

    async def _observe(self, move: Move, need: Need) -> Observed:
        if need == Need.NOTHING:
            return Observed()
        if need == Need.TARGET:
            return Observed(await self._progress(move.target, move.group))
        voters = [v for v in self._topology().group_voters(move.group) if v != move.target]
        states = await asyncio.gather(self._progress(move.target, move.group),
                                      *(self._progress(v, move.group) for v in voters))
        commit = max((s.commit_index for s in states[1:] if s is not None and s.mode == "voter"), default=0)
        return Observed(states[0], commit)

    async def _act(self, move: Move, action) -> None:
        if isinstance(action, ChangeMember):
            await self._change_membership(move, "add" if action.add else "remove", action.node)
        elif isinstance(action, Record):
            self._still_current(move)
            await self._meta().propose(action.command)
        elif isinstance(action, Compact):
            await self._compact(move)
        elif isinstance(action, Reseed):
            await self._reseed(move)
        elif isinstance(action, Say):
            (log.warning if action.warning else log.info)("%s", action.message)

    async def _progress(self, node_id: str, group: int) -> Progress | None:
        """How `node_id`'s replica of `group` stands (None: no answer)."""
        try:
            state = await answer(self._peers.admin(node_id).ReplicaProgress(pb.ReplicaRequest(group=group),
                                                                            timeout=RPC_TIMEOUT))
        except grpc.aio.AioRpcError:  # not this node stopping (Unavailable): that pauses the move, not a stall
            return None
        return Progress(state.mode, state.applied_index, state.snapshot_bytes_received, state.commit_index)

    def _still_current(self, move: Move) -> None:
        """MoveSuperseded unless this node leads the metadata group and `move` is still its record;
        checked before every observation, membership change and proposal of a step.

        When the metadata leadership moves, the old leader's mover is in the middle of a step while
        the new leader's starts from the record: a step that waits on a record the other one has
        since advanced would wait forever (a learner that is a voter by now never reports `learner`),
        and one that goes on would act for a record that is no longer there."""
        if not self._meta().is_leader or self._topology().move_of(move.group) != move:
            raise MoveSuperseded()

    async def _reseed(self, move: Move) -> None:
        try:
            await answer(self._peers.admin(move.target).Reseed(pb.ReplicaRequest(group=move.group),
                                                               timeout=RPC_TIMEOUT))
        except grpc.aio.AioRpcError as exc:
            log.info("%s: %s could not start afresh: %s", group_name(move.group), move.target, exc.details())

    async def _compact(self, move: Move) -> None:
        request = pb.ReplicaRequest(group=move.group)
        try:
            await on_leader(self._peers, lambda: self._topology().group_voters(move.group),
                            lambda admin: admin.Compact(request, timeout=RPC_TIMEOUT),
                            f"{group_name(move.group)}: snapshot", timeout=RPC_TIMEOUT)
        except Unavailable as exc:
            log.info("%s; the target catches up from the log", exc)

    async def _change_membership(self, move: Move, action: str, node_id: str) -> None:
        """Ask the group's leader to add or remove `node_id`, following leader hints, until it is done."""
        self._still_current(move)
        request = pb.ChangeMembershipRequest(group=move.group, action=action, node=node_id)
        await on_leader(self._peers, lambda: self._topology().group_voters(move.group),
                        lambda admin: admin.ChangeMembership(request, timeout=RPC_TIMEOUT),
                        f"{group_name(move.group)}: {action} {node_id}")


async def on_leader(peers: Peers, voters: Callable[[], tuple[str, ...]], call, what: str,
                    timeout: float = MEMBERSHIP_TIMEOUT) -> None:
    """`call(admin stub)` on the group's leader until it answers done: each round asks the voter last named
    the leader first, then the others in turn until one names the leader. A voter that names none is
    passed over: a member removed from the group knows no leader for good, and campaigns on until the
    move that removed it ends, which asking it alone would keep from ending."""
    deadline = time.monotonic() + timeout
    ask = None
    while time.monotonic() < deadline:
        hinted, ask = ask, None
        for voter in ([hinted] if hinted else []) + [v for v in voters() if v != hinted]:
            try:
                reply = await answer(call(peers.admin(voter)))
            except grpc.aio.AioRpcError:
                continue
            if reply.done:
                return
            if reply.leader:
                ask = reply.leader
                break
        await asyncio.sleep(POLL_SECONDS)
    raise Unavailable(f"{what}: not done within {timeout:.0f}s")
