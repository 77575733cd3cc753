"""What the node log keeps in memory for each group, and what each record does to it.

One `GroupState` per group: its live entries (the list pysyncobj reads, as RaftJournal keeps it),
term, vote and commit index, and where its live records lie (the segment of each run of its
entries and of its latest state record), which says when a segment is dead. The same methods
change it when a record is written and when it is replayed at start-up (`replay`), so what
recovery rebuilds is what was there.
"""

from __future__ import annotations

from collections import deque

from raftkv.raft.node_log_format import ENTRY_OVERHEAD, BadPayload, Entry, Kind, read_entries, read_index, read_state

PENDING = -1  # the segment of a record that waits in a batch, not yet written


class GroupState:
    __slots__ = ("entries", "starts", "total", "runs", "term", "voted", "commit", "state_seq", "saved_commit",
                 "written", "pending")

    def __init__(self) -> None:
        self.entries: list[Entry] = []  # never rebound: a GroupLog holds on to this list
        self.starts: list[int] = []  # bytes of the entries before each one, counted from a fixed origin
        self.total = 0  # ... and after the last one
        self.runs: deque[list[int]] = deque()  # [segment seq, count] for the live entries, in order
        self.term, self.voted, self.commit = 0, None, 1
        self.state_seq: int | None = None  # segment of the latest state record
        self.saved_commit = 1  # the commit index that record holds
        self.written = 0  # the node log's write count when a record of this group was last written
        self.pending = False  # a record of this group waits in a batch

    # Entries

    def follows(self, idx: int) -> bool:
        return not self.entries or idx == self.entries[-1][1] + 1

    def append_one(self, entry: Entry, seq: int) -> None:
        self.starts.append(self.total)
        self.total += ENTRY_OVERHEAD + len(entry[0])
        self.entries.append(entry)
        runs = self.runs
        if runs and runs[-1][0] == seq:
            runs[-1][1] += 1
        else:
            runs.append([seq, 1])

    def append(self, entries: list[Entry], seq: int) -> None:
        for entry in entries:
            self.append_one(entry, seq)

    def truncate(self, position: int) -> None:
        """Keep entries[:position]."""
        dropped = len(self.entries) - position
        if dropped <= 0:
            return
        self.total = self.starts[position]
        del self.entries[position:]
        del self.starts[position:]
        runs = self.runs
        while dropped:
            take = min(dropped, runs[-1][1])
            runs[-1][1] -= take
            dropped -= take
            if not runs[-1][1]:
                runs.pop()

    def compact(self, position: int) -> None:
        """Drop entries[:position]."""
        dropped = min(position, len(self.entries))
        del self.entries[:dropped]
        del self.starts[:dropped]
        runs = self.runs
        while dropped:
            take = min(dropped, runs[0][1])
            runs[0][1] -= take
            dropped -= take
            if not runs[0][1]:
                runs.popleft()

    def clear(self) -> None:
        self.entries.clear()
        self.starts.clear()
        self.runs.clear()

    def replace(self, entries: list[Entry], seq: int) -> None:
        self.clear()
        self.append(entries, seq)

    def position_of(self, idx: int) -> int:
        """The list position of entry `idx`, clamped to the list."""
        if not self.entries:
            return 0
        return min(max(idx - self.entries[0][1], 0), len(self.entries))

    # Term, vote and commit index

    def set_state(self, term: int, commit: int, voted: str | None, seq: int) -> None:
        self.term, self.commit, self.voted = term, commit, voted
        self.saved_commit = commit
        self.state_seq = seq

    # Where its records lie

    @property
    def live_bytes(self) -> int:
        return self.total - self.starts[0] if self.starts else 0

    def first_seq(self) -> int | None:
        """The oldest segment holding a live record of this group (records still in a batch aside)."""
        found = [seq for seq in (self.runs[0][0] if self.runs else None, self.state_seq)
                 if seq is not None and seq != PENDING]
        return min(found, default=None)

    def settle(self, seq: int, written: int) -> None:
        """This group's batched records were written to segment `seq` by the node log's write `written`."""
        runs = self.runs
        at = len(runs) - 1
        while at >= 0 and runs[at][0] == PENDING:
            runs[at][0] = seq
            at -= 1
        if 0 <= at < len(runs) - 1 and runs[at][0] == seq:
            runs[at][1] += runs[at + 1][1]
            del runs[at + 1]
        if self.state_seq == PENDING:
            self.state_seq = seq
        self.written = written
        self.pending = False


def replay(groups: dict[int, GroupState], kind: int, group: int, data: bytes, start: int, end: int, seq: int) -> None:
    """Apply the record of `kind` for `group` whose payload is data[start:end], read from segment `seq`."""
    if kind == Kind.REMOVE:
        groups.pop(group, None)
        return
    state = groups.get(group)
    if state is None:
        state = groups[group] = GroupState()
    if kind == Kind.ENTRIES or kind == Kind.REPLACE:
        first, items = read_entries(data, start, end)
        if kind == Kind.REPLACE:
            state.clear()
        elif not state.follows(first):
            raise BadPayload(f"group {group}: entry {first} follows entry {state.entries[-1][1]}")
        state.append([(command, first + i, term) for i, (command, term) in enumerate(items)], seq)
    elif kind == Kind.TRUNCATE:
        state.truncate(state.position_of(read_index(data, start, end)))
    elif kind == Kind.COMPACT:
        state.compact(state.position_of(read_index(data, start, end)))
    elif kind == Kind.CLEAR:
        state.clear()
    elif kind == Kind.STATE:
        state.set_state(*read_state(data, start, end), seq)
    else:
        raise BadPayload(f"unknown record kind {kind}")
