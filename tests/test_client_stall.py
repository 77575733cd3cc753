"""The client keeps one Execute in flight per node, but a stuck one is overtaken.

A partition whose leader cannot reach a quorum holds its request until the
timeout. Requests for the node's healthy partitions must not wait behind it.
Real nodes: 4 nodes, replication 2, so stopping one process (SIGSTOP) leaves
one partition of the leader without a quorum and another one healthy.
"""

from __future__ import annotations

import asyncio
import signal
import time

from raftkv import AsyncClient
from raftkv.core.partitioning import partition_for_key
from tests.conftest import wait_until
from tests.raft_admin import lead, leader_of

PARTITIONS = 4


def key_in(partition: int, tag: str) -> bytes:
    return next(k for i in range(10_000) if partition_for_key(k := b"%s-%d" % (tag.encode(), i), PARTITIONS) == partition)


def test_requests_for_healthy_partitions_overtake_one_stuck_on_a_lost_quorum(make_cluster):
    # n1 hosts partition 0 (with n2) and 3 (with n4); a long fallback keeps n1 leading the stuck one
    cluster = make_cluster(nodes=4, partitions=PARTITIONS, replication=2, leader_fallback_timeout=30.0,
                           request_timeout=10.0)
    for partition in (0, 3):
        wait_until(lambda: leader_of(cluster.endpoints, partition), 30, "a leader")
        lead(cluster, partition, "n1")

    async def scenario() -> tuple[float, bool]:
        async with AsyncClient(cluster.endpoints, timeout=10.0) as kv:
            await kv.put(key_in(0, "warm"), b"v")  # the client knows the leaders
            await kv.put(key_in(3, "warm"), b"v")
            cluster.procs["n2"].send_signal(signal.SIGSTOP)
            stuck = asyncio.ensure_future(kv.put(key_in(0, "stuck"), b"v"))
            try:
                await asyncio.sleep(0)  # it goes out first
                started = time.monotonic()
                for i in range(20):
                    await kv.put(key_in(3, f"healthy{i}"), b"v")
                return time.monotonic() - started, stuck.done()
            finally:
                cluster.procs["n2"].send_signal(signal.SIGCONT)
                stuck.cancel()

    healthy_seconds, stuck_done = asyncio.run(scenario())
    assert not stuck_done  # it was still waiting for a quorum meanwhile
    assert healthy_seconds < 5.0  # not the stuck request's 10 s timeout
