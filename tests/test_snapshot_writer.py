"""The asynchronous snapshot writer against pysyncobj's own rename of its placeholder."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tarfile
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from pysyncobj import SERIALIZER_STATE

from raftkv import failpoints
from raftkv.raft import snapshot_file
from raftkv.core.commands import Put
from raftkv.core.errors import CorruptData
from raftkv.core.log_codec import encode_proposal
from raftkv.raft.journal import RaftJournal
from raftkv.dev.local_cluster import free_port_block
from raftkv.core.spec import Tuning
from raftkv.node.replica import PartitionReplica
from raftkv.raft.group import Outcome, Role
from raftkv.raft.replica_logs import ReplicaLogs
from raftkv.raft.syncobj_group import GroupConfig, SyncObjGroup
from raftkv.raft.syncobj_snapshots import SnapshotFiles, snapshot_writer
from raftkv.raft.syncobj_patches import KEPT_ASIDE
from raftkv.storage.engine import Position
from raftkv.storage.rocks_engine import RocksEngine
from tests.conftest import until
from tests.test_corrupt_data import damage_table_files
from tests.loopback_hubs import LoopbackHubs, unconnected_hub


def single_voter(folder: Path, fsync: bool = False, hubs: LoopbackHubs | None = None,
                 node_log: ReplicaLogs | None = None) -> PartitionReplica:
    """`hubs`: where others reach it (a learner); without, it has a hub that connects nowhere. `node_log`:
    its log is a group of that node log, not a RaftJournal of its own."""
    address = f"127.0.0.1:{free_port_block(1)}"
    config = GroupConfig(partition=0, hub=hubs.hub(address) if hubs else unconnected_hub(), self_address=address,
                         peers=(), folder=folder, fsync=fsync, tuning=Tuning(), node_log=node_log)
    loop = asyncio.get_running_loop()
    return PartitionReplica(0, RocksEngine(folder), Tuning(), open_group=lambda sm: SyncObjGroup(config, sm, loop))


def test_a_worker_that_finishes_before_pysyncobj_renames_still_leaves_the_new_snapshot(tmp_path):
    async def scenario():
        replica = single_voter(tmp_path / "p0")
        group = replica.group
        group.snapshots.on_written = lambda: None  # this test plays pysyncobj's part: no tick may check for it
        try:
            snapshot = str(group.snapshots.path)
            for last in (5, 9):
                tmp = snapshot + ".tmp"
                group.snapshots.write(tmp, ((b"x", last, 1), (b"y", last - 1, 1), set()))
                await asyncio.wrap_future(group.snapshots.job)  # the worker is done first...
                os.replace(tmp, snapshot)  # ...then pysyncobj renames its placeholder (Serializer.serialize)
                assert group.snapshots.state() == SERIALIZER_STATE.SUCCESS
                assert snapshot_file.read_meta(snapshot).last_entry[1] == last
        finally:
            replica.close()

    asyncio.run(scenario())


def test_a_restart_between_the_snapshot_rename_and_the_journal_compaction_keeps_the_entries_after_it(tmp_path):
    """Found by the chaos harness (kill all): pysyncobj cleared such a journal down to the snapshot."""
    folder = tmp_path / "p0"
    journal_dir = folder / "journal"

    async def run(proposals: int, compact_after: int | None = None, journal_before_compaction: Path | None = None):
        replica = single_voter(folder)
        journal = replica.group._journal
        try:
            await until(lambda: replica.role == Role.LEADER)
            for i in range(proposals):
                done = asyncio.get_running_loop().create_future()
                replica.propose(encode_proposal([Put(b"k%03d" % i, b"v")]),
                                lambda result, reason, done=done: done.set_result(reason))
                assert await done == Outcome.APPLIED
                if i == compact_after:
                    shutil.copytree(journal_dir, journal_before_compaction)  # what a kill would have left
                    replica.group.compact()
                    await until(lambda: journal[0][1] > 1)  # snapshot renamed, journal compacted
            return journal[:]
        finally:
            replica.close()

    async def scenario():
        kept = tmp_path / "journal-before-compaction"
        full_log = await run(proposals=40, compact_after=19, journal_before_compaction=kept)
        # the crash state: the new snapshot, and the journal as it was before its compaction,
        # with the entries appended after the snapshot (they were appended to that journal)
        shutil.rmtree(journal_dir)
        shutil.copytree(kept, journal_dir)
        journal = RaftJournal(journal_dir, fsync=False)
        for entry in full_log:
            if entry[1] > journal[-1][1]:
                journal.add(*entry)
        journal._destroy()
        after_restart = await run(proposals=0)  # (as leader again, it adds a no-op entry of a new term)
        snapshot_prev = snapshot_file.read_meta(str(folder / "raft.snapshot")).prev_entry[1]
        assert after_restart[0][1] == snapshot_prev
        # every entry after the snapshot is still there
        assert [e for e in after_restart if e[1] <= full_log[-1][1]] == [e for e in full_log if e[1] >= snapshot_prev]

    asyncio.run(scenario())


def test_in_fsync_mode_the_snapshot_rename_is_durable_before_the_journal_is_compacted(tmp_path, monkeypatch):
    """A power loss must not leave a journal compacted past the snapshot file on disk (which cannot be
    produced for real here: the order of the directory sync and the compaction is what is checked)."""
    events: list[str] = []
    monkeypatch.setattr("raftkv.raft.syncobj_snapshots.fsync_directory", lambda d: events.append(f"sync {Path(d).name}"))

    async def scenario():
        replica = single_voter(tmp_path / "p0", fsync=True)
        journal = replica.group._journal
        compact = journal.deleteEntriesTo
        monkeypatch.setattr(journal, "deleteEntriesTo", lambda to: (events.append("compact"), compact(to)))
        try:
            await until(lambda: replica.role == Role.LEADER)
            for i in range(5):
                done = asyncio.get_running_loop().create_future()
                replica.propose(encode_proposal([Put(b"k%d" % i, b"v")]), lambda r, reason: done.set_result(reason))
                await done
            replica.group.compact()
            await until(lambda: "compact" in events)
        finally:
            replica.close()

    asyncio.run(scenario())
    assert events.index("sync p0") < events.index("compact")


def test_a_snapshot_finished_after_a_newer_one_was_installed_does_not_replace_it(tmp_path):
    """A replica's own snapshot, still being written when a leader's newer one was installed, was renamed
    over it. At the next start pysyncobj found the journal beginning after that older snapshot and
    cleared it down to it: the log rewound below the database (docs/chaos.md)."""
    folder = tmp_path / "p0"

    async def scenario():
        replica = single_voter(folder)
        group, journal = replica.group, replica.group._journal
        busy = threading.Event()
        try:
            await until(lambda: replica.role == Role.LEADER)
            await put(replica, range(20))
            group.compact()  # the state machine's flush goes to the writer first, then
            snapshot_writer().submit(busy.wait)  # the writer is busy: this replica's snapshot waits
            await until(lambda: group.snapshots.job is not None)
            await put(replica, range(20, 40))
            # a leader's newer snapshot arrives: pysyncobj renames it over the snapshot file and
            # loads it, clearing the journal down to its last two entries
            received = tmp_path / "received"
            received.mkdir()
            meta = snapshot_file.Meta(partition=0, position=replica.engine.checkpoint(received / "db"),
                                      last_entry=journal[-1], prev_entry=journal[-2], cluster=[])
            snapshot_file.write(group.snapshots.path.with_suffix(".received"), received / "db", meta, fsync=False)
            os.replace(group.snapshots.path.with_suffix(".received"), group.snapshots.path)
            group._member._SyncObj__loadDumpFile(clearJournal=True)
            busy.set()
            await until(lambda: group.snapshots.job is None)
            assert snapshot_file.read_meta(group.snapshots.path).last_entry == meta.last_entry
        finally:
            busy.set()
            replica.close()
        replica = single_voter(folder)  # restarted: the log must still reach the database's position
        try:
            await until(lambda: replica.role == Role.LEADER)
            await put(replica, range(40, 41))
            assert replica.engine.position.index > meta.last_entry[1]
        finally:
            replica.close()

    asyncio.run(scenario())


def test_a_restart_while_a_received_snapshot_was_checked_puts_the_own_one_back(tmp_path):
    """The last chunk of a received snapshot replaces this replica's own, kept aside until the log is
    found to cover it (PatchedSyncObj); a crash in between left the older, received one in place, and
    pysyncobj cleared the journal, which began after it, down to it."""
    folder = tmp_path / "p0"

    async def scenario():
        replica = single_voter(folder)
        group, journal = replica.group, replica.group._journal
        try:
            await until(lambda: replica.role == Role.LEADER)
            await put(replica, range(20))
            group.compact()
            await until(lambda: journal[0][1] > 1)
            older = tmp_path / "older.snapshot"  # as a leader sends one: the database in the tar
            meta = snapshot_file.read_meta(group.snapshots.path)
            snapshot_file.write(older, snapshot_file.kept_checkpoint(group.snapshots.path, meta) / "db",
                                replace(meta, in_place=False, checkpoint=None))
            first = journal[0][1]
            await put(replica, range(20, 40))
            group.compact()
            await until(lambda: journal[0][1] > first)
            os.link(group.snapshots.path, f"{group.snapshots.path}{KEPT_ASIDE}")  # the crash state
            os.replace(older, group.snapshots.path)
            entries = journal[:]
        finally:
            replica.close()
        replica = single_voter(folder)
        try:
            await until(lambda: replica.role == Role.LEADER)
            assert replica.group._journal[:len(entries)] == entries
            await put(replica, range(40, 41))
        finally:
            replica.close()

    asyncio.run(scenario())


async def put(replica: PartitionReplica, keys: range) -> None:
    for i in keys:
        done = asyncio.get_running_loop().create_future()
        replica.propose(encode_proposal([Put(b"k%03d" % i, b"v")]), lambda r, reason: done.set_result(reason))
        assert await asyncio.wait_for(done, 10) == Outcome.APPLIED


def test_a_compaction_on_a_slow_disk_syncs_on_the_worker_while_the_loop_serves_writes(tmp_path):
    """A compaction synced the node's log on the event loop: on a slow disk (test_chaos's fsync fault) py-spy
    caught the loop held for two fsyncs, about 10 s, and every peer took the node's connections for dead."""

    async def scenario():
        logs = ReplicaLogs(tmp_path / "raft-log", fsync=False)
        replica = single_voter(tmp_path / "p0", node_log=logs)
        group = replica.group
        try:
            await until(lambda: replica.role == Role.LEADER)
            # From here every fsync of the log takes 8 s: whichever thread first syncs the writes below
            # (the compaction's, or the once-a-second syncer's, which the compaction's then waits for).
            failpoints.arm("journal-fsync-before", "delay(8000)")
            armed = asyncio.get_running_loop().time()
            await put(replica, range(5))  # a tick each: about 0.5 s
            group.compact()
            await until(lambda: group.snapshots.job is not None)
            job = group.snapshots.job
            await put(replica, range(5, 10))
            assert asyncio.get_running_loop().time() - armed < 4, "the loop waited for the compaction's sync"
            assert not job.done()
            failpoints.disarm_all()
            await until(lambda: group.snapshots.job is None and (group.snapshots.last_index() or 0) >= 5)
        finally:
            failpoints.disarm_all()
            replica.close()
            logs.close()

    asyncio.run(scenario())


