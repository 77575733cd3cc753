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


def assert_every_acknowledged_write_kept(cluster, writer: Writer) -> None:
    with Client(cluster.endpoints) as kv:
        held = dict(kv.scan())
    lost = [key for key, value in writer.acked.items() if held.get(key) != value]
    assert not lost, f"{len(lost)} acknowledged writes lost, e.g. {lost[:5]}"
    assert replica_differences(cluster.spec, placement_of(cluster.spec), each_round=lambda: None) == []


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
    assert_every_acknowledged_write_kept(cluster, writer)


def test_a_majority_crashed_between_a_snapshot_rename_and_the_journal_compaction_keeps_every_acknowledged_write(
        make_cluster):
    """The rewound log (docs/chaos.md): restarted with a journal that began before its new snapshot,
    a replica had it cleared down to the snapshot, dropping the entries after it while its database
    kept them. Two replicas so could elect one of themselves, which appended new entries at indices
    their databases had applied already, and they skipped them: acknowledged writes lost."""
    cluster = make_cluster(nodes=3, partitions=1, compaction_min_entries=40, start=False)
    *armed, last = cluster.spec.node_ids
    for node_id in cluster.spec.node_ids:  # armed from the start: their crashes come under writes
        cluster.start(node_id, env={failpoints.ENVIRONMENT_VARIABLE: "snapshot-rename-after=2*off->crash"}
                      if node_id in armed else None)
    cluster.wait_ready(timeout=60)
    with Writer(cluster.endpoints) as writer:
        wait_until(lambda: all(cluster.procs[n].poll() is not None for n in armed), 60,
                   f"{' and '.join(armed)} to crash at their third snapshot rename")
        assert [cluster.procs[n].returncode for n in armed] == [-signal.SIGKILL] * len(armed)
        cluster.kill(last)  # its log is whole: the two must elect one of themselves
        for node_id in armed:
            cluster.start(node_id)
        acked = len(writer.acked)
        wait_until(lambda: len(writer.acked) > acked + 100, 60, f"writes to {' and '.join(armed)} after the restart")
        cluster.start(last)
        cluster.wait_ready(timeout=60)

    assert_every_acknowledged_write_kept(cluster, writer)
    assert not cluster.exited(), "a node stopped"


def test_a_replica_whose_journal_fsync_fails_stops_with_one_line_and_acknowledges_nothing_after(make_cluster):
    """fsyncgate: after a failed fsync the kernel may have dropped the unsynced pages and report the
    next fsync as a success, so the replica must stop, not retry and acknowledge."""
    cluster = make_cluster(nodes=3, partitions=1, durability="fsync")
    node_id = cluster.spec.node_ids[0]
    log = cluster.log_path(node_id)
    with Writer(cluster.endpoints) as writer:
        cluster.kill(node_id)
        cluster.start(node_id, env={failpoints.ENVIRONMENT_VARIABLE: f"journal-fsync-before={PASSES}*off->error"})
        proc = cluster.procs[node_id]
        wait_until(lambda: proc.poll() is not None, 60, f"{node_id} to stop on its failed fsync")
        assert proc.returncode == 2, f"{node_id} exited with {proc.returncode}; see {log}"
        errors = [line for line in log.read_text().splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and "fsync of" in errors[0] and "failed" in errors[0], errors
        assert "Traceback" not in log.read_text()
        acked = len(writer.acked)
        wait_until(lambda: len(writer.acked) > acked + 50, 30, "writes to go on without it")
        cluster.start(node_id)
        cluster.wait_ready(timeout=60)

    assert_every_acknowledged_write_kept(cluster, writer)
