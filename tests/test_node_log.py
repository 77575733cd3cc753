"""Tests for raftkv.raft.node_log: its format, a GroupLog held to RaftJournal's behaviour, many groups
in one log, one write per batch and one fdatasync per sync, and the timer. Segments, purge and the
syncer thread: test_node_log_segments.py; crashes: test_node_log_recovery.py; a model: test_node_log_model.py."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import pytest

from raftkv.core import metrics
from raftkv.raft.node_log import GroupLog, NodeLog
from tests.test_journal import assert_behaves_like_a_list
from tests.test_journal_model import Counter, journals_for_syncobj

ROOT = Path(__file__).resolve().parents[1]
SEGMENT_HEADER = b"RKVWAL\0\0" + struct.pack("<I", 1)
ENTRIES = [(b"first", 1, 1), (b"second entry", 2, 1), (b"third", 3, 2)]
GROUP = 7


# The format, built from the layout documented in raftkv.raft.node_log_format


def record(kind: int, group: int, payload: bytes) -> bytes:
    fixed = struct.pack("<BI", kind, group)
    crc = zlib.crc32(fixed + payload)
    return struct.pack("<III", len(payload), len(payload) ^ 0xFFFFFFFF, crc) + fixed + payload


def entries(group: int, items: list[tuple[bytes, int, int]], kind: int = 1) -> bytes:
    payload = struct.pack("<Q", items[0][1] if items else 0)
    for command, _, term in items:
        payload += struct.pack("<QI", term, len(command)) + command
    return record(kind, group, payload)


def state(group: int, term: int = 0, commit: int = 1, voted: str | None = None) -> bytes:
    vote = b"" if voted is None else voted.encode()
    return record(5, group, struct.pack("<QQi", term, commit, -1 if voted is None else len(vote)) + vote)


def synced(seq: int, offset: int) -> bytes:
    return record(8, 0xFFFFFFFF, struct.pack("<QQ", seq, offset))


# Helpers


class Clock:
    """The node log's clock: time moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def open_log(folder: Path, fsync: bool = False, **options) -> NodeLog:
    return NodeLog(folder, fsync=fsync, **options)


def open_with(folder: Path, items: list[tuple[bytes, int, int]], fsync: bool = False, **options) -> tuple[NodeLog, GroupLog]:
    log = open_log(folder, fsync, **options)
    group = log.group(GROUP)
    for entry in items:
        group.add(*entry)
    return log, group


def reopen(log: NodeLog, **options) -> NodeLog:
    log.close()
    return NodeLog(log.folder, fsync=log._fsync, **options)


def kill(log: NodeLog) -> None:
    """What kill -9 leaves: the files as written, nothing flushed or synced."""
    log._files.close()
    log._closed = True
    log._pending.clear()  # the process's memory is gone with it


def segment(log: NodeLog, seq: int = 1) -> bytes:
    return log.segment_path(seq).read_bytes()


class Counting:
    """Counts calls of an os function a test patches, passing them on."""

    def __init__(self, monkeypatch, name: str):
        self.calls: list[tuple] = []
        real = getattr(os, name)

        def counted(*args):
            self.calls.append(args)
            return real(*args)

        monkeypatch.setattr(os, name, counted)


# A GroupLog does what a RaftJournal does


@pytest.mark.parametrize("fsync", [False, True])
def test_round_trip_across_reopen(tmp_path: Path, fsync: bool) -> None:
    log = reopen(open_with(tmp_path, ENTRIES, fsync)[0])
    assert log.group(GROUP)[:] == ENTRIES
    assert all(type(command) is bytes for command, _, _ in log.group(GROUP)[:])
    log.close()


def test_a_new_log_is_one_segment_of_the_documented_records_and_empty_defaults(tmp_path: Path) -> None:
    log = open_log(tmp_path / "a" / "b")
    group = log.group(GROUP)
    assert (len(group), group.getCurrentTerm(), group.getVotedForNodeId(), group.getRaftCommitIndex()) == (0, 0, None, 1)
    for entry in ENTRIES:
        group.add(*entry)
    log.close()
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["0000000000000001.log", "meta"]
    assert segment(log) == SEGMENT_HEADER + state(GROUP) + b"".join(entries(GROUP, [entry]) for entry in ENTRIES)


