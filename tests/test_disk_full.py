"""A node whose disk fills up never acknowledges what it could not store, lets another replica lead,
and catches up once space is back (found by the chaos harness, docs/chaos.md)."""

from __future__ import annotations

import os

import pytest

from raftkv import Client, StorageFull, Undetermined, Unavailable
from raftkv.chaos.small_disk import SmallDisk
from tests.conftest import wait_until
from tests.raft_admin import leader_of, statuses, transfer_leadership

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")


def test_a_leader_whose_disk_fills_refuses_writes_hands_leadership_on_and_recovers(make_cluster):
    cluster = make_cluster(nodes=3, partitions=1, start=False)
    disk = SmallDisk(cluster.spec.node("n1").data_dir, size_mb=64)
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=60)
        if leader_of(cluster.endpoints) != "n1":
            transfer_leadership(cluster.spec, 0, "n1")
            wait_until(lambda: leader_of(cluster.endpoints) == "n1", 20, "n1 to lead")
        acknowledged = {}
        with Client(cluster.endpoints, timeout=3) as kv:
            for i in range(50):
                kv.put(b"before-%d" % i, b"%d" % i)
                acknowledged[b"before-%d" % i] = b"%d" % i
            disk.fill()
            outcomes = []

            def write() -> bool:
                key = b"during-%d" % len(outcomes)
                try:
                    kv.put(key, b"x" * 512)
                except (StorageFull, Undetermined, Unavailable) as error:
                    outcomes.append(type(error).__name__)
                    return False
                acknowledged[key] = b"x" * 512
                outcomes.append("ok")
                return True

            # the files' last pages still take a few writes; then n1 refuses
            wait_until(lambda: not write(), 30, "n1 to run out of space")
            wait_until(lambda: write() and leader_of(cluster.endpoints) != "n1", 20,
                       "a write acknowledged by a new leader")
            assert cluster.exited() == {}
            disk.free()
            for key, value in acknowledged.items():
                assert kv.get(key) == value

        def n1_caught_up() -> bool:
            applied = {node: ps.applied_index for node, ps in statuses(cluster.endpoints)}
            return applied.get("n1") == max(applied.values())

        wait_until(n1_caught_up, 30, "n1 to catch up once its disk has room")
    finally:
        for node_id in list(cluster.procs):
            cluster.kill(node_id)
        disk.close()
