"""A learner's replica against a real voter, in one process: what it keeps and when it compacts."""

from __future__ import annotations

import asyncio

from learners.feed_pump import FeedPump
from learners.learner_replica import LearnerReplica
from learners.sinks.memory_sink import MemorySink
from raftkv.core.commands import Put
from raftkv.core.log_codec import encode_proposal
from raftkv.core.spec import Tuning
from raftkv.node.replica import PartitionReplica
from raftkv.raft.group import Outcome, Role
from raftkv.raft.syncobj_group import GroupConfig, SyncObjGroup
from raftkv.storage.engine import Position
from raftkv.storage.rocks_engine import RocksEngine
from tests.loopback_hubs import LoopbackHubs
from tests.test_snapshot_writer import single_voter, until


def learner_of(voter: PartitionReplica, hubs: LoopbackHubs, folder, **config) -> LearnerReplica:
    """A learner of `voter`'s group, on this loop; `config`: more GroupConfig fields."""
    loop = asyncio.get_running_loop()
    group = GroupConfig(partition=0, hub=hubs.hub(None), self_address=None, peers=(voter.group.config.self_address,),
                        folder=folder, fsync=False, tuning=Tuning(), **config)
    return LearnerReplica(0, RocksEngine(folder), open_group=lambda copy: SyncObjGroup(group, copy, loop))


async def put(voter: PartitionReplica, key: bytes) -> None:
    done = asyncio.get_running_loop().create_future()
    voter.propose(encode_proposal([Put(key, b"v")]), lambda r, outcome: done.set_result(outcome))
    assert await done == Outcome.APPLIED


def test_a_learner_that_delivered_everything_compacts_its_own_log(tmp_path):
    """Its snapshot lists the group's members; a learner is not one of them (it has no address). A copy
    still behind its log does not ask: its snapshot would be refused, with a warning, at every step."""

    async def scenario():
        hubs = LoopbackHubs()
        voter: PartitionReplica = single_voter(tmp_path / "voter", hubs=hubs)
        learner = learner_of(voter, hubs, tmp_path / "learner")
        try:
            await until(lambda: voter.role == Role.LEADER)
            for i in range(30):
                await put(voter, b"k%02d" % i)
            last = voter.group.last_applied
            await until(lambda: learner.group.last_applied == last)
            asked = []
            learner.group.compact = lambda *args: asked.append(args)
            learner.compact_when_longer_than(10)  # its copy has none of them yet: the snapshot would be refused
            assert asked == []
            del learner.group.compact
            entries = learner.committed_entries(learner.engine.position.index, 1000)
            learner.engine.write([], Position(entries[-1][0], entries[-1][1]))  # as the feed pump does
            learner.compact_when_longer_than(10)
            await until(lambda: learner.group.log_entries <= 2)
        finally:
            learner.close()
            voter.close()
            await hubs.close()

    asyncio.run(scenario())


def test_the_feed_pump_delivers_a_committed_entry_when_the_learner_applies_it_not_at_a_poll(tmp_path):
    """The learner's group tells the pump after each apply step (`after_apply`); the pump polls only as a
    safety net, here once an hour, so a delivery within the deadline came from the wake."""

    async def scenario():
        hubs = LoopbackHubs()
        voter: PartitionReplica = single_voter(tmp_path / "voter", hubs=hubs)
        sink = MemorySink()
        sink.open({"learner": "l1"})
        pump = FeedPump("test", {}, sink)
        learner = learner_of(voter, hubs, tmp_path / "learner", after_apply=lambda: pump.wake(0))
        pump.add(learner)
        stop = asyncio.Event()
        running = asyncio.create_task(pump.run(stop, idle_wait=3600))
        try:
            await until(lambda: voter.role == Role.LEADER)
            for i in range(3):
                await put(voter, b"k%d" % i)
                await until(lambda: [e.key for e in sink.events][-1:] == [b"k%d" % i], timeout=10)
        finally:
            stop.set()
            await running
            learner.close()
            voter.close()
            await hubs.close()

    asyncio.run(scenario())
