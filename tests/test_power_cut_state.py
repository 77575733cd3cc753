"""A replica whose database a power cut left further than its Raft log (the default mode)."""

from __future__ import annotations

import asyncio
import logging
import shutil
from dataclasses import replace

import pytest

from raftkv.core.commands import Put
from raftkv.core.log_codec import encode_proposal
from raftkv.core.spec import Tuning
from raftkv.dev.local_cluster import free_port_block
from raftkv.node.replica import PartitionReplica
from raftkv.raft.group import Outcome, Role
from raftkv.raft import snapshot_file
from raftkv.raft.journal import RaftJournal
from raftkv.raft.syncobj_seed import seed
from raftkv.raft.syncobj_group import GroupConfig, SyncObjGroup
from raftkv.storage.rocks_engine import RocksEngine
from tests.loopback_hubs import LoopbackHubs
from tests.test_snapshot_writer import single_voter, until

KEYS = [b"k%02d" % i for i in range(16)]


def as_a_tar_of_0_2(folder) -> None:
    """The replica's snapshot file made what 0.1 and 0.2 wrote: the whole database in a tar, no folder beside."""
    path = folder / "raft.snapshot"
    meta = snapshot_file.read_meta(path)
    kept = snapshot_file.kept_checkpoint(path, meta)
    snapshot_file.write(path, kept / "db", replace(meta, in_place=False, checkpoint=None))
    shutil.rmtree(kept)


async def put(leader: PartitionReplica, key: bytes) -> None:
    """`key` set to b"v" through `leader`, applied."""
    done = asyncio.get_running_loop().create_future()
    leader.propose(encode_proposal([Put(key, b"v")]), lambda _, outcome: done.set_result(outcome))
    assert await asyncio.wait_for(done, 10) == Outcome.APPLIED


def data(replica: PartitionReplica) -> dict[bytes, bytes | None]:
    return {key: replica.engine.get(key) for key in KEYS}


@pytest.mark.parametrize("snapshot", [True, "tar of 0.2", False],
                         ids=["from-its-snapshot", "from-a-snapshot-file-of-0.2", "from-empty"])
def test_a_database_a_power_cut_left_past_the_log_is_rolled_back_and_applied_from_the_log(tmp_path, snapshot, caplog):
    """Found by the chaos harness (powerloss:torn, default mode): the kernel wrote the database's last
    writes back and not the journal's. The node stopped on "the Raft log contradicts the database" as
    soon as a new leader's entry took an index the database had applied. A snapshot is the checkpoint a
    compaction keeps, or (a data dir of 0.2) a tar of the database."""
    folder, kept = tmp_path / "p0", tmp_path / "journal-at-the-cut"

    async def run(keys: list[bytes], cut_after: int | None = None) -> dict[bytes, bytes | None]:
        replica = single_voter(folder)
        try:
            await until(lambda: replica.role == Role.LEADER)
            for i, key in enumerate(keys):
                await put(replica, key)
                if snapshot and i == 4:
                    replica.group.compact()
                    await until(lambda: replica.group.snapshots.last_index() is not None)
                if i == cut_after:
                    shutil.copytree(folder / "journal", kept)  # what the journal keeps of a cut here
            return data(replica)
        finally:
            replica.close()

    async def scenario():
        await run(KEYS[:15], cut_after=9)
        if snapshot == "tar of 0.2":
            as_a_tar_of_0_2(folder)
        shutil.rmtree(folder / "journal")
        shutil.copytree(kept, folder / "journal")  # the database kept everything, the journal up to k09
        with caplog.at_level(logging.WARNING, logger="raftkv.raft.state_repair"):
            after = await run(KEYS[15:])
        assert "the database reached entry" in caplog.text
        assert "rolled back" in caplog.text
        assert after == {key: b"v" if key <= b"k09" or key == b"k15" else None for key in KEYS}

    asyncio.run(scenario())


def test_a_seeded_replica_whose_database_a_power_cut_left_past_the_log_rolls_back_to_its_seed(tmp_path, caplog):
    """A soak hour (lose-last-second mode): a move's target, seeded at entry 65,526, applied entries to
    65,567, and a power cut of every node kept its database's writes and lost its log's. Its snapshot
    file was still the seed's (its first compaction was refused while its database was past its commit
    index), which named no checkpoint, and the node stopped at every start: "the database is at entry
    65567 (term 208), not where its seed left it (65526, term 208) or after it in the log". A seed now
    keeps a checkpoint, as a compaction does, and the replica rolls back to it."""
    folder, staging, cut = tmp_path / "new", tmp_path / ".copy-new", tmp_path / "journal-at-the-cut"

    async def scenario():
        loop = asyncio.get_running_loop()
        hubs = LoopbackHubs()
        voter = single_voter(tmp_path / "voter", hubs=hubs)
        address = voter.group.config.self_address

        def seeded() -> PartitionReplica:  # a move's target catching up as a learner
            config = GroupConfig(partition=0, hub=hubs.hub(None), self_address=None, peers=(address,), folder=folder,
                                 fsync=False, tuning=Tuning())
            return PartitionReplica(0, RocksEngine(folder), Tuning(), open_group=lambda sm: SyncObjGroup(config, sm, loop))

        async def write(keys: list[bytes]) -> None:
            for key in keys:
                await put(voter, key)

        replica = None
        try:
            await until(lambda: voter.role == Role.LEADER)
            await write(KEYS[:5])
            staging.mkdir()
            position = voter.engine.checkpoint(staging / "db")
            seed(staging, folder, 0, position, voter.group.log_base_at(position.index), [address])
            replica = seeded()
            shutil.copytree(folder / "journal", cut)  # what the journal keeps of a cut here: the seed's base
            await write(KEYS[5:10])
            await until(lambda: replica.engine.position == voter.engine.position)
            replica.engine.flush_memtable()  # the database durable past the log, as any memtable flush makes it
            replica.close()
            shutil.rmtree(folder / "journal")
            shutil.copytree(cut, folder / "journal")
            with caplog.at_level(logging.WARNING, logger="raftkv.raft.state_repair"):
                replica = seeded()
                await until(lambda: replica.group.last_applied == voter.group.last_applied)
            assert "the database reached entry" in caplog.text and "rolled back to the snapshot at entry" in caplog.text
            assert data(replica) == data(voter) == {key: b"v" if key <= b"k09" else None for key in KEYS}
        finally:
            if replica is not None:
                replica.close()
            voter.close()
            await hubs.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("snapshot, commit_saved, compacted_alone",
                         [(True, True, False), (False, True, False), (True, False, False), (True, False, True)],
                         ids=["from-its-snapshot", "from-empty", "commit-index-not-saved", "compacted-before-the-others-came"])
