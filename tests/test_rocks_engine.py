"""The RocksDB engine alone: restarts, views, checkpoints and installs, recovery, a full disk, damaged files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from raftkv.core.commands import Delete, DeleteRange, Put
from raftkv.storage.engine import KeyRange, Position
from raftkv.chaos.small_disk import SmallDisk
from raftkv.core.errors import CorruptData, StorageFull, Unavailable
from raftkv.storage import rocks_memory
from raftkv.storage.rocks_engine import RocksEngine
from raftkv.storage.rocks_files import INSTALL_READY, recover_interrupted_install
from tests.conftest import wait_until
from tests.test_engine import scan

ROOT = Path(__file__).resolve().parents[1]


def test_rocks_data_and_position_survive_close_and_reopen(tmp_path):
    e = RocksEngine(tmp_path / "p")
    e.write([Put(b"a", b"1"), Put(b"b", b"2")], Position(7, 3))
    e.write([Delete(b"b")], Position(8, 3))
    e.close()
    e = RocksEngine(tmp_path / "p")
    try:
        assert e.position == Position(8, 3)
        assert scan(e) == [(b"a", b"1")]
    finally:
        e.close()


def test_reading_the_metadata_writes_no_table_file(tmp_path):
    """rocksdict flushes a column family whenever a view of it is dropped; one view per call made a
    table file (and a synced WAL) per apply that read the metadata."""
    engine = RocksEngine(tmp_path / "p")
    for index in range(1, 11):
        engine.write([Put(b"k", b"%d" % index)], Position(index, 1), {b"m": b"%d" % index})
        assert engine.meta_get(b"m") == b"%d" % index
        engine.meta_items()
    assert not list((tmp_path / "p" / "db").glob("*.sst"))
    engine.close()


def test_a_replica_keeps_no_more_write_ahead_log_than_its_memtables_hold(tmp_path):
    """The position's column family takes a write with every batch and rarely fills: flushed alone, it kept
    every log file since the database opened (RocksDB frees a log once every family in it has flushed)."""
    e = RocksEngine(tmp_path / "p")
    try:
        value = os.urandom(1000)
        for batch in range(80):  # 80 MiB, five times a memtable
            e.write([Put(b"%02d%06d" % (batch, k), value) for k in range(1024)], Position(batch + 1, 1))
        logs = sum(f.stat().st_size for f in (tmp_path / "p" / "db").glob("*.log"))
        assert logs <= 2 * rocks_memory.MEMTABLE_MB << 20, f"{logs / 2**20:.0f} MiB of write-ahead log"
    finally:
        e.close()


def test_rocks_position_is_not_visible_as_a_user_key(tmp_path):
    e = RocksEngine(tmp_path / "p")
    try:
        e.write([], Position(1, 1))
        assert e.get(b"position") is None
        assert scan(e) == []
    finally:
        e.close()


def test_rocks_scan_sees_one_consistent_view_despite_later_writes(tmp_path):
    e = RocksEngine(tmp_path / "p")
    try:
        e.write([Put(b"a", b"1"), Put(b"b", b"2"), Put(b"c", b"3")], Position(1, 1))
        pos, items = e.scan(KeyRange())
        e.write([Put(b"a0", b"new"), Delete(b"b"), Put(b"c", b"changed"), Put(b"d", b"4")], Position(2, 1))
        assert pos == Position(1, 1)
        assert list(items) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
        assert scan(e) == [(b"a", b"1"), (b"a0", b"new"), (b"c", b"changed"), (b"d", b"4")]
    finally:
        e.close()


def test_rocks_scan_view_holds_even_when_writes_land_mid_iteration(tmp_path):
    e = RocksEngine(tmp_path / "p")
    try:
        e.write([Put(bytes([k]), b"old") for k in b"abcdef"], Position(1, 1))
        _, items = e.scan(KeyRange())
        seen = [next(items)]
        e.write([DeleteRange(b"b", b"e"), Put(b"f", b"new")], Position(2, 1))
        seen += list(items)
        assert seen == [(bytes([k]), b"old") for k in b"abcdef"]
    finally:
        e.close()


def test_rocks_checkpoint_and_install_swap_contents_and_position(tmp_path):
    leader = RocksEngine(tmp_path / "leader")
    follower = RocksEngine(tmp_path / "follower")
    try:
        leader.write([Put(b"a", b"leader"), Put(b"b", b"leader")], Position(10, 4))
        follower.write([Put(b"a", b"follower"), Put(b"z", b"follower")], Position(3, 2))

        checkpoint = tmp_path / "checkpoint"
        assert leader.checkpoint(checkpoint) == Position(10, 4)
        leader.write([Put(b"c", b"after checkpoint")], Position(11, 4))

        assert follower.install(checkpoint) == Position(10, 4)
        assert follower.position == Position(10, 4)
        assert scan(follower) == [(b"a", b"leader"), (b"b", b"leader")]
        assert not checkpoint.exists()
        folder = tmp_path / "follower"
        assert sorted(p.name for p in folder.iterdir()) == ["db"]
        assert not (folder / "db" / INSTALL_READY).exists()

        follower.write([Put(b"d", b"follower again")], Position(12, 4))
    finally:
        leader.close()
        follower.close()

    reopened = RocksEngine(tmp_path / "follower")
    try:
        assert reopened.position == Position(12, 4)
        assert scan(reopened) == [(b"a", b"leader"), (b"b", b"leader"), (b"d", b"follower again")]
    finally:
        reopened.close()


def _make_db(folder: Path, items: dict[bytes, bytes], position: Position) -> None:
    e = RocksEngine(folder)
    e.write([Put(k, v) for k, v in items.items()], position)
    e.close()


def _open_and_read(folder: Path) -> tuple[Position, list[tuple[bytes, bytes]]]:
    e = RocksEngine(folder)
    try:
        return e.position, scan(e)
    finally:
        e.close()


@pytest.fixture
def crashed(tmp_path):
    """`folder` has an old db (a=old @ 1) and a complete incoming db (a=new @ 9) next to it."""
    folder = tmp_path / "partition"
    _make_db(folder, {b"a": b"old"}, Position(1, 1))
    _make_db(tmp_path / "other", {b"a": b"new"}, Position(9, 2))
    shutil.move(tmp_path / "other" / "db", folder / "db.incoming")
    (folder / "db.incoming" / INSTALL_READY).touch()
    return folder


def test_recovery_finishes_an_install_when_db_is_missing_and_incoming_is_ready(crashed):
    (crashed / "db").rename(crashed / "db.old")  # the crash came after the first rename
    recover_interrupted_install(crashed)
    assert sorted(p.name for p in crashed.iterdir()) == ["db"]
    assert _open_and_read(crashed) == (Position(9, 2), [(b"a", b"new")])


def test_opening_an_engine_recovers_an_interrupted_install(crashed):
    shutil.rmtree(crashed / "db")
    assert _open_and_read(crashed) == (Position(9, 2), [(b"a", b"new")])
    assert sorted(p.name for p in crashed.iterdir()) == ["db"]


def test_recovery_rolls_back_when_db_is_missing_and_only_db_old_exists(crashed):
    shutil.rmtree(crashed / "db.incoming")
    (crashed / "db").rename(crashed / "db.old")
    recover_interrupted_install(crashed)
    assert sorted(p.name for p in crashed.iterdir()) == ["db"]
    assert _open_and_read(crashed) == (Position(1, 1), [(b"a", b"old")])


def test_recovery_rolls_back_when_incoming_was_never_marked_ready(crashed):
    (crashed / "db.incoming" / INSTALL_READY).unlink()
    (crashed / "db").rename(crashed / "db.old")
    recover_interrupted_install(crashed)
    assert sorted(p.name for p in crashed.iterdir()) == ["db"]
    assert _open_and_read(crashed) == (Position(1, 1), [(b"a", b"old")])


def test_recovery_keeps_the_live_db_and_drops_leftovers_when_db_exists(crashed):
    shutil.copytree(crashed / "db", crashed / "db.old")
    recover_interrupted_install(crashed)
    assert sorted(p.name for p in crashed.iterdir()) == ["db"]
    assert _open_and_read(crashed) == (Position(1, 1), [(b"a", b"old")])


def test_recovery_of_a_clean_folder_changes_nothing(tmp_path):
    folder = tmp_path / "partition"
    _make_db(folder, {b"k": b"v"}, Position(2, 1))
    before = sorted(p.name for p in (folder / "db").iterdir())
    recover_interrupted_install(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["db"]
    assert sorted(p.name for p in (folder / "db").iterdir()) == before
    assert _open_and_read(folder) == (Position(2, 1), [(b"k", b"v")])


def test_rocks_scan_dropped_before_iterating_releases_its_reader(tmp_path):
    import gc

    engine = RocksEngine(tmp_path / "e")
    engine.write([Put(b"a", b"1")], Position(1, 1))
    _, items = engine.scan(KeyRange())
    del items
    gc.collect()
    assert engine._readers == 0
    _, items = engine.scan(KeyRange())
    assert list(items) == [(b"a", b"1")]
    assert engine._readers == 0
    engine.close()


def test_rocks_inverted_delete_range_is_a_no_op_not_a_broken_database(tmp_path):
    engine = RocksEngine(tmp_path / "e")
    engine.write([Put(b"a", b"1"), DeleteRange(b"b", b"a")], Position(1, 1))
    engine.write([Put(b"c", b"3")], Position(2, 1))
    assert engine.get(b"a") == b"1" and engine.get(b"c") == b"3" and engine.position == Position(2, 1)
    engine.close()


# --- a full disk and damaged files (found by the chaos harness, docs/chaos.md) ---------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")


@pytest.fixture
def small_disk(tmp_path):
    disk = SmallDisk(tmp_path / "disk", size_mb=24)
    yield disk
    disk.close()


def fill_until_a_write_fails(e: RocksEngine, disk: SmallDisk, index: int) -> int:
    disk.fill()
    with pytest.raises(StorageFull):
        for index in range(index, index + 10_000):
            e.write([Put(b"k%d" % index, b"x" * 4096)], Position(index, 1))
    return index


@needs_root
def test_rocks_writes_resume_after_a_full_disk_is_freed_without_a_restart(small_disk):
    e = RocksEngine(small_disk.folder / "p")
    try:
        e.write([Put(b"before", b"1")], Position(1, 1))
        failed_at = fill_until_a_write_fails(e, small_disk, 2)
        with pytest.raises(StorageFull):  # still full: refused without touching the database
            e.write([Put(b"during", b"1")], Position(failed_at, 1))
        assert e.get(b"before") == b"1"  # reads keep working
        small_disk.free()
        e.write([Put(b"after", b"1")], Position(failed_at, 1))
        assert e.position == Position(failed_at, 1)
        assert e.get(b"after") == b"1" and e.get(b"k%d" % failed_at) is None
    finally:
        e.close()
    reopened = RocksEngine(small_disk.folder / "p")
    try:
        assert reopened.position == Position(failed_at, 1) and reopened.get(b"after") == b"1"
    finally:
        reopened.close()


@needs_root
def test_rocks_install_on_a_full_disk_leaves_an_engine_that_recovers(small_disk, tmp_path):
    leader = RocksEngine(tmp_path / "leader")
    follower = RocksEngine(small_disk.folder / "follower")
    try:
        leader.write([Put(b"a", b"leader")], Position(50_000, 4))
        checkpoint = leader.checkpoint(small_disk.folder / "checkpoint")
        follower.write([Put(b"a", b"follower")], Position(3, 2))
        fill_until_a_write_fails(follower, small_disk, 4)
        try:  # closing the old database cannot flush; opening the new one may not fit either
            follower.install(small_disk.folder / "checkpoint")
        except StorageFull:
            small_disk.free()
            follower.write([], Position(50_001, 4))  # reopens
        else:
            small_disk.free()
        assert follower.get(b"a") == b"leader" and follower.position.index >= checkpoint.index
    finally:
        leader.close()
        follower.close()


@needs_root
def test_rocks_checkpoint_and_close_on_a_full_disk_are_a_clear_error_and_lose_nothing(small_disk):
    """The lose-last-second hour: on a full disk, the checkpoint a replica copy asked for raised
    RocksDB's bare Exception through the Admin servicer (a traceback), and closing a replica the
    metadata had moved away raised out of the node's reconcile, which stopped half done."""
    e = RocksEngine(small_disk.folder / "p")
    e.write([Put(b"before", b"1")], Position(1, 1))
    failed_at = fill_until_a_write_fails(e, small_disk, 2)
    with pytest.raises(StorageFull, match="disk full taking a checkpoint"):
        e.checkpoint(small_disk.folder / "checkpoint")
    e.close()
    small_disk.free()
    reopened = RocksEngine(small_disk.folder / "p")
    try:
        assert reopened.get(b"before") == b"1" and reopened.position == Position(failed_at - 1, 1)
    finally:
        reopened.close()


