"""A follower whose log diverges from its leader's is repaired in a few round trips (Raft section 5.3),
with real pysyncobj members over the hub in one process (raftkv/raft/syncobj_patches.py)."""

from __future__ import annotations

import asyncio

from raftkv.dev.local_cluster import free_port_block
from raftkv.raft import syncobj_patches
from raftkv.raft.group import Outcome, Role
from raftkv.raft.syncobj_group import SyncObjGroup
from tests.loopback_hubs import LoopbackHubs
from tests.raft_scenarios import DictStateMachine
from tests.test_snapshot_writer import until
from tests.test_syncobj_group import outcome_of, voter


def test_a_member_whose_log_diverges_for_200_entries_is_resumed_in_a_few_answers_not_one_a_heartbeat(
        tmp_path, monkeypatch):
    """A leader cut off from its followers appends 200 proposals no one else gets; the others elect a
    leader and commit 300 of their own. pysyncobj walks the old leader's log back one entry per heartbeat
    (20 s here; the CI run of stop 44 gave up on a replica after 60 s of it); answered with the term it
    holds there and where that term begins, the new leader goes back past the whole term at once."""
    mismatches = []

    def counting(member, node, message):
        if message["type"] == "next_node_idx" and message["success"] is False and message["reset"] is True:
            mismatches.append(message["next_node_idx"])
        original(member, node, message)

    original = syncobj_patches._originalOnMessageReceived
    monkeypatch.setattr(syncobj_patches, "_originalOnMessageReceived", counting)

    async def scenario():
        loop = asyncio.get_running_loop()
        hubs = LoopbackHubs()
        port = free_port_block(3)
        addresses = [f"127.0.0.1:{port + i}" for i in range(3)]
        hubs.know(*addresses)

        def open_member(address: str) -> SyncObjGroup:
            return voter(hubs, address, addresses, tmp_path / address.replace(":", "_"), DictStateMachine(), loop)

        groups = {a: open_member(a) for a in addresses}
        try:
            await until(lambda: sum(g.role == Role.LEADER for g in groups.values()) == 1 and
                        all(g.last_applied == g.commit_index > 0 for g in groups.values()))
            cut_off = next(a for a, g in groups.items() if g.role == Role.LEADER)
            for a in addresses:
                if a != cut_off:
                    groups.pop(a).close()
            for i in range(200):
                groups[cut_off].propose(b"lost%d=x" % i, lambda result, outcome: None)
            await until(lambda: groups[cut_off].last_log_index >= 200)
            lost_to = groups[cut_off].last_log_index
            groups.pop(cut_off).close()

            groups = {a: open_member(a) for a in addresses if a != cut_off}
            await until(lambda: any(g.role == Role.LEADER for g in groups.values()))
            leader = next(g for g in groups.values() if g.role == Role.LEADER)
            for i in range(300):
                assert await outcome_of(leader.propose, b"kept%d=y" % i) == Outcome.APPLIED
            assert leader.last_log_index > lost_to  # its log holds other entries at every lost one's index

            groups[cut_off] = open_member(cut_off)
            await until(lambda: groups[cut_off].last_applied == leader.last_applied, what="the old leader to resume")
            assert groups[cut_off].term == leader.term and leader.role == Role.LEADER
            assert 1 <= len(mismatches) <= 3, mismatches
        finally:
            for g in groups.values():
                g.close()
            await hubs.close()

    asyncio.run(scenario())
