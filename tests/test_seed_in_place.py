"""A replica seeded in place (`syncobj_seed`): its database is the copy it was sent, its snapshot file names a
checkpoint of the seed beside it, and a crash leaves the old state or the new one (docs/elasticity.md, "One copy").
A seed of 0.2 named none: its file is never sent, and it is checked against the database as it opens."""

from __future__ import annotations

import asyncio
import multiprocessing
import shutil
import signal
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from pysyncobj import SERIALIZER_STATE

from raftkv import failpoints
from raftkv.core.commands import Put
from raftkv.core.errors import CorruptData
from raftkv.core.spec import Tuning
from raftkv.dev.local_cluster import free_port_block
from raftkv.node.replica_copy import drop_unfinished_copies
from raftkv.raft import snapshot_file
from raftkv.raft.group import Outcome, Role
from raftkv.raft.syncobj_group import GroupConfig, SyncObjGroup
from raftkv.raft.syncobj_seed import SEED_CHECKPOINT, seed
from raftkv.raft.syncobj_snapshots import SNAPSHOT_FILE, SnapshotFiles
from raftkv.storage.engine import Position
from raftkv.storage.rocks_engine import RocksEngine
from tests.loopback_hubs import LoopbackHubs
from tests.raft_scenarios import DictStateMachine
from tests.test_snapshot_writer import until
from tests.test_syncobj_seed import raft_bytes_sent

PARTITION = 8  # this module's own metric series
BASE = ((b"\x00p", 4, 2), (b"\x00l", 5, 2))  # the log's entries at the checkpoint, as a member's log holds them


def _checkpoint(tmp_path: Path, staging: Path) -> Position:
    """A real RocksDB checkpoint of a database at entry 5 (term 2), in `staging`/db."""
    engine = RocksEngine(tmp_path / "voter")
    try:
        engine.write([Put(b"k", b"v")], Position(5, 2))
        staging.mkdir(parents=True)
        return engine.checkpoint(staging / "db")
    finally:
        engine.close()


def _seed_crashing_at(point: str, staging: Path, folder: Path, position: Position) -> None:
    failpoints.arm(point, "crash")
    seed(staging, folder, 0, position, BASE, ["127.0.0.1:1"])


@pytest.mark.parametrize("point", ["seed-rename-before", "seed-rename-after"])
def test_a_seed_killed_at_its_fail_points_leaves_an_empty_folder_or_the_whole_replica(tmp_path, point):
    data = tmp_path / "data"
    staging, folder = data / ".copy-p0000", data / "p0000"
    position = _checkpoint(tmp_path, staging)
    folder.mkdir()  # a move's target may have made the replica's folder already
    child = multiprocessing.get_context("fork").Process(target=_seed_crashing_at,
                                                        args=(point, staging, folder, position))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL  # kill -9, exactly at the point

    drop_unfinished_copies(data)  # what the node does when it starts again
    assert sorted(p.name for p in data.iterdir()) == ["p0000"]
    if point == "seed-rename-before":
        assert not any(folder.iterdir())  # the old state: the copy starts again
        return
    assert sorted(p.name for p in folder.iterdir()) == ["db", SNAPSHOT_FILE, SEED_CHECKPOINT]  # the new state, whole
    meta = snapshot_file.read_meta(folder / SNAPSHOT_FILE)
    assert meta.in_place and meta.position == position and (meta.prev_entry, meta.last_entry) == BASE
    assert meta.checkpoint == SEED_CHECKPOINT and not meta.seeded
    for where in (folder, folder / SEED_CHECKPOINT):  # the replica's database is the copy itself; its seed beside
        engine = RocksEngine(where)
        try:
            assert engine.position == position and engine.get(b"k") == b"v"
        finally:
            engine.close()


def test_a_seed_that_fails_before_its_rename_leaves_the_folder_empty(tmp_path):
    data = tmp_path / "data"
    staging, folder = data / ".copy-p0000", data / "p0000"
    position = _checkpoint(tmp_path, staging)
    failpoints.arm("seed-rename-before", "error")
    try:
        with pytest.raises(OSError, match="injected"):
            seed(staging, folder, 0, position, BASE, [])
    finally:
        failpoints.disarm_all()
    assert not folder.exists() and staging.is_dir()  # the caller removes the scratch (`copy_replica`)


def as_a_seed_of_0_2(folder: Path) -> None:
    """The seed's files as 0.2 wrote them: a head that names no checkpoint (the live database is the only copy)."""
    path = folder / SNAPSHOT_FILE
    snapshot_file.write_head(path, replace(snapshot_file.read_meta(path), checkpoint=None))
    shutil.rmtree(folder / SEED_CHECKPOINT)


def _files(tmp_path: Path, position: Position, journal: list) -> SnapshotFiles:
    """The snapshot files of a replica seeded by 0.2 at entry 5, whose database is at `position` and log is
    `journal`."""
    staging = tmp_path / ".copy"
    (staging / "db").mkdir(parents=True)
    seed(staging, tmp_path / "p0000", 0, Position(5, 2), BASE, [])
    as_a_seed_of_0_2(tmp_path / "p0000")
    files = SnapshotFiles(0, tmp_path / "p0000", SimpleNamespace(position=position))
    files.journal = journal
    return files


