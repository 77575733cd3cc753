"""A voter whose snapshot holds entries a power cut of the whole cluster took from the others (lose-last-second
mode) starts over from its peers, on real node processes.

Stop 44's CI run: a replica stayed at applied index 614, its snapshot, while its peers went on to 674. Its
snapshot held entries the cut took from the other two, whose new leader wrote others at their indices;
pysyncobj's follower answered every append below its snapshot with its log end, the leader walked back
below it again, for ever. The cut is made here by stopping the cluster and giving two nodes back the data
they had before the last writes, with a term above any the cluster reached (a real cut keeps the term: it
is synced at every election).
"""

from __future__ import annotations

import shutil

import grpc
import pytest

from raftkv import Client
from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.chaos.convergence import scan_replica
from raftkv.node.hosted_replicas import partition_folder
from raftkv.raft import snapshot_file
from raftkv.raft.replica_logs import META_GROUP, ReplicaLogs, log_group
from tests.conftest import wait_until
from tests.raft_admin import leader_of, statuses

TERM_AFTER_THE_CUT = 1000  # above any term the cluster reached: as if each had been synced at its election


def _applied(cluster, node_id: str) -> int:
    return next((s.applied_index for n, s in statuses([cluster.node(node_id).api_address]) if s.partition == 0), -1)


def _put_all(cluster, keys: list[bytes]) -> None:
    with Client(cluster.endpoints, timeout=20) as kv:
        for key in keys:
            kv.put(key, b"v")


def _as_after_the_cut(cluster, node_id: str, kept) -> None:
    """`node_id`'s data as it was at `kept` (its log lost what came after), its terms above the cluster's."""
    data_dir = cluster.node(node_id).data_dir
    shutil.rmtree(data_dir)
    shutil.copytree(kept, data_dir)
    logs = ReplicaLogs(data_dir / "raft-log", fsync=True)
    try:
        groups = ((partition_folder(data_dir, 0), log_group(0)), (cluster.node(node_id).meta_dir, META_GROUP))
        for folder, group in groups:
            view = logs.open(folder, group)
            view.setCurrentTerm(TERM_AFTER_THE_CUT, None)
            view._destroy()
    finally:
        logs.close()


@pytest.mark.parametrize("written_after", [100, 5], ids=["past-the-snapshot", "ending-before-it"])
def test_a_voter_whose_snapshot_holds_entries_a_cut_of_the_whole_cluster_lost_starts_over_from_its_peers(
        make_cluster, tmp_path, written_after):
    """The new leader's log holds the snapshot's first entry in another term, or ends before it."""
    cluster = make_cluster(nodes=3, partitions=1)
    before = [b"a%03d" % i for i in range(20)]
    lost = [b"b%03d" % i for i in range(80)]  # more than a leader's eager compaction leaves (64 entries)
    after = [b"c%03d" % i for i in range(written_after)]
    _put_all(cluster, before)
    cluster.stop_all()
    kept = {n: tmp_path / f"kept-{n}" for n in cluster.spec.node_ids}
    for node_id, folder in kept.items():
        shutil.copytree(cluster.node(node_id).data_dir, folder, ignore=shutil.ignore_patterns("node.log"))

    cluster.start_all()
    cluster.wait_ready(timeout=60)
    _put_all(cluster, lost)
    keeper = leader_of(cluster.endpoints)
    others = [n for n in cluster.spec.node_ids if n != keeper]
    last = _applied(cluster, keeper)
    snapshot = partition_folder(cluster.node(keeper).data_dir, 0) / "raft.snapshot"
    with grpc.insecure_channel(cluster.node(keeper).api_address) as channel:
        assert kv_pb2_grpc.AdminStub(channel).Compact(pb.ReplicaRequest(group=0), timeout=10).done
    wait_until(lambda: snapshot.exists() and snapshot_file.read_meta(snapshot).last_entry[1] >= last, 30,
               "the keeper's snapshot to hold every write")
    cluster.stop_all()

    for node_id in others:
        _as_after_the_cut(cluster, node_id, kept[node_id])
        cluster.start(node_id)
    wait_until(lambda: leader_of([cluster.node(n).api_address for n in others]) is not None, 60,
               "the other two to elect a leader")
    _put_all(cluster, after)  # the new leader's entries take the lost ones' indices
    leader = leader_of([cluster.node(n).api_address for n in others])
    assert _applied(cluster, leader) - len(after) < snapshot_file.read_meta(snapshot).last_entry[1]  # began below it

    cluster.start(keeper)
    wait_until(lambda: _applied(cluster, keeper) == _applied(cluster, leader), 60, "the keeper to catch up")
    index, contents = scan_replica(cluster.node(keeper).api_address, 0)
    assert (index, contents) == scan_replica(cluster.node(leader).api_address, 0)
    assert set(contents) == set(before) | set(after)
    assert "this replica's data is deleted and it catches up from its peers" in cluster.log_path(keeper).read_text()
