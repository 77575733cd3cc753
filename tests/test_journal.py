"""Tests for raftkv.raft.journal.RaftJournal: format, recovery, durability modes and pysyncobj use."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pysyncobj.syncobj
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.journal import MemoryJournal

from raftkv.core.errors import CorruptData, StorageFull
from raftkv.dev.local_cluster import free_port_block
from raftkv.raft.journal import LOG_NAME, META_NAME, RaftJournal

ROOT = Path(__file__).resolve().parents[1]
LOG_HEADER = b"RKVLOG\0\0" + struct.pack("<I", 1)
ENTRIES = [(b"first", 1, 1), (b"second entry", 2, 1), (b"third", 3, 2)]


def record(command: bytes, idx: int, term: int) -> bytes:
    """One log record, built from the layout documented in raftkv.raft.journal."""
    idx_term = struct.pack("<QQ", idx, term)
    crc = zlib.crc32(idx_term + command)
    return struct.pack("<III", len(command), len(command) ^ 0xFFFFFFFF, crc) + idx_term + command


def record_offsets(entries: list[tuple[bytes, int, int]]) -> list[int]:
    offsets = [len(LOG_HEADER)]
    for entry in entries:
        offsets.append(offsets[-1] + len(record(*entry)))
    return offsets


def open_with(directory: Path, entries: list[tuple[bytes, int, int]], fsync: bool = False) -> RaftJournal:
    journal = RaftJournal(directory, fsync=fsync)
    for entry in entries:
        journal.add(*entry)
    return journal


def reopen(journal: RaftJournal, directory: Path, fsync: bool = False) -> RaftJournal:
    journal._destroy()
    return RaftJournal(directory, fsync=fsync)


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.01)


# Basics


@pytest.mark.parametrize("fsync", [False, True])
def test_round_trip_across_reopen(tmp_path: Path, fsync: bool) -> None:
    journal = reopen(open_with(tmp_path / "p0", ENTRIES, fsync), tmp_path / "p0", fsync)
    assert journal[:] == ENTRIES
    assert all(type(command) is bytes for command, _, _ in journal[:])
    journal._destroy()


def test_new_directory_is_created_with_empty_defaults(tmp_path: Path) -> None:
    journal = RaftJournal(tmp_path / "a" / "b", fsync=True)
    assert (tmp_path / "a" / "b" / LOG_NAME).read_bytes() == LOG_HEADER
    assert (len(journal), journal.getCurrentTerm(), journal.getVotedForNodeId(), journal.getRaftCommitIndex()) == (
        0, 0, None, 1,
    )
    journal._destroy()


def test_file_holds_the_documented_records(tmp_path: Path) -> None:
    open_with(tmp_path, ENTRIES)._destroy()
    assert (tmp_path / LOG_NAME).read_bytes() == LOG_HEADER + b"".join(record(*entry) for entry in ENTRIES)


def test_indexing_and_slicing_behave_like_a_list(tmp_path: Path) -> None:
    journal = open_with(tmp_path, ENTRIES)
    for i in range(-len(ENTRIES), len(ENTRIES)):
        assert journal[i] == ENTRIES[i]
    for s in [slice(None), slice(1, None), slice(-2, None), slice(0, 2), slice(1, 1), slice(5, 9), slice(None, -1)]:
        assert journal[s] == ENTRIES[s]
    for bad in (3, -4):
        with pytest.raises(IndexError):
            journal[bad]
    journal._destroy()


def test_add_rejects_an_index_that_does_not_follow(tmp_path: Path) -> None:
    journal = open_with(tmp_path, ENTRIES)
    with pytest.raises(ValueError):
        journal.add(b"gap", 5, 2)
    assert reopen(journal, tmp_path)[:] == ENTRIES


# Deletions


@pytest.mark.parametrize("position", [0, 1, 2, 3, -1, -3, 10])
def test_delete_entries_from_survives_reopen(tmp_path: Path, position: int) -> None:
    journal = open_with(tmp_path, ENTRIES)
    journal.deleteEntriesFrom(position)
    expected = ENTRIES[:position]
    assert journal[:] == expected
    journal = reopen(journal, tmp_path)
    assert journal[:] == expected
    next_idx = expected[-1][1] + 1 if expected else 1
    journal.add(b"after", next_idx, 3)
    assert reopen(journal, tmp_path)[:] == [*expected, (b"after", next_idx, 3)]


@pytest.mark.parametrize("position", [0, 1, 2, 3, -1, 10])
def test_delete_entries_to_survives_reopen(tmp_path: Path, position: int) -> None:
    journal = open_with(tmp_path, ENTRIES)
    journal.deleteEntriesTo(position)
    expected = ENTRIES[position:]
    assert journal[:] == expected
    next_idx = expected[-1][1] + 1 if expected else 9
    journal.add(b"after", next_idx, 3)
    journal = reopen(journal, tmp_path)
    assert journal[:] == [*expected, (b"after", next_idx, 3)]
    journal._destroy()


def test_clear_survives_reopen(tmp_path: Path) -> None:
    journal = open_with(tmp_path, ENTRIES)
    journal.clear()
    assert len(journal) == 0
    journal = reopen(journal, tmp_path)
    assert len(journal) == 0
    journal.add(b"snapshot", 40, 5)
    assert reopen(journal, tmp_path)[:] == [(b"snapshot", 40, 5)]


def test_compaction_interrupted_before_replace_keeps_every_entry(tmp_path: Path, monkeypatch) -> None:
    journal = open_with(tmp_path, ENTRIES)

    def crash(*args: object) -> None:
        raise OSError(errno.EIO, "simulated crash")

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", crash)
        with pytest.raises(OSError):
            journal.deleteEntriesTo(2)
    assert RaftJournal(tmp_path, fsync=False)[:] == ENTRIES
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOG_NAME]


def test_compaction_fsyncs_even_without_fsync_mode(tmp_path: Path, monkeypatch) -> None:
    journal = open_with(tmp_path, ENTRIES)
    calls = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd)))
    journal.deleteEntriesTo(1)
    assert len(calls) >= 2  # the new file and its directory
    journal._destroy()


# Term, vote and commit index


def test_term_and_vote_are_stored_before_set_current_term_returns(tmp_path: Path) -> None:
    journal = RaftJournal(tmp_path, fsync=True)
    journal.setCurrentTerm(7, "10.0.0.1:4321")
    other = RaftJournal(tmp_path, fsync=True)
    assert (other.getCurrentTerm(), other.getVotedForNodeId()) == (7, "10.0.0.1:4321")
    journal.setCurrentTerm(8, None)
    other = RaftJournal(tmp_path, fsync=True)
    assert (other.getCurrentTerm(), other.getVotedForNodeId()) == (8, None)
    journal._destroy()


def test_commit_index_is_stored_lazily(tmp_path: Path) -> None:
    journal = open_with(tmp_path, ENTRIES)
    journal.setRaftCommitIndex(2)
    assert journal.getRaftCommitIndex() == 2
    assert RaftJournal(tmp_path, fsync=False).getRaftCommitIndex() == 1
    journal.onOneSecondTimer()
    assert RaftJournal(tmp_path, fsync=False).getRaftCommitIndex() == 2
    journal.setRaftCommitIndex(3)
    journal.setCurrentTerm(4, "n1")
    journal = reopen(journal, tmp_path)
    assert (journal.getRaftCommitIndex(), journal.getCurrentTerm(), journal.getVotedForNodeId()) == (3, 4, "n1")
    journal.setRaftCommitIndex(1000)
    journal = reopen(journal, tmp_path)
    assert journal.getRaftCommitIndex() == 1000
    journal._destroy()


# Recovery


@pytest.mark.parametrize("cut", [1, 5, 12, 28, len(record(*ENTRIES[2])) - 1])
def test_truncated_tail_is_repaired(tmp_path: Path, cut: int, caplog) -> None:
    open_with(tmp_path, ENTRIES)._destroy()
    log = tmp_path / LOG_NAME
    os.truncate(log, log.stat().st_size - cut)
    with caplog.at_level(logging.WARNING, logger="raftkv.raft.journal"):
        journal = RaftJournal(tmp_path, fsync=False)
    assert journal[:] == ENTRIES[:2]
    assert log.stat().st_size == record_offsets(ENTRIES)[2]
    assert "torn" in caplog.text and str(log) in caplog.text
    journal.add(*ENTRIES[2])
    assert reopen(journal, tmp_path)[:] == ENTRIES


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x9c\x07",
        b"\0" * 4096,
        record(b"never finished", 4, 2)[:-3],
        record(b"never finished", 4, 2)[:-3] + b"\0" * 100,
        struct.pack("<II", 9999, 9999 ^ 0xFFFFFFFF) + b"partial",
    ],
)
def test_garbage_tail_is_repaired(tmp_path: Path, garbage: bytes) -> None:
    open_with(tmp_path, ENTRIES)._destroy()
    log = tmp_path / LOG_NAME
    with open(log, "ab") as f:
        f.write(garbage)
    journal = RaftJournal(tmp_path, fsync=False)
    assert journal[:] == ENTRIES
    assert log.stat().st_size == record_offsets(ENTRIES)[3]
    journal._destroy()


def test_damaged_last_record_is_dropped(tmp_path: Path) -> None:
    open_with(tmp_path, ENTRIES)._destroy()
    log = tmp_path / LOG_NAME
    data = bytearray(log.read_bytes())
    data[-1] ^= 0xFF
    log.write_bytes(bytes(data))
    assert RaftJournal(tmp_path, fsync=False)[:] == ENTRIES[:2]


@pytest.mark.parametrize("field_offset", [0, 3, 4, 8, 12, 20, 28, 30])  # length, check, crc, idx, term, payload
def test_flipped_byte_in_middle_record_raises(tmp_path: Path, field_offset: int) -> None:
    open_with(tmp_path, ENTRIES)._destroy()
    log = tmp_path / LOG_NAME
    data = bytearray(log.read_bytes())
    middle = record_offsets(ENTRIES)[1]
    data[middle + field_offset] ^= 0x40
    log.write_bytes(bytes(data))
    with pytest.raises(CorruptData) as raised:
        RaftJournal(tmp_path, fsync=False)
    message = str(raised.value)
    assert str(log) in message and f"at byte {middle}" in message
    assert "\n" not in message


def test_non_consecutive_indexes_on_disk_raise(tmp_path: Path) -> None:
    (tmp_path / LOG_NAME).write_bytes(LOG_HEADER + record(b"a", 1, 1) + record(b"b", 3, 1))
    with pytest.raises(CorruptData, match="entry 3 follows entry 1"):
        RaftJournal(tmp_path, fsync=False)


@pytest.mark.parametrize(
    "content",
    [b"", b"RKV", b"PYSYNCOBJ\0\0\0 this is somebody else's file", b"RKVLOG\0\0" + struct.pack("<I", 2)],
)
def test_foreign_log_file_raises(tmp_path: Path, content: bytes) -> None:
    (tmp_path / LOG_NAME).write_bytes(content)
    with pytest.raises(CorruptData, match=str(tmp_path / LOG_NAME)):
        RaftJournal(tmp_path, fsync=False)


def test_unreadable_meta_raises(tmp_path: Path) -> None:
    journal = RaftJournal(tmp_path, fsync=False)
    journal.setCurrentTerm(3, "n2")
    journal._destroy()
    meta = tmp_path / META_NAME
    data = bytearray(meta.read_bytes())
    data[-1] ^= 0x01
    meta.write_bytes(bytes(data))
    with pytest.raises(CorruptData, match=f"{meta} is corrupt .*checksum"):
        RaftJournal(tmp_path, fsync=False)
    meta.write_bytes(b"garbage")
    with pytest.raises(CorruptData, match=str(meta)):
        RaftJournal(tmp_path, fsync=False)


def test_leftover_temp_files_are_removed(tmp_path: Path) -> None:
    open_with(tmp_path, ENTRIES)._destroy()
    for name in (LOG_NAME, META_NAME):
        (tmp_path / f"{name}.tmp").write_bytes(b"half written")
    journal = RaftJournal(tmp_path, fsync=False)
    assert journal[:] == ENTRIES
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOG_NAME]
    journal._destroy()


# Durability


def test_entries_survive_kill_9(tmp_path: Path) -> None:
    script = (
        "import os, signal, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from raftkv.raft.journal import RaftJournal\n"
        "journal = RaftJournal(sys.argv[1], fsync=False)\n"
        "for i in range(1, 101):\n"
        "    journal.add(b'command %d' % i, i, 1)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], timeout=60)
    assert done.returncode == -signal.SIGKILL
    journal = RaftJournal(tmp_path, fsync=False)
    assert journal[:] == [(b"command %d" % i, i, 1) for i in range(1, 101)]
    journal._destroy()


def test_fsync_mode_batches_one_fdatasync_per_sync(tmp_path: Path, monkeypatch) -> None:
    journal = RaftJournal(tmp_path, fsync=True)
    calls = []
    real_fdatasync = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(fd), real_fdatasync(fd)))
    assert not journal.dirty
    for entry in ENTRIES:
        journal.add(*entry)
    assert journal.dirty and calls == []
    journal.sync()
    assert not journal.dirty and len(calls) == 1
    journal.sync()
    assert len(calls) == 1
    journal.deleteEntriesFrom(2)
    assert journal.dirty
    journal.sync()
    assert not journal.dirty and len(calls) == 2
    journal._destroy()


def test_log_is_synced_before_meta_and_on_destroy(tmp_path: Path, monkeypatch) -> None:
    journal = RaftJournal(tmp_path, fsync=True)
    synced_before_meta = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (synced_before_meta.append(not journal.dirty), real_replace(a, b)))
    journal.add(*ENTRIES[0])
    journal.setRaftCommitIndex(1)
    journal.onOneSecondTimer()
    journal.add(*ENTRIES[1])
    journal.setCurrentTerm(2, "n1")
    assert synced_before_meta == [True, True]
    journal.add(*ENTRIES[2])
    calls = []
    monkeypatch.setattr(os, "fdatasync", calls.append)
    journal._destroy()
    assert len(calls) == 1


def test_without_fsync_nothing_is_ever_dirty(tmp_path: Path, monkeypatch) -> None:
    journal = RaftJournal(tmp_path, fsync=False)
    monkeypatch.setattr(os, "fdatasync", lambda fd: pytest.fail("fdatasync called without fsync mode"))
    for entry in ENTRIES:
        journal.add(*entry)
    journal.deleteEntriesFrom(2)
    assert not journal.dirty
    journal.sync()
    journal._destroy()


def test_disk_full_raises_and_leaves_the_log_readable(tmp_path: Path, monkeypatch) -> None:
    journal = open_with(tmp_path, ENTRIES[:2])
    log = tmp_path / LOG_NAME
    size = log.stat().st_size
    real_write = os.write
    writes = []

    def fill_disk(fd: int, data: bytes) -> int:
        if writes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        writes.append(fd)
        return real_write(fd, data[: len(data) // 2])

    with monkeypatch.context() as patch:
        patch.setattr(os, "write", fill_disk)
        with pytest.raises(StorageFull) as raised:
            journal.add(*ENTRIES[2])
    assert writes, "the partial write never happened"
    assert str(log) in str(raised.value) and "\n" not in str(raised.value)
    assert log.stat().st_size == size
    assert journal[:] == ENTRIES[:2]
    journal.add(*ENTRIES[2])
    assert reopen(journal, tmp_path)[:] == ENTRIES


def test_a_full_journal_says_so_until_the_disk_has_room(tmp_path: Path, monkeypatch) -> None:
    """A leader asks this before proposing: it refuses writes, and steps aside, while it is full."""
    journal = open_with(tmp_path, ENTRIES[:2])
    free = [0]
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=free[0]))
    assert not journal.full
    with monkeypatch.context() as patch:
        patch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
        with pytest.raises(StorageFull):
            journal.add(*ENTRIES[2])
    assert journal.full
    free[0] = 1 << 30
    assert not journal.full
    journal.add(*ENTRIES[2])
    assert not journal.full


# Model-based test


class JournalMachine(RuleBasedStateMachine):
    """Compares RaftJournal with a list under random edits and reopens."""

    def __init__(self, make_directory: Callable[[], Path]):
        super().__init__()
        self.directory = make_directory()
        self.model: list[tuple[bytes, int, int]] = []
        self.term_vote: tuple[int, str | None] = (0, None)
        self.commit = 1

    @initialize(fsync=st.booleans())
    def open(self, fsync: bool) -> None:
        self.fsync = fsync
        self.journal = RaftJournal(self.directory, fsync=fsync)

    @rule(command=st.binary(max_size=40), term_step=st.integers(0, 2), first_idx=st.integers(1, 2**40))
    def add(self, command: bytes, term_step: int, first_idx: int) -> None:
        idx, term = (self.model[-1][1] + 1, self.model[-1][2] + term_step) if self.model else (first_idx, term_step)
        self.journal.add(command, idx, term)
        self.model.append((command, idx, term))

    @rule(position=st.integers(-8, 40))
    def delete_entries_from(self, position: int) -> None:
        self.journal.deleteEntriesFrom(position)
        del self.model[position:]

    @rule(position=st.integers(-8, 40))
    def delete_entries_to(self, position: int) -> None:
        self.journal.deleteEntriesTo(position)
        self.model = self.model[position:]

    @rule()
    def clear(self) -> None:
        self.journal.clear()
        self.model = []

    @rule(term=st.integers(0, 2**63), voted=st.none() | st.text(max_size=12))
    def set_current_term(self, term: int, voted: str | None) -> None:
        self.journal.setCurrentTerm(term, voted)
        self.term_vote = (term, voted)

    @rule(commit=st.integers(0, 2**63))
    def set_commit_index(self, commit: int) -> None:
        self.journal.setRaftCommitIndex(commit)
        self.commit = commit

    @rule()
    def sync(self) -> None:
        self.journal.sync()
        assert not self.journal.dirty

    @rule()
    def reopen(self) -> None:
        self.journal._destroy()
        self.journal = RaftJournal(self.directory, fsync=self.fsync)

    @invariant()
    def matches_model(self) -> None:
        assert len(self.journal) == len(self.model)
        assert self.journal[:] == self.model
        if self.model:
            assert self.journal[-1] == self.model[-1]
            assert self.journal[0] == self.model[0]
        assert (self.journal.getCurrentTerm(), self.journal.getVotedForNodeId()) == self.term_vote
        assert self.journal.getRaftCommitIndex() == self.commit

    def teardown(self) -> None:
        self.journal._destroy()


def test_journal_behaves_like_a_list(tmp_path_factory: pytest.TempPathFactory) -> None:
    run_state_machine_as_test(
        lambda: JournalMachine(lambda: tmp_path_factory.mktemp("journal")),
        settings=settings(max_examples=60, stateful_step_count=30, deadline=None),
    )


# pysyncobj integration


def free_port() -> int:
    return free_port_block(1)


class Counter(SyncObj):
    def __init__(self, journal_dir: Path):
        self.counter = 0  # set before the tick thread starts replaying the journal
        self.address = f"127.0.0.1:{free_port()}"
        super().__init__(self.address, [], SyncObjConf(journalFile=str(journal_dir)))

    @replicated
    def add(self, amount: int) -> int:
        self.counter += amount
        return self.counter


def test_syncobj_replays_its_raft_journal(tmp_path: Path, monkeypatch) -> None:
    created: list[RaftJournal] = []

    def create_journal(path: str | None = None):
        if path is None:
            return MemoryJournal()
        created.append(RaftJournal(path, fsync=True))
        return created[-1]

    monkeypatch.setattr(pysyncobj.syncobj, "createJournal", create_journal)
    journal_dir = tmp_path / "partition-0"

    node = Counter(journal_dir)
    try:
        assert [node.add(n, sync=True, timeout=10) for n in range(1, 6)] == [1, 3, 6, 10, 15]
    finally:
        node.destroy_synchronous()
    assert len(created) == 1

    journal = RaftJournal(journal_dir, fsync=False)
    entries = journal[:]
    assert [idx for _, idx, _ in entries] == list(range(1, len(entries) + 1))
    regular = [entry for entry in entries if entry[0][:1] == b"\x00"]
    assert len(regular) == 5
    assert journal.getRaftCommitIndex() >= regular[-1][1]
    assert journal.getCurrentTerm() >= 1 and journal.getVotedForNodeId() == node.address
    journal._destroy()

    node = Counter(journal_dir)
    try:
        wait_until(lambda: node.counter == 15)
        assert node.add(100, sync=True, timeout=10) == 115
    finally:
        node.destroy_synchronous()
    assert len(created) == 2
    assert RaftJournal(journal_dir, fsync=False)[: len(entries)] == entries
