"""Raft's safety properties, checked after every step of a simulation (Figure 3 of the Raft paper):

- election safety: at most one leader per term per group;
- log matching: an entry is named by its index and term: every log that holds it holds the same
  command, after an entry of the same term (so, by induction, the same entries before it);
- leader completeness: a leader's log holds every entry committed before it leads;
- state-machine safety: every member that applied an entry at an index applied the same history up
  to it (a digest of the applied entries, so a skipped or extra entry counts too), and no proposal
  is applied at two indices;
- a learner (a read-only member) counts committed only entries a voter's commit index covered, and
  applies the voters' history (the digest above).

A committed entry is one at or below some member's commit index. Only a power cut can take one from
a majority, and only in the default mode (no fsync before an acknowledgement): then `forget_from`
marks it lost, and the group may replace it with another history: at those indices a member may apply
either (one that kept the old entries applies them again after a restart, then rolls back), but the
digest of what it applies next tells whether it went on from the right one, and once settled every
member must hold the same history (the replaced entries are reported, not a violation). In fsync mode nothing is forgotten, so
an acknowledged proposal lost shows up as a violation of one of the above.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.engine_sim.storage import LogEntry


@dataclass
class GroupRecord:
    committed: dict[int, tuple[int, bytes]] = field(default_factory=dict)  # index -> (term, command)
    committed_in: dict[int, int] = field(default_factory=dict)  # index -> the term of the member that first counted it
    applied: dict[int, int] = field(default_factory=dict)  # index -> history digest
    applied_at: dict[bytes, int] = field(default_factory=dict)  # payload -> index
    acked: dict[bytes, int] = field(default_factory=dict)  # acknowledged proposal -> index
    rejected: set[bytes] = field(default_factory=set)
    forgotten: int = 0  # committed entries a power cut took from a majority (default mode)
    replaceable: set[int] = field(default_factory=set)  # indices of those: members may apply either history there


class Checker:
    def __init__(self, trace):
        self._trace = trace
        self.violations: list[str] = []
        self.leaders: dict[tuple[int, int], str] = {}  # (group, term) -> node
        self.entries: dict[tuple[int, int, int], tuple[bytes, int]] = {}  # (group, index, term) -> (command, prev term)
        self.groups: dict[int, GroupRecord] = {}

    def group(self, group: int) -> GroupRecord:
        record = self.groups.get(group)
        if record is None:
            record = self.groups[group] = GroupRecord()
        return record

    def fail(self, text: str) -> None:
        self.violations.append(text)
        self._trace.add("VIOLATION", text)

    # -- hooks ----------------------------------------------------------------

    def on_append(self, node: str, group: int, previous_term: int, entry: LogEntry) -> None:
        command, index, term = entry
        key = (group, index, term)
        seen = self.entries.get(key)
        if seen is None:
            self.entries[key] = (command, previous_term)
        elif seen != (command, previous_term):
            self.fail(f"log matching: g{group} {node} appended entry {index}:{term} after term {previous_term} "
                      f"with command {command[:24]!r}; another log has {seen[0][:24]!r} after term {seen[1]}")

    def on_apply(self, node: str, group: int, index: int, term: int, payload: bytes, digest: int) -> None:
        record = self.group(group)
        if index in record.replaceable:  # the old history (a member that kept it) or the new one
            record.applied[index] = digest
            seen = digest
        else:
            seen = record.applied.setdefault(index, digest)
        if seen != digest:
            self.fail(f"state-machine safety: g{group} {node} applied {payload!r} at {index}:{term} after a history "
                      "other members did not apply")
        where = record.applied_at.setdefault(payload, index)
        if where != index:
            self.fail(f"state-machine safety: g{group} {node} applied {payload!r} at {index}, and at {where} before")
        if payload in record.rejected and index not in record.replaceable:
            self.fail(f"g{group} {node} applied {payload!r}, which was answered as rejected")

    def on_roll_back(self, node: str, group: int) -> None:
        self._trace.add("rollback", f"g{group} {node}: state rolled back to empty")

    def acknowledged(self, group: int, payload: bytes, index: int) -> None:
        self.group(group).acked[payload] = index

    def rejected(self, group: int, payload: bytes) -> None:
        """Answered as not applied: it may have been only where a power cut's forgotten entries may be replaced
        (a member replaying the old history there), which the settled state tells (`SimCluster.check_final`)."""
        record = self.group(group)
        record.rejected.add(payload)
        index = record.applied_at.get(payload)
        if index is not None and index not in record.replaceable:
            self.fail(f"g{group}: {payload!r} was answered as rejected but is applied at {index}")

    # -- after every step -------------------------------------------------------

    def leads(self, node: str, group: int, term: int) -> bool:
        """A member is leader in `term`; True the first time it is seen leading in it."""
        holder = self.leaders.setdefault((group, term), node)
        if holder != node:
            self.fail(f"election safety: g{group} has two leaders in term {term}: {holder} and {node}")
            return False
        return True

    def new_leader(self, node: str, group: int, term: int, log) -> None:
        """Raft's leader completeness: an entry committed in a term is in the log of every leader of a later
        one. Not of an earlier one: a candidate of term 25 whose votes were held up won after a leader of
        term 26 had committed 454:20, which it lacked (seed 1247, `--stale`)."""
        first, last = log[0][1], log[-1][1]
        record = self.group(group)
        for index, (entry_term, command) in record.committed.items():
            if record.committed_in[index] >= term:
                continue
            held = log[index - first] if first <= index <= last else None
            if held is None or held[2] != entry_term:
                self.fail(f"leader completeness: g{group} {node} leads term {term} without committed entry "
                          f"{index}:{entry_term} (it holds {None if held is None else held[1:]})")
                return

    def committed(self, node: str, group: int, log, start: int, end: int, current_term: int) -> None:
        """A member in `current_term` moved its commit index from `start` to `end`: the entries between are
        committed (in that term, if no member counted them before)."""
        record = self.group(group)
        committed = record.committed
        first = log[0][1]
        for index in range(start + 1, end + 1):
            _, _, term = entry = log[index - first]
            record.committed_in.setdefault(index, current_term)
            seen = committed.setdefault(index, (term, entry[0]))
            if seen != (term, entry[0]):
                self.fail(f"commit: g{group} {node} counts {index}:{term} committed; {index}:{seen[0]} was")
                return

    def learned(self, node: str, group: int, log, start: int, end: int) -> None:
        """A learner's commit index moved from `start` to `end`: a leader told it, so a voter's commit index
        covered each of those entries first, unless a power cut took it from a majority since (default mode:
        the leader still counts it, and the learner may apply it, then roll back as a voter would)."""
        record = self.group(group)
        first = log[0][1]
        for index in range(start + 1, end + 1):
            _, _, term = entry = log[index - first]
            seen = record.committed.get(index)
            if seen is None and index in record.replaceable:
                continue
            if seen != (term, entry[0]):
                self.fail(f"learner: g{group} {node} counts {index}:{term} committed; "
                          f"{'no voter did' if seen is None else f'{index}:{seen[0]} was'}")
                return

    # -- power cuts (default mode) ---------------------------------------------

    def forget_from(self, group: int, index: int) -> int:
        """A power cut took committed entries from `index` on from a majority: another history may take
        their place. Returns how many acknowledged proposals among them may be lost."""
        record = self.group(group)
        gone = [i for i in record.committed if i >= index]
        for i in gone:
            del record.committed[i]
            del record.committed_in[i]
        record.forgotten += len(gone)
        record.replaceable.update(gone)
        for i in [i for i in record.applied if i >= index]:
            del record.applied[i]
        for payload in [p for p, i in record.applied_at.items() if i >= index]:
            del record.applied_at[payload]
        at_risk = sum(1 for i in record.acked.values() if i >= index)
        self._trace.add("forget", f"g{group}: committed entries from {index} on are on no majority "
                                  f"({len(gone)} entries, {at_risk} acknowledged proposals)")
        return at_risk
