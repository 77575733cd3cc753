"""The commit index rides on the next entry instead of an AppendEntries of its own.

Unbatched pysyncobj sends a leader's every entry to each replica and, once
applied, an empty AppendEntries with the new commit index; each is answered.
PartitionReplica leaves the empty one out when group commit has already
queued its next batch (docs/pysyncobj.md). Three real replicas on one event
loop, on loopback, under a steady stream of writes.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from raftkv.commands import Put
from raftkv.engine import KeyRange
from raftkv.group_commit import PartitionFrontend
from raftkv.local_cluster import free_port_block
from raftkv.spec import Tuning
from raftkv.syncobj_replica import PartitionReplica, Role

WRITERS, PUTS_EACH = 32, 40


async def write_through_a_group(folder) -> tuple[Counter, list[set[bytes]]]:
    """(leader's AppendEntries sent, with and without entries; each replica's keys afterwards)."""
    loop = asyncio.get_running_loop()
    base = free_port_block(3)
    addresses = [f"127.0.0.1:{base + i}" for i in range(3)]
    replicas = [PartitionReplica(partition=0, self_address=a, peer_addresses=[p for p in addresses if p != a],
                                 folder=folder / f"r{i}", fsync=False, tuning=Tuning(), loop=loop)
                for i, a in enumerate(addresses)]
    try:
        leader = await _leader(replicas)
        sent: Counter = Counter()
        transport = leader._SyncObj__transport
        upstream_send = transport.send

        def counting_send(node, message):
            if message.get("type") == "append_entries" and "entries" in message:
                sent["entries" if message["entries"] else "empty"] += 1
            return upstream_send(node, message)

        transport.send = counting_send
        frontend = PartitionFrontend(leader, loop, max_batch_ops=4096, max_batch_bytes=1 << 20, request_timeout=10.0,
                                     leader_id_of=lambda address: None)

        async def writer(w: int) -> None:
            for i in range(PUTS_EACH):
                await frontend.submit(Put(b"k%02d-%03d" % (w, i), b"v"))

        await asyncio.wait_for(asyncio.gather(*(writer(w) for w in range(WRITERS))), 60)
        await _until(lambda: all(r.engine.position.index >= leader.engine.position.index for r in replicas))
        return sent, [{k for k, _ in r.engine.scan(KeyRange())[1]} for r in replicas]
    finally:
        for r in replicas:
            r.close()


async def _leader(replicas: list[PartitionReplica]) -> PartitionReplica:
    await _until(lambda: any(r.role == Role.LEADER for r in replicas))
    leader = next(r for r in replicas if r.role == Role.LEADER)
    await _until(lambda: leader.raftLastApplied >= 1)  # its no-op entry is committed
    return leader


async def _until(condition, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_a_queued_batch_carries_the_commit_index_and_every_write_still_lands(tmp_path):
    sent, keys_per_replica = asyncio.run(write_through_a_group(tmp_path))
    # Without the change there is one empty message per entry message; what is left are
    # heartbeats and the moments group commit had nothing queued.
    assert sent["entries"] > 50
    assert sent["empty"] < 0.5 * sent["entries"], sent
    expected = {b"k%02d-%03d" % (w, i) for w in range(WRITERS) for i in range(PUTS_EACH)}
    assert keys_per_replica == [expected] * 3
