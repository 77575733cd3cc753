"""RaftJournal's recovery from damaged and leftover files, its durability under kill -9 and fsync, and a full disk."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from raftkv.core.errors import CorruptData, StorageFull
from raftkv.raft.journal import LOG_NAME, META_NAME, RaftJournal
from tests.test_journal import ENTRIES, LOG_HEADER, ROOT, open_with, record, record_offsets, reopen


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


def test_damage_after_the_last_sync_is_a_torn_tail_and_before_it_corruption(tmp_path: Path) -> None:
    """A power cut keeps any part of what was written after the last sync: here the first of two
    later records is lost (a hole of zeros) and the second reached the disk. Both go; the synced
    records stay. The same damage inside the synced bytes is corruption."""
    journal = open_with(tmp_path, ENTRIES[:2])
    journal.onOneSecondTimer()  # synced, and the meta says how far
    journal.add(*ENTRIES[2])
    journal.add(b"later", 4, 2)
    os.close(journal._fd)  # the power cut: no destroy, no sync
    log = tmp_path / LOG_NAME
    data = bytearray(log.read_bytes())
    hole = slice(record_offsets(ENTRIES)[2], record_offsets(ENTRIES)[3])
    data[hole] = bytes(hole.stop - hole.start)
    log.write_bytes(data)
    assert RaftJournal(tmp_path, fsync=False)[:] == ENTRIES[:2]

    os.truncate(log, record_offsets(ENTRIES)[2])
    with open(log, "r+b") as f:  # the hole, inside the synced bytes this time
        f.seek(record_offsets(ENTRIES)[1])
        f.write(bytes(8))
        f.seek(0, os.SEEK_END)
        f.write(record(*ENTRIES[2]))
    with pytest.raises(CorruptData, match="corrupt at byte"):
        RaftJournal(tmp_path, fsync=False)


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
    assert sorted(p.name for p in tmp_path.iterdir()) == [META_NAME, LOG_NAME]
    journal._destroy()


# Durability


def run_then_kill_9(code: str, folder: Path) -> None:
    """Run `code` in a new process (raftkv importable, `folder` in sys.argv[1]), which then kills itself with SIGKILL."""
    script = f"import os, signal, sys\nsys.path.insert(0, {str(ROOT)!r})\n{code}os.kill(os.getpid(), signal.SIGKILL)\n"
    done = subprocess.run([sys.executable, "-c", script, str(folder)], timeout=60)
    assert done.returncode == -signal.SIGKILL


def test_entries_survive_kill_9(tmp_path: Path) -> None:
    run_then_kill_9(
        "from raftkv.raft.journal import RaftJournal\n"
        "journal = RaftJournal(sys.argv[1], fsync=False)\n"
        "for i in range(1, 101):\n"
        "    journal.add(b'command %d' % i, i, 1)\n", tmp_path)
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
    journal.deleteEntriesFrom(2)  # cuts synced bytes: synced, with the meta saying so, at once
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


def test_without_fsync_the_journal_is_synced_once_a_second_not_per_write(tmp_path: Path, monkeypatch) -> None:
    journal = RaftJournal(tmp_path, fsync=False)
    calls = []
    real_fdatasync = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(fd), real_fdatasync(fd)))
    for entry in ENTRIES:
        journal.add(*entry)
    assert not journal.dirty and calls == []  # nothing waits for a sync before it is sent
    journal.onOneSecondTimer()
    assert len(calls) == 1
    journal.onOneSecondTimer()
    assert len(calls) == 1
    journal._destroy()


class FillingDisk:
    """os.write as the disk fills up: the first call writes half its data, every later one fails (ENOSPC)."""

    def __init__(self) -> None:
        self.writes: list[int] = []
        self._real_write = os.write

    def __call__(self, fd: int, data: bytes) -> int:
        if self.writes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.writes.append(fd)
        return self._real_write(fd, data[: len(data) // 2])


def add_as_the_disk_fills(journal, entry: tuple[bytes, int, int], path: Path, monkeypatch) -> None:
    """`journal.add(*entry)` while the disk fills up: StorageFull, one line naming `path`, the file as it was."""
    size = path.stat().st_size
    fill_disk = FillingDisk()
    with monkeypatch.context() as patch:
        patch.setattr(os, "write", fill_disk)
        with pytest.raises(StorageFull) as raised:
            journal.add(*entry)
    assert fill_disk.writes, "the partial write never happened"
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)
    assert path.stat().st_size == size


def test_disk_full_raises_and_leaves_the_log_readable(tmp_path: Path, monkeypatch) -> None:
    journal = open_with(tmp_path, ENTRIES[:2])
    add_as_the_disk_fills(journal, ENTRIES[2], tmp_path / LOG_NAME, monkeypatch)
    assert journal[:] == ENTRIES[:2]
    journal.add(*ENTRIES[2])
    assert reopen(journal, tmp_path)[:] == ENTRIES


def full_until_the_disk_has_room(journals: list, entry: tuple[bytes, int, int], monkeypatch) -> None:
    """The first journal's add of `entry` fails for want of space: each journal says it is full until
    the disk has room again."""
    free = [0]
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=free[0]))
    assert not any(journal.full for journal in journals)
    with monkeypatch.context() as patch:
        patch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
        with pytest.raises(StorageFull):
            journals[0].add(*entry)
    assert all(journal.full for journal in journals)
    free[0] = 1 << 30
    assert not any(journal.full for journal in journals)


def test_a_full_journal_says_so_until_the_disk_has_room(tmp_path: Path, monkeypatch) -> None:
    """A leader asks this before proposing: it refuses writes, and steps aside, while it is full."""
    journal = open_with(tmp_path, ENTRIES[:2])
    full_until_the_disk_has_room([journal], ENTRIES[2], monkeypatch)
    journal.add(*ENTRIES[2])
    assert not journal.full
