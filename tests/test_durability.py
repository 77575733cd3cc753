"""Acknowledged writes survive kill -9 of a leader, of every node, and a follower's long absence."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from raftkv import Client, Timeout, Unavailable, Undetermined
from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.core.partitioning import partition_for_key
from tests.conftest import wait_for_compaction, wait_until
from tests.raft_admin import statuses


def leaders(client: Client) -> dict[int, str]:
    found = {}
    for status in client.status():
        for ps in status.partitions:
            if ps.role == "leader":
                found[ps.partition] = status.node_id
    return found


def write_keys(endpoints, keys: list[bytes], acked: dict[bytes, bytes], errors: list, stop: threading.Event):
    with Client(endpoints, timeout=10) as kv:
        for key in keys:
            if stop.is_set():
                return
            value = b"value-of-" + key
            try:
                kv.put(key, value)
                acked[key] = value
            except (Undetermined, Unavailable) as exc:
                errors.append(exc)


def test_leader_kill_during_concurrent_writes(make_cluster):
    cluster = make_cluster(nodes=3, partitions=8)
    keys = [b"key-%05d" % i for i in range(5000)]
    acked: dict[bytes, bytes] = {}
    errors: list = []
    stop = threading.Event()
    threads = [
        threading.Thread(target=write_keys, args=(cluster.endpoints, keys[i::8], acked, errors, stop))
        for i in range(8)
    ]
    for t in threads:
        t.start()
    wait_until(lambda: len(acked) >= 1500, 60, "1500 acknowledged writes")
    with Client(cluster.endpoints) as kv:
        victim = leaders(kv)[0]
    killed_at = time.monotonic()
    cluster.kill(victim)

    # a write to the victim's partition succeeds again within 5 s
    probe_keys = (b"probe-%d" % i for i in range(10**6))
    probe = next(k for k in probe_keys if partition_for_key(k, 8) == 0)
    survivors = [n.api_address for n in cluster.spec.nodes if n.id != victim]
    with Client(survivors, timeout=5) as kv:
        def probe_write():
            try:
                kv.put(probe, b"after-kill")
                return time.monotonic()
            except (Undetermined, Unavailable):
                return None

        resumed_at = wait_until(probe_write, 15, "a write to partition 0 after the leader was killed")
    assert resumed_at - killed_at <= 5.0, f"writes resumed after {resumed_at - killed_at:.1f}s"

    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert len(acked) >= 4000, f"only {len(acked)} of 5000 writes acknowledged ({len(errors)} errors)"
    with Client(survivors) as kv:
        lost = [k for k, v in acked.items() if kv.get(k) != v]
    assert not lost, f"{len(lost)} acknowledged writes lost, e.g. {lost[:5]}"


@pytest.mark.parametrize("durability", ["lose-last-second", "fsync"])
def test_kill_all_nodes_and_restart(make_cluster, durability):
    cluster = make_cluster(nodes=3, partitions=4, durability=durability)
    with Client(cluster.endpoints) as kv:
        for i in range(300):
            kv.put(b"k%04d" % i, b"v%d" % i)
        kv.delete(b"k0007")
    for node_id in cluster.spec.node_ids:
        cluster.kill(node_id)
    cluster.start_all()
    cluster.wait_ready(timeout=60)
    with Client(cluster.endpoints) as kv:
        items = dict(kv.scan(prefix=b"k"))
    expected = {b"k%04d" % i: b"v%d" % i for i in range(300) if i != 7}
    assert items == expected


def scan_node(address: str, partition: int) -> tuple[int, list[tuple[bytes, bytes]]]:
    with grpc.insecure_channel(address) as channel:
        stub = kv_pb2_grpc.KVStub(channel)
        chunks = list(stub.Scan(pb.ScanRequest(partition=partition, consistency=pb.FOLLOWER)))
    return chunks[0].applied_index, [(kv.key, kv.value) for c in chunks for kv in c.items]


def test_follower_catches_up_through_a_snapshot(make_cluster):
    cluster = make_cluster(nodes=3, partitions=2, compaction_min_entries=20)
    follower = "n3"
    cluster.kill(follower)
    survivors = [n.api_address for n in cluster.spec.nodes if n.id != follower]
    with Client(survivors) as kv:
        for i in range(400):
            kv.put(b"key-%04d" % i, b"%d" % i)
        kv.delete_range(b"key-0100", b"key-0200")

    wait_for_compaction(cluster, range(2), past_index=10, except_node=follower)  # it stopped at ~2
    cluster.start(follower)

    def caught_up():
        with Client(cluster.endpoints, timeout=2) as kv:
            statuses = kv.status()
        applied = {}
        for s in statuses:
            for ps in s.partitions:
                applied.setdefault(ps.partition, {})[s.node_id] = ps.applied_index
        return all(len(by_node) == 3 and len(set(by_node.values())) == 1 for by_node in applied.values())

    wait_until(caught_up, 60, "the restarted follower to reach the leaders' applied index")
    assert "installed a snapshot" in cluster.log_path(follower).read_text()
    for p in range(2):
        views = {n.id: scan_node(n.api_address, p) for n in cluster.spec.nodes}
        indexes = {index for index, _ in views.values()}
        contents = [items for _, items in views.values()]
        assert len(indexes) == 1, f"partition {p} served at different indexes: {indexes}"
        assert contents[0] == contents[1] == contents[2]
    with Client(cluster.endpoints) as kv:
        assert len(list(kv.scan(prefix=b"key-"))) == 300


def test_client_reroutes_after_leader_change(make_cluster):
    cluster = make_cluster(nodes=3, partitions=1)
    with Client(cluster.endpoints) as kv:
        kv.put(b"before", b"1")
        old_leader = leaders(kv)[0]
        cluster.kill(old_leader)
        try:
            kv.put(b"after", b"2")  # NotLeader / connection refused -> refresh -> new leader
        except Undetermined:
            # The request can go out on the dead leader's cached connection before the client has
            # seen it close; the client cannot tell that from a leader that died after receiving it.
            # A put is idempotent, so asking again is safe, and must reach the new leader.
            kv.put(b"after", b"2")
        assert kv.get(b"before") == b"1" and kv.get(b"after") == b"2"
        new_leader = leaders(kv)[0]
    assert new_leader != old_leader


def test_read_of_unreachable_cluster_is_a_clear_error():
    with Client(["127.0.0.1:1"], timeout=1) as kv:
        with pytest.raises((Unavailable, Timeout), match="no node answered"):
            kv.get(b"x")


def node_log_fsyncs(cluster) -> dict[str, float]:
    import re
    import urllib.request

    counts = {}
    for node in cluster.spec.nodes:
        with urllib.request.urlopen(f"http://{node.host}:{node.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        counts[node.id] = float(re.search(r'^raftkv_node_log_fsyncs_total (\S+)', text, re.M).group(1))
    return counts


@pytest.mark.parametrize("durability", ["lose-last-second", "fsync"])
def test_fsync_mode_syncs_the_node_log_once_per_group_commit_on_every_replica(make_cluster, durability):
    cluster = make_cluster(nodes=3, partitions=1, durability=durability)
    before = node_log_fsyncs(cluster)
    with Client(cluster.endpoints) as kv:
        for i in range(50):
            kv.put(b"k%d" % i, b"v")  # sequential: one group commit (one Raft entry) each
    # a commit needs only one follower: the other may still be receiving the last entries
    wait_until(lambda: len({ps.last_log_index for _, ps in statuses(cluster.endpoints)}) == 1
               and len(statuses(cluster.endpoints)) == 3, 30, "every replica to hold every entry")
    synced = {node: count - before[node] for node, count in node_log_fsyncs(cluster).items()}
    if durability == "fsync":
        # the leader synced before sending each entry and a follower before acknowledging it: a majority made
        # every entry durable before its write was acknowledged. The third replica may take two entries in
        # one append, after the commit, and sync once for both (49 syncs for 50 entries, CI at a load of 2).
        leader_and_follower = sorted(synced.values())[-2:]
        assert all(count >= 50 for count in leader_and_follower) and min(synced.values()) > 0, synced
    else:
        assert all(count == 0 for count in synced.values()), synced
