"""The commit index rides on the next batch instead of an AppendEntries of its own.

Unbatched pysyncobj sends a leader's every entry to each replica and, once applied, an empty
AppendEntries with the new commit index; each is answered. Group commit proposes its next batch
from the apply callback, and the group leaves the empty message out while a proposal is queued
(docs/pysyncobj.md). Three real replicas on one event loop, on loopback, under 32 writers.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from raftkv.core.commands import Put
from raftkv.core.spec import Tuning
from raftkv.dev.local_cluster import free_port_block
from raftkv.node.group_commit import PartitionFrontend
from raftkv.node.replica import PartitionReplica
from raftkv.raft.group import Role
from raftkv.raft.syncobj_group import GroupConfig, SyncObjGroup
from raftkv.storage.engine import KeyRange
from raftkv.storage.rocks_engine import RocksEngine
from tests.conftest import until
from tests.loopback_hubs import LoopbackHubs

WRITERS, PUTS_EACH = 32, 40


def replicas_on_one_loop(folder: Path, hubs: LoopbackHubs) -> list[PartitionReplica]:
    loop = asyncio.get_running_loop()
    base = free_port_block(3)
    addresses = [f"127.0.0.1:{base + i}" for i in range(3)]
    hubs.know(*addresses)
    replicas = []
    for i, address in enumerate(addresses):
        config = GroupConfig(partition=0, hub=hubs.hub(address), self_address=address, peers=tuple(a for a in addresses if a != address),
                             folder=folder / f"r{i}", fsync=False, tuning=Tuning())
        replicas.append(PartitionReplica(0, RocksEngine(config.folder), Tuning(),
                                         open_group=lambda sm, config=config: SyncObjGroup(config, sm, loop)))
    return replicas


async def write_through_a_group(folder: Path) -> tuple[Counter, list[set[bytes]]]:
    """(the leader's AppendEntries sent, with entries and empty; each replica's keys afterwards)."""
    hubs = LoopbackHubs()
    replicas = replicas_on_one_loop(folder, hubs)
    try:
        await until(lambda: any(r.role == Role.LEADER for r in replicas))
        leader = next(r for r in replicas if r.role == Role.LEADER)
        await until(lambda: leader.group.last_applied >= 1)  # its no-op entry is committed
        sent: Counter = Counter()
        transport = leader.group._member._SyncObj__transport
        upstream_send = transport.send

        def counting_send(node, message):
            if message.get("type") == "append_entries" and "entries" in message:
                sent["entries" if message["entries"] else "empty"] += 1
            return upstream_send(node, message)

        transport.send = counting_send
        frontend = PartitionFrontend(leader, asyncio.get_running_loop(), max_batch_ops=4096, max_batch_bytes=1 << 20,
                                     request_timeout=10.0, leader_id_of=lambda address: None)

        async def writer(w: int) -> None:
            for i in range(PUTS_EACH):
                await frontend.submit(Put(b"k%02d-%03d" % (w, i), b"v"))

        await asyncio.wait_for(asyncio.gather(*(writer(w) for w in range(WRITERS))), 60)
        await until(lambda: all(r.engine.position.index >= leader.engine.position.index for r in replicas))
        return sent, [{k for k, _ in r.engine.scan(KeyRange())[1]} for r in replicas]
    finally:
        for r in replicas:
            r.close()
        await hubs.close()


def test_a_queued_batch_carries_the_commit_index_and_every_write_still_lands(tmp_path):
    sent, keys_per_replica = asyncio.run(write_through_a_group(tmp_path))
    # Without the change there is one empty message per entry message; what is left are
    # heartbeats and the moments group commit had nothing queued.
    assert sent["entries"] > 50
    assert sent["empty"] < 0.5 * sent["entries"], sent
    expected = {b"k%02d-%03d" % (w, i) for w in range(WRITERS) for i in range(PUTS_EACH)}
    assert keys_per_replica == [expected] * 3