def test_a_restart_after_a_kill_during_the_first_compaction_is_quiet_and_keeps_the_data(tmp_path, caplog):
    """A kill -9 while a replica's first snapshot was written leaves pysyncobj's placeholder, an empty file,
    as the snapshot file; the journal was not compacted yet. pysyncobj failed to load it at the restart
    ("failed to load full dump", an ERROR with a traceback) and then went on from the journal, as designed."""
    folder = tmp_path / "p0"

    async def scenario():
        replica = single_voter(folder)
        try:
            await until(lambda: replica.role == Role.LEADER)
            await put(replica, range(20))
        finally:
            replica.close()
        open(folder / "raft.snapshot", "wb").close()  # the crash state
        replica = single_voter(folder)
        journal = replica.group._journal
        try:
            await until(lambda: replica.role == Role.LEADER)
            await put(replica, range(20, 21))
            assert [replica.engine.get(b"k%03d" % i) for i in range(21)] == [b"v"] * 21
            replica.group.compact()
            await until(lambda: journal[0][1] > 1)  # and its next compaction succeeds
        finally:
            replica.close()

    with caplog.at_level(logging.INFO):
        asyncio.run(scenario())
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_resting_group_finishes_its_compaction_when_the_snapshot_is_written(tmp_path):
    """Only a tick finds the written snapshot and drops the log before it, and a resting group has no
    periodic ticks: at a load of 20 a learner's compaction once waited past 20 s for a tick that only
    a write would have brought."""

    async def scenario():
        voter = single_voter(tmp_path / "voter")
        gate = threading.Event()
        try:
            await until(lambda: voter.role == Role.LEADER)
            await put(voter, range(30))
            await until(lambda: voter.group.quiet.resting)
            voter.group.compact()  # the state machine's flush goes to the worker first, then
            snapshot_writer().submit(gate.wait, 10)  # the worker is busy: the snapshot waits behind this
            await until(lambda: voter.group.snapshots.job is not None)
            assert voter.group.quiet.resting and voter.group.log_entries > 2
            gate.set()
            await until(lambda: voter.group.log_entries <= 2, timeout=5.0)
        finally:
            gate.set()
            voter.close()

    asyncio.run(scenario())


