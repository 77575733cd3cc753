"""Quiescence: an idle group rests (no ticks, no heartbeats), and whatever needs it wakes it.

Real pysyncobj members in one process, each behind a Raft hub of its own as if it were a node
(tests/loopback_hubs.py). The safety half, that a resting group still elects a new leader when its
leader's node goes, is also checked on real node processes in tests/test_quiescence_cluster.py.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import pysyncobj.syncobj

from raftkv.core.spec import Tuning
from raftkv.dev.local_cluster import free_port_block
from raftkv.raft.group import Outcome, Role
from raftkv.raft.hub import Directory, RaftHub
from raftkv.raft.quiescence import SETTLE_HEARTBEATS, LeaderState, Settling, follower_may_rest
from raftkv.raft.syncobj_group import GroupConfig, SyncObjGroup
from tests.engine_sim.clock import Scheduler, SimLoop, virtual_time
from tests.loopback_hubs import LoopbackHubs
from tests.raft_scenarios import DictStateMachine
from tests.test_snapshot_writer import until

TUNING = Tuning()


class Members:
    def __init__(self, tmp_path, hubs: LoopbackHubs, addresses: list[str]):
        self._tmp_path = tmp_path
        self.hubs = hubs
        self.addresses = addresses
        self.groups: dict[str, SyncObjGroup] = {}
        self.machines: dict[str, DictStateMachine] = {}
        self.ticks: dict[str, int] = {}

    def open(self, address: str) -> SyncObjGroup:
        config = GroupConfig(partition=0, hub=self.hubs.hub(address), self_address=address,
                             peers=tuple(a for a in self.addresses if a != address),
                             folder=self._tmp_path / address.replace(":", "_"), fsync=False, tuning=TUNING)
        machine = self.machines[address] = DictStateMachine()
        group = self.groups[address] = SyncObjGroup(config, machine, asyncio.get_running_loop())
        self.ticks[address] = 0
        tick = group._ticker._tick

        def counted() -> None:
            self.ticks[address] += 1
            tick()

        group._ticker._tick = counted
        return group

    def leader(self) -> SyncObjGroup | None:
        leaders = [g for g in self.groups.values() if g.role == Role.LEADER]
        return leaders[0] if len(leaders) == 1 else None

    async def rested(self) -> tuple[SyncObjGroup, int]:
        """Once every member rests: the leader, and its term."""
        await until(self.all_resting, timeout=10)
        return self.leader(), self.leader().term

    def all_resting(self) -> bool:
        return all(g.quiet.resting for g in self.groups.values())

    def settled(self) -> bool:
        leader = self.leader()
        return leader is not None and all(
            g.last_applied == leader.last_log_index and g.leader == leader.config.self_address
            for g in self.groups.values())

    async def outcome(self, group: SyncObjGroup, payload: bytes) -> Outcome:
        done = asyncio.get_running_loop().create_future()
        group.propose(payload, lambda result, o: done.done() or done.set_result(o))
        return await asyncio.wait_for(done, 20)


@asynccontextmanager
async def three_members(tmp_path):
    port = free_port_block(3)
    addresses = [f"127.0.0.1:{port + i}" for i in range(3)]
    hubs = LoopbackHubs(tuning=TUNING)
    hubs.know(*addresses)
    members = Members(tmp_path, hubs, addresses)
    for address in addresses:
        members.open(address)
    try:
        await until(members.settled)
        yield members
    finally:
        for group in members.groups.values():
            group.close()
        await hubs.close()


def test_an_idle_group_rests_and_a_proposal_wakes_it_and_commits(tmp_path):
    async def scenario():
        async with three_members(tmp_path) as members:
            leader, term = await members.rested()
            await asyncio.sleep(0.3)  # the members' answers to the leader's last message may still tick it once
            before = dict(members.ticks)
            await asyncio.sleep(3 * TUNING.election_timeout_max)
            assert members.ticks == before, "a resting group ticked"
            assert members.all_resting() and members.leader() is leader and leader.term == term

            for i in range(5):
                assert await members.outcome(leader, b"k=%d" % i) == Outcome.APPLIED
                await until(lambda: all(m.data.get("k") == str(i) for m in members.machines.values()))
                await until(members.all_resting, timeout=10)
                assert leader.role == Role.LEADER and leader.term == term
                # The default mode's once-a-second sync comes whether or not the group ticks (journal_syncer):
                # in a tick, it would leave a resting member's last entries unsynced about two rounds in three.
                await until(lambda: not any(g._journal._dirty for g in members.groups.values()), timeout=3)

    asyncio.run(scenario())


def test_a_resting_follower_ticked_for_its_own_reasons_never_campaigns(tmp_path):
    async def scenario():
        async with three_members(tmp_path) as members:
            leader, term = await members.rested()
            follower = next(g for g in members.groups.values() if g is not leader)
            for _ in range(3):  # a compaction ticks it without waking it, long after its election timeout
                await asyncio.sleep(TUNING.election_timeout_max)
                follower.compact()
            await until(lambda: follower.quiet.resting)
            assert leader.role == Role.LEADER and leader.term == term

            # a proposal at the follower wakes it, and it wakes its leader, so it does not campaign either
            assert await members.outcome(follower, b"from=follower") == Outcome.APPLIED
            await asyncio.sleep(2 * TUNING.election_timeout_max)
            assert members.leader() is leader and leader.term == term
            await until(members.all_resting, timeout=10)

            # so does a call that only a leader can answer (refused at once, nothing is sent)
            follower.transfer_leadership()
            assert not follower.quiet.resting
            await asyncio.sleep(2 * TUNING.election_timeout_max)
            assert members.leader() is leader and leader.term == term
            await until(members.all_resting, timeout=10)

            # and a resting leader asked to hand over does
            leader.transfer_leadership(follower.config.self_address)
            await until(lambda: members.leader() is follower and members.settled())
            assert await members.outcome(follower, b"new=leader") == Outcome.APPLIED
            await until(members.all_resting, timeout=10)

    asyncio.run(scenario())


def test_resting_followers_elect_a_new_leader_when_their_leaders_node_goes(tmp_path):
    async def scenario():
        async with three_members(tmp_path) as members:
            leader, old_term = await members.rested()
            leader._ticker.stop()  # as if its node froze, then its connections went: no goodbye from the group
            await members.hubs.hub(leader.config.self_address).close()
            del members.groups[leader.config.self_address]

            await until(lambda: members.leader() is not None and members.leader().term > old_term, timeout=15)
            assert await members.outcome(members.leader(), b"after=leader") == Outcome.APPLIED
            leader.close()

    asyncio.run(scenario())


def test_a_replica_that_closes_among_resting_members_wakes_them_and_is_heartbeaten_till_it_is_back(tmp_path):
    async def scenario():
        async with three_members(tmp_path) as members:
            leader, term = await members.rested()

            # a follower goes and comes back while its node (hub) stays up: no election is needed
            follower = next(g for g in members.groups.values() if g is not leader)
            address = follower.config.self_address
            follower.close()
            await until(lambda: not leader.quiet.resting, timeout=5)
            await asyncio.sleep(1.0)
            assert not leader.quiet.resting, "a leader rested while a member did not answer"
            reopened = members.open(address)
            await until(lambda: reopened.leader == leader.config.self_address and members.settled())
            assert leader.term == term and leader.role == Role.LEADER
            await until(members.all_resting, timeout=10)

            # the leader replica closes while its node stays up: its followers must not wait on it
            del members.groups[leader.config.self_address]
            leader.close()
            await until(lambda: members.leader() is not None and members.leader().term > term, timeout=15)
            assert await members.outcome(members.leader(), b"after=close") == Outcome.APPLIED

    asyncio.run(scenario())


def test_a_leader_rests_only_once_settled_for_some_heartbeats_with_every_member_answering():
    settled = LeaderState(last_index=7, commit_index=7, last_applied=7, members_hold_last=True, busy=False)
    settling = Settling(heartbeat_period=0.1)
    assert not settling.may_rest(settled, oldest_answer=0.0, now=10.0)
    assert not settling.may_rest(settled, oldest_answer=10.05, now=10.0 + 0.1 * SETTLE_HEARTBEATS - 0.01)
    assert not settling.may_rest(settled, oldest_answer=9.9, now=11.0), "a member did not answer since"
    assert settling.may_rest(settled, oldest_answer=10.05, now=11.0)
    for unsettled in (LeaderState(8, 7, 7, True, False), LeaderState(7, 7, 6, True, False),
                      LeaderState(7, 7, 7, False, False), LeaderState(7, 7, 7, True, True)):
        assert not settling.may_rest(unsettled, oldest_answer=11.5, now=12.0)
        assert not settling.may_rest(settled, oldest_answer=12.5, now=12.05), "settling starts over"


def test_a_follower_rests_only_on_its_leaders_word_for_the_log_it_holds_committed():
    message = {"type": "quiesce", "term": 3, "index": 10}
    assert follower_may_rest(message, term=3, from_leader=True, last_index=10, commit_index=10)
    assert not follower_may_rest(message, term=3, from_leader=False, last_index=10, commit_index=10)
    assert not follower_may_rest(message, term=4, from_leader=True, last_index=10, commit_index=10)
    assert not follower_may_rest(message, term=3, from_leader=True, last_index=11, commit_index=10)
    assert not follower_may_rest(message, term=3, from_leader=True, last_index=10, commit_index=9)
    assert not follower_may_rest(message, term=3, from_leader=True, last_index=10, commit_index=10, transfer_to_it=True)


def test_on_virtual_time_a_leader_rests_after_settling_for_its_heartbeats_and_then_costs_no_event(tmp_path):
    """The rest decision on the group's clock: a single voter on the simulation's scheduler (pysyncobj's
    clock and ours both), no wall-clock time spent waiting."""
    scheduler = Scheduler()
    loop = SimLoop(scheduler, "g0")
    with virtual_time(scheduler, seed=1, create_journal=pysyncobj.syncobj.createJournal):
        hub = RaftHub(loop, "solo", Directory, None, retry_seconds=0.5, dead_after=3.5, clock=scheduler.time)
        config = GroupConfig(partition=0, hub=hub, self_address="solo:0", peers=(), folder=tmp_path, fsync=False,
                             tuning=TUNING, clock=scheduler.time)
        group = SyncObjGroup(config, DictStateMachine(), loop)
        try:
            settled_at = None
            while not group.quiet.resting and scheduler.now < 10.0:
                scheduler.step()
                if settled_at is None and group.role == Role.LEADER and group.last_applied == group.last_log_index:
                    settled_at = scheduler.now
            assert group.quiet.resting and settled_at is not None
            rest = SETTLE_HEARTBEATS * TUNING.heartbeat_period
            assert rest <= scheduler.now - settled_at <= rest + 2 * TUNING.heartbeat_period
            assert scheduler.step() is None, "a resting group has a timer still"
            done = []
            group.propose(b"k=v", lambda result, outcome: done.append(outcome))  # wakes it
            woke_at = scheduler.now
            while not done and scheduler.now < woke_at + 1.0:
                scheduler.step()
            assert done == [Outcome.APPLIED] and not group.quiet.resting
        finally:
            group.close()