def test_indexing_and_slicing_behave_like_a_list(tmp_path: Path) -> None:
    log, group = open_with(tmp_path, ENTRIES)
    assert_behaves_like_a_list(group, ENTRIES)
    assert list(group) == ENTRIES
    log.close()


def test_add_rejects_an_index_that_does_not_follow(tmp_path: Path) -> None:
    log, group = open_with(tmp_path, ENTRIES)
    with pytest.raises(ValueError, match="entry 5 does not follow 3"):
        group.add(b"gap", 5, 2)
    with pytest.raises(ValueError), log.batch():
        group.add(b"gap", 3, 2)
    assert reopen(log).group(GROUP)[:] == ENTRIES


@pytest.mark.parametrize("position", [0, 1, 2, 3, -1, -3, 10])
def test_delete_entries_from_survives_reopen(tmp_path: Path, position: int) -> None:
    log, group = open_with(tmp_path, ENTRIES)
    group.deleteEntriesFrom(position)
    expected = ENTRIES[:position]
    assert group[:] == expected
    log = reopen(log)
    assert log.group(GROUP)[:] == expected
    next_idx = expected[-1][1] + 1 if expected else 1
    log.group(GROUP).add(b"after", next_idx, 3)
    assert reopen(log).group(GROUP)[:] == [*expected, (b"after", next_idx, 3)]


@pytest.mark.parametrize("position", [0, 1, 2, 3, -1, 10])
def test_delete_entries_to_survives_reopen(tmp_path: Path, position: int) -> None:
    log, group = open_with(tmp_path, ENTRIES)
    group.deleteEntriesTo(position)
    expected = ENTRIES[position:]
    assert group[:] == expected
    next_idx = expected[-1][1] + 1 if expected else 9
    group.add(b"after", next_idx, 3)
    log = reopen(log)
    assert log.group(GROUP)[:] == [*expected, (b"after", next_idx, 3)]
    log.close()


def test_clear_survives_reopen(tmp_path: Path) -> None:
    log, group = open_with(tmp_path, ENTRIES)
    group.clear()
    assert len(group) == 0
    log = reopen(log)
    assert len(log.group(GROUP)) == 0
    log.group(GROUP).add(b"snapshot", 40, 5)
    assert reopen(log).group(GROUP)[:] == [(b"snapshot", 40, 5)]


def test_sizes_count_each_live_entry(tmp_path: Path) -> None:
    log, group = open_with(tmp_path, ENTRIES)
    sizes = [12 + len(command) for command, _, _ in ENTRIES]
    assert group.size_bytes == sum(sizes)
    assert [group.bytes_from(p) for p in (0, 1, 2, 3, -1)] == [sum(sizes), sum(sizes[1:]), sizes[2], 0, 0]
    group.deleteEntriesTo(1)
    assert group.size_bytes == sum(sizes[1:]) == group.bytes_from(0)
    assert reopen(log).group(GROUP).size_bytes == sum(sizes[1:])


@pytest.mark.parametrize("fsync", [False, True])
def test_term_and_vote_are_synced_before_set_current_term_returns(tmp_path: Path, fsync: bool, monkeypatch) -> None:
    log, group = open_with(tmp_path, ENTRIES[:1], fsync)
    synced_sizes = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced_sizes.append(os.fstat(fd).st_size), real(fd)))
    group.setCurrentTerm(7, "10.0.0.1:4321")
    assert synced_sizes == [len(segment(log))]
    assert segment(log).endswith(state(GROUP, 7, 1, "10.0.0.1:4321"))
    group.setCurrentTerm(8, None)
    kill(log)
    group = open_log(tmp_path, fsync).group(GROUP)
    assert (group.getCurrentTerm(), group.getVotedForNodeId()) == (8, None)


def test_commit_index_is_stored_lazily(tmp_path: Path) -> None:
    clock = Clock()
    log, group = open_with(tmp_path, ENTRIES, clock=clock)
    group.setRaftCommitIndex(2)
    assert group.getRaftCommitIndex() == 2
    group.onOneSecondTimer()
    group.setRaftCommitIndex(3)
    group.onOneSecondTimer()  # within the period: nothing written
    kill(log)
    log = open_log(tmp_path, clock=clock)
    assert log.group(GROUP).getRaftCommitIndex() == 2
    log.group(GROUP).setRaftCommitIndex(4)
    log.group(GROUP).setCurrentTerm(4, "n1")  # its state record carries the commit index too
    kill(log)
    log = open_log(tmp_path, clock=clock)
    group = log.group(GROUP)
    assert (group.getRaftCommitIndex(), group.getCurrentTerm(), group.getVotedForNodeId()) == (4, 4, "n1")
    group.setRaftCommitIndex(1000)
    assert reopen(log).group(GROUP).getRaftCommitIndex() == 1000


