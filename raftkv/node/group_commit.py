"""Group commit for one partition, on the node's asyncio loop.

Writes and linearizable-read barriers queue here; `GroupCommit` decides when
a batch goes out; each batch becomes ONE Raft entry (one WriteBatch on every
replica). Reads share the barrier of whatever batch carries them: once that
entry is applied on this leader, every write acknowledged before the read
arrived is visible, so a local read is linearizable.

A proposal that neither commits nor fails within the request timeout (a
deposed leader never hears back) is reported Undetermined and its slot freed.

A large `put_many` is logged as one table file (docs/bulk-ingest.md), alone in
its entry: it is counted as a full batch.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from typing import Callable

from raftkv.core import metrics
from raftkv.core.batching import GroupCommit
from raftkv.core.bulk_ingest import SST_INGEST_SINCE, ingest_wanted
from raftkv.core.command_kinds import encode_command, kind_of
from raftkv.core.commands import Command, PutMany
from raftkv.core.errors import NotLeader, StorageFull, Undetermined, Unavailable
from raftkv.core.log_codec import join_proposal
from raftkv.meta.cluster_version import FIRST_RELEASE, at_least
from raftkv.node.replica import PartitionReplica
from raftkv.raft.group import Outcome, Role
from raftkv.storage import rocks_sst

_BARRIER_SIZE = 1

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Pending:
    encoded: bytes | None  # the command as the log holds it (encoded once, here); None: a read barrier
    future: asyncio.Future


class PartitionFrontend:
    def __init__(
        self,
        replica: PartitionReplica,
        loop: asyncio.AbstractEventLoop,
        *,
        max_batch_ops: int,
        max_batch_bytes: int,
        request_timeout: float,
        leader_id_of: callable,
        cluster_version: Callable[[], str] = lambda: FIRST_RELEASE,
    ):
        """`cluster_version()`: the lowest release every member runs; a command only a later one applies
        (a bulk-load file, a guarded batch) is not logged before."""
        self.replica = replica
        self.partition = replica.partition
        self._loop = loop
        self._policy: GroupCommit[_Pending] = GroupCommit(max_batch_ops, max_batch_bytes, max_in_flight=1)
        self._timeout = request_timeout
        self._leader_id_of = leader_id_of
        self._cluster_version = cluster_version
        self._ids = itertools.count()
        self._in_flight: dict[int, tuple[list[_Pending], asyncio.TimerHandle]] = {}
        self._closed = False

    @property
    def is_leader(self) -> bool:
        return self.replica.role == Role.LEADER

    def not_leader(self) -> NotLeader:
        return NotLeader(self.partition, self._leader_id_of(self.replica.leader_address))

    def member_ids(self) -> tuple[str, ...]:
        """The group's voters as this replica's Raft configuration has them, by node id (an address no node
        has, as is)."""
        return tuple(sorted(self._leader_id_of(a) or a for a in self.replica.group.voters))

    def submit(self, command: Command) -> asyncio.Future:
        since = kind_of(command).since
        if since and self.is_leader and not at_least(self._cluster_version(), since):  # a follower forwards it
            future = self._loop.create_future()
            future.set_exception(Unavailable(  # retried: a new cluster raises its version in its first seconds
                f"a {type(command).__name__} needs every node at {since} or later, and the cluster version is "
                f"{self._cluster_version()}: it is raised once every node runs {since} (docs/operations.md)"))
            return future
        if (type(command) is PutMany and self.is_leader and ingest_wanted(command, self._policy.max_bytes)
                and at_least(self._cluster_version(), SST_INGEST_SINCE)):  # a follower refuses it in `_enqueue`
            file = rocks_sst.build(command)
            metrics.INGEST_FILES.labels(self.partition).inc()
            return self._enqueue(_Pending(encode_command(file), self._loop.create_future()), self._policy.max_bytes)
        encoded = encode_command(command)
        return self._enqueue(_Pending(encoded, self._loop.create_future()), len(encoded))

    def barrier(self) -> asyncio.Future:
        return self._enqueue(_Pending(None, self._loop.create_future()), _BARRIER_SIZE)

    def _enqueue(self, pending: _Pending, size: int) -> asyncio.Future:
        if self._closed:  # its group would never answer: the request would wait out its timeout
            pending.future.set_exception(Unavailable(f"partition {self.partition}: its replica here is closed "
                                                     "(the node is stopping, or the replica left it); retry"))
            return pending.future
        if not self.is_leader:
            pending.future.set_exception(self.not_leader())
            return pending.future
        if self.replica.storage_full:  # refuse at once, and let a replica with room lead
            self.replica.step_aside(self._loop.time())
            pending.future.set_exception(StorageFull(
                f"partition {self.partition}: this node's disk is full; it refuses writes and hands "
                "leadership to another replica"))
            return pending.future
        for batch in self._policy.add(pending, size):
            self._propose(batch)
        return pending.future

    def _propose(self, batch: list[_Pending]) -> None:
        proposal_id = next(self._ids)
        payload = join_proposal(p.encoded for p in batch if p.encoded is not None)
        timer = self._loop.call_later(self._timeout, self._finish, proposal_id, None, None)
        self._in_flight[proposal_id] = (batch, timer)
        metrics.PROPOSALS.labels(self.partition).inc()
        metrics.PROPOSAL_OPS.labels(self.partition).observe(len(batch))
        loop = self._loop

        def on_applied(results, reason):  # inside the replica's tick, on the loop
            if reason == Outcome.APPLIED:
                self._applied(proposal_id, results)
            else:
                loop.call_soon(self._finish, proposal_id, results, reason)

        try:
            self.replica.propose(payload, on_applied)
        except Exception as exc:  # the replica is shutting down
            self._finish(proposal_id, None, exc)

    def _applied(self, proposal_id: int, results) -> None:
        """Inside the group's apply step: the next batch is proposed at once, so that it leaves in this
        same tick and carries the new commit index, which then needs no message of its own (the Raft
        adapter's `_Member`); the writers hear back on the next turn of the loop. Nothing may raise
        into the apply step: it would stop between applying an entry and counting it applied."""
        try:
            if (batch := self._take(proposal_id)) is not None:
                self._loop.call_soon(self._resolve, batch, results, Outcome.APPLIED)
                self._propose_next()
        except Exception:
            log.exception("partition %d: group commit failed after an apply", self.partition)

    def _finish(self, proposal_id: int, results, reason) -> None:
        if (batch := self._take(proposal_id)) is not None:
            self._resolve(batch, results, reason)
            self._propose_next()

    def _take(self, proposal_id: int) -> list[_Pending] | None:
        """The proposal's batch, no longer in flight; None if it timed out earlier (the late answer
        changes nothing we can still report)."""
        entry = self._in_flight.pop(proposal_id, None)
        if entry is None:
            return None
        batch, timer = entry
        timer.cancel()
        return batch

    def _resolve(self, batch: list[_Pending], results, reason) -> None:
        if reason == Outcome.APPLIED:
            writes = iter(results or ())
            for p in batch:
                if not p.future.done():
                    p.future.set_result(next(writes) if p.encoded is not None else None)
        else:
            error = self._error_for(reason)
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(error)

    def _propose_next(self) -> None:
        for next_batch in self._policy.completed():
            self._propose(next_batch)

    def _error_for(self, reason) -> Exception:
        if reason is None:
            return Undetermined(f"partition {self.partition}: no commit within {self._timeout:.1f}s; the write may or may not apply")
        if isinstance(reason, Exception):
            return Unavailable(f"partition {self.partition}: {reason}")
        if reason == Outcome.REJECTED:
            return self.not_leader()
        return Undetermined(f"partition {self.partition}: leadership changed while the write was in flight")

    def on_leadership_lost(self) -> None:
        """Fail what was queued but not yet proposed, so clients re-route at once."""
        error = self.not_leader()
        for p in self._policy.abandon():
            if not p.future.done():
                p.future.set_exception(error)

    def close(self) -> None:
        """The replica leaves this node: fail what waits here at once, then close it."""
        self._closed = True
        self.on_leadership_lost()
        for proposal_id in list(self._in_flight):
            self._finish(proposal_id, None, Outcome.UNKNOWN)
        self.replica.close()
