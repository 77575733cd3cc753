"""A learner's replica against a real voter, in one process: what it keeps and when it compacts."""

from __future__ import annotations

import asyncio

from learners.learner_replica import LearnerReplica
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


def test_a_learner_that_delivered_everything_compacts_its_own_log(tmp_path):
    """Its snapshot lists the group's members; a learner is not one of them (it has no address). A copy
    still behind its log does not ask: its snapshot would be refused, with a warning, at every step."""

    async def scenario():
        loop = asyncio.get_running_loop()
        hubs = LoopbackHubs()
        voter: PartitionReplica = single_voter(tmp_path / "voter", hubs=hubs)
        config = GroupConfig(partition=0, hub=hubs.hub(None), self_address=None,
                             peers=(voter.group.config.self_address,), folder=tmp_path / "learner", fsync=False,
                             tuning=Tuning())
        learner = LearnerReplica(0, RocksEngine(config.folder),
                                 open_group=lambda copy: SyncObjGroup(config, copy, loop))
        try:
            await until(lambda: voter.role == Role.LEADER)
            for i in range(30):
                done = loop.create_future()
                voter.propose(encode_proposal([Put(b"k%02d" % i, b"v")]), lambda r, outcome: done.set_result(outcome))
                assert await done == Outcome.APPLIED
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