def test_applied_entries_a_new_leader_replaces_after_a_whole_cluster_cut_are_rolled_back_and_applied_again(
        tmp_path, snapshot, commit_saved, compacted_alone, caplog):
    """Found by the chaos harness (powerloss:cut, default mode, every node cut): two replicas lost the
    last acknowledged entries from journal and database alike (but not the term: it is synced at each
    election), the third kept them in both. A leader of the two wrote other entries at their indices, and the third, which had applied the old ones, stopped
    on "committed entry 529 (term 3) cannot come before its position 529 (term 2)" (its saved commit
    index was below 529); had it saved one above, it refused the leader's entries for ever.

    compacted-before-the-others-came: 0.2.0's power-cut runs, 2 in 6. The keeper, up first, compacted
    while its database was past its commit index: its snapshot "at entry 1029" held the database at 1095,
    and the roll-back to it went nowhere ("committed entry 1081 (term 5) cannot come before its position
    1095 (term 4)")."""
    loop_port = free_port_block(3)
    addresses = [f"127.0.0.1:{loop_port + i}" for i in range(3)]
    keeper = addresses[2]  # the replica whose files kept the entries the others lost
    folders = {address: tmp_path / address.replace(":", "_") for address in addresses}

    async def scenario():
        loop = asyncio.get_running_loop()
        hubs = LoopbackHubs()
        hubs.know(*addresses)
        replicas: dict[str, PartitionReplica] = {}

        def open_replica(address: str) -> None:
            config = GroupConfig(partition=0, hub=hubs.hub(address), self_address=address,
                                 peers=tuple(a for a in addresses if a != address), folder=folders[address],
                                 fsync=False, tuning=Tuning())
            replicas[address] = PartitionReplica(0, RocksEngine(folders[address]), Tuning(),
                                                 open_group=lambda sm: SyncObjGroup(config, sm, loop))

        def close_all() -> None:
            while replicas:
                replicas.popitem()[1].close()

        async def write(keys: list[bytes]) -> PartitionReplica:
            await until(lambda: sum(r.group.role == Role.LEADER for r in replicas.values()) == 1)
            leader = next(r for r in replicas.values() if r.group.role == Role.LEADER)
            for key in keys:
                await put(leader, key)
            await until(lambda: all(r.applied_index >= leader.applied_index for r in replicas.values()))
            return leader

        try:
            for address in addresses:
                open_replica(address)
            await write(KEYS[:5])
            if snapshot:
                replicas[keeper].group.compact()
                await until(lambda: replicas[keeper].group.snapshots.last_index() is not None)
            close_all()
            for address in addresses[:2]:
                shutil.copytree(folders[address], tmp_path / f"cut-{address}")
            for address in addresses:
                open_replica(address)
            leader = await write(KEYS[5:10])  # acknowledged, then lost by the cut on all but the keeper
            term, cut_commit = leader.group.term, replicas[keeper].group.commit_index - 5
            close_all()
            if not commit_saved:
                journal = RaftJournal(folders[keeper] / "journal", fsync=False)
                journal.setRaftCommitIndex(cut_commit)
                journal._destroy()
            if compacted_alone:
                open_replica(keeper)
                member = replicas[keeper].group._member
                await until(lambda: member.raftLastApplied == cut_commit)
                replicas[keeper].maybe_compact(0.0)
                replicas[keeper].maybe_compact(1e9)  # its housekeeping leaves such a log be...
                assert not member._SyncObj__forceLogCompaction
                replicas[keeper].group.compact()  # ...and a compaction asked for anyway is refused
                await until(lambda: not member._SyncObj__forceLogCompaction and replicas[keeper].group.snapshots.job is None)
                close_all()
            for address in addresses[:2]:
                shutil.rmtree(folders[address])
                shutil.copytree(tmp_path / f"cut-{address}", folders[address])
                journal = RaftJournal(folders[address] / "journal", fsync=False)
                journal.setCurrentTerm(term, None)  # synced at the election, in both modes
                journal._destroy()

            for address in addresses[:2]:
                open_replica(address)
            leader = await write(KEYS[10:11])
            with caplog.at_level(logging.WARNING, logger="raftkv.raft.state_repair"):
                open_replica(keeper)
                await until(lambda: replicas[keeper].engine.position == leader.engine.position)
            assert "the leader replaces committed entries" in caplog.text
            assert data(replicas[keeper]) == data(leader) == {
                key: b"v" if key <= b"k04" or key == b"k10" else None for key in KEYS}
        finally:
            close_all()
            await hubs.close()

    asyncio.run(scenario())
