"""A large put_many logged as one table file and ingested by every replica (docs/bulk-ingest.md): on the
twins (MemoryEngine under the in-memory Raft group) and on RocksDB, in one process."""

from __future__ import annotations

import asyncio
import os
import subprocess
from dataclasses import replace

import pytest

from learners.change_capture import EntryContext, capture_entry, pending_view
from raftkv import failpoints
from raftkv.chaos.small_disk import SmallDisk
from raftkv.core.bulk_ingest import INGEST_MIN_BYTES, SST_INGEST_SINCE, ingest_wanted
from raftkv.meta.cluster_version import FIRST_RELEASE
from raftkv.core.command_kinds import check_command
from raftkv.core.commands import IngestSst, Limits, Put, PutMany
from raftkv.core.errors import CorruptData, InvalidRequest, StorageFull
from raftkv.core.log_codec import decode_proposal
from raftkv.node.gatekeeper import command_requests
from raftkv.node.group_commit import PartitionFrontend
from raftkv.raft.group import Role
from raftkv.security.permissions import Access, Grant, Identity, check
from raftkv.storage import rocks_sst
from raftkv.storage.engine import KeyRange, MemoryEngine, Position
from raftkv.storage.rocks_engine import RocksEngine
from raftkv.storage.rocks_files import INGEST_PREFIX
from tests.test_partition_replica import Twins, items

VALUE = b"v" * 100
ROWS = INGEST_MIN_BYTES // (len(b"k000000") + len(VALUE)) + 1  # just over the threshold


def bulk(n: int = ROWS, tag: bytes = b"") -> PutMany:
    return PutMany.of([b"k%06d" % i for i in range(n)], [VALUE + tag] * n)


@pytest.fixture(params=["memory", "rocks"])
def engine(request, tmp_path):
    e = MemoryEngine() if request.param == "memory" else RocksEngine(tmp_path / "p")
    yield e
    e.close()


def test_an_ingest_overwrites_keys_keeps_a_repeated_keys_last_value_and_applies_in_order_with_puts(engine):
    engine.write([Put(b"b", b"old"), Put(b"z", b"old")], Position(1, 1))
    file = rocks_sst.build(PutMany.of([b"c", b"b", b"c"], [b"1", b"2", b"3"]))
    assert file.rows == 2
    engine.write([Put(b"a", b"before"), Put(b"c", b"put before"), file, Put(b"b", b"put after")], Position(2, 1))
    assert list(engine.scan(KeyRange())[1]) == [(b"a", b"before"), (b"b", b"put after"), (b"c", b"3"),
                                                 (b"z", b"old")]
    assert engine.position == Position(2, 1)


def test_a_file_that_does_not_match_its_checksum_is_refused_with_one_line_and_nothing_applied(engine):
    engine.write([Put(b"a", b"1")], Position(1, 1))
    file = rocks_sst.build(bulk(10))
    damaged = replace(file, data=file.data[:100] + bytes([file.data[100] ^ 1]) + file.data[101:])
    with pytest.raises(CorruptData, match="does not match its SHA-256, so nothing of it was applied") as refused:
        engine.write([Put(b"a", b"2"), damaged], Position(2, 1))
    assert "\n" not in str(refused.value)
    assert engine.position == Position(1, 1) and list(engine.scan(KeyRange())[1]) == [(b"a", b"1")]
    with pytest.raises(InvalidRequest, match="does not match its SHA-256"):
        check_command(damaged, Limits())


def test_a_crash_between_the_ingest_and_its_position_is_undone_by_applying_the_entry_again(tmp_path):
    e = RocksEngine(tmp_path / "p")
    e.write([Put(b"k000001", b"old"), Put(b"other", b"1")], Position(1, 1))
    file = rocks_sst.build(bulk(50))
    failpoints.arm("ingest-after", "error")  # where kill -9 would strike
    try:
        with pytest.raises(OSError, match="fail point ingest-after"):
            e.write([file], Position(2, 1))
    finally:
        failpoints.disarm_all()
    e.close()
    e = RocksEngine(tmp_path / "p")
    try:
        assert e.position == Position(1, 1) and e.get(b"k000001") == VALUE  # the rows, without their position
        e.write([file], Position(2, 1))  # the replay
        assert e.position == Position(2, 1)
        assert list(e.scan(KeyRange())[1]) == [(b"k%06d" % i, VALUE) for i in range(50)] + [(b"other", b"1")]
    finally:
        e.close()


def test_a_file_left_on_its_way_in_is_deleted_at_the_next_open(tmp_path):
    RocksEngine(tmp_path / "p").close()
    stray = tmp_path / "p" / f"{INGEST_PREFIX}0123456789abcdef.sst"
    stray.write_bytes(b"half a file")
    RocksEngine(tmp_path / "p").close()
    assert not stray.exists()


def test_a_checkpoint_after_an_ingest_holds_its_rows_and_its_position(tmp_path):
    e = RocksEngine(tmp_path / "p")
    try:
        e.write([rocks_sst.build(bulk(20))], Position(7, 2))
        (tmp_path / "cp").mkdir()
        assert e.checkpoint(tmp_path / "cp" / "db") == Position(7, 2)
    finally:
        e.close()
    copy = RocksEngine(tmp_path / "cp")
    try:
        assert copy.position == Position(7, 2) and len(list(copy.scan(KeyRange())[1])) == 20
    finally:
        copy.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
