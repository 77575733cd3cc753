"""What a replica needs from Raft, and what Raft needs from a replica.

`RaftGroup` is one member of one Raft group (in the spirit of hashicorp/raft's
`NewRaft(conf, fsm, ...)`): the caller proposes opaque payloads, reads the
group's state, compacts, hands leadership on and changes membership. The group
calls back into a `StateMachine` it was given: to apply a committed entry, to
checkpoint the state for a snapshot and to restore one.

`syncobj_group.SyncObjGroup` implements it over pysyncobj, `memory_group` in
memory for deterministic scenario tests. Everything outside `raftkv.raft`
sees only these types.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from raftkv.storage.engine import Position


class Role(enum.IntEnum):
    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2

    @property
    def label(self) -> str:
        return self.name.lower()


class Outcome(enum.Enum):
    """How a proposal ended."""

    APPLIED = "applied"  # committed and applied; the callback has the state machine's result
    REJECTED = "rejected"  # certainly never applied (not the leader, queue full, shutting down)
    UNKNOWN = "unknown"  # leadership changed while it was in flight: it may or may not apply


@dataclass(frozen=True)
class Entry:
    """A committed log entry. `payload` is None for Raft's own entries (no-ops, membership)."""

    index: int
    term: int
    payload: bytes | None


@dataclass(frozen=True)
class Snapshot:
    """A snapshot file: the state machine's checkpoint and the Raft entry it covers up to."""

    path: Path
    position: Position  # where the checkpointed state stands
    last: Position  # the last log entry the snapshot replaces


ProposalCallback = Callable[[Any, Outcome], None]


def contradicts(index: int, term: int, position: Position) -> bool:
    """Whether committed entry (`index`, `term`), at or below the state's `position`, cannot be one
    the state reflects: terms never fall along a log, and every member commits the same entries, so
    such an entry has at most the position's term, and exactly it at the position's index. A
    position of term 0 (data restored from a backup: no log position) says nothing."""
    if not position.term:
        return False
    return term > position.term or (index == position.index and term != position.term)


class StateMachine(Protocol):
    """What a group drives. All calls come on the group's thread (the node's event loop),
    except `flush`, `verify`, and `checkpoint`'s result being written to a file."""

    @property
    def position(self) -> Position:
        """The last entry reflected in the state: entries at or below it are not applied again."""

    def apply(self, entry: Entry) -> Any:
        """Apply a committed entry with a payload; the result goes to the proposer's callback."""

    def checkpoint(self, dest: Path, last: Position) -> Position:
        """Write a consistent copy of the state to `dest` for a snapshot covering the log up to
        `last`, and return the position it reflects. Raise to refuse (no snapshot this time)."""

    def verify(self, checkpoint: Path) -> None:
        """Check a checkpoint of the state before it leaves the node (on a worker thread); CorruptData if it is
        damaged, which is the state's own damage."""

    def restore(self, snapshot: Snapshot) -> None:
        """A leader sent a snapshot: replace the state with it (or stash it to do so later)."""

    def roll_back(self, snapshot: Snapshot | None) -> None:
        """The state reaches past the log (a power cut kept the state's last writes and lost the
        log's): replace it with `snapshot`'s (None: the empty state), from which the log is applied again."""

    def flush(self) -> None:
        """A compaction is coming: on the snapshot worker thread, while entries are applied, write out what
        its `checkpoint` would otherwise write on the group's thread."""


class RaftGroup(Protocol):
    """One member of a Raft group. Not thread-safe: call it on the thread it ticks on."""

    @property
    def role(self) -> Role: ...

    @property
    def leader(self) -> str | None:
        """The leader's Raft address, as this member believes."""

    @property
    def term(self) -> int: ...

    @property
    def commit_index(self) -> int: ...

    @property
    def leader_commit_index(self) -> int | None:
        """The commit index the leader last sent this member (its own when it leads); None until it
        heard from a leader. A member has caught up once it applied that far."""

    @property
    def last_applied(self) -> int:
        """The last committed entry handed to the state machine (or skipped as already in it)."""

    @property
    def last_log_index(self) -> int: ...

    @property
    def voters(self) -> frozenset[str]:
        """The group's voters' Raft addresses as this member knows them (a membership change counts
        from when it is appended, as in Ongaro's single-server changes)."""

    @property
    def has_quorum(self) -> bool:
        """This member is connected to a majority of the voters (itself included)."""

    def term_at(self, index: int) -> int | None:
        """The term of entry `index` in this member's log; None when the log does not hold it."""

    def log_base_at(self, index: int) -> tuple[tuple[bytes, int, int], tuple[bytes, int, int]] | None:
        """The log's entries `index - 1` and `index` in pysyncobj's form, for a replica seeded elsewhere
        to start its log with; None unless the log holds both (the in-memory twin never does)."""

    @property
    def log_entries(self) -> int:
        """Entries after the last snapshot (entries kept before it, see `compact`, do not count)."""

    def log_bytes_after(self, index: int) -> int:
        """Bytes of the log's entries after `index`."""

    @property
    def log_bytes(self) -> int: ...

    @property
    def log_full(self) -> bool:
        """The log's disk is full: this member can append nothing."""

    @property
    def snapshot_bytes_received(self) -> int:
        """Bytes of a snapshot this member is receiving from the leader so far; 0 when none."""

    def learners_caught_up(self) -> int:
        """On the leader: connected learners that hold every applied entry."""

    def propose(self, payload: bytes, callback: ProposalCallback) -> None: ...

    def committed_entries(self, after: int, limit: int) -> list[Entry]:
        """Committed entries after index `after`, at most `limit`; LookupError if compacted away."""

    def compact(self, keep_from: int = 0) -> None:
        """Snapshot the state machine and drop the log it covers (asynchronously), except the entries
        from `keep_from` - 1 on (0: none): a replica seeded from a backup at `keep_from` starts its log
        with that entry and the one before, and catches up from the rest. A group may keep fewer:
        the in-memory twin keeps none."""

    def transfer_leadership(self, to: str | None = None) -> None: ...

    def add_member(self, address: str, callback: ProposalCallback) -> None: ...

    def remove_member(self, address: str, callback: ProposalCallback) -> None: ...

    def name_members(self, addresses: frozenset[str]) -> None:
        """The group's members as the cluster metadata has them now: this member keeps hearing from
        each, even while its own log (an old snapshot, a journal it replays) counts one out."""

    def close(self) -> None: ...
