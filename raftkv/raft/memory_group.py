"""`RaftGroup` in memory: several members of a group in one process, deterministically.

The twin of `SyncObjGroup` for scenario tests (tests/testdata/raft/). No
threads, sockets or clocks: time moves only by `MemoryNetwork.tick()`, messages
wait in one queue until `deliver()`, and election timeouts come from a seeded
`random.Random`. It follows Raft as pysyncobj does where that shows: the log
starts with a no-op entry at index 1, a new leader appends a no-op, a
membership entry takes effect when appended, entries are applied once
committed, and snapshots are `snapshot_file` files made from the state
machine's checkpoint. What survives `close()` is the member's `Disk`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from raftkv.raft import snapshot_file
from raftkv.raft.group import Entry, Outcome, ProposalCallback, Role, Snapshot, StateMachine
from raftkv.raft.memory_network import MemoryNetwork
from raftkv.storage.engine import Position

NOOP, PAYLOAD, ADD, REMOVE = "noop", "payload", "add", "remove"


@dataclass(frozen=True)
class LogEntry:
    index: int
    term: int
    kind: str
    data: bytes | str | None = None  # the payload, or the member a membership entry adds or removes


@dataclass
class Disk:
    """What a member keeps across a restart (pysyncobj's journal keeps the commit index too)."""

    folder: Path
    voters: frozenset[str]  # the configuration at the snapshot (or at the start)
    term: int = 0
    vote: str | None = None
    log: list[LogEntry] = field(default_factory=lambda: [LogEntry(1, 0, NOOP)])
    snapshot: Snapshot | None = None
    commit: int = 0


class MemoryGroup:
    """One member: a voter if its address is in the configuration, else a learner."""

    HEARTBEAT_TICKS = 1
    ELECTION_TICKS = 10

    def __init__(self, address: str, disk: Disk, state_machine: StateMachine, network: MemoryNetwork,
                 partition: int = 0):
        self.address, self.disk, self._sm, self._net, self.partition = address, disk, state_machine, network, partition
        self.closed = False
        self._role = Role.FOLLOWER
        self.leader: str | None = None
        self._leader_commit: int | None = None
        self.last_applied = disk.snapshot.last.index if disk.snapshot else 0
        self._voters = set(disk.voters)
        for entry in disk.log:
            self._configure(entry)
        self._votes: set[str] = set()
        self._next: dict[str, int] = {}
        self._match: dict[str, int] = {}
        self._waiting: dict[int, tuple[int, ProposalCallback]] = {}
        self._noop_index = 0
        self._elapsed = 0
        self._timeout = self._new_timeout()
        self._now = 0
        self._heard: dict[str, int] = {}  # on the leader: when each peer last answered
        network.members[address] = self
        if disk.snapshot is not None:
            self._sm.restore(disk.snapshot)
        self._apply()

    # -- RaftGroup --------------------------------------------------------

    role = property(lambda self: self._role)
    term = property(lambda self: self.disk.term)
    commit_index = property(lambda self: self.disk.commit)
    leader_commit_index = property(lambda self: self.disk.commit if self._role == Role.LEADER else self._leader_commit)
    last_log_index = property(lambda self: self.disk.log[-1].index if self.disk.log else self._snapshot_index())
    log_entries = property(lambda self: len(self.disk.log))

    def log_base_at(self, index: int) -> None:
        return None

    def log_bytes_after(self, index: int) -> int:
        return sum(len(e.data or b"") for e in self.disk.log if e.index > index)

    def term_at(self, index: int) -> int | None:
        held = self._snapshot_index() <= index <= self.last_log_index and index > 0
        return self._term_at(index) if held else None
    log_bytes = property(lambda self: sum(len(e.data or b"") for e in self.disk.log))
    log_full = property(lambda self: False)
    snapshot_bytes_received = property(lambda self: 0)  # a snapshot arrives in one message
    voters = property(lambda self: frozenset(self._voters))

    @property
    def has_quorum(self) -> bool:
        reachable = [v for v in self._voters if v in self._net.members and not self._net.members[v].closed
                     and not {v, self.address} & self._net._cut]
        return len(reachable) * 2 > len(self._voters)

    def learners_caught_up(self) -> int:
        if self._role != Role.LEADER:
            return 0
        return sum(1 for a, m in self._match.items() if a not in self._voters and m >= self.last_applied - 1)

    def propose(self, payload: bytes, callback: ProposalCallback) -> None:
        self._append_as_leader(PAYLOAD, payload, callback)

    def add_member(self, address: str, callback: ProposalCallback) -> None:
        self._change(ADD, address, callback)

    def remove_member(self, address: str, callback: ProposalCallback) -> None:
        self._change(REMOVE, address, callback)

    def committed_entries(self, after: int, limit: int) -> list[Entry]:
        if after < self._snapshot_index():
            raise LookupError(f"partition {self.partition}: entries after {after} were compacted away")
        return [Entry(e.index, e.term, e.data if e.kind == PAYLOAD else None)
                for e in self.disk.log if after < e.index <= min(self.last_applied, after + limit)]

    def compact(self, keep_from: int = 0) -> None:
        if self.last_applied <= self._snapshot_index():
            return
        last = self._entry(self.last_applied)
        work = Path(tempfile.mkdtemp(dir=self.disk.folder, prefix="checkpoint-"))
        try:
            position = self._sm.checkpoint(work / "db", Position(last.index, last.term))
            path = self.disk.folder / f"snapshot-{last.index}"
            meta = snapshot_file.Meta(self.partition, position, (b"", last.index, last.term),
                                      (b"", last.index - 1, 0), sorted(self._voters))
            snapshot_file.write(path, work / "db", meta)
        except RuntimeError:  # the state machine refused (a learner whose feed is behind)
            return
        finally:
            shutil.rmtree(work, ignore_errors=True)
        self._install_log_base(Snapshot(path, position, Position(last.index, last.term)), self._voters_at(last.index))

    def transfer_leadership(self, to: str | None = None) -> None:
        if self._role != Role.LEADER:
            return
        last = self.last_log_index
        ready = sorted(a for a in self._voters if a != self.address and self._match.get(a) == last)
        target = to if to in ready else (ready[0] if ready and to is None else None)
        if target is not None:
            self._send(target, type="timeout_now")

    def name_members(self, addresses: frozenset[str]) -> None:
        """Nothing to do: the twin hears from every member of its network, as Raft asks."""

    def close(self) -> None:
        """A crash: the connections go, and what was in flight on them with them."""
        self.closed = True
        self._net.drop(self.address)

    # -- time -------------------------------------------------------------

    def tick(self) -> None:
        self._elapsed += 1
        self._now += 1
        if self._role == Role.LEADER and not self._heard_from_quorum():
            self._step_down(self.disk.term, leader=None)  # like pysyncobj's leaderFallbackTimeout
        if self._role == Role.LEADER:
            if self._elapsed >= self.HEARTBEAT_TICKS:
                self._elapsed = 0
                for peer in self._peers():
                    self._replicate(peer)
        elif self._elapsed >= self._timeout and self.address in self._voters:
            self.campaign()

    def campaign(self) -> None:
        self._step_down(self.disk.term + 1, leader=None)
        self._role = Role.CANDIDATE
        self.disk.vote = self.address
        self._votes = {self.address}
        last = self.last_log_index
        for peer in sorted(self._voters - {self.address}):
            self._send(peer, type="vote", last_index=last, last_term=self._term_at(last))
        self._count_votes()

    # -- messages ---------------------------------------------------------

    def receive(self, src: str, m: dict) -> None:
        if m["term"] > self.disk.term:
            self._step_down(m["term"], leader=src if m["type"] in ("append", "snapshot") else None)
        if m["term"] < self.disk.term:
            if m["type"] in ("append", "snapshot", "vote"):
                self._send(src, type=m["type"] + "_reply", ok=False, match=0)
            return
        getattr(self, "_on_" + m["type"])(src, m)

    def _on_vote(self, src: str, m: dict) -> None:
        last = self.last_log_index
        up_to_date = (m["last_term"], m["last_index"]) >= (self._term_at(last), last)
        granted = up_to_date and self.disk.vote in (None, src) and self._role != Role.LEADER
        if granted:
            self.disk.vote = src
            self._elapsed = 0
        self._send(src, type="vote_reply", ok=granted, match=0)

    def _on_vote_reply(self, src: str, m: dict) -> None:
        if self._role == Role.CANDIDATE and m["ok"]:
            self._votes.add(src)
            self._count_votes()

    def _on_timeout_now(self, src: str, m: dict) -> None:
        if self.address in self._voters:
            self.campaign()

    def _on_append(self, src: str, m: dict) -> None:
        self._follow(src)
        self._leader_commit = m["commit"]
        prev = m["prev_index"]
        if prev > self.last_log_index or (prev > self._snapshot_index() and self._term_at(prev) != m["prev_term"]):
            self._send(src, type="append_reply", ok=False, match=min(prev - 1, self.last_log_index))
            return
        for entry in m["entries"]:
            if entry.index <= self._snapshot_index():
                continue
            if entry.index <= self.last_log_index:
                if self._term_at(entry.index) == entry.term:
                    continue
                assert entry.index > self.disk.commit, "a committed entry conflicts with the leader"
                self._truncate_from(entry.index)
            self.disk.log.append(entry)
            self._configure(entry)
        verified = prev + len(m["entries"])
        self.disk.commit = max(self.disk.commit, min(m["commit"], verified))
        self._send(src, type="append_reply", ok=True, match=verified)
        self._apply()

    def _on_append_reply(self, src: str, m: dict) -> None:
        if self._role != Role.LEADER:
            return
        self._heard[src] = self._now
        if m["ok"]:
            self._match[src] = max(self._match.get(src, 0), m["match"])
            self._next[src] = self._match[src] + 1
            self._advance_commit()
        else:
            self._next[src] = max(1, min(self._next.get(src, 1) - 1, m["match"] + 1))
            self._replicate(src)

    def _on_snapshot(self, src: str, m: dict) -> None:
        self._follow(src)
        snapshot: Snapshot = m["snapshot"]
        last = snapshot.last
        covered = last.index <= self._snapshot_index() or (
            last.index <= self.last_log_index and self._term_at(last.index) == last.term)
        if not covered:  # Raft's InstallSnapshot rule 6: never replace a log that holds it
            # One name for every snapshot received, the next renamed over the last, as pysyncobj does
            own = self.disk.folder / "received-snapshot"
            shutil.copyfile(snapshot.path, f"{own}.tmp")
            os.replace(f"{own}.tmp", own)
            installed = Snapshot(own, snapshot.position, last)
            self._sm.restore(installed)
            self._install_log_base(installed, m["voters"])
            self.disk.log = []
            self._voters = set(m["voters"])
            self.disk.commit = self.last_applied = last.index
        self._send(src, type="append_reply", ok=True, match=last.index)

    # -- internals --------------------------------------------------------

    def _send(self, dst: str, **message) -> None:
        self._net.send(self.address, dst, {"term": self.disk.term, **message})

    def _peers(self) -> list[str]:
        """The voters, and every running member of the network that is not one (the learners), in order:
        messages sent in a set's order would make a run depend on the interpreter's string hashing."""
        learners = {a for a, m in self._net.members.items() if not m.closed and a not in self._voters}
        return sorted((self._voters | learners) - {self.address})

    def _new_timeout(self) -> int:
        return self.ELECTION_TICKS + self._net.rng.randrange(self.ELECTION_TICKS)

    def _follow(self, leader: str) -> None:
        if self._role != Role.FOLLOWER:
            self._step_down(self.disk.term, leader)
        self.leader = leader
        self._elapsed = 0

    def _step_down(self, term: int, leader: str | None) -> None:
        if term > self.disk.term:
            self.disk.term, self.disk.vote = term, None
        self._role, self.leader = Role.FOLLOWER, leader
        self._elapsed, self._timeout = 0, self._new_timeout()

    def _heard_from_quorum(self) -> bool:
        recent = [v for v in self._voters if v != self.address and self._now - self._heard.get(v, -1) <= self.ELECTION_TICKS]
        return (len(recent) + 1) * 2 > len(self._voters)

    def _count_votes(self) -> None:
        if len(self._votes) * 2 > len(self._voters):
            self._role, self.leader = Role.LEADER, self.address
            self._heard = {v: self._now for v in self._voters}
            self._next = {p: self.last_log_index + 1 for p in self._peers()}
            self._match = {}
            self._append_as_leader(NOOP, None, None)
            self._noop_index = self.last_log_index

    def _append_as_leader(self, kind: str, data, callback: ProposalCallback | None) -> None:
        if self._role != Role.LEADER:
            if callback is not None:
                callback(None, Outcome.REJECTED)
            return
        entry = LogEntry(self.last_log_index + 1, self.disk.term, kind, data)
        self.disk.log.append(entry)
        self._configure(entry)
        if callback is not None:
            self._waiting[entry.index] = (entry.term, callback)
        for peer in self._peers():
            self._replicate(peer)
        self._advance_commit()

    def _change(self, kind: str, address: str, callback: ProposalCallback) -> None:
        """One server at a time, and only once this leader committed an entry of its own term."""
        pending = any(e.kind in (ADD, REMOVE) for e in self.disk.log if e.index > self.disk.commit)
        known = address in self._voters
        if (self._role != Role.LEADER or self.disk.commit < self._noop_index or pending
                or known == (kind == ADD) or address == self.address):
            callback(None, Outcome.REJECTED)
            return
        self._append_as_leader(kind, address, callback)

    def _configure(self, entry: LogEntry, undo: bool = False) -> None:
        if entry.kind in (ADD, REMOVE):
            if (entry.kind == ADD) != undo:
                self._voters.add(entry.data)
            else:
                self._voters.discard(entry.data)

    def _replicate(self, peer: str) -> None:
        next_index = self._next.setdefault(peer, self.last_log_index + 1)
        if next_index <= self._snapshot_index() and self.disk.snapshot is not None:
            self._send(peer, type="snapshot", snapshot=self.disk.snapshot, voters=frozenset(self._voters))
            return
        prev = next_index - 1
        entries = [e for e in self.disk.log if e.index >= next_index]
        self._send(peer, type="append", prev_index=prev, prev_term=self._term_at(prev), entries=entries,
                   commit=self.disk.commit)

    def _advance_commit(self) -> None:
        for n in range(self.last_log_index, self.disk.commit, -1):
            replicas = 1 + sum(1 for a, m in self._match.items() if a in self._voters and a != self.address and m >= n)
            if self._term_at(n) == self.disk.term and replicas * 2 > len(self._voters | {self.address}):
                self.disk.commit = n
                break
        self._apply()

    def _apply(self) -> None:
        while self.last_applied < self.disk.commit:
            entry = self._entry(self.last_applied + 1)
            result = None
            if entry.kind == PAYLOAD and entry.index > self._sm.position.index:
                result = self._sm.apply(Entry(entry.index, entry.term, entry.data))
            self.last_applied = entry.index
            # like pysyncobj, a proposal is answered when its index is applied, whoever leads by then
            term, callback = self._waiting.pop(entry.index, (None, None))
            if callback is not None:
                callback(result, Outcome.APPLIED if term == entry.term else Outcome.REJECTED)

    def _truncate_from(self, index: int) -> None:
        while self.disk.log and self.disk.log[-1].index >= index:
            self._configure(self.disk.log.pop(), undo=True)

    def _install_log_base(self, snapshot: Snapshot, voters: frozenset[str]) -> None:
        old = self.disk.snapshot
        self.disk.snapshot = snapshot
        self.disk.voters = voters
        self.disk.log = [e for e in self.disk.log if e.index > snapshot.last.index]
        if old is not None and old.path != snapshot.path:
            old.path.unlink(missing_ok=True)

    def _voters_at(self, index: int) -> frozenset[str]:
        voters = set(self._voters)
        for entry in reversed(self.disk.log):
            if entry.index > index and entry.kind in (ADD, REMOVE):
                (voters.discard if entry.kind == ADD else voters.add)(entry.data)
        return frozenset(voters)

    def _snapshot_index(self) -> int:
        return self.disk.snapshot.last.index if self.disk.snapshot else 0

    def _entry(self, index: int) -> LogEntry:
        return self.disk.log[index - (self.disk.log[0].index if self.disk.log else index)]

    def _term_at(self, index: int) -> int:
        if self.disk.snapshot and index == self.disk.snapshot.last.index:
            return self.disk.snapshot.last.term
        if index == 0 or not self.disk.log or index < self.disk.log[0].index:
            return 0
        return self._entry(index).term
