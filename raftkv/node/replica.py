"""A voter's replica of one partition: a Raft group over a state machine in an engine (RocksDB on a
node, `MemoryEngine` in tests).

Every committed proposal is applied by `state_machine.apply_proposal` and
written with its Raft position in one atomic engine write, so the engine's
position says exactly which entries it holds.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Generic, TypeVar

from raftkv.core import metrics
from raftkv.core.log_codec import decode_proposal
from raftkv.core.learner_registry import learners_from, only_progress
from raftkv.core.retention import compaction_due, compaction_wanted, kept_for_seeds
from raftkv.core.spec import Tuning
from raftkv.core.state_machine import apply_proposal
from raftkv.raft.engine_state import EngineStateMachine
from raftkv.raft.group import Entry, ProposalCallback, RaftGroup, Role, Snapshot, StateMachine
from raftkv.storage.engine import Position, ReplicaEngine

E = TypeVar("E", bound=ReplicaEngine)

EAGER_COMPACTION_ENTRIES = 64


class KVStateMachine(EngineStateMachine):
    """The partition's key-value state: what a voter's Raft group applies entries to."""

    def __init__(self, partition: int, engine: ReplicaEngine):
        super().__init__(f"partition {partition}", engine)
        self.partition = partition
        self._apply_seconds = metrics.APPLY_SECONDS.labels(partition)
        # The last entry applied here that was more than learners' progress reports; until one is
        # applied, the position (a learner's lag may then show an entry or two too many).
        self.last_data_index = engine.position.index

    def apply(self, entry: Entry):
        started = time.perf_counter()
        commands = decode_proposal(entry.payload)
        applied = apply_proposal(self.engine.get, commands, self.engine.meta_get)
        self.engine.write(applied.mutations, Position(entry.index, entry.term), applied.meta)
        if not only_progress(commands):
            self.last_data_index = entry.index
        self._apply_seconds.observe(time.perf_counter() - started)
        return applied.results

    def restore(self, snapshot: Snapshot) -> None:
        super().restore(snapshot)
        self.last_data_index = max(self.last_data_index, self.engine.position.index)

    def roll_back(self, snapshot: Snapshot | None) -> None:
        super().roll_back(snapshot)
        self.last_data_index = self.engine.position.index


class Replica(Generic[E]):
    """A group's engine and the Raft group that drives the state machine over it. The replica owns
    the engine from here on: it closes it (also when the group does not open)."""

    def __init__(self, partition: int, engine: E, open_group: Callable[[StateMachine], RaftGroup],
                 state_machine: Callable[[E], StateMachine]):
        self.partition = partition
        self._new_state_machine = state_machine
        self.reopen(engine, open_group)

    def reopen(self, engine: E, open_group: Callable[[StateMachine], RaftGroup]) -> None:
        """Drive `engine` with a new group: at the start, or after `close` (a learner's partition starting
        over, learners/partition_heal.py)."""
        self.engine = engine
        try:
            self.state_machine = self._new_state_machine(engine)
            self.group = open_group(self.state_machine)
        except BaseException:
            self.engine.close()
            raise

    @property
    def role(self) -> Role:
        return self.group.role

    @property
    def leader_address(self) -> str | None:
        return self.group.leader

    @property
    def storage_full(self) -> bool:
        """This replica cannot write: its log or its database found the disk full."""
        return self.group.log_full or self.engine.broken

    def close(self) -> None:
        try:
            self.group.close()
        finally:
            self.engine.close()


class PartitionReplica(Replica[E]):
    """The replica a node serves a partition from: a voter applying every committed entry."""

    def __init__(self, partition: int, engine: E, tuning: Tuning,
                 open_group: Callable[[StateMachine], RaftGroup],
                 backup_index: Callable[[], int] = lambda: 0):
        self._tuning = tuning
        self._backup_index = backup_index  # of the newest backup copy of the partition (0: none)
        self._last_compaction: float | None = None  # when the log was last compacted (or first checked)
        self._stepped_aside: float | None = None  # when this leader last handed leadership on for want of disk space
        super().__init__(partition, engine, open_group, lambda engine: KVStateMachine(partition, engine))

    def propose(self, payload: bytes, callback: ProposalCallback) -> None:
        self.group.propose(payload, callback)

    @property
    def applied_index(self) -> int:
        """The index the local state reflects: Raft's no-op entries advance it without
        touching the engine, and after a restart the engine is ahead until the replay catches up."""
        return max(self.group.last_applied, self.engine.position.index)

    @property
    def last_data_index(self) -> int:
        """A learner that delivered this far is caught up: what follows only reports progress."""
        return self.state_machine.last_data_index

    @property
    def applied_position(self) -> Position:
        """`applied_index` and its term (0 if the log no longer holds that entry)."""
        engine = self.engine.position
        if engine.index >= self.group.last_applied:
            return engine
        return Position(self.group.last_applied, self.group.term_at(self.group.last_applied) or 0)

    def maybe_compact(self, now: float, eager: bool = False, moving_in: bool = False) -> None:
        """Compact the log when the retention policy allows at time `now` (called about once a second).
        `eager`: a new replica is about to catch up, so compact once the log holds more than a few
        entries (learners' retention still applies): it then gets checkpoint files, not the log entry
        by entry. `moving_in`: a move's target is being copied or catching up, from a voter's checkpoint
        at an entry this log still holds: it counts as a learner behind (the retention bounds apply), or
        a compaction meanwhile would send it a full snapshot on top of the copy (bench_move: 115 MB
        more, and the leader's writes stalled while it packed it)."""
        if self._last_compaction is None:
            self._last_compaction = now
        if self.engine.position.index > self.group.last_applied:
            return  # the replay after a restart has not reached the database: its checkpoint would be refused
        tuning = replace(self._tuning, compaction_min_entries=EAGER_COMPACTION_ENTRIES) if eager else self._tuning
        if not compaction_wanted(entries=self.group.log_entries, size_bytes=self.group.log_bytes,
                                 seconds_since_last=now - self._last_compaction, tuning=tuning):
            return  # at 1,024 partitions, reading each one's learners every second was a tenth of an idle node's time
        if compaction_due(
            entries=self.group.log_entries,
            size_bytes=self.group.log_bytes,
            seconds_since_last=now - self._last_compaction,
            applied=self.group.last_applied,
            learner_progress=[i.progress for i in learners_from(self.engine.meta_items()).values()]
            + ([0] if moving_in and not eager else []),
            learners_streaming=self.group.learners_caught_up(),
            tuning=tuning,
        ):
            self.group.compact(self._kept_for_seeds())
            self._last_compaction = now

    def _kept_for_seeds(self) -> int:
        backup_index = self._backup_index()
        return kept_for_seeds(backup_index=backup_index, in_log=self.group.term_at(backup_index) is not None,
                              applied=self.group.last_applied, bytes_after=self.group.log_bytes_after(backup_index),
                              tuning=self._tuning)

    def step_aside(self, now: float) -> None:
        """A leader that cannot write hands leadership to its most caught-up follower (at most once a
        second; refused when no connected follower has every entry)."""
        if self.role == Role.LEADER and (self._stepped_aside is None or now - self._stepped_aside >= 1.0):
            self._stepped_aside = now
            self.group.transfer_leadership()