LOG = [BASE[0], BASE[1], (b"\x00a", 6, 2), (b"\x00b", 7, 3)]


@pytest.mark.parametrize("position, journal", [
    (Position(5, 2), []),  # as the seed left it: its log is still empty
    (Position(7, 3), LOG),  # it applied entries of its log before a restart, or before it reopened as a voter
])
def test_a_seed_of_0_2_opens_on_its_database_at_the_seed_or_past_it_by_its_own_log(tmp_path, position, journal):
    files = _files(tmp_path, position, journal)
    assert files.in_place
    files.before_load()


def _compaction(index: int, term: int) -> snapshot_file.Meta:
    """The head a compaction's worker returns (`SnapshotFiles._finish`), up to entry `index`."""
    return snapshot_file.Meta(partition=0, position=Position(index, term), last_entry=(b"\x00c", index, term),
                              prev_entry=(b"\x00p", index - 1, term), cluster=[], in_place=True, checkpoint="snapshot-test")


def test_a_compaction_up_to_the_entry_of_a_seed_of_0_2_replaces_its_file(tmp_path):
    """A moved replica that leads before any entry after its seed compacts up to the seed's entry: its
    full snapshot must replace the seed's file, which holds no database and is never sent. It was
    dropped as if a newer one had been installed meanwhile, and the replica withheld snapshots for good
    (found by bench_big: a learner waited for one until its timeout)."""
    files = _files(tmp_path, Position(5, 2), [])
    next_file = files.path.with_name(f"{SNAPSHOT_FILE}.next")
    next_file.write_bytes(b"the compaction's head")  # what its worker wrote, up to entry 5
    job = Future()
    job.set_result(_compaction(5, 2))
    files.job = job
    assert files.state() == SERIALIZER_STATE.SUCCESS
    assert not files.seeded and files.kept == "snapshot-test" and files.path.read_bytes() == b"the compaction's head"


def test_a_compaction_up_to_the_entry_of_a_leader_s_installed_snapshot_is_dropped(tmp_path):
    """The seed's exception goes no further: after a power cut of the whole cluster, a snapshot a leader
    sent up to the same index may hold other entries than this replica's compaction. Renamed over it, that
    compaction made a later roll-back install this replica's lost entries again (a full run's power cuts:
    "committed entry 1098 (term 9) cannot come before its position 1106 (term 7)")."""
    folder, db = tmp_path / "p0000", tmp_path / "db"
    folder.mkdir()
    db.mkdir()
    leaders = snapshot_file.Meta(partition=0, position=Position(5, 3), last_entry=(b"\x00l", 5, 3),
                                 prev_entry=(b"\x00p", 4, 3), cluster=[])
    snapshot_file.write(folder / SNAPSHOT_FILE, db, leaders)
    files = SnapshotFiles(0, folder, SimpleNamespace(position=Position(5, 3)))
    folder.joinpath(f"{SNAPSHOT_FILE}.next").write_bytes(b"this replica's compaction up to entry 5")
    job = Future()
    job.set_result(_compaction(5, 5))
    files.job = job
    assert files.state() == SERIALIZER_STATE.FAILED
    assert snapshot_file.read_meta(files.path).last_entry == (b"\x00l", 5, 3)  # the leader's stays


def test_the_placeholder_of_a_first_snapshot_being_written_is_no_snapshot(tmp_path):
    """A roll-back after a whole-cluster power cut met partition 3's first compaction in progress: its
    empty placeholder was read as a corrupt snapshot and the node stopped (a full run's power cuts)."""
    folder = tmp_path / "p0000"
    folder.mkdir()
    files = SnapshotFiles(0, folder, SimpleNamespace(position=Position(0, 0)))
    files.path.write_bytes(b"")  # as pysyncobj leaves it once `_start` returned for a first snapshot
    assert files.current() is None


@pytest.mark.parametrize("position, journal", [
    (Position(4, 2), LOG),  # behind the seed
    (Position(5, 1), []),  # at the seed's index, in another term
    (Position(7, 2), LOG),  # past it, but not by an entry of its log
    (Position(9, 3), LOG),  # past its log
])
def test_a_seed_of_0_2_whose_database_is_not_where_it_left_it_stops_with_one_line(tmp_path, position, journal):
    files = _files(tmp_path, position, journal)
    with pytest.raises(CorruptData, match=r"not where its seed left it \(5, term 2\).*move .*p0000 away") as error:
        files.before_load()
    assert "\n" not in str(error.value)


async def _lead(members: list[SyncObjGroup], member: SyncObjGroup) -> None:
    """Hand leadership to `member` (pysyncobj's transfer is best effort, and a loaded machine may elect another
    leader meanwhile: the one leading is asked again after a while, not at once, which would start election
    after election)."""
    for _ in range(10):
        for leader in (m for m in members if m.role == Role.LEADER and m is not member):
            leader.transfer_leadership(member.config.self_address)
        try:
            return await until(lambda: member.role == Role.LEADER, timeout=2.0)
        except AssertionError:
            continue
    raise AssertionError(f"{member.config.self_address} never took the lead")