def test_rocks_reads_of_a_closed_engine_say_it_is_closed(tmp_path):
    """A scan too: one that came in as the node stopped on a corrupt file was a grpc traceback (CI)."""
    e = RocksEngine(tmp_path / "p")
    e.write([], Position(1, 1), {b"learner": b"x"})
    assert e.meta_items() == [(b"learner", b"x")]  # kept until the next change: the close is one
    e.close()
    with pytest.raises(Unavailable, match="is closed"):
        e.meta_items()
    with pytest.raises(Unavailable, match="is closed"):
        e.get(b"a")
    with pytest.raises(Unavailable, match="is closed"):
        e.get_many([b"a", b"b"])
    with pytest.raises(Unavailable, match="is closed"):
        e.scan(KeyRange(b"", None))
    assert e._readers == 0


def test_a_close_while_a_worker_flushes_the_memtable_waits_for_it_and_releases_the_database(tmp_path, caplog):
    """A compaction's flush runs on the snapshot worker while the loop goes on; a replica closed meanwhile
    (a move's removal, the node's stop) could not close a handle the flush was inside ("Already
    borrowed"), so the database stayed open and locked."""
    e = RocksEngine(tmp_path / "p")
    for batch in range(10):  # about 10 MB in the memtable: its flush takes tens of ms
        e.write([Put(b"k%07d" % i, os.urandom(100)) for i in range(batch * 10_000, (batch + 1) * 10_000)],
                Position(batch + 1, 1))
    flush = threading.Thread(target=e.flush_memtable)
    flush.start()
    wait_until(lambda: e._flushing or not flush.is_alive(), 10, "the flush to begin")
    assert flush.is_alive(), "the flush ended before the close: nothing was tested"
    e.close()
    flush.join()
    assert "Already borrowed" not in caplog.text
    again = RocksEngine(tmp_path / "p")  # RocksDB's lock went with the close
    try:
        assert again.position == Position(10, 1) and again.get(b"k0099999") is not None
    finally:
        again.close()
    with pytest.raises(Unavailable, match="is closed"):
        e.flush_memtable()