def _a_snapshot(tmp_path: Path, position: Position = Position(7, 1)) -> Path:
    engine = RocksEngine(tmp_path / "checkpoint")
    engine.write([Put(b"k%03d" % i, b"v" * 100) for i in range(200)], position)
    engine.flush()
    engine.checkpoint(tmp_path / "cp")
    engine.close()
    meta = snapshot_file.Meta(0, position, (b"c", position.index, position.term),
                              (b"p", position.index - 1, position.term), ["127.0.0.1:1"])
    snapshot_file.write(tmp_path / "raft.snapshot", tmp_path / "cp", meta)
    return tmp_path / "raft.snapshot"


def test_a_snapshot_whose_table_file_was_damaged_is_not_unpacked(tmp_path):
    """A chaos run: a leader's damaged snapshot, installed by a wiped follower, stopped it on a corrupt
    database at every start. The tar checks its headers only; the digests catch the table file."""
    path = _a_snapshot(tmp_path)
    with tarfile.open(path) as tar:
        sst = next(m for m in tar.getmembers() if m.name.endswith(".sst"))
    data = bytearray(path.read_bytes())
    data[sst.offset_data + sst.size // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert snapshot_file.read_meta(path).position == Position(7, 1)  # its head reads as before
    with pytest.raises(CorruptData, match=rf"is damaged: {sst.name} does not match its digest"):
        snapshot_file.extract_db(path, tmp_path / "out")


async def _compacted_leader(folder: Path) -> PartitionReplica:
    """A single voter that leads and has compacted (its checkpoint kept beside the head), whose test asks
    `sendable` itself: no tick does on its behalf. The caller closes it."""
    replica = single_voter(folder)
    snapshots = replica.group.snapshots
    try:
        await until(lambda: replica.role == Role.LEADER)
        await put(replica, range(50))
        replica.group.compact()
        await until(lambda: snapshots.job is None and snapshots.kept is not None)
    except BaseException:
        replica.close()
        raise
    snapshots.on_written = lambda: None
    return replica


def test_a_compaction_checkpoint_with_a_damaged_block_is_never_packed_and_the_replica_stops(tmp_path):
    """A chaos run: a leader packed its compaction's checkpoint, whose table file was damaged on its disk in a
    block it had never read, and two learners installed it and stopped. The tar's digests are of the files
    as they are: every block is read before packing, and the damage stops this replica instead."""
    folder = tmp_path / "p0"

    async def scenario():
        replica = await _compacted_leader(folder)
        group = replica.group
        try:
            assert damage_table_files(folder / group.snapshots.kept / "db", lambda key: key.startswith(b"k"))
            group.snapshots.withheld(SimpleNamespace(id="127.0.0.1:1"))
            await until(group.snapshots.packing.done)
            with pytest.raises(CorruptData, match=rf"database {folder / 'db'} is corrupt .*checksum mismatch"):
                group.snapshots.sendable()
            assert group.snapshots.in_place and not (folder / "raft.snapshot.full").exists()
        finally:
            replica.close()

    asyncio.run(scenario())


def test_a_snapshot_received_while_the_checkpoint_is_packed_leaves_it_to_the_packer(tmp_path):
    """Reading the checkpoint whole before packing it takes a while. A leader that stepped down meanwhile and
    installed a snapshot from the next one retired that checkpoint: deleted under the reader, it read as
    damage, and the replica would have stopped. (A compaction cannot end meanwhile: its file is written on
    the same worker, after the pack.)"""
    folder = tmp_path / "p0"
    received = _a_snapshot(tmp_path / "received", Position(1000, 9))

    async def scenario():
        replica = await _compacted_leader(folder)
        snapshots = replica.group.snapshots
        try:
            packed, reading, installed = snapshots.kept, threading.Event(), threading.Event()
            checked = snapshots._sm.verify

            def verify_once_installed(checkpoint: Path) -> None:
                reading.set()
                assert installed.wait(30)
                checked(checkpoint)

            snapshots._sm.verify = verify_once_installed
            snapshots.withheld(SimpleNamespace(id="127.0.0.1:1"))
            await until(reading.is_set)
            shutil.copy(received, f"{snapshots.path}.received")
            snapshots.read(f"{snapshots.path}.received")  # pysyncobj's deserializer, as a follower again
            installed.set()
            await until(snapshots.packing.done)
            assert snapshots.packing.exception() is None
            assert snapshots.sendable()  # the tar of the retired checkpoint is dropped; the received file is whole
            await until(lambda: not (folder / packed).exists())
            assert replica.engine.position == Position(1000, 9)
        finally:
            replica.close()

    asyncio.run(scenario())


def test_a_snapshot_of_the_release_before_digests_unpacks_as_before(tmp_path):
    path = _a_snapshot(tmp_path)
    old = tmp_path / "old.snapshot"
    with tarfile.open(path) as tar, tarfile.open(old, "w") as out:
        for member in tar.getmembers():
            if member.name != snapshot_file.DIGESTS:
                out.addfile(member, tar.extractfile(member) if member.isfile() else None)
    db = snapshot_file.extract_db(old, tmp_path / "out")
    engine = RocksEngine(db.parent)
    try:
        assert engine.get(b"k042") == b"v" * 100
    finally:
        engine.close()


def _bytes_written() -> int:
    """What this process (every thread of it: RocksDB's too) has handed to write(2) so far."""
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("wchar:"))


