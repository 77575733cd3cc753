"""In-memory disks for a simulated member: its Raft journal and its state machine's database, each
knowing what is synced, what only reached the page cache (it survives a kill -9, not a power cut),
and what a power cut keeps of the latter (a prefix: the kernel writes pages back in any order, and a
hole is read back as a torn tail).

`SimJournal` behaves as `RaftJournal` does (raftkv/raft/journal.py) wherever durability is concerned:
- every `add` and truncation is written at once (page cache) and synced by `sync()`, which in fsync
  mode the transport calls before any message leaves, and in the default mode the node's syncer calls
  about once a second (`sync_in_background`);
- a truncation of entries a sync covered syncs at once, with the meta file;
- term and vote are synced before `setCurrentTerm` returns (in both modes), together with the log;
- the commit index is stored in the meta file, written after each sync (the directory synced only in
  fsync mode: in the default mode a power cut may keep the meta file before it);
- at a restart what was read counts as synced (`dirty` is false) although a kill -9 left it in the
  page cache only: RaftJournal reads its file back without syncing it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

from pysyncobj.journal import Journal

from raftkv.raft.group import Entry, Snapshot
from raftkv.storage.engine import Position

LogEntry = tuple[bytes, int, int]  # (command, index, term), as pysyncobj keeps them


@dataclass
class Meta:
    term: int = 0
    commit: int = 1  # RaftJournal's default without a meta file
    vote: str | None = None


@dataclass
class JournalDisk:
    """One member's journal as the disk holds it: `durable`, then `pending` operations in the page cache."""

    durable: list[LogEntry] = field(default_factory=list)
    pending: list[tuple[str, object]] = field(default_factory=list)  # ("add", entry) | ("cut", list position)
    meta_written: Meta = field(default_factory=Meta)
    meta_durable: Meta = field(default_factory=Meta)

    def sync(self) -> None:
        for op, arg in self.pending:
            if op == "add":
                self.durable.append(arg)
            else:
                del self.durable[arg:]
        self.pending.clear()

    def power_cut(self, rng: random.Random) -> int:
        """Keep a random prefix of what was not synced; the meta file as last written or as last synced.
        Returns how many operations were lost."""
        kept = rng.randint(0, len(self.pending))
        lost = len(self.pending) - kept
        del self.pending[kept:]
        self.sync()
        if rng.random() < 0.5:
            self.meta_written = self.meta_durable
        self.meta_durable = self.meta_written
        return lost

    def entries(self) -> list[LogEntry]:
        """What a process opening the journal reads: the durable part and the page cache's."""
        entries = list(self.durable)
        for op, arg in self.pending:
            if op == "add":
                entries.append(arg)
            else:
                del entries[arg:]
        return entries


class SimJournal(Journal):
    """`RaftJournal`'s interface over a `JournalDisk`. `on_append(previous_term, entry)` sees every add."""

    def __init__(self, disk: JournalDisk, fsync: bool, on_append: Callable[[int, LogEntry], None]):
        self._disk = disk
        self._fsync = fsync
        self._on_append = on_append
        self._entries = disk.entries()
        meta = disk.meta_written
        self._term, self._commit, self._voted = meta.term, meta.commit, meta.vote
        self._dirty = False
        self._synced_len = len(self._entries)  # what it believes synced: what it read, at first
        self._meta_saved = True
        self._synced_elsewhere = False
        self.syncs = 0

    # -- entries ------------------------------------------------------------

    def add(self, command: bytes, idx: int, term: int) -> None:
        entries = self._entries
        if entries and idx != entries[-1][1] + 1:
            raise ValueError(f"entry {idx} does not follow {entries[-1][1]}")
        entry = (command, idx, term)
        self._on_append(entries[-1][2] if entries else -1, entry)
        entries.append(entry)
        self._disk.pending.append(("add", entry))
        self._dirty = True

    def __getitem__(self, item):
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        start = slice(entryFrom, None).indices(len(self._entries))[0]
        if start == len(self._entries):
            return
        del self._entries[start:]
        self._disk.pending.append(("cut", start))
        self._dirty = True
        if start < self._synced_len:  # it cuts entries it believes synced: synced at once, with the meta file
            self._save_meta(fsync=True)

    def deleteEntriesTo(self, entryTo: int) -> None:
        start = slice(entryTo, None).indices(len(self._entries))[0]
        if start:
            self._install(self._entries[start:])

    def clear(self) -> None:
        self._install([])

    def _install(self, entries: list[LogEntry]) -> None:
        """A whole new file, synced, as RaftJournal's compaction writes it."""
        self._entries = list(entries)
        self._disk.durable, self._disk.pending = list(entries), []
        self._dirty = False
        self._synced_len = len(entries)
        self._save_meta(fsync=True)

    # -- durability ---------------------------------------------------------

    @property
    def size_bytes(self) -> int:
        return sum(len(entry[0]) + 28 for entry in self._entries)

    def bytes_from(self, position: int) -> int:
        return sum(len(entry[0]) + 28 for entry in self._entries[position:])

    @property
    def full(self) -> bool:
        return False

    @property
    def dirty(self) -> bool:
        return self._fsync and self._dirty

    def sync(self) -> None:
        if self._dirty:
            self._disk.sync()  # an fdatasync covers the whole file, what an earlier process wrote too
            self.syncs += 1
            self._synced_len = len(self._entries)
            self._dirty = False
            self._meta_saved = False

    def flush(self) -> None:
        self._sync_and_save()

    def onOneSecondTimer(self) -> None:
        if not self._synced_elsewhere:
            self._sync_and_save()

    def sync_elsewhere(self) -> None:
        self._synced_elsewhere = True

    def sync_in_background(self) -> bool:
        self._sync_and_save()
        return True

    def _sync_and_save(self) -> None:
        self.sync()
        if not self._meta_saved:
            self._save_meta()

    def _destroy(self) -> None:
        self.flush()

    # -- term, vote, commit index -------------------------------------------

    def setCurrentTerm(self, term: int, votedForNodeId) -> None:
        self._term, self._voted = term, votedForNodeId
        self._save_meta(fsync=True)

    def getCurrentTerm(self) -> int:
        return self._term

    def getVotedForNodeId(self):
        return self._voted

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        self._commit = raftCommitIndex
        self._meta_saved = False

    def getRaftCommitIndex(self) -> int:
        return self._commit

    def _save_meta(self, fsync: bool | None = None) -> None:
        self.sync()
        meta = Meta(self._term, self._commit, self._voted)
        self._disk.meta_written = meta
        if self._fsync if fsync is None else fsync:
            self._disk.meta_durable = meta
        self._meta_saved = True


