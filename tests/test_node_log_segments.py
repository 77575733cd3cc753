"""NodeLog's segments: rolled once synced, the dead oldest ones deleted, purge; and syncing from the
syncer's thread while the event loop writes on."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from raftkv.core.errors import DiskFailed
from tests.test_journal import next_fsync_fails, sync_held
from tests.test_node_log import ENTRIES, GROUP, SEGMENT_HEADER, Counting, open_log, open_with, reopen, segment


# Syncing from another thread


def test_a_log_synced_elsewhere_is_synced_by_that_thread_and_every_group_hears_of_its_failure(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    a, b = log.group(1), log.group(2)
    a.sync_elsewhere()
    a.add(b"a", 1, 1)
    a.setRaftCommitIndex(1)
    a.onOneSecondTimer()  # writes the commit index, does not sync
    assert log.synced < log.written
    assert b.sync_in_background() and log.synced == log.written
    a.add(b"b", 2, 1)
    with next_fsync_fails():
        assert log.sync_in_background()  # the syncer's thread carries on
    for group in (a, b):
        with pytest.raises(DiskFailed, match=r"fsync of .*0000000000000001.log failed"):
            group.onOneSecondTimer()
    a._destroy()
    assert not a.sync_in_background() and b.sync_in_background()
    log.close()
    assert not log.sync_in_background()


def test_writes_go_on_while_the_background_fdatasync_runs(tmp_path: Path, monkeypatch) -> None:
    log, group = open_with(tmp_path, ENTRIES[:1])
    with sync_held(monkeypatch, log.sync_in_background):
        group.add(*ENTRIES[1])
        group.deleteEntriesFrom(1)
        group.add(*ENTRIES[1])
    assert log.synced < log.written  # that sync covered only what was written before it
    assert reopen(log).group(GROUP)[:] == ENTRIES[:2]


def test_the_syncer_thread_keeps_up_with_writes_compactions_truncations_and_rolls(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=4096)
    stop = threading.Event()

    def syncer() -> None:
        while not stop.is_set():
            log.sync_in_background()

    thread = threading.Thread(target=syncer)
    thread.start()
    expected: dict[int, list] = {0: [], 1: []}
    try:
        for idx in range(1, 3001):
            for g in (0, 1):
                entry = (b"entry %d" % idx, expected[g][-1][1] + 1 if expected[g] else 1, 1)
                log.group(g).add(*entry)
                expected[g].append(entry)
            if idx % 500 == 0:
                log.group(idx // 500 % 2).deleteEntriesTo(len(expected[idx // 500 % 2]) - 10)
                del expected[idx // 500 % 2][:-10]
            elif idx % 97 == 0:
                log.group(1).deleteEntriesFrom(-3)
                del expected[1][-3:]
    finally:
        stop.set()
        thread.join(30)
    assert log._error_count == 0 and len(log.segments) > 1
    log = reopen(log)
    assert {g: log.group(g)[:] for g in (0, 1)} == expected
    log.close()


# Segments, garbage collection and purge


def test_segments_roll_once_synced_and_the_dead_oldest_ones_are_deleted(tmp_path: Path, monkeypatch) -> None:
    """segment_bytes=1: every write starts a new segment, so segment n holds write n."""
    log = open_log(tmp_path, segment_bytes=1)
    one, two = log.group(1), log.group(2)  # 1, 2: their state records
    one.add(b"a", 1, 1)  # 3
    two.add(b"b", 1, 1)  # 4
    one.add(b"c", 2, 1)  # 5
    calls = Counting(monkeypatch, "fdatasync").calls
    one.setCurrentTerm(2, None)  # 6 (the roll syncs 5, then the term's sync)
    assert len(calls) == 2
    two.setCurrentTerm(2, None)  # 7
    assert log.segments == [1, 2, 3, 4, 5, 6, 7]
    assert all(segment(log, seq).startswith(SEGMENT_HEADER) for seq in log.segments)
    assert log.collect() == 2 and log.segments == [3, 4, 5, 6, 7]  # both states moved on
    one.deleteEntriesTo(1)  # 8: entry 1 compacted away
    assert log.collect() == 1 and log.segments == [4, 5, 6, 7, 8]
    one.setCurrentTerm(3, None)  # 9: segment 6 is dead, but 4 (group 2's entry) is not
    assert log.collect() == 0 and log.segments == [4, 5, 6, 7, 8, 9]
    two.deleteEntriesTo(1)  # 10
    assert log.collect() == 1 and log.segments == [5, 6, 7, 8, 9, 10]
    purged = log.purge()  # group 1 (entry 2 in 5, state in 9) rewritten at 11; 5, 6 go; 7 holds group 2's state
    assert (purged.rewritten, purged.holding, purged.deleted) == ((1,), (2,), 2)
    assert log.segments == [7, 8, 9, 10, 11]
    log.remove(2)  # 12
    assert log.collect() == 4 and log.segments == [11, 12]
    log = reopen(log, segment_bytes=1)
    assert log.groups() == [1] and log.group(1)[:] == [(b"c", 2, 1)] and log.group(1).getCurrentTerm() == 3
    log.close()


def test_records_written_by_a_batch_hold_their_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=1)
    with log.batch():
        log.group(1).add(b"a", 1, 1)  # with its state record: segment 1
    log.group(2).add(b"b", 1, 1)  # 2: its state record, 3: the entry
    log.group(1).deleteEntriesTo(1)  # 4: only group 1's state record keeps segment 1
    assert log.collect() == 0 and log.segments == [1, 2, 3, 4]
    log = reopen(log, segment_bytes=1)
    assert log.groups() == [1, 2]
    log.close()


def test_a_roll_syncs_what_came_before_it(tmp_path: Path) -> None:
    log = open_log(tmp_path, fsync=True, segment_bytes=1)
    one, two = log.group(1), log.group(2)
    one.add(b"a", 1, 1)
    assert one.dirty
    two.add(b"b", 1, 1)  # a new segment, once the last was synced
    assert not one.dirty and two.dirty
    log.close()


def test_purge_rewrites_the_smallest_holders_first_within_its_budget(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=1 << 20)
    for g, count in ((1, 30), (2, 1), (3, 5)):
        for idx in range(1, count + 1):
            log.group(g).add(b"%d" % idx * 10, idx, 1)
    log.group(4).add(b"young", 1, 1)
    log._files._segment_bytes = 1  # the next write starts segment 2
    log.group(4).add(b"younger", 2, 1)
    log._files._segment_bytes = 1 << 20
    first = log.purge(max_bytes=100)  # group sizes: 2: 22 bytes, 4: 36, 3: 110, 1: 852
    assert (first.rewritten, first.holding, first.deleted) == ((2, 4), (1, 3), 0)
    second = log.purge(max_bytes=100)  # at least one group per call, whatever its size
    assert (second.rewritten, second.holding, second.deleted) == ((3,), (1,), 0)
    third = log.purge(max_bytes=100)
    assert (third.rewritten, third.holding, third.deleted) == ((1,), (), 1)
    assert log.segments == [2] and log.purge() == type(third)((), (), 0)
    log = reopen(log)
    assert [len(log.group(g)) for g in (1, 2, 3, 4)] == [30, 1, 5, 2]
    log.close()


def test_a_compaction_still_batched_kills_no_segment_until_it_is_written_and_synced(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=1)
    log.group(1).add(b"a", 1, 1)  # 2 (its state record is 1)
    log.group(1).setCurrentTerm(1, None)  # 3
    with log.batch():
        log.group(1).deleteEntriesTo(1)  # segment 2 is dead in memory, not on disk
        assert log.sync_in_background() and log.segments == [1, 2, 3]
    assert log.segments == [1, 2, 3, 4]
    assert log.sync_in_background() and log.segments == [3, 4]  # 3: its state record
    log.close()