def test_a_compaction_writes_a_few_kilobytes_however_large_the_database(tmp_path):
    """Each compaction wrote the whole database into a tar: a bulk load, compacting every 16 MiB of log,
    wrote each partition's database again and again (at 10M keys the load took 210 s, not 126 s). It keeps
    a checkpoint of hard links beside a file of the head only; the tar is packed when a member needs one."""
    folder = tmp_path / "p0"

    async def scenario():
        replica = single_voter(folder)
        group, journal = replica.group, replica.group._journal
        try:
            await until(lambda: replica.role == Role.LEADER)
            for batch in range(4):  # 4 MB of values that do not compress
                done = asyncio.get_running_loop().create_future()
                puts = [Put(b"k%05d" % (batch * 1000 + i), os.urandom(1000)) for i in range(1000)]
                replica.propose(encode_proposal(puts), lambda r, reason: done.set_result(reason))
                assert await asyncio.wait_for(done, 10) == Outcome.APPLIED
            group.compact()  # the first one flushes the memtable: RocksDB's own write, which any snapshot needs
            await until(lambda: group.snapshots.job is None and journal[0][1] > 1)
            await put(replica, range(10))
            first, before = journal[0][1], _bytes_written()
            group.compact()
            await until(lambda: group.snapshots.job is None and journal[0][1] > first)
            assert _bytes_written() - before < 256 * 1024  # a tar of the database: over 4 MB
        finally:
            replica.close()

    asyncio.run(scenario())
    meta = snapshot_file.read_meta(folder / "raft.snapshot")
    kept = folder / meta.checkpoint / "db"
    assert meta.in_place and (folder / "raft.snapshot").stat().st_size < 64 * 1024
    assert [p.name for p in folder.glob(snapshot_file.KEPT_PREFIX + "*")] == [meta.checkpoint]  # the old one gone
    tables = list(kept.glob("*.sst"))
    assert tables and all((folder / "db" / t.name).stat().st_ino == t.stat().st_ino for t in tables)
    db = snapshot_file.extract_db(folder / "raft.snapshot", tmp_path / "out")  # what a roll-back installs
    engine = RocksEngine(db.parent)
    try:
        assert engine.position == meta.position and len(engine.get(b"k03999")) == 1000
    finally:
        engine.close()