def damage_a_table_file(folder: Path) -> None:
    """Flip bytes in the first data block of the database's table files (opening still works)."""
    for sst in (folder / "db").glob("*.sst"):
        data = bytearray(sst.read_bytes())
        data[10:18] = bytes(b ^ 0xFF for b in data[10:18])
        sst.write_bytes(bytes(data))


def test_rocks_reads_of_a_damaged_block_raise_corrupt_data_and_tell_on_corrupt(tmp_path):
    e = RocksEngine(tmp_path / "p")
    e.write([Put(b"k%03d" % i, b"v") for i in range(100)], Position(1, 1))
    e.checkpoint(tmp_path / "flushed")  # a checkpoint flushes the memtable into table files
    e.close()
    damage_a_table_file(tmp_path / "p")
    reported = []
    try:
        e = RocksEngine(tmp_path / "p", on_corrupt=reported.append)
    except CorruptData:  # the position's own block was hit: refused at once, which is as good
        return
    try:
        with pytest.raises(CorruptData, match="is corrupt"):
            e.get(b"k050")
        with pytest.raises(CorruptData, match="is corrupt"):  # a scan used to end early without a word
            list(e.scan(KeyRange())[1])
        assert len(reported) == 2 and all(isinstance(r, CorruptData) for r in reported)
    finally:
        e.close()