def test_an_ingest_on_a_full_disk_is_storage_full_with_nothing_applied_and_goes_through_once_freed(tmp_path):
    disk = SmallDisk(tmp_path / "disk", size_mb=24)
    e = RocksEngine(disk.folder / "p")
    try:
        e.write([Put(b"a", b"1")], Position(1, 1))
        file = rocks_sst.build(bulk(2000))
        disk.fill()
        with pytest.raises(StorageFull, match="disk full"):
            e.write([file], Position(2, 1))
        assert e.broken and e.position == Position(1, 1) and e.get(b"k000000") is None
        assert not list((disk.folder / "p").glob(INGEST_PREFIX + "*"))
        disk.free()
        e.write([file], Position(2, 1))
        assert e.position == Position(2, 1) and e.get(b"k001999") == VALUE
    finally:
        e.close()
        disk.close()


def test_the_learner_emits_each_row_of_a_file_once_in_key_order_with_its_before_image():
    copy = MemoryEngine()
    copy.write([Put(b"b", b"old")], Position(1, 1))
    view = pending_view(copy)
    file = rocks_sst.build(PutMany.of([b"c", b"b", b"a", b"c"], [b"1", b"2", b"3", b"4"]))
    events = list(capture_entry(view, [file], EntryContext("c", 0, 2, 1, 0)))
    assert [(e.op, e.key, e.before, e.after, e.index, e.seq) for e in events] == [
        ("c", b"a", None, b"3", 2, 0), ("u", b"b", b"old", b"2", 2, 1), ("c", b"c", None, b"4", 2, 2)]
    copy.write(view.mutations, Position(2, 1))  # what the learner then writes to its copy
    assert list(copy.scan(KeyRange())[1]) == [(b"a", b"3"), (b"b", b"2"), (b"c", b"4")]


def test_a_scratch_folder_of_a_process_that_died_is_deleted_by_the_next_read(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = tmp_path / f"sst-read-{dead.pid}-abc"
    mine = tmp_path / f"sst-read-{os.getpid()}-abc"  # a read of this process still at work
    left.mkdir()
    mine.mkdir()
    assert rocks_sst.rows(rocks_sst.build(bulk(3), tmp_path), tmp_path).split()[0] == [b"k000000", b"k000001",
                                                                                      b"k000002"]
    assert not left.exists() and mine.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [mine.name]  # and its own are gone


def test_only_a_put_many_between_the_bounds_is_ingested():
    assert not ingest_wanted(bulk(ROWS - 2), 2 << 20)
    assert ingest_wanted(bulk(ROWS), 2 << 20)
    assert not ingest_wanted(bulk(ROWS), INGEST_MIN_BYTES // 4)  # a file past the largest entry: rows


def test_a_put_many_big_enough_to_be_ingested_is_checked_key_by_key_before_the_leader_builds_a_file():
    """The gatekeeper sees the client's PutMany (raftkv/node/service.py checks it before `submit`)."""
    roles, users = {"app-writer": [Grant(Access.WRITE, b"k0000")], "root": [Grant(Access.ADMIN)]}, \
        {"walt": ["app-writer"], "ada": ["root"]}
    rows = bulk(ROWS)  # keys k000000, k000001, ...: all but the first 100 are outside the prefix k0000
    assert ingest_wanted(rows, 2 << 20)
    assert check(Identity("walt"), command_requests(bulk(100)), users, roles) is None
    assert check(Identity("walt"), command_requests(rows), users, roles) == (
        "permission denied: user walt may not write key b'k000100'")
    file = rocks_sst.build(rows)  # were a file ever asked for, it would need the whole key space
    assert check(Identity("walt"), command_requests(file), users, roles) is not None
    assert check(Identity("ada"), command_requests(file), users, roles) is None


def submit_all(twins: Twins, leader, may_ingest: bool, *commands) -> list:
    """`commands` submitted at once to the leader's group commit, and their results once all are applied."""
    async def run() -> list:
        frontend = PartitionFrontend(leader, asyncio.get_running_loop(), max_batch_ops=100,
                                     max_batch_bytes=2 << 20, request_timeout=10.0,
                                     leader_id_of=lambda address: None,
                                     cluster_version=lambda: SST_INGEST_SINCE if may_ingest else FIRST_RELEASE)
        futures = [frontend.submit(c) for c in commands]
        for _ in range(20):
            if all(f.done() for f in futures):
                break
            twins.net.stabilize()
            twins.net.tick()
            await asyncio.sleep(0)  # the writers hear back on the next turn of the loop
        return await asyncio.gather(*futures)
    return asyncio.run(run())


@pytest.mark.parametrize("may_ingest", [True, False])
def test_the_leader_logs_a_large_put_many_as_one_file_alone_in_its_entry_and_every_replica_ingests_it(
        tmp_path, may_ingest):
    twins = Twins(tmp_path)
    leader, follower = twins.start("n1"), twins.start("n2")
    leader.group.campaign()
    twins.net.stabilize()
    assert leader.role == Role.LEADER
    logged = []
    propose = leader.propose
    leader.propose = lambda payload, callback: (logged.append(decode_proposal(payload)), propose(payload, callback))

    results = submit_all(twins, leader, may_ingest, Put(b"k000000", b"small"), bulk(ROWS, b"new"),
                         PutMany.of([b"x"], [b"y"]))

    assert results == [None, None, None]
    kinds = [[type(c) for c in entry] for entry in logged]
    assert kinds == ([[Put], [IngestSst], [PutMany]] if may_ingest else [[Put], [PutMany, PutMany]])
    expected = sorted([(b"k%06d" % i, VALUE + b"new") for i in range(ROWS)] + [(b"x", b"y")])
    assert items(leader) == items(follower) == expected
    leader.group.compact()  # a replica that joins after the ingest gets its rows with the snapshot
    late = twins.start("n3")
    twins.net.tick(3)
    assert items(late) == expected
