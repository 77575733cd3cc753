"""A node whose disk fills up never acknowledges what it could not store, lets another replica lead,
and catches up once space is back (found by the chaos harness, docs/chaos.md)."""

from __future__ import annotations

import os

import pytest

from raftkv import Client, StorageFull, Undetermined, Unavailable
from raftkv.chaos.small_disk import SmallDisk
from tests.conftest import wait_until
from tests.raft_admin import lead, leader_of, statuses

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")


def test_a_leader_whose_disk_fills_refuses_writes_hands_leadership_on_and_recovers(make_cluster):
    cluster = make_cluster(nodes=3, partitions=1, start=False)
    disk = SmallDisk(cluster.spec.node("n1").data_dir, size_mb=64)
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=60)
        lead(cluster, 0, "n1")
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


def test_a_follower_whose_disk_fills_under_the_node_engine_falls_back_and_catches_up(make_cluster):
    """The chaos diskfull fault with the node engine: a follower's engine appended the leader's entries
    into a full disk, and StorageFull escaped into the hub, which logged a traceback and dropped the
    connection. The group goes back to pysyncobj, which stores the entries again once there is room."""
    cluster = make_cluster(nodes=3, partitions=1, start=False, raft_engine="steady")
    disk = SmallDisk(cluster.spec.node("n1").data_dir, size_mb=64)
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=60)
        if leader_of(cluster.endpoints) == "n1":
            lead(cluster, 0, "n2")
        with Client(cluster.endpoints, timeout=5) as kv:
            for i in range(50):  # the leader hands the group to its engine
                kv.put(b"before-%d" % i, b"%d" % i)
            disk.fill()
            for i in range(300):  # n2 and n3 acknowledge; n1's engine appends into the full disk
                kv.put(b"during-%d" % i, b"x" * 512)
            assert cluster.exited() == {}
            disk.free()
            kv.put(b"after", b"1")

        def n1_caught_up() -> bool:
            applied = {node: ps.applied_index for node, ps in statuses(cluster.endpoints)}
            return applied.get("n1") == max(applied.values())

        wait_until(n1_caught_up, 30, "n1 to catch up once its disk has room")
        log = cluster.log_path("n1").read_text()  # on the small disk: gone once it is unmounted
        assert "disk full" in log and "Traceback" not in log, log[-3000:]
    finally:
        for node_id in list(cluster.procs):
            cluster.kill(node_id)
        disk.close()
