"""NodeLog's recovery from torn and damaged segments, kill -9, power cuts, failed fsyncs and a full disk;
and importing a RaftJournal."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import struct
from pathlib import Path

import pytest

from raftkv.chaos.small_disk import SmallDisk, unavailable_reason
from raftkv.core.errors import CorruptData, DiskFailed, StorageFull
from raftkv.raft.journal import RaftJournal
from raftkv.raft.node_log import NodeLog
from tests.test_journal_recovery import add_as_the_disk_fills, full_until_the_disk_has_room, run_then_kill_9
from tests.test_node_log import (
    ENTRIES, GROUP, SEGMENT_HEADER, Clock, Counting, entries, kill, open_log, open_with, reopen, segment, state,
)

LOGGER = "raftkv.raft.node_log"


def offsets(items: list[tuple[bytes, int, int]], group: int = GROUP) -> list[int]:
    """Where each of a new log's records of `items` (one add each, after the group's state record) starts."""
    at = [len(SEGMENT_HEADER) + len(state(group))]
    for entry in items:
        at.append(at[-1] + len(entries(group, [entry])))
    return at


def power_cut(log: NodeLog, unsynced: str) -> None:
    """Stop `log` as a power cut would: what was written after its durable point is lost
    ("truncate"), or was extended with zeros ("zeros")."""
    seq, offset = log.durable_point
    kill(log)
    for later in log.segments:
        if later >= seq:
            path = log.segment_path(later)
            keep = offset if later == seq else len(SEGMENT_HEADER)
            size = path.stat().st_size
            os.truncate(path, keep)
            if unsynced == "zeros":
                with open(path, "ab") as f:
                    f.write(bytes(size - keep))


# Torn tails and corruption


@pytest.mark.parametrize("cut", [1, 5, 12, 17, 20, len(entries(GROUP, ENTRIES[2:])) - 1])
def test_a_truncated_tail_is_cut_off_with_a_warning_naming_file_offset_and_group(tmp_path: Path, cut: int, caplog) -> None:
    log = open_with(tmp_path, ENTRIES)[0]
    log.close()
    path = log.segment_path(1)
    os.truncate(path, path.stat().st_size - cut)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        log = open_log(tmp_path)
    assert log.group(GROUP)[:] == ENTRIES[:2]
    assert path.stat().st_size == offsets(ENTRIES)[2]
    assert "torn" in caplog.text and str(path) in caplog.text and f"at byte {offsets(ENTRIES)[2]}" in caplog.text
    assert (f"of groups: {GROUP}" in caplog.text) == (cut <= len(entries(GROUP, ENTRIES[2:])) - 17)  # header left
    log.group(GROUP).add(*ENTRIES[2])
    assert reopen(log).group(GROUP)[:] == ENTRIES


@pytest.mark.parametrize("garbage", [
    b"\x9c\x07", b"\0" * 4096, entries(GROUP, [(b"never finished", 4, 2)])[:-3],
    entries(GROUP, [(b"never finished", 4, 2)])[:-3] + b"\0" * 100,
    entries(GROUP, [(b"never finished", 4, 2)])[:12],
])
def test_a_garbage_tail_is_cut_off(tmp_path: Path, garbage: bytes) -> None:
    log = open_with(tmp_path, ENTRIES)[0]
    log.close()
    with open(log.segment_path(1), "ab") as f:
        f.write(garbage)
    log = open_log(tmp_path)
    assert log.group(GROUP)[:] == ENTRIES and log.segment_path(1).stat().st_size == offsets(ENTRIES)[3]
    log.close()


@pytest.mark.parametrize("unsynced", ["truncate", "zeros"])
def test_a_power_cut_takes_exactly_what_was_written_after_the_last_sync(tmp_path: Path, unsynced: str) -> None:
    """The last sync is the timer's, or the one that rolled the segment the writes after it went on to."""
    clock = Clock()
    log = open_log(tmp_path, segment_bytes=300, clock=clock)
    for i in range(1, 30):
        log.group(i % 3).add(b"synced %d" % i, i // 3 + 1, 1)
    log.group(0).onOneSecondTimer()  # the default mode's sync
    segments = log.segments
    i = 30
    while log.segments == segments:  # on until a write starts a segment: that roll synced what came before it
        expected = {g: log.group(g)[:] for g in range(3)}
        log.group(i % 3).add(b"synced by the roll %d" % i, i // 3 + 1, 1)
        i += 1
    assert len(log.segments) == len(segments) + 1
    for i in range(i, i + 5):
        log.group(i % 3).add(b"lost %d" % i, i // 3 + 1, 1)
    power_cut(log, unsynced)
    log = open_log(tmp_path, segment_bytes=300, clock=clock)
    assert {g: log.group(g)[:] for g in range(3)} == expected
    log.close()


def test_after_a_power_cut_a_hole_and_a_later_record_are_a_torn_tail_and_before_the_sync_corruption(tmp_path: Path,
                                                                                                   caplog) -> None:
    """A power cut keeps any part of what was written after the last sync: here group 1's record is lost
    (a hole of zeros) and the later records of groups 2 and 3 reached the disk. All three go; the synced
    records stay. The same damage inside the synced bytes is corruption."""
    def write_and_cut(sync_it_all: bool) -> tuple[Path, int]:
        clock = Clock()
        log = open_log(tmp_path, clock=clock)
        one, two, three = log.group(1), log.group(2), log.group(3)
        one.add(b"a", 1, 1)
        two.add(b"b", 1, 1)
        one.onOneSecondTimer()  # synced, and the meta file says how far
        hole = len(segment(log))
        one.add(b"lost", 2, 1)
        hole_end = len(segment(log))
        two.add(b"landed", 2, 1)
        three.add(b"landed too", 1, 1)
        if sync_it_all:
            clock.now += 1
            one.onOneSecondTimer()
        kill(log)
        path = log.segment_path(1)
        data = bytearray(path.read_bytes())
        data[hole:hole_end] = bytes(hole_end - hole)
        path.write_bytes(data)
        return path, hole

    path, hole = write_and_cut(sync_it_all=False)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        log = open_log(tmp_path)
    assert [log.group(g)[:] for g in (1, 2, 3)] == [[(b"a", 1, 1)], [(b"b", 1, 1)], []]
    assert f"{path}: dropped" in caplog.text and f"at byte {hole}" in caplog.text and "of groups: 2, 3" in caplog.text
    log.close()
    shutil.rmtree(tmp_path)

    path, hole = write_and_cut(sync_it_all=True)
    with pytest.raises(CorruptData) as raised:
        open_log(tmp_path)
    message = str(raised.value)
    assert f"node log {path} is corrupt at byte {hole}" in message and "groups 1, 2, 3" in message
    assert f"move {tmp_path} away" in message and "\n" not in message


@pytest.mark.parametrize("field_offset", [0, 3, 4, 8, 12, 13, 17, 25, 29, 32])  # length, check, crc, kind, group, payload
def test_a_flipped_byte_before_the_durable_point_names_file_offset_and_groups(tmp_path: Path, field_offset: int) -> None:
    log = open_with(tmp_path, ENTRIES)[0]
    log.group(3).add(b"other group", 1, 1)
    log.close()
    path = log.segment_path(1)
    data = bytearray(path.read_bytes())
    middle = offsets(ENTRIES)[1]
    data[middle + field_offset] ^= 0x40
    path.write_bytes(data)
    with pytest.raises(CorruptData) as raised:
        open_log(tmp_path)
    message = str(raised.value)
    assert f"node log {path} is corrupt at byte {middle}" in message
    assert f"groups {GROUP}" in message or f"groups 3, {GROUP}" in message
    assert "\n" not in message


def test_damage_at_the_end_of_an_older_segment_is_corruption(tmp_path: Path) -> None:
    log = open_with(tmp_path, ENTRIES, segment_bytes=1)[0]  # a segment per write
    log.close()
    older = log.segment_path(log.segments[-2])
    os.truncate(older, older.stat().st_size - 1)
    with pytest.raises(CorruptData, match=f"{older} is corrupt .*incomplete record"):
        open_log(tmp_path, segment_bytes=1)


def test_in_fsync_mode_bytes_synced_after_the_meta_was_written_are_not_mistaken_for_a_torn_tail(tmp_path: Path,
                                                                                                 caplog) -> None:
    """The meta file is rewritten once a second; each sync is also noted at the head of the next write.
    RaftJournal read damage to bytes synced since its meta as a torn tail, and dropped acknowledged entries."""
    log = open_log(tmp_path, fsync=True)
    group = log.group(GROUP)
    group.add(*ENTRIES[0])
    group.sync()
    group.add(*ENTRIES[1])  # its write begins with a `synced` record covering the entry before
    group.sync()
    kill(log)
    path = log.segment_path(1)
    first_entry = offsets(ENTRIES)[0]
    written = path.read_bytes()
    damaged = bytearray(written)
    damaged[first_entry + 20] ^= 0x01  # the first entry: the meta's durable point is still the empty log's
    path.write_bytes(damaged)
    with pytest.raises(CorruptData, match=f"corrupt at byte {first_entry} .*groups {GROUP}"):
        open_log(tmp_path, fsync=True)
    damaged = bytearray(written)
    damaged[-1] ^= 0x01  # the last write: synced, but no later write said so (what is left of the weakness)
    path.write_bytes(damaged)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert open_log(tmp_path, fsync=True).group(GROUP)[:] == ENTRIES[:1]
    assert "torn" in caplog.text


def test_records_that_break_the_group_s_order_are_corruption(tmp_path: Path) -> None:
    (tmp_path / "0000000000000001.log").write_bytes(
        SEGMENT_HEADER + state(GROUP) + entries(GROUP, [(b"a", 1, 1)]) + entries(GROUP, [(b"b", 3, 1)]))
    with pytest.raises(CorruptData, match=f"group {GROUP}: entry 3 follows entry 1"):
        open_log(tmp_path)


@pytest.mark.parametrize("content", [b"", b"RKV", b"PYSYNCOBJ\0\0\0 somebody else's", b"RKVWAL\0\0\2\0\0\0"])
def test_a_foreign_segment_file_is_corruption(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "0000000000000001.log").write_bytes(content)
    with pytest.raises(CorruptData, match=str(tmp_path / "0000000000000001.log")):
        open_log(tmp_path)


def test_a_missing_segment_a_bad_meta_and_leftovers(tmp_path: Path) -> None:
    log = open_with(tmp_path, ENTRIES, segment_bytes=1)[0]
    log.close()
    (tmp_path / "meta.tmp").write_bytes(b"half written")
    (tmp_path / "0000000000000009.log.tmp").write_bytes(b"half a segment")
    log = open_log(tmp_path, segment_bytes=1)
    assert log.group(GROUP)[:] == ENTRIES and not list(tmp_path.glob("*.tmp"))
    log.close()
    meta = (tmp_path / "meta").read_bytes()
    (tmp_path / "meta").write_bytes(meta[:-1] + bytes([meta[-1] ^ 1]))
    with pytest.raises(CorruptData, match=f"{tmp_path / 'meta'} is corrupt .*checksum"):
        open_log(tmp_path)
    (tmp_path / "meta").write_bytes(meta)
    log.segment_path(2).unlink()
    with pytest.raises(CorruptData, match="0000000000000002.log is corrupt at byte 0 .*missing"):
        open_log(tmp_path)


# Durability


def test_reopening_makes_what_it_read_durable_and_says_so_in_the_meta_file(tmp_path: Path, monkeypatch) -> None:
    """A kill -9 leaves writes in the page cache only: read back, they are synced before anything is said of them."""
    log = open_with(tmp_path, ENTRIES)[0]
    kill(log)
    calls = Counting(monkeypatch, "fdatasync").calls
    log = open_log(tmp_path)
    size = log.segment_path(1).stat().st_size
    assert len(calls) == 1 and os.fstat(calls[0][0]).st_size == size
    assert (tmp_path / "meta").read_bytes()[-16:] == struct.pack("<QQ", 1, size)
    log.close()


def test_entries_survive_kill_9(tmp_path: Path) -> None:
    run_then_kill_9(
        "from raftkv.raft.node_log import NodeLog\n"
        "log = NodeLog(sys.argv[1], fsync=False, segment_bytes=2048)\n"
        "for i in range(1, 101):\n"
        "    log.group(i % 3).add(b'unbatched %d' % i, i // 3 + 1, 1)\n"
        "with log.batch():\n"
        "    for g in range(3):\n"
        "        log.group(g).add(b'batched', log.group(g)[-1][1] + 1, 2)\n", tmp_path)
    log = open_log(tmp_path)
    for g in range(3):
        unbatched = [(b"unbatched %d" % i, i // 3 + 1, 1) for i in range(1, 101) if i % 3 == g]
        assert log.group(g)[:] == [*unbatched, (b"batched", unbatched[-1][1] + 1, 2)]
    log.close()


def test_after_a_failed_fsync_every_later_sync_fails_too(tmp_path: Path, monkeypatch) -> None:
    """fsyncgate: the kernel may drop the pages a failed fsync could not write and report the next
    fsync as a success, so the log must never again claim its entries are durable."""
    log = open_log(tmp_path, fsync=True)
    one, two = log.group(1), log.group(2)
    one.add(b"a", 1, 1)
    real, failures = os.fdatasync, [OSError(errno.EIO, os.strerror(errno.EIO))]
    monkeypatch.setattr(os, "fdatasync", lambda fd: real(fd) if not failures else (_ for _ in ()).throw(failures.pop()))
    with pytest.raises(DiskFailed, match=r"fsync of .*0000000000000001.log failed .*stops"):
        one.sync()
    two.add(b"b", 1, 1)  # written, never to be called durable
    for call in (one.sync, two.sync, log.sync, log.collect, log.purge, one.onOneSecondTimer, two.onOneSecondTimer,
                 lambda: one.setCurrentTerm(2, None)):
        with pytest.raises(DiskFailed):
            call()
    assert one.dirty and two.dirty
    log.close()  # without a sync


def test_a_full_disk_raises_and_nothing_half_written_counts(tmp_path: Path, monkeypatch) -> None:
    log, group = open_with(tmp_path, ENTRIES[:2])
    add_as_the_disk_fills(group, ENTRIES[2], log.segment_path(1), monkeypatch)
    assert group[:] == ENTRIES[:2]
    group.add(*ENTRIES[2])
    assert reopen(log).group(GROUP)[:] == ENTRIES


def test_a_failed_batch_write_keeps_the_batch_for_the_next_write(tmp_path: Path, monkeypatch) -> None:
    log, group = open_with(tmp_path, ENTRIES[:1])
    size = len(segment(log))
    real_write = os.write
    with monkeypatch.context() as patch:
        patch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
        with pytest.raises(StorageFull), log.batch():
            group.add(*ENTRIES[1])
            log.group(8).add(b"other", 1, 1)
    assert len(segment(log)) == size
    assert group[:] == ENTRIES[:2]  # in memory, as pysyncobj was told
    monkeypatch.setattr(os, "write", real_write)
    group.add(*ENTRIES[2])  # writes the kept batch first
    kill(log)
    log = open_log(tmp_path)
    assert log.group(GROUP)[:] == ENTRIES and log.group(8)[:] == [(b"other", 1, 1)]


def test_a_full_log_says_so_for_every_group_until_the_disk_has_room(tmp_path: Path, monkeypatch) -> None:
    log, group = open_with(tmp_path, ENTRIES[:2])
    full_until_the_disk_has_room([group, log.group(3), log], ENTRIES[2], monkeypatch)
    group.add(*ENTRIES[2])
    assert not log.full
    log.close()


@pytest.mark.skipif(unavailable_reason() != "", reason=unavailable_reason() or "")
def test_a_disk_that_fills_up(tmp_path: Path) -> None:
    disk = SmallDisk(tmp_path / "disk", size_mb=16)
    log = open_log(disk.folder / "wal", segment_bytes=1 << 20)
    try:
        group = log.group(1)
        group.add(b"before", 1, 1)
        disk.fill()
        with pytest.raises(StorageFull):
            for idx in range(2, 1000):
                group.add(b"x" * 4096, idx, 1)
        assert log.full
        kept = group[:]
        disk.free()
        assert not log.full
        group.add(b"after", kept[-1][1] + 1, 1)
        log = reopen(log, segment_bytes=1 << 20)
        assert log.group(1)[:] == [*kept, (b"after", kept[-1][1] + 1, 1)]
    finally:
        log.close()
        disk.close()


# Importing a RaftJournal


def test_convert_imports_a_raft_journal_durably_and_again_if_asked(tmp_path: Path, monkeypatch) -> None:
    journal = RaftJournal(tmp_path / "p4", fsync=False)
    for entry in [(b"zero", 0, 1), *ENTRIES]:
        journal.add(*entry)
    journal.deleteEntriesTo(1)
    journal.setCurrentTerm(5, "n2")
    journal.setRaftCommitIndex(2)
    journal._destroy()
    log = open_log(tmp_path / "wal")
    log.group(9).add(b"other", 1, 1)
    group = log.convert(tmp_path / "p4", 4)
    assert group is log.group(4)
    assert (group[:], group.getCurrentTerm(), group.getVotedForNodeId(), group.getRaftCommitIndex()) == (
        ENTRIES, 5, "n2", 2)
    power_cut(log, "truncate")  # converted means synced
    log = open_log(tmp_path / "wal")
    group = log.group(4)
    assert (group[:], group.getCurrentTerm(), group.getRaftCommitIndex()) == (ENTRIES, 5, 2)
    group.add(b"since", 4, 5)
    assert log.convert(tmp_path / "p4", 4)[:] == ENTRIES  # a conversion done again replaces what was there
    assert log.group(9)[:] == [(b"other", 1, 1)]
    log.close()