def test_a_checkpoint_folder_no_snapshot_file_names_is_deleted_when_the_replica_opens(tmp_path):
    """A kill -9 after a compaction's checkpoint was made and before its head was renamed in (or before the
    previous checkpoint was deleted, or while a tar was packed) leaves what no file names: deleted at the
    next open. The one the snapshot kept aside names stays: it may go back (`settle_kept_aside`)."""
    folder = tmp_path / "p0"
    for name in ("snapshot-current", "snapshot-aside", "snapshot-crashed", "checkpoint-of-0.2"):
        (folder / name / "db").mkdir(parents=True)
    head = snapshot_file.Meta(0, Position(7, 1), (b"c", 7, 1), (b"p", 6, 1), [], in_place=True,
                              checkpoint="snapshot-current")
    snapshot_file.write_head(folder / "raft.snapshot", head)
    snapshot_file.write_head(folder / f"raft.snapshot{KEPT_ASIDE}", replace(head, checkpoint="snapshot-aside"))
    (folder / "raft.snapshot.full").write_bytes(b"half a tar")
    snapshots = SnapshotFiles(0, folder, state_machine=None)
    assert snapshots.kept == "snapshot-current" and snapshots.in_place and not snapshots.seeded
    assert sorted(p.name for p in folder.iterdir()) == ["raft.snapshot", f"raft.snapshot{KEPT_ASIDE}",
                                                        "snapshot-aside", "snapshot-current"]