def test_a_checkpoint_is_read_whole_before_it_leaves_and_a_damaged_block_is_the_databases(tmp_path):
    """RocksDB checks a block only when it reads it, and a checkpoint hard-links the database's table files:
    a leader shipped a block damaged on its disk, never read there, to two learners (a chaos run)."""
    reported = []
    e = RocksEngine(tmp_path / "p", on_corrupt=reported.append)
    try:
        e.write([Put(b"k%03d" % i, b"v" * 100) for i in range(100)], Position(1, 1))
        e.checkpoint(tmp_path / "intact")
        e.verify(tmp_path / "intact")
        assert not reported
        damage_a_table_file(tmp_path / "p")
        e.checkpoint(tmp_path / "damaged")
        with pytest.raises(CorruptData, match=rf"database {tmp_path / 'p' / 'db'} is corrupt .*checksum mismatch"):
            e.verify(tmp_path / "damaged")
        assert len(reported) == 1
    finally:
        e.close()


def test_a_scan_still_reading_after_the_grace_fails_its_next_step_and_the_install_goes_through(tmp_path):
    """Found by the fail-point suite: a replica-equality scan outlived the install's grace; the old handle,
    still referenced by the scan, kept RocksDB's lock, the reopen failed as if the disk had ('lock hold by
    current process') and the node stopped; the scan then met DbClosedError."""
    leader = RocksEngine(tmp_path / "leader")
    follower = RocksEngine(tmp_path / "follower", reader_grace=0.1)
    try:
        leader.write([Put(b"k%03d" % i, b"new") for i in range(100)], Position(10, 4))
        follower.write([Put(b"k%03d" % i, b"old") for i in range(100)], Position(3, 2))
        leader.checkpoint(tmp_path / "checkpoint")
        _, items = follower.scan(KeyRange(b"", None))
        assert next(items) == (b"k000", b"old")
        assert follower.install(tmp_path / "checkpoint") == Position(10, 4)
        with pytest.raises(Unavailable, match="replaced while this scan read it"):
            next(items)
        assert scan(follower)[0] == (b"k000", b"new")
    finally:
        leader.close()
        follower.close()


