"""An engine-driven leader's read-only members (learners): fed by pysyncobj's own appends, sent to them
alone, while the engine carries the voters' (docs/raft-engine.md, "Learners under the engine").

pysyncobj keeps each learner's `nextIndex` and `matchIndex` and handles its answers (`next_node_idx`) as
before; a learner never counts toward a commit (pysyncobj's rule and `quorum_commit` count voters only).
"""

from __future__ import annotations


def needs_snapshot(member) -> bool:
    """A learner whose next entry the log no longer holds: pysyncobj would send it a snapshot."""
    first, next_index = member._SyncObj__raftLog[0][1], member._SyncObj__raftNextIndex
    return any(next_index.get(node, first + 1) <= first for node in member._SyncObj__readonlyNodes)


class LearnerFeed:
    def __init__(self, member):
        self._member = member
        self._commit_sent = -1  # the commit index the learners were last sent
        self._sent_at = 0.0
        self._beat = False  # a heartbeat is due: the next turn feeds whatever else it has

    def due(self) -> bool:
        """Whether a learner was not sent the last entry or the commit index moved since the last feed."""
        member = self._member
        learners = member._SyncObj__readonlyNodes
        if not learners:
            return False
        if self._beat:
            return True
        last, next_index = member._SyncObj__raftLog[-1][1], member._SyncObj__raftNextIndex
        return member.raftCommitIndex != self._commit_sent or any(next_index[node] <= last for node in learners)

    def heartbeat(self, now: float, period: float) -> bool:
        """The node timer: True if the learners were sent nothing for half a period (the next turn feeds them:
        a late commit index, and pysyncobj's repair of a lost message through the learner's `reset` answer)."""
        self._beat = bool(self._member._SyncObj__readonlyNodes) and now - self._sent_at >= period / 2
        return self._beat

    def feed(self, now: float) -> None:
        """pysyncobj's AppendEntries (entries from each learner's `nextIndex`, the commit index; at least a
        heartbeat) to the learners only: the voters are hidden from it for the call."""
        member = self._member
        voters = member._SyncObj__otherNodes
        member._SyncObj__otherNodes = set()
        try:
            member._SyncObj__sendAppendEntries()
        finally:
            member._SyncObj__otherNodes = voters
        self._commit_sent, self._sent_at, self._beat = member.raftCommitIndex, now, False
