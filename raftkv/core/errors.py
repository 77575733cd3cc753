"""Every error raftkv raises, in one place.

Each class builds its own message; only the CLI turns them into text and exit
codes. `Undetermined` means the outcome of a write is unknown: it may or may
not have been applied, and a history checker must treat it as maybe-applied.
"""

from __future__ import annotations


class RaftKVError(Exception):
    """Base of every raftkv error."""


class InvalidRequest(RaftKVError):
    """The request is malformed or breaks a limit; nothing was written."""


class ConfigError(RaftKVError):
    """The cluster spec or a flag is wrong; `problems` names each by field."""

    def __init__(self, problems: list[str] | str, source: str = "config"):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        super().__init__(f"{source}: " + "; ".join(self.problems))


class NotLeader(RaftKVError):
    """This replica does not lead `partition`; `leader_hint` is the node id it believes leads."""

    def __init__(self, partition: int, leader_hint: str | None = None):
        self.partition = partition
        self.leader_hint = leader_hint
        hint = f"; leader is {leader_hint}" if leader_hint else "; no leader known"
        super().__init__(f"not the leader of partition {partition}{hint}")


class Unavailable(RaftKVError):
    """No replica could be reached, or no leader was elected before the deadline; nothing was written."""


class Undeliverable(RaftKVError):
    """The sink refuses an event for good (e.g. larger than its backend accepts): retrying cannot help, so
    the learner stops feeding `partition` and keeps feeding the others."""

    def __init__(self, partition: int, index: int, reason: str):
        self.partition = partition
        self.index = index
        self.reason = reason
        super().__init__(f"partition {partition}: the event at index {index} cannot be delivered: {reason}")


class Unauthenticated(RaftKVError):
    """The TLS set-up with every node failed: a certificate one side does not trust, or TLS on one
    side only; nothing was sent."""


class PermissionDenied(RaftKVError):
    """The caller's roles do not allow the operation; nothing was written."""


class ResourceExhausted(RaftKVError):
    """The caller is over one of its limits on a node (calls, scans or writes in flight); nothing was
    applied. Not retried: the caller is the one to slow down."""


class Timeout(RaftKVError):
    """A read did not complete before its deadline."""


class Undetermined(RaftKVError):
    """A write was sent but its outcome is unknown: it may or may not have been applied."""


class CorruptData(RaftKVError):
    """A file on disk failed its integrity check; the node refuses to serve it."""


class DiskFailed(CorruptData):
    """The disk failed an fsync or a read. After a failed fsync the kernel may have dropped the
    writes it held (and report the next fsync as a success), so nothing on that disk can be
    trusted; the node stops rather than serve or acknowledge what may be lost."""


class LogContradiction(CorruptData):
    """A replica's Raft log holds a committed entry its state cannot have come after: the log was
    rewound and refilled with other entries. A node stops; a learner re-syncs the partition from the
    cluster (learners/partition_heal.py)."""

    def __init__(self, partition: int, message: str):
        self.partition = partition
        super().__init__(message)


class SnapshotContradiction(LogContradiction):
    """A replica's snapshot holds committed entries its leader's log replaced: a power cut of the whole
    cluster in lose-last-second mode took them from the others (docs/durability.md). The replica cannot
    roll back below its snapshot; a node deletes its data and it catches up from its peers."""


class StorageFull(RaftKVError):
    """The disk holding a node's data is full; nothing was acknowledged."""


class ChangeRefused(RaftKVError):
    """A change to the cluster's topology broke a rule (an unknown node, a second move of a
    partition...); nothing changed."""


def one_line(text: str) -> str:
    """`text` with line breaks and other control characters escaped, for an error of one line that
    quotes what a user wrote: a key or a host may hold them."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
