"""A node crashed at each fail point on its hot path restarts, and the cluster keeps every acknowledged write.

Real nodes in fsync mode (so the journal's fsync points are reached too) with compaction every few
dozen entries (so the snapshot rename is), under a steady stream of puts.
"""

from __future__ import annotations

import signal

from raftkv import Client, failpoints
from raftkv.chaos.convergence import replica_differences
from raftkv.chaos.faults import placement_of
from tests.conftest import Writer, wait_until

PASSES = 5  # hits let through after the restart, so the crash comes mid-stream, not at start-up


def test_a_node_crashed_at_each_fail_point_restarts_and_the_cluster_keeps_every_acknowledged_write(make_cluster):
    cluster = make_cluster(nodes=3, partitions=2, durability="fsync", compaction_min_entries=40)
    points = failpoints.node_points(fsync=True)
    with Writer(cluster.endpoints) as writer:
        for n, point in enumerate(points):
            node_id = cluster.spec.node_ids[n % len(cluster.spec.node_ids)]
            log = cluster.log_path(node_id)
            cluster.kill(node_id)
            cluster.start(node_id, env={failpoints.ENVIRONMENT_VARIABLE: f"{point}={PASSES}*off->crash"})
            proc = cluster.procs[node_id]
            wait_until(lambda: proc.poll() is not None, 60, f"{node_id} to crash at {point}")
            assert proc.returncode == -signal.SIGKILL, f"{node_id} exited with {proc.returncode}; see {log}"
            assert f"fail point {point}: crashing" in log.read_text()
            cluster.start(node_id)
            cluster.wait_ready(timeout=60)
            acked = len(writer.acked)
            wait_until(lambda: len(writer.acked) > acked + 20, 30, f"writes to go on after the crash at {point}")

    assert len(writer.acked) > 200
    with Client(cluster.endpoints) as kv:
        held = dict(kv.scan())
    lost = [key for key, value in writer.acked.items() if held.get(key) != value]
    assert not lost, f"{len(lost)} acknowledged writes lost, e.g. {lost[:5]}"
    assert replica_differences(cluster.spec, placement_of(cluster.spec), each_round=lambda: None) == []