def _sent(kind: str) -> float:
    return raft_bytes_sent(PARTITION, kind)


class _FailsFirstCheckpoint(DictStateMachine):
    """Its first checkpoint fails (as a full disk would make it): the compaction when it opens writes nothing."""

    checkpoints = 0

    def checkpoint(self, dest, last):
        self.checkpoints += 1
        if self.checkpoints == 1:
            raise OSError("no room for a checkpoint")
        return super().checkpoint(dest, last)


@pytest.mark.parametrize("release", ["0.3", "0.2"])
def test_a_seeded_voter_sends_a_snapshot_only_with_a_database(tmp_path, release):
    """A move's steps on real pysyncobj members: a replica seeded in place catches up as a learner, is added,
    reopens as a voter on the same folder and is made leader; then a new learner needs a snapshot. A seed of
    0.3 names its checkpoint: the voter sends a tar packed from it, with no compaction. A seed of 0.2 named
    none: the voter compacts at once when it opens; that first compaction fails here, so it holds only the
    seed's file, and sends none (pysyncobj would have sent the file) until a compaction writes one with its
    database, then that one."""

    async def scenario():
        loop = asyncio.get_running_loop()
        port = free_port_block(4)
        addresses = [f"127.0.0.1:{port + i}" for i in range(3)]
        new = f"127.0.0.1:{port + 3}"
        hubs = LoopbackHubs(group=PARTITION)
        hubs.know(*addresses, new)

        def config(name: str, address: str | None, peers) -> GroupConfig:
            return GroupConfig(partition=PARTITION, hub=hubs.hub(address), self_address=address, peers=tuple(peers),
                               folder=tmp_path / name, fsync=False, tuning=Tuning(), membership_changes=True)

        groups = {a: SyncObjGroup(config(f"n{i}", a, [p for p in addresses if p != a]), DictStateMachine(), loop)
                  for i, a in enumerate(addresses)}
        opened: list[SyncObjGroup] = []

        async def done(call) -> Outcome:
            future = loop.create_future()
            call(lambda result, outcome: future.set_result(outcome))
            return await asyncio.wait_for(future, 20)

        try:
            await until(lambda: sum(g.role == Role.LEADER for g in groups.values()) == 1)
            leader = next(g for g in groups.values() if g.role == Role.LEADER)
            for i in range(30):
                assert await done(lambda cb: leader.propose(f"k{i}=v".encode(), cb)) == Outcome.APPLIED
            source = next(g for g in groups.values() if g is not leader)
            source_machine = source._sm
            position = source_machine.position
            source_machine.checkpoint(tmp_path / ".copy-new" / "db", position)
            seed(tmp_path / ".copy-new", tmp_path / "new", PARTITION, position, source.log_base_at(position.index),
                 addresses)
            if release == "0.2":
                as_a_seed_of_0_2(tmp_path / "new")

            learner = SyncObjGroup(config("new", None, addresses), DictStateMachine.at(tmp_path / "new" / "db"), loop)
            opened.append(learner)
            await until(lambda: learner.last_applied >= leader.commit_index)
            assert await done(lambda cb: leader.add_member(new, cb)) == Outcome.APPLIED
            opened.remove(learner)
            learner.close()  # and reopened as a voter on the same folder, as a move's target is
            machine = _FailsFirstCheckpoint.at(tmp_path / "new" / "db")  # the database as the seed left it
            voter = SyncObjGroup(config("new", new, addresses), machine, loop)
            opened.append(voter)
            if release == "0.2":
                await until(lambda: machine.checkpoints == 1)  # the compaction when it opened, which failed
            assert voter.snapshots.in_place
            await until(lambda: voter.last_applied >= leader.commit_index)
            await _lead(list(groups.values()), voter)

            snapshots = _sent("snapshot")
            late = SyncObjGroup(config("late", None, addresses + [new]), DictStateMachine(), loop)
            opened.append(late)
            if release == "0.3":
                await until(lambda: late._sm.data == machine.data)
                assert _sent("snapshot") > snapshots and machine.checkpoints == 0
                return
            await until(lambda: voter.snapshots.withheld_count >= 3)  # three heartbeats that would have sent the file
            assert voter.snapshots.in_place and _sent("snapshot") == snapshots and not late._sm.data
            assert late.leader == new and late.leader_commit_index == voter.commit_index  # it heard them

            voter.compact()
            await until(lambda: not voter.snapshots.in_place)
            assert not snapshot_file.read_meta(voter.snapshots.path).in_place
            await until(lambda: late._sm.data == machine.data)
            assert _sent("snapshot") > snapshots
        finally:
            for g in list(groups.values()) + opened:
                g.close()
            await hubs.close()

    asyncio.run(scenario())
