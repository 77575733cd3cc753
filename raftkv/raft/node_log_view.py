"""GroupLog: one Raft group's part of the node log, with RaftJournal's interface, for pysyncobj.

Entries are `(command, idx, term)` tuples held in memory; positions passed to `deleteEntriesFrom`
and `deleteEntriesTo` are list positions with slice semantics, as in RaftJournal. Each change is a
record of the node log (`node_log.NodeLog`, whose lock every change holds), written at once unless
the node log is batching. `sync()`, `flush()` and the timer are the node log's, for every group.
"""

from __future__ import annotations

from pysyncobj.journal import Journal

from raftkv.raft.journal import list_position
from raftkv.raft.node_log_format import Entry, Kind, bare_record, index_record, one_entry_record, state_record
from raftkv.raft.node_log_groups import PENDING, GroupState


class GroupLog(Journal):
    def __init__(self, node, group: int, state: GroupState):  # node: a node_log.NodeLog
        self._node = node
        self.group_id = group
        self.state = state
        self._entries = state.entries
        self.closed = False  # destroyed, removed, or its node log closed
        self._errors_seen = node._error_count

    # Log entries

    def add(self, command: bytes, idx: int, term: int) -> None:
        node, state = self._node, self.state
        with node._lock:
            if not state.follows(idx):
                raise ValueError(f"node log {node.folder}: group {self.group_id}: entry {idx} does not follow "
                                 f"{state.entries[-1][1]}")
            if node._batching:
                node._queue_entry(self.group_id, state, command, idx, term)
            else:
                seq = node._write(one_entry_record(self.group_id, command, term, idx))
                state.written = node._writes
                state.append_one((command, idx, term), seq)

    def waiting(self, idx: int) -> bool:
        """Whether entry `idx` waits in the node log's batch, not yet written."""
        state = self.state
        if not state.pending or not self._entries:
            return False
        waiting = 0
        for seq, count in reversed(state.runs):
            if seq != PENDING:
                break
            waiting += count
        return idx > self._entries[-1][1] - waiting

    def write_pending(self) -> None:
        """The node log's batch written now, every group's (one os.write)."""
        self._node.write_pending()

    def __getitem__(self, item: int | slice) -> Entry | list[Entry]:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        state = self.state
        with self._node._lock:
            start = list_position(entryFrom, len(self._entries))
            if start < len(self._entries):
                self._node._record(state, index_record(Kind.TRUNCATE, self.group_id, self._entries[start][1]),
                                   lambda seq: state.truncate(start))

    def deleteEntriesTo(self, entryTo: int) -> None:
        state, entries = self.state, self._entries
        with self._node._lock:
            start = list_position(entryTo, len(entries))
            if start:
                idx = entries[start][1] if start < len(entries) else entries[-1][1] + 1
                self._node._record(state, index_record(Kind.COMPACT, self.group_id, idx),
                                   lambda seq: state.compact(start))

    def clear(self) -> None:
        state = self.state
        with self._node._lock:
            self._node._record(state, bare_record(Kind.CLEAR, self.group_id), lambda seq: state.clear())

    # Durability

    @property
    def size_bytes(self) -> int:
        """Bytes of this group's live entries in the log's records (12 + the command each)."""
        return self.state.live_bytes

    def bytes_from(self, position: int) -> int:
        """Bytes of the entries from list position `position` to the end."""
        state = self.state
        return state.total - state.starts[position] if 0 <= position < len(state.starts) else 0

    full = property(lambda self: self._node.full, doc="The node log's: a write failed for want of space.")

    @property
    def dirty(self) -> bool:
        """fsync mode: whether a record of this group was written (or batched) since the node log's last
        sync, which must come before this replica says anything of it (always False without fsync)."""
        node, state = self._node, self.state
        return node._fsync and (state.pending or state.written > node._synced_writes)

    def sync(self) -> None:
        """The node log's sync: every group's writes made durable with one fdatasync."""
        self._node.sync()

    def sync_written(self) -> None:
        """`sync` from a thread other than the group's: what is written made durable, not what is batched
        (the group's thread writes that first: `write_pending`)."""
        self._node.sync_written()

    def flush(self) -> None:
        self._node.flush()

    def onOneSecondTimer(self) -> None:
        """The node log's once-a-second work (run by the first group to tick in the period), and any
        failure of its background sync that this group has not yet raised."""
        node = self._node
        node.on_timer()
        if node._error_count > self._errors_seen:
            self._errors_seen = node._error_count
            raise node._last_error

    def sync_elsewhere(self) -> None:
        self._node.sync_elsewhere()

    def sync_in_background(self) -> bool:
        return not self.closed and self._node.sync_in_background()

    def _destroy(self) -> None:
        """The replica closes: its commit index written and everything synced (unless the disk failed).
        The node log stays open for the other groups."""
        if self.closed:
            return
        try:
            if self._node._files.failed is None and not self._node.closed:
                self._node.flush()
        finally:
            self.closed = True

    # Term, vote and commit index

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:
        """Synced before it returns, in both modes: a vote forgotten in a power cut could be cast again
        in the same term, and two leaders of one term would split the log for good."""
        node, state = self._node, self.state
        with node._lock:
            node._record(state, state_record(self.group_id, term, state.commit, votedForNodeId),
                         lambda seq: state.set_state(term, state.commit, votedForNodeId, seq))
            node._unsaved.discard(self.group_id)
        node.sync()

    def getCurrentTerm(self) -> int:
        return self.state.term

    def getVotedForNodeId(self) -> str | None:
        return self.state.voted

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        """Kept in memory; written in a state record by the next timer (or flush), as RaftJournal's meta."""
        node, state = self._node, self.state
        with node._lock:
            state.commit = raftCommitIndex
            node._unsaved.add(self.group_id)

    def getRaftCommitIndex(self) -> int:
        return self.state.commit
