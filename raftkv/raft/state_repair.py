"""Where a replica's state and its Raft log disagree, and what it does about it.

Only a power cut of the default mode (no fsync before an acknowledgement) leaves them so: the kernel
writes dirty pages back in any order, across files too, so the database may keep writes the journal
lost; and if the cut took the whole cluster, entries every member acknowledged may be gone from every
log (within the bound docs/durability.md gives), and a new leader's entries take their indices. The
state is then rolled back to the snapshot and the log applied again; but a learner's copy, which its
sink already has, re-syncs instead (learners/partition_heal.py), and a replica whose snapshot holds the
lost entries, which it cannot roll back below, starts over from its peers. Anything else that contradicts the
state (fsync mode: an acknowledged entry lost) stops the replica: its state cannot be trusted.
"""

from __future__ import annotations

import logging

from raftkv.core.errors import LogContradiction, SnapshotContradiction
from raftkv.raft.group import Snapshot, StateMachine, contradicts
from raftkv.raft.syncobj_snapshots import SnapshotFiles

log = logging.getLogger(__name__)


class StateRepair:
    """Checks one member's state against its log: `member` is the pysyncobj SyncObj."""

    def __init__(self, partition: int, folder, fsync: bool, state_machine: StateMachine, snapshots: SnapshotFiles,
                 member, resyncs_itself: bool = False):
        self._partition = partition
        self._resyncs_itself = resyncs_itself  # a learner process (learners/partition_heal.py)
        self._folder = folder
        self._fsync = fsync
        self._sm = state_machine
        self._snapshots = snapshots
        self._member = member

    def _term_at(self, index: int) -> int:
        journal = self._member._SyncObj__raftLog
        return journal[index - journal[0][1]][2]

    def after_load(self) -> None:
        """At start-up, once the snapshot is loaded: a commit index or a state that reaches past the log's
        end. pysyncobj clamps the commit index only when it loads a snapshot: a leader elected with one
        past its log asked for appends at every tick for good (the simulation, seed 109, power cuts of
        every node in the default mode)."""
        member = self._member
        position, end = self._sm.position, member._SyncObj__raftLog[-1][1]
        if member._SyncObj__raftCommitIndex > end:
            log.warning("partition %d: the saved commit index %d is past the log's end %d (a power cut took the "
                        "log's last entries); it is %d now", self._partition, member._SyncObj__raftCommitIndex,
                        end, end)
            member._SyncObj__raftCommitIndex = end
            member._SyncObj__raftLog.setRaftCommitIndex(end)
        if position.index > end:
            snapshot = self._snapshots.current()
            log.warning("partition %d: the database reached entry %d but the log ends at %d (a power cut kept "
                        "the database's last writes and lost the log's); rolled back to %s and applied from the "
                        "log again", self._partition, position.index, end, _named(snapshot))
            self._sm.roll_back(snapshot)

    def before_truncation(self, first: int) -> None:
        """A leader replaces this log's entries from `first` on. If they were committed here, the whole
        cluster lost them in a power cut (Raft never replaces a committed entry a member still has; in
        fsync mode `PatchedSyncObj` refuses): commit index and last applied go back below them, and if
        the state applied some of them it goes back to the snapshot, from which the log is applied again.
        Where the snapshot covers them too, the replica starts over from its peers (`snapshot_contradicted`)."""
        if self._fsync:
            return  # an acknowledged entry lost: `check_committed` stops the replica
        member, position = self._member, self._sm.position
        last_applied, commit = member._SyncObj__raftLastApplied, member._SyncObj__raftCommitIndex
        if first > max(last_applied, commit, position.index):
            return  # entries no member committed: Raft's own repair of a follower's log
        if self._resyncs_itself and position.index >= first:
            # A learner's copy is what its sink has: rolled back and applied again, the new entries would
            # take the delivered ones' positions, and consumers (the sink too) drop them as duplicates.
            raise LogContradiction(self._partition,
                f"partition {self._partition}: the leader replaces entries from {first} on, and this learner "
                f"delivered them (its copy is at {position.index}): a power cut of the whole cluster lost them, "
                "within lose-last-second mode's bound; the learner re-syncs the partition from the cluster")
        restart = first - 1
        if position.index >= first and position.term:
            snapshot = self._snapshots.current()
            restart = snapshot.last.index if snapshot else 1  # 1: pysyncobj's first no-op, never applied
            if restart >= first or restart < member._SyncObj__raftLog[0][1]:  # the entries to apply again are gone
                self.snapshot_contradicted(f"the leader replaces entries from {first} on, and this replica's state "
                                           f"(at {position.index}) cannot go back below them")
            self._sm.roll_back(snapshot)
            rolled_back = f"; rolled back to {_named(snapshot)} and applied from the log again"
        else:
            rolled_back = ""
        log.warning("partition %d: the leader replaces committed entries from %d on (to %d here): a power cut of "
                    "the whole cluster lost them, within lose-last-second mode's bound (docs/durability.md)%s",
                    self._partition, first, max(last_applied, commit, position.index), rolled_back)
        member._SyncObj__raftLastApplied = min(last_applied, restart)
        member._SyncObj__raftCommitIndex = min(commit, first - 1)

    def snapshot_contradicted(self, detail: str) -> None:
        """The leader's log contradicts entries this replica's snapshot holds (`PatchedSyncObj`), or that
        its state applied and cannot roll back below: raised, and the group stops. In lose-last-second
        mode a power cut of the whole cluster took them from the others (within the bound), and the
        replica starts over from its peers (a voter: `HostedReplicas.start_over`; a learner re-syncs);
        in fsync mode an acknowledged entry was lost, and the node stops."""
        if self._fsync:
            raise LogContradiction(self._partition, f"partition {self._partition}: {detail}: an entry this replica "
                                   f"committed is gone from the leader's log, which fsync mode never allows; stop "
                                   f"the node, move {self._folder} away and restart it so the partition re-syncs")
        raise SnapshotContradiction(self._partition, f"partition {self._partition}: {detail}: a power cut of the "
                                    "whole cluster lost entries this replica had committed, within lose-last-second "
                                    "mode's bound (docs/durability.md)")

    def check_committed(self) -> None:
        """Before pysyncobj applies its next committed entry (no-ops and membership changes too): one the
        state already reflects must fit the state's position, or this replica's log was rewound and
        refilled with other entries (docs/chaos.md), and its state cannot be trusted."""
        index = self._member._SyncObj__raftLastApplied + 1
        position = self._sm.position
        if index > position.index:
            return
        term = self._term_at(index)
        if contradicts(index, term, position):
            remedy = ("the learner re-syncs the partition from the cluster" if self._resyncs_itself else
                      f"stop the node, move {self._folder} away and restart it so the partition re-syncs from its peers")
            raise LogContradiction(self._partition,
                f"partition {self._partition}: the Raft log contradicts the database: committed entry {index} "
                f"(term {term}) cannot come before its position {position.index} (term {position.term}); {remedy}")


def _named(snapshot: Snapshot | None) -> str:
    return f"the snapshot at entry {snapshot.last.index}" if snapshot else "empty"