def test_pysyncobj_runs_on_a_group_log_and_replays_it(tmp_path: Path, monkeypatch) -> None:
    groups = journals_for_syncobj(monkeypatch, lambda path: NodeLog(path, fsync=True).group(3))
    node = Counter(tmp_path)
    try:
        assert [node.add(n, sync=True, timeout=10) for n in range(1, 6)] == [1, 3, 6, 10, 15]
    finally:
        node.destroy_synchronous()
        groups[-1]._node.close()
    node = Counter(tmp_path)
    try:
        assert node.add(100, sync=True, timeout=10) == 115  # after the five before, replayed from the log
    finally:
        node.destroy_synchronous()
        groups[-1]._node.close()
    group = NodeLog(tmp_path, fsync=False).group(3)
    assert group.getVotedForNodeId() == node.address and group.getCurrentTerm() >= 1


# Many groups in one log


def test_groups_interleaved_are_each_read_back_as_they_were(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    expected: dict[int, list] = {g: [] for g in range(5)}
    for i in range(1, 41):
        g = i * 7 % 5
        entry = (b"g%d-%d" % (g, i), len(expected[g]) + 1, 1 + i // 10)
        log.group(g).add(*entry)
        expected[g].append(entry)
    log.group(1).deleteEntriesFrom(2)
    del expected[1][2:]
    log.group(2).deleteEntriesTo(3)
    del expected[2][:3]
    log.group(3).clear()
    expected[3] = []
    log.group(4).setCurrentTerm(9, "n4")
    log = reopen(log)
    assert log.groups() == [0, 1, 2, 3, 4]
    assert {g: log.group(g)[:] for g in range(5)} == expected
    assert log.group(4).getCurrentTerm() == 9 and log.group(0).getCurrentTerm() == 0
    log.close()


def test_a_removed_group_stays_removed_and_comes_back_empty_if_created_again(tmp_path: Path, monkeypatch) -> None:
    log, group = open_with(tmp_path, ENTRIES)
    log.group(8).add(b"other", 1, 1)
    calls = Counting(monkeypatch, "fdatasync").calls
    log.remove(GROUP)
    assert len(calls) == 1 and group.closed
    kill(log)  # the remove record was synced
    log = open_log(tmp_path)
    assert log.groups() == [8]
    group = log.group(GROUP)
    assert (len(group), group.getCurrentTerm()) == (0, 0)
    group.add(b"anew", 20, 4)
    assert reopen(log).group(GROUP)[:] == [(b"anew", 20, 4)]


def test_group_ids_are_u32_with_one_reserved(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for bad in (-1, 0xFFFFFFFF, 1 << 32):
        with pytest.raises(ValueError):
            log.group(bad)
    assert log.group(0xFFFFFFFE) is log.group(0xFFFFFFFE)
    log.close()


# One write per batch, one fdatasync per sync


def test_a_batch_over_many_groups_is_one_write_with_one_entries_record_per_group(tmp_path: Path, monkeypatch) -> None:
    log = open_log(tmp_path)
    groups = [log.group(g) for g in range(8)]
    before = len(segment(log))
    writes = Counting(monkeypatch, "write").calls
    counted = metrics.JOURNAL_WRITES._value.get()
    with log.batch():
        for round_ in range(1, 4):
            for g, group in enumerate(groups):
                group.add(b"%d/%d" % (g, round_), round_, 1)
            groups[0].setRaftCommitIndex(round_)
        with log.batch():  # nested: still the outer batch's write
            groups[5].deleteEntriesFrom(2)
        assert writes == [] and len(segment(log)) == before  # nothing written yet
    assert len(writes) == 1 and metrics.JOURNAL_WRITES._value.get() == counted + 1
    expected = [[(b"%d/%d" % (g, r), r, 1) for r in range(1, 4)] for g in range(8)]
    assert segment(log)[before:before + len(entries(0, expected[0]))] == entries(0, expected[0])
    assert segment(log).count(struct.pack("<BI", 1, 3)) == 1  # group 3's three entries: one record
    expected[5] = expected[5][:2]
    log = reopen(log)
    assert [log.group(g)[:] for g in range(8)] == expected


def test_without_a_batch_each_call_is_written_when_it_returns(tmp_path: Path, monkeypatch) -> None:
    log, group = open_with(tmp_path, ENTRIES[:1])
    writes = Counting(monkeypatch, "write").calls
    group.add(*ENTRIES[1])
    group.add(*ENTRIES[2])
    assert len(writes) == 2
    kill(log)
    assert open_log(tmp_path).group(GROUP)[:] == ENTRIES


def test_batched_records_are_only_written_by_the_batch_end_or_write_pending(tmp_path: Path) -> None:
    log, group = open_with(tmp_path, ENTRIES[:1])
    with log.batch():
        group.add(*ENTRIES[1])
        assert log.write_pending() == log.written
        group.add(*ENTRIES[2])
        kill(log)  # inside the batch: the last add was never written
    assert open_log(tmp_path).group(GROUP)[:] == ENTRIES[:2]


def test_one_fdatasync_covers_every_group(tmp_path: Path, monkeypatch) -> None:
    log = open_log(tmp_path, fsync=True)
    groups = [log.group(g) for g in range(16)]
    log.sync()
    calls = Counting(monkeypatch, "fdatasync").calls
    assert not any(group.dirty for group in groups)
    with log.batch():
        for group in groups:
            group.add(b"x", 1, 1)
        assert all(group.dirty for group in groups)  # batched: not even written yet
    written = log.written
    assert all(group.dirty for group in groups) and log.synced < written
    for group in groups:  # as each replica's transport would before sending
        if group.dirty:
            group.sync()
    assert len(calls) == 1 and log.synced == written
    assert not any(group.dirty for group in groups)
    log.sync()
    assert len(calls) == 1
    log.close()


def test_without_fsync_mode_nothing_is_dirty_and_the_timer_syncs_once_for_every_group(tmp_path: Path, monkeypatch) -> None:
    clock = Clock()
    log = open_log(tmp_path, clock=clock)
    groups = [log.group(g) for g in range(4)]
    calls = Counting(monkeypatch, "fdatasync").calls
    for group in groups:
        group.add(b"x", 1, 1)
    assert not any(group.dirty for group in groups) and calls == []
    for group in groups:  # every group ticks within the period: one sync
        group.onOneSecondTimer()
    assert len(calls) == 1
    clock.now += 1
    writes = Counting(monkeypatch, "write").calls
    for group in groups:
        group.onOneSecondTimer()
    assert len(calls) == 1 and writes == []  # nothing new to write or sync
    groups[1].setRaftCommitIndex(5)
    groups[2].setRaftCommitIndex(6)
    clock.now += 1
    groups[0].onOneSecondTimer()
    assert len(calls) == 2 and [fd for fd, _ in writes].count(log._files.fd) == 1  # one write of both indexes
    clock.now += 1
    groups[0].onOneSecondTimer()
    assert [fd for fd, _ in writes].count(log._files.fd) == 1  # written once is enough
    log.close()


def test_a_batch_keeps_each_group_s_records_in_order(tmp_path: Path) -> None:
    log, group = open_with(tmp_path, ENTRIES[:1])
    with log.batch():
        group.add(*ENTRIES[1])
        group.add(*ENTRIES[2])
        group.deleteEntriesFrom(1)
        group.add(b"instead", 2, 3)
        log.group(8).add(b"other", 1, 1)
        log.group(8).clear()
        log.group(8).add(b"after the clear", 2, 1)
        group.add(b"and then", 3, 3)
        group.setCurrentTerm(3, "n1")  # synced at once: the batch so far is written first
        group.add(b"last", 4, 3)
    expected = [ENTRIES[0], (b"instead", 2, 3), (b"and then", 3, 3), (b"last", 4, 3)]
    assert group[:] == expected
    log = reopen(log)
    assert log.group(GROUP)[:] == expected and log.group(8)[:] == [(b"after the clear", 2, 1)]
    log.close()
