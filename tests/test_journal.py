"""Tests for raftkv.raft.journal.RaftJournal: format, recovery, durability modes and pysyncobj use."""

from __future__ import annotations

import errno
import os
import struct
import threading
import time
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pysyncobj.syncobj
import pytest

from raftkv import failpoints
from raftkv.core.errors import DiskFailed
from raftkv.raft import journal as journal_module
from raftkv.raft.journal import LOG_NAME, RaftJournal, _read_meta
from raftkv.raft.journal_syncer import JournalSyncer

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


def assert_behaves_like_a_list(journal, entries: list[tuple[bytes, int, int]]) -> None:
    """Indexing and slicing as a list's, for any journal pysyncobj could use."""
    for i in range(-len(entries), len(entries)):
        assert journal[i] == entries[i]
    for s in [slice(None), slice(1, None), slice(-2, None), slice(0, 2), slice(1, 1), slice(5, 9), slice(None, -1)]:
        assert journal[s] == entries[s]
    for bad in (len(entries), -len(entries) - 1):
        with pytest.raises(IndexError):
            journal[bad]


@contextmanager
def next_fsync_fails() -> Iterator[None]:
    """The journal's next fsync fails with EIO (its fail point), and only that one."""
    failpoints.arm("journal-fsync-before", "1*error")
    try:
        yield
    finally:
        failpoints.disarm_all()


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
    assert_behaves_like_a_list(journal, ENTRIES)
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


def test_after_a_failed_fsync_every_later_sync_fails_too(tmp_path: Path) -> None:
    """fsyncgate: the kernel may drop the pages a failed fsync could not write and report the next
    fsync as a success, so the journal must never again claim its entries are durable."""
    journal = RaftJournal(tmp_path, fsync=True)
    journal.add(b"a", 1, 1)
    with next_fsync_fails(), pytest.raises(DiskFailed, match=r"fsync of .*raft.log failed .*stops"):
        journal.sync()
    journal.add(b"b", 2, 1)
    for _ in range(2):
        with pytest.raises(DiskFailed):
            journal.sync()
    assert journal.dirty


def test_a_journal_synced_elsewhere_is_synced_by_the_syncer_and_its_tick_only_reports_failures(tmp_path: Path) -> None:
    """Default mode at scale: the once-a-second sync runs on the process's syncer thread (journal_syncer),
    never on the event loop, and a failure there reaches the replica's tick as it would have there."""
    journal = RaftJournal(tmp_path, fsync=False)
    journal.sync_elsewhere()
    journal.add(b"a", 1, 1)
    journal.setRaftCommitIndex(1)
    journal.onOneSecondTimer()
    assert journal._dirty and not journal._meta_saved, "the tick synced a journal synced elsewhere"
    assert journal.sync_in_background()
    assert not journal._dirty and journal._meta_saved
    assert _read_meta(tmp_path / "meta")[1:3] == (1, journal.size_bytes)  # commit index, synced bytes

    journal.add(b"b", 2, 1)
    with next_fsync_fails():
        assert journal.sync_in_background()  # the syncer's thread carries on
    with pytest.raises(DiskFailed, match=r"fsync of .*raft.log failed"):
        journal.onOneSecondTimer()
    journal._destroy()
    assert not journal.sync_in_background(), "a closed journal stays with the syncer"


def test_the_syncer_thread_keeps_up_with_a_journal_written_compacted_and_truncated_meanwhile(tmp_path: Path) -> None:
    journal = RaftJournal(tmp_path, fsync=False)
    syncer = JournalSyncer(period=0.001)
    syncer.add(journal)
    expected: list[tuple[bytes, int, int]] = []
    for idx in range(1, 8001):
        journal.add(b"entry %d" % idx, idx, 1)
        expected.append((b"entry %d" % idx, idx, 1))
        if idx % 500 == 0:
            journal.deleteEntriesTo(len(journal) - 10)  # a compaction: a new file under the syncer
            expected = expected[-10:]
        elif idx % 97 == 0:
            journal.deleteEntriesFrom(len(journal) - 3)  # a truncation
            del expected[-3:]
            idx_next = expected[-1][1] + 1
            for i in range(idx_next, idx + 1):
                journal.add(b"entry %d" % i, i, 2)
                expected.append((b"entry %d" % i, i, 2))
    wait_until(lambda: not journal._dirty and journal._meta_saved)
    assert _read_meta(tmp_path / "meta")[2] == journal.size_bytes
    assert list(reopen(journal, tmp_path)) == expected


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


@contextmanager
def sync_held(monkeypatch, sync: Callable[[], object]) -> Iterator[None]:
    """`sync` runs on a thread whose fdatasync waits until the block ends (the writes in it would hang if they
    waited for that fsync); then it goes on, and fdatasync is the real one again."""
    started, release = threading.Event(), threading.Event()
    real = os.fdatasync

    def held(fd: int) -> None:
        started.set()
        assert release.wait(10)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", held)
    syncer = threading.Thread(target=sync)
    syncer.start()
    try:
        assert started.wait(10)
        yield
    finally:
        release.set()
        syncer.join(10)
        monkeypatch.setattr(os, "fdatasync", real)


def test_appends_go_on_while_the_background_fdatasync_runs_and_it_counts_for_what_was_before(tmp_path: Path,
                                                                                            monkeypatch) -> None:
    """The syncer's fdatasync runs outside the journal's lock: an append from the loop does not wait for it,
    and stays for the next sync; a truncation meanwhile makes that sync count for nothing."""
    journal = RaftJournal(tmp_path, fsync=False)
    journal.sync_elsewhere()
    journal.add(b"a", 1, 1)
    before = journal.size_bytes
    with sync_held(monkeypatch, journal.sync_in_background):
        journal.add(b"b", 2, 1)
    assert journal._dirty and journal._synced == before < journal.size_bytes
    assert _read_meta(tmp_path / "meta")[2] == before  # how far the log is durable, saved
    with sync_held(monkeypatch, journal.sync_in_background):
        journal.deleteEntriesFrom(1)
        journal.add(b"c", 2, 2)
    assert journal._dirty and journal._synced == before  # the truncation came after the sync began
    assert journal.sync_in_background()
    assert not journal._dirty and journal._synced == journal.size_bytes
    assert list(reopen(journal, tmp_path)) == [(b"a", 1, 1), (b"c", 2, 2)]


def test_the_background_meta_write_leaves_the_journal_free_and_never_replaces_a_newer_state(tmp_path: Path,
                                                                                           monkeypatch) -> None:
    journal = RaftJournal(tmp_path, fsync=False)
    journal.sync_elsewhere()
    journal.add(b"a", 1, 1)
    journal.setRaftCommitIndex(1)
    started, release = threading.Event(), threading.Event()
    real = journal_module.write_new_file

    def held(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            started.set()
            assert release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(journal_module, "write_new_file", held)
    syncer = threading.Thread(target=journal.sync_in_background)
    syncer.start()
    try:
        assert started.wait(10)
        journal.add(b"b", 2, 1)  # would hang here if the meta write held the journal's lock
        journal.setRaftCommitIndex(2)
    finally:
        release.set()
        syncer.join(10)
    assert _read_meta(tmp_path / "meta")[1] == 1 and not journal._meta_saved  # 2 waits for the next sync
    stale = journal._meta_state()  # as the syncer's thread takes it, then the loop stores a new vote
    journal.setCurrentTerm(5, "n2")
    journal._store_meta(stale)
    assert _read_meta(tmp_path / "meta")[0] == 5
