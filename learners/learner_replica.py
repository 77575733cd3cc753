"""A learner's replica of one partition: a Raft member that never votes.

It applies nothing as entries commit: the feed pump reads committed entries
from the group and writes the copy only after the sink has them
(docs/learners.md). So its state machine:
- applies nothing: the group's `last_applied` just marks what is committed;
- stashes a snapshot from the leader instead of installing it: the pump turns
  the difference into `r` events first, then installs it;
- refuses to checkpoint while the copy is behind the entries the snapshot
  would replace, so undelivered entries are never dropped. The learner
  compacts only when the pump asks, once it has caught up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from raftkv.core.commands import Command
from raftkv.core.log_codec import decode_proposal
from raftkv.node.replica import Replica
from raftkv.raft.engine_state import install
from raftkv.raft.group import Entry, RaftGroup, Snapshot, StateMachine
from raftkv.storage.engine import Position
from raftkv.storage.rocks_engine import RocksEngine


class _FeedStateMachine:
    """The learner's copy, as its Raft group sees it. RocksDB: the snapshots it installs are the voters'."""

    def __init__(self, engine: RocksEngine):
        self.engine = engine
        self.pending_snapshot: Snapshot | None = None

    @property
    def position(self) -> Position:
        return self.engine.position

    def apply(self, entry: Entry) -> None:
        return None

    def checkpoint(self, dest: Path, last: Position) -> Position:
        if self.engine.position.index < last.index:
            raise RuntimeError(f"the feed is behind index {last.index}; compaction waits")
        return self.engine.checkpoint(dest)

    def verify(self, checkpoint: Path) -> None:
        self.engine.verify(checkpoint)

    def restore(self, snapshot: Snapshot) -> None:
        if snapshot.position.index > self.engine.position.index or snapshot.last.index > self.engine.position.index:
            self.pending_snapshot = snapshot

    def roll_back(self, snapshot: Snapshot | None) -> None:
        """The entries after it are delivered again; consumers deduplicate them (docs/learners.md)."""
        install(self.engine, snapshot)
        self.pending_snapshot = None

    def flush(self) -> None:
        self.engine.flush_memtable()


class LearnerReplica(Replica[RocksEngine]):
    state_machine: _FeedStateMachine

    def __init__(self, partition: int, engine: RocksEngine, open_group: Callable[[StateMachine], RaftGroup]):
        super().__init__(partition, engine, open_group, _FeedStateMachine)

    @property
    def applied_index(self) -> int:
        """What reads from this learner reflect: the copy, which waits for the sink."""
        return self.engine.position.index

    @property
    def applied_position(self) -> Position:
        return self.engine.position

    @property
    def last_data_index(self) -> int:
        """A learner never leads, and only leaders' statuses tell learners' lag."""
        return self.applied_index

    @property
    def pending_snapshot(self) -> Snapshot | None:
        """A snapshot the leader sent that the copy has not caught up with yet."""
        return self.state_machine.pending_snapshot

    def committed_entries(self, after: int, limit: int) -> list[tuple[int, int, list[Command]]]:
        """(index, term, commands) of committed entries after `after`, at most `limit` of them.

        Entries that are not proposals (Raft's no-ops, membership) come with no
        commands: they still advance the position.
        """
        return [(e.index, e.term, decode_proposal(e.payload) if e.payload is not None else [])
                for e in self.group.committed_entries(after, limit)]

    def mark_snapshot_installed(self, snapshot: Snapshot) -> None:
        """After the pump installed the stashed snapshot: the copy stands at the snapshot's index. A newer
        one the leader sent while the pump installed it stays stashed: the log now begins at that one, and
        forgetting it left the copy behind the log's first entry, its feed stalled for good (the soak of
        seed 1880499202, 2026-11-28: partition 2's copy at 21,006, its log from 22,935)."""
        if self.engine.position.index < snapshot.last.index:
            self.engine.write([], snapshot.last)
        if self.state_machine.pending_snapshot is snapshot:
            self.state_machine.pending_snapshot = None

    def compact_when_longer_than(self, entries: int) -> None:
        """The pump calls this after each delivery. Only a copy that has every applied entry can be a
        snapshot (`_FeedStateMachine.checkpoint` refuses otherwise, with a warning), so a learner
        that is still catching up does not ask."""
        if self.group.log_entries > entries and self.engine.position.index >= self.group.last_applied:
            self.group.compact()