@dataclass
class StateDisk:
    """A state machine's database: the entries it applied, `durable` of them past a power cut."""

    applied: list[tuple[int, int, bytes, int]] = field(default_factory=list)  # (index, term, payload, history)
    durable: int = 0

    def power_cut(self, rng: random.Random) -> int:
        kept = rng.randint(self.durable, len(self.applied))
        lost = len(self.applied) - kept
        del self.applied[kept:]
        self.durable = kept
        return lost


def history(previous: int, index: int, term: int, payload: bytes) -> int:
    """A digest of the applied entries up to this one: equal digests, equal histories."""
    return hash((previous, index, term, payload))


class SimStateMachine:
    """The `StateMachine` a member drives: it keeps the entries it applied, as a database that
    stores each write with its position would. `on_apply(index, term, payload, history)` sees each."""

    def __init__(self, disk: StateDisk, on_apply: Callable[[int, int, bytes, int], None],
                 on_roll_back: Callable[[], None]):
        self.disk = disk
        self._on_apply = on_apply
        self._on_roll_back = on_roll_back

    @property
    def position(self) -> Position:
        applied = self.disk.applied
        return Position(applied[-1][0], applied[-1][1]) if applied else Position(0, 0)

    @property
    def history(self) -> int:
        applied = self.disk.applied
        return applied[-1][3] if applied else 0

    def apply(self, entry: Entry):
        digest = history(self.history, entry.index, entry.term, entry.payload)
        self.disk.applied.append((entry.index, entry.term, entry.payload, digest))
        self._on_apply(entry.index, entry.term, entry.payload, digest)
        return entry.index

    def roll_back(self, snapshot: Snapshot | None) -> None:
        if snapshot is not None:
            raise AssertionError("the simulation takes no snapshots")
        self.disk.applied.clear()
        self.disk.durable = 0
        self._on_roll_back()

    def flush(self) -> None:
        self.disk.durable = len(self.disk.applied)

    def checkpoint(self, dest, last: Position) -> Position:
        raise RuntimeError("the simulation takes no snapshots")

    def restore(self, snapshot: Snapshot) -> None:
        raise AssertionError("the simulation takes no snapshots")


class SimLogSync:
    """fsync mode with the engine: the node log's sync off the loop (`raftkv.raft.log_turn.LogTurn`), for a
    node whose members keep journals of their own. Its engine's leaders send before their journals are
    synced; every journal of the node is synced a little later (one fdatasync of the node log, on the I/O
    thread), and only then does the engine hear that what it marked is durable."""

    def __init__(self, scheduler, loop, rng: random.Random, journals: Callable[[], list[SimJournal]]):
        self._scheduler = scheduler
        self._loop = loop  # the node's engine loop: a crash kills the sync under way with it
        self._rng = rng
        self._journals = journals
        self.engine = None
        self._made = 0  # write points handed out
        self._synced = 0
        self._in_flight = False

    def mark(self) -> int:
        self._made += 1
        if not self._in_flight:
            self._start()
        return self._made

    def _start(self) -> None:
        self._in_flight = True
        rng = self._rng  # mostly a fast disk; now and then a slow one, slower than the followers' answers
        took = rng.uniform(0.0002, 0.004) if rng.random() < 0.8 else rng.uniform(0.01, 0.08)
        self._scheduler.at(self._scheduler.now + took, self._done, self._made, loop=self._loop)

    @property
    def synced(self) -> int:
        return self._synced

    def sync_now(self) -> None:
        self._sync_journals()
        self._synced = self._made

    def _sync_journals(self) -> None:
        for journal in self._journals():
            journal.sync()

    def _done(self, covers: int) -> None:
        self._in_flight = False
        self._sync_journals()
        self._synced = max(self._synced, covers)
        self.engine.on_synced()
        if self._made > self._synced:
            self._start()