def test_a_checkpoint_being_sent_when_the_process_died_is_deleted_at_the_next_open(tmp_path):
    """Its hard links would keep every table file it named on disk, compacted away or not, for good."""
    engine = RocksEngine(tmp_path)
    engine.write([Put(b"k", b"v")], Position(1, 1))
    scratch = engine.scratch()
    engine.checkpoint(scratch / "db")
    engine.close()  # the process died here: nobody removed the scratch folder
    assert list((scratch / "db").iterdir())
    RocksEngine(tmp_path).close()
    assert not scratch.exists()


def test_every_database_of_a_process_shares_one_block_cache_and_one_memtable_budget(tmp_path):
    """Four databases written with 8 MiB each under an 8 MiB memtable budget: the budget makes them flush
    (alone, each would keep its 8 MiB in a memtable, 32 MiB together); reading each of them adds to the one
    block cache, index blocks included. In a process of its own: in a full run this process's cache is
    full of other tests' blocks, and the next database's evicted as much as they added."""
    in_a_process_of_its_own("one_budget_measured", tmp_path)


def in_a_process_of_its_own(check: str, folder: Path) -> None:
    """This module's function `check`(folder) in a fresh interpreter: one process, one RocksDB budget."""
    measured = subprocess.run([sys.executable, "-c", f"import sys; from tests.test_rocks_engine import {check}; "
                               f"{check}(sys.argv[1])", str(folder)],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert measured.returncode == 0, measured.stderr[-3000:]


def one_budget_measured(folder: str) -> None:
    rocks_memory.configure(block_cache_mb=64, memtables_mb=8)
    engines = [RocksEngine(Path(folder) / f"p{i}") for i in range(4)]
    try:
        for e in engines:
            e.write([Put(b"first", b"1")], Position(1, 1))
        assert rocks_memory.usage()[1] > 0  # the process's one budget counts these databases' memtables
        value = b"v" * 1000
        for e in engines:
            for batch in range(8):
                e.write([Put(b"%02d%06d" % (batch, k), value) for k in range(1024)], Position(batch + 2, 1))
        cache = rocks_memory.usage()[0]
        wait_until(lambda: rocks_memory.usage()[1] < 16 << 20, 10, "the budget's flushes (RocksDB's threads)")
        seen = []
        for e in engines:
            e.flush()
            assert all(e.get(b"%02d%06d" % (b, k)) == value for b in range(8) for k in range(0, 1024, 64))
            seen.append(rocks_memory.usage()[0])
        assert cache < seen[0] < seen[1] < seen[2] < seen[3] <= 64 << 20, seen  # one cache: each database adds
    finally:
        for e in engines:
            e.close()


def test_many_databases_holding_a_few_writes_each_stay_within_the_memtable_budget(tmp_path):
    """A node's many partitions each hold a few writes in their memtables: the budget's smallest unit, an
    arena block, must be small enough that together they do not pass it, or RocksDB flushes a table file of
    a few entries on nearly every write (with 256 KiB blocks, 128 databases made 690 files of 40 writes
    each under an 8 MiB budget; at 1,024 partitions a node flushed 300 a second under the default 64 MiB)."""
    in_a_process_of_its_own("many_small_memtables_measured", tmp_path)


def many_small_memtables_measured(folder: str) -> None:
    rocks_memory.configure(block_cache_mb=64, memtables_mb=8)
    engines = [RocksEngine(Path(folder) / f"p{i:03d}") for i in range(128)]
    try:
        for index in range(1, 41):
            for e in engines:
                e.write([Put(b"k%02d" % index, b"v" * 100)], Position(index, 1), {b"m": b"%d" % index})
        assert rocks_memory.usage()[1] < 4 << 20, rocks_memory.usage()
        assert not list(Path(folder).glob("*/db/*.sst"))
    finally:
        for e in engines:
            e.close()
