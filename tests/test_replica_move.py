"""Replica moves on real node processes: the metadata group, `raftkv replica move`, `raftkv node list`."""

from __future__ import annotations

import dataclasses
import json
import random
import re
import shutil
import signal
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import grpc

from raftkv import Client, CorruptData
from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.backup.manifest import backup_id_for
from raftkv.backup.store import list_backups
from raftkv.core.partitioning import partition_for_key
from raftkv.core.spec import BackupConfig
from raftkv.raft.snapshot_file import read_meta
from raftkv.storage.engine import KeyRange, Position
from raftkv.storage.rocks_engine import RocksEngine
from tests.conftest import Writer, changelog_caught_up, settled_topology, wait_until
from tests.test_corrupt_data import wipe
from tests.test_cli import assert_one_line_error, run


def _bootstrapped(kv: Client) -> bool:
    return kv.topology().meta.epoch >= 1


def _moved(kv: Client) -> bool:
    return not kv.topology().meta.moves


def _hosted(cluster, node_id: str, kv: Client) -> dict[int, object]:
    status = next(s for s in kv.status() if s.node_id == node_id)
    return {ps.partition: ps for ps in status.partitions}


def test_a_replica_moves_under_load_and_the_move_survives_a_restart(make_cluster):
    cluster = make_cluster(nodes=4, partitions=4, replication=3, rebalance_interval=0)  # placed by hand
    with Client(cluster.endpoints, timeout=10.0) as kv:
        wait_until(lambda: _bootstrapped(kv), 30, "the metadata to be bootstrapped")
        before = kv.topology().meta
        assert before.placement[0] == ("n1", "n2", "n3")
        assert [n.id for n in before.nodes] == ["n1", "n2", "n3", "n4"]
        for i in range(300):  # something to catch up on before the move starts
            kv.put(b"pre-%04d" % i, b"x" * 100)

        writer = Writer(cluster.endpoints)
        writer.start()
        wait_until(lambda: len(writer.acked) > 50, 30, "the writer to get going")
        source = _leader_of(kv, 0)  # the hardest replica to move: leadership goes first
        expected = tuple("n4" if n == source else n for n in before.placement[0])
        result = run("replica", "move", "--config", str(cluster.spec_path), "--partition", "0",
                     "--from", source, "--to", "n4", timeout=120)
        assert result.returncode == 0, result.stderr
        assert f"partition 0 moved; its replicas are on {', '.join(expected)}" in result.stdout
        moved_at = len(writer.acked)
        wait_until(lambda: len(writer.acked) > moved_at + 50, 30, "writes after the move")
        acked = writer.stop()

        after = kv.topology().meta
        assert after.placement[0] == expected and not after.moves
        assert after.placement[1:] == before.placement[1:]
        assert sum(1 for k in acked if partition_for_key(k, 4) == 0) > 10
        for key, value in acked.items():
            assert kv.get(key) == value, key
        wait_until(lambda: 0 not in _hosted(cluster, source, kv), 10, "the source to drop its replica")
        assert not (cluster.spec.node(source).data_dir / "p0000").exists()
        wait_until(lambda: 0 in _hosted(cluster, "n4", kv) and len(
            {ps.applied_index for s in kv.status() for ps in s.partitions if ps.partition == 0}) == 1,
                   10, "every voter of partition 0, n4 included, to apply the same entries")
        listed = run("node", "list", "--config", str(cluster.spec_path), "--json")
        assert listed.returncode == 0, listed.stderr
        doc = json.loads(listed.stdout)
        assert {n["id"]: n["replicas"] for n in doc["nodes"]} == {n: 4 if n == "n4" else 2 if n == source else 3
                                                                  for n in ("n1", "n2", "n3", "n4")}
        assert doc["moves"] == [] and doc["epoch"] >= 4

    cluster.stop_all()
    contents = [_contents(cluster.spec.node(node_id).data_dir / "p0000") for node_id in expected]
    assert contents[0] == contents[1] == contents[2] and len(contents[0]) > 100
    cluster.start_all()
    cluster.wait_ready(timeout=60)
    with Client(cluster.endpoints, timeout=10.0) as kv:
        assert kv.topology().meta.placement[0] == expected
        assert 0 not in _hosted(cluster, source, kv)
        for key, value in acked.items():
            assert kv.get(key) == value, key


def _leader_of(kv: Client, partition: int) -> str:
    return wait_until(lambda: next((s.node_id for s in kv.status() for ps in s.partitions
                                    if ps.partition == partition and ps.role == "leader"), None), 10, "a leader")


def _contents(folder) -> list[tuple[bytes, bytes]]:
    engine = RocksEngine(folder)
    try:
        return list(engine.scan(KeyRange(b"", None))[1])
    finally:
        engine.close()


def test_a_move_that_breaks_a_rule_is_one_line_and_changes_nothing(make_cluster):
    cluster = make_cluster(nodes=4, partitions=4, replication=3, rebalance_interval=0)  # placed by hand
    move = ("replica", "move", "--config", str(cluster.spec_path))
    with Client(cluster.endpoints, timeout=10.0) as kv:
        before = settled_topology(kv)
        for args, fragment in [
            (("--partition", "0", "--from", "n1", "--to", "n2"), "n2 already holds a replica of partition 0"),
            (("--partition", "0", "--from", "n1", "--to", "n9"), "node 'n9' is not in the cluster"),
            (("--partition", "0", "--from", "n4", "--to", "n1"), "n4 holds no replica of partition 0"),
            (("--partition", "7", "--from", "n1", "--to", "n4"), "partition 7 does not exist"),
        ]:
            assert_one_line_error(run(*move, *args), fragment)
            assert kv.topology().meta == before

        # A second move of a partition while one is under way: the target is paused, so the first waits.
        cluster.signal("n4", signal.SIGSTOP)
        try:
            started = run(*move, "--partition", "0", "--from", "n1", "--to", "n4", "--no-wait")
            assert started.returncode == 0, started.stderr
            assert_one_line_error(run(*move, "--partition", "0", "--from", "n2", "--to", "n4"),
                                  "partition 0 is already moving (n1 -> n4)")
        finally:
            cluster.signal("n4", signal.SIGCONT)
        wait_until(lambda: _moved(kv), 60, "the first move to finish")
        assert kv.topology().meta.placement[0] == ("n4", "n2", "n3")


def _bytes_sent(cluster, partition: int, kind: str) -> float:
    """raftkv_raft_bytes_sent_total of `partition` and `kind`, summed over every node."""
    total = 0.0
    for node in cluster.spec.nodes:
        with urllib.request.urlopen(f"http://{node.host}:{node.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        pattern = rf'^raftkv_raft_bytes_sent_total{{kind="{kind}",partition="{partition}"}} (\S+)'
        total += sum(float(v) for v in re.findall(pattern, text, re.M))
    return total


def test_a_moved_replica_gets_checkpoint_files_and_the_leader_sends_it_only_the_log_after_them(make_cluster):
    """The new replica copies a voter's checkpoint over gRPC, off the Raft loop; the group's members send
    it no snapshot and, beyond heartbeats, only the entries written since (here none: 1% of the data)."""
    cluster = make_cluster(nodes=4, partitions=2, replication=3, rebalance_interval=0)
    with Client(cluster.endpoints, timeout=10.0) as kv:
        wait_until(lambda: _bootstrapped(kv), 30, "the metadata to be bootstrapped")
        keys = [k for k in (b"k-%05d" % i for i in range(6000)) if partition_for_key(k, 2) == 0][:2000]
        value = b"v" * 1000
        for i in range(0, len(keys), 200):
            kv.put_many(keys[i:i + 200], [value] * 200)
        data_bytes = len(keys) * len(value)
        snapshots, entries = _bytes_sent(cluster, 0, "snapshot"), _bytes_sent(cluster, 0, "entries")
        result = run("replica", "move", "--config", str(cluster.spec_path), "--partition", "0",
                     "--from", "n1", "--to", "n4", timeout=120)
        assert result.returncode == 0, result.stderr
        assert _bytes_sent(cluster, 0, "snapshot") == snapshots
        assert _bytes_sent(cluster, 0, "entries") - entries < data_bytes / 100
        assert "partition 0: copied a checkpoint at index" in cluster.log_path("n4").read_text()
        assert all(kv.get(k) == value for k in keys[::50])
    cluster.stop_all()
    contents = [_contents(cluster.spec.node(node_id).data_dir / "p0000") for node_id in ("n2", "n3", "n4")]
    assert contents[0] == contents[1] == contents[2] and len(contents[0]) == len(keys)


def _snapshot_index(cluster, node_id: str, partition: int) -> int:
    try:
        return read_meta(cluster.spec.node(node_id).data_dir / f"p{partition:04d}" / "raft.snapshot").last_entry[1]
    except CorruptData:  # none yet
        return 0


def _checkpoint_bytes_sent(cluster, partition: int) -> float:
    total = 0.0
    for node in cluster.spec.nodes:
        text = urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=5).read().decode()
        pattern = rf'^raftkv_checkpoint_bytes_sent_total{{partition="{partition}"}} (\S+)'
        total += sum(float(v) for v in re.findall(pattern, text, re.M))
    return total


def test_a_moved_replica_is_seeded_from_the_newest_backup_and_catches_up_from_the_log_after_it(make_cluster,
                                                                                               tmp_path):
    """With a backup URL in the spec, the new replica downloads the partition's newest backup copy and the
    group sends it only the entries written since, although the members compacted their logs after the
    backup: they keep the log from the backup's entry on (10% of the data at most, asserted from metrics)."""
    url = (tmp_path / "backups").as_uri()
    cluster = make_cluster(nodes=4, partitions=2, replication=3, rebalance_interval=0, compaction_min_entries=100,
                           backup_poll_seconds=0.5, backup=BackupConfig(url))
    with Client(cluster.endpoints, timeout=10.0) as kv:
        wait_until(lambda: _bootstrapped(kv), 30, "the metadata to be bootstrapped")
        keys = [k for k in (b"k-%05d" % i for i in range(6000)) if partition_for_key(k, 2) == 0][:2000]
        rng = random.Random(7)
        values = [rng.randbytes(1000) for _ in keys]  # incompressible: the backup holds all 2 MB
        for i in range(0, len(keys), 200):
            kv.put_many(keys[i:i + 200], values[i:i + 200])
        # A backup copies the leaders' checkpoints: a partition's copy is at the last entry that wrote to it.
        kv.put(next(k for k in (b"p1-%d" % i for i in range(100)) if partition_for_key(k, 2) == 1), b"x")
        data_bytes = len(keys) * 1000
        result = run("backup", "create", "--config", str(cluster.spec_path), "--to", url, timeout=120)
        assert result.returncode == 0, result.stderr
        wait_until(lambda: all("is the newest copy of partitions [0, 1]" in cluster.log_path(n).read_text()
                               for n in cluster.spec.node_ids), 30, "every node to find the backup")
        later = [k for k in (b"later-%04d" % i for i in range(1000)) if partition_for_key(k, 2) == 0][:150]
        for key in later:  # more entries than compaction_min_entries: the voters compact past the backup
            kv.put(key, b"w" * 100)
        backup_index = list_backups(url)[-1].positions[0].index
        wait_until(lambda: all(_snapshot_index(cluster, n, 0) > backup_index for n in ("n1", "n2", "n3")), 30,
                   "the voters to compact their logs past the backup")
        sent = (_bytes_sent(cluster, 0, "snapshot"), _bytes_sent(cluster, 0, "entries"), _checkpoint_bytes_sent(cluster, 0))
        result = run("replica", "move", "--config", str(cluster.spec_path), "--partition", "0",
                     "--from", "n1", "--to", "n4", timeout=120)
        assert result.returncode == 0, result.stderr
        assert "partition 0: seeded from backup" in cluster.log_path("n4").read_text()
        assert _bytes_sent(cluster, 0, "snapshot") == sent[0] and _checkpoint_bytes_sent(cluster, 0) == sent[2]
        assert _bytes_sent(cluster, 0, "entries") - sent[1] < data_bytes / 10
        assert all(kv.get(k) == v for k, v in zip(keys[::50], values[::50]))
        assert all(kv.get(k) == b"w" * 100 for k in later)

        # A newer copy whose entry has another term than the leader's is not from this history: not used.
        forged = _forge_newer_backup(tmp_path / "backups", partition=1)
        wait_until(lambda: f"backups: {forged} is the newest" in cluster.log_path("n1").read_text(), 30,
                   "n1 to find the forged backup")
        result = run("replica", "move", "--config", str(cluster.spec_path), "--partition", "1",
                     "--from", "n4", "--to", "n1", timeout=120)
        assert result.returncode == 0, result.stderr
        n1_log = cluster.log_path("n1").read_text()
        assert "partition 1: the leader's log holds no entry" in n1_log and "partition 1: seeded" not in n1_log
    cluster.stop_all()
    contents = [_contents(cluster.spec.node(node_id).data_dir / "p0000") for node_id in ("n2", "n3", "n4")]
    assert contents[0] == contents[1] == contents[2] and len(contents[0]) == len(keys) + len(later)
    contents = [_contents(cluster.spec.node(node_id).data_dir / "p0001") for node_id in ("n1", "n2", "n3")]
    assert contents[0] == contents[1] == contents[2]


def _forge_newer_backup(root: Path, partition: int) -> str:
    """A copy of the newest backup under a newer id, `partition`'s term changed in its manifest."""
    [info] = list_backups(root.as_uri())[-1:]
    copies = tuple(dataclasses.replace(c, position=Position(c.position.index, c.position.term + 5))
                   if c.partition == partition else c for c in info.copies)
    forged = dataclasses.replace(info, id=backup_id_for(datetime.now(timezone.utc)), copies=copies)
    shutil.copytree(root / info.id, root / forged.id)
    (root / forged.id / "manifest.json").write_bytes(forged.to_manifest())
    return forged.id


def test_a_move_whose_target_cannot_catch_up_is_rolled_back_after_move_timeout(make_cluster):
    """A target that is up (not dead) but makes no progress, here a stopped process, must not hold the
    move, and the moves queued behind it, forever: after `move_timeout` the move is undone."""
    cluster = make_cluster(nodes=4, partitions=4, replication=3, rebalance_interval=0, move_timeout=3.0)
    move = ("replica", "move", "--config", str(cluster.spec_path), "--partition", "0", "--from", "n1", "--to", "n4")
    with Client(cluster.endpoints, timeout=10.0) as kv:
        wait_until(lambda: _bootstrapped(kv), 30, "the metadata to be bootstrapped")
        before = kv.topology().meta
        assert before.placement[0] == ("n1", "n2", "n3") and "n4" not in before.meta_voters
        for i in range(100):
            kv.put(b"pre-%04d" % i, b"x" * 100)
        post = next(k for k in (b"post-%d" % i for i in range(100)) if partition_for_key(k, 4) == 0)
        cluster.signal("n4", signal.SIGSTOP)
        try:
            with Client(cluster.endpoints[:3], timeout=10.0) as running:  # n4's answers would wait for it
                started = run(*move, "--no-wait")
                assert started.returncode == 0, started.stderr
                wait_until(lambda: running.topology().meta.moves, 10, "the move to be recorded")
                wait_until(lambda: _moved(running), 60, "the stalled move to be rolled back")
                after = running.topology().meta
                assert after.placement == before.placement and after.epoch > before.epoch
                running.put(post, b"1")  # partition 0's group is whole: its three voters commit
        finally:
            cluster.signal("n4", signal.SIGCONT)
        wait_until(lambda: not (cluster.spec.node("n4").data_dir / "p0000").exists(), 30,
                   "n4 to delete the copy it had begun")
        result = run(*move, timeout=120)  # with n4 running again, the same move goes through
        assert result.returncode == 0, result.stderr
        assert kv.topology().meta.placement[0] == ("n4", "n2", "n3")
        assert all(kv.get(b"pre-%04d" % i) == b"x" * 100 for i in range(100)) and kv.get(post) == b"1"


def test_a_learner_follows_its_partition_to_a_new_node_that_leads_it(make_cluster, changelog_learner):
    cluster = make_cluster(nodes=4, partitions=2, replication=3, rebalance_interval=0)
    with Client(cluster.endpoints, timeout=10.0) as kv:
        wait_until(lambda: _bootstrapped(kv), 30, "the metadata to be bootstrapped")
        address = changelog_learner(cluster)
        for i in range(50):
            kv.put(b"before-%03d" % i, b"x")
        wait_until(lambda: changelog_caught_up(cluster, address), 60, "the learner to log the first writes")
        source = kv.topology().meta.placement[0][0]
        assert run("replica", "move", "--config", str(cluster.spec_path), "--partition", "0",
                   "--from", source, "--to", "n4").returncode == 0
        moved = run("leader", "transfer", "--config", str(cluster.spec_path), "--partition", "0", "--to", "n4")
        assert moved.returncode == 0, moved.stderr
        assert _leader_of(kv, 0) == "n4"  # a node the learner was not started with
        for i in range(200):
            kv.put(b"after-%03d" % i, b"y")
        wait_until(lambda: changelog_caught_up(cluster, address), 60, "the learner to log the writes after the move")


def test_a_wiped_voter_follows_a_leader_that_moved_in_while_it_was_away_without_disrupting_it(make_cluster):
    """Found by a 300 s chaos run (seed 301): a wiped node opened its replicas with the spec's voters, as
    its empty metadata copy counted as caught up. A partition's leader that had moved in meanwhile was
    unknown to it, and with pysyncobj's transport (since replaced by the hub) of two members only the one
    with the higher address connected: the replica was a candidate until its terms passed the group's
    (50 s there) and deposed the leader."""
    cluster = make_cluster(nodes=4, partitions=2, replication=3, rebalance_interval=0)
    with Client(cluster.endpoints, timeout=10.0) as kv:
        wait_until(lambda: _bootstrapped(kv), 30, "the metadata to be bootstrapped")
        placement = kv.topology().meta.placement
        p = next(p for p, nodes in enumerate(placement) if "n1" not in nodes)  # n1 has the lowest ports
        source, *others = placement[p]
        wiped = max(others)
        assert run("replica", "move", "--config", str(cluster.spec_path), "--partition", str(p),
                   "--from", source, "--to", "n1", timeout=120).returncode == 0
        assert run("leader", "transfer", "--config", str(cluster.spec_path), "--partition", str(p),
                   "--to", "n1").returncode == 0
        written = {key: b"v" for key in (b"k%04d" % i for i in range(2000)) if partition_for_key(key, 2) == p}
        kv.put_many(list(written), list(written.values()))
        leader = _hosted(cluster, "n1", kv)[p]
        assert leader.role == "leader"

        cluster.kill(wiped)
        wipe(cluster, wiped)
        cluster.start(wiped)
        wait_until(lambda: _hosted(cluster, wiped, kv).get(p) is not None
                   and _hosted(cluster, wiped, kv)[p].applied_index >= leader.commit_index, 30,
                   f"{wiped} to catch up on partition {p}")
        now = _hosted(cluster, "n1", kv)[p]
        assert (now.role, now.term) == ("leader", leader.term), f"{wiped} deposed the leader of partition {p}"
        with Client([cluster.spec.node(wiped).api_address], timeout=5.0) as local:
            assert all(local.get(key, consistency="follower") == value for key, value in written.items())


def test_a_replica_that_reopens_on_a_folder_whose_journal_removed_the_leader_still_hears_from_it(make_cluster):
    """Issue 32: n4's leftover journal holds the entry that removed n1 but not the one that added n1 back.
    Replaying it dropped n1, the leader now, and the learner opened for the next move to n4 never heard
    from it: the move waited in catching_up until leadership happened to move (docs/pysyncobj.md)."""
    cluster = make_cluster(nodes=4, partitions=1, replication=3, rebalance_interval=0)
    config = ("--config", str(cluster.spec_path), "--partition", "0")
    with Client(cluster.endpoints[:3], timeout=10.0) as kv, Writer(cluster.endpoints[:3]) as writer:
        wait_until(lambda: _bootstrapped(kv), 30, "the metadata to be bootstrapped")
        assert kv.topology().meta.placement[0] == ("n1", "n2", "n3")
        wait_until(lambda: len(writer.acked) > 50, 30, "the writer to get going")
        assert run("replica", "move", *config, "--from", "n1", "--to", "n4", timeout=120).returncode == 0
        back = run("replica", "move", *config, "--from", "n4", "--to", "n1", "--no-wait")
        assert back.returncode == 0, back.stderr
        wait_until(lambda: kv.topology().meta.moves, 10, "the move back to be recorded")
        cluster.kill("n4")  # while n1 catches up: n4 never hears that n1 is back
        wait_until(lambda: _moved(kv), 60, "the move back to end without n4")
        assert kv.topology().meta.placement[0] == ("n1", "n2", "n3")
        assert run("leader", "transfer", *config, "--to", "n1").returncode == 0
        cluster.start("n4")  # on its old p0000 folder
        moved = run("replica", "move", *config, "--from", "n2", "--to", "n4", "--timeout", "60", timeout=120)
        assert moved.returncode == 0, moved.stderr + moved.stdout
        assert kv.topology().meta.placement[0] == ("n1", "n4", "n3")
        acked = writer.stop()
        assert all(kv.get(key) == value for key, value in acked.items())
    cluster.stop_all()
    contents = [_contents(cluster.spec.node(node_id).data_dir / "p0000") for node_id in ("n1", "n3", "n4")]
    assert contents[0] == contents[1] == contents[2]


def test_a_learner_started_afresh_during_its_move_copies_a_checkpoint_again_and_the_move_ends(make_cluster):
    """What the mover asks of a learner that makes no progress while its group commits (`Reseed`): its
    node drops the learner and its data, copies a voter's checkpoint again, and the move goes on."""
    cluster = make_cluster(nodes=4, partitions=1, replication=3, rebalance_interval=0)
    config = ("--config", str(cluster.spec_path), "--partition", "0")
    cluster.stop("n4")
    cluster.start("n4", env={"RAFTKV_FAILPOINTS": "apply-before=120*delay(25)"})  # a slow learner, for a while
    with Client(cluster.endpoints[:3], timeout=10.0) as kv, Writer(cluster.endpoints[:3]) as writer:
        wait_until(lambda: _bootstrapped(kv), 30, "the metadata to be bootstrapped")
        for i in range(300):
            kv.put(b"pre-%05d" % i, b"x" * 200)
        wait_until(lambda: len(writer.acked) > 50, 30, "the writer to get going")
        assert run("replica", "move", *config, "--from", "n1", "--to", "n4", "--no-wait").returncode == 0
        with grpc.insecure_channel(cluster.spec.node("n4").api_address) as channel:
            admin = kv_pb2_grpc.AdminStub(channel)
            wait_until(lambda: admin.ReplicaProgress(pb.ReplicaRequest(group=0)).mode == "learner", 60,
                       "n4 to run partition 0 as a learner")
            assert admin.Reseed(pb.ReplicaRequest(group=0)).done
        wait_until(lambda: _moved(kv), 60, "the move to end")
        assert kv.topology().meta.placement[0] == ("n4", "n2", "n3")
        acked = writer.stop()
        assert all(kv.get(key) == value for key, value in acked.items())
    log = cluster.log_path("n4").read_text()
    assert "starting it again from a voter's checkpoint" in log
    assert log.count("copied a checkpoint at index") == 2
    cluster.stop_all()
    contents = [_contents(cluster.spec.node(node_id).data_dir / "p0000") for node_id in ("n2", "n3", "n4")]
    assert contents[0] == contents[1] == contents[2] and len(contents[0]) > 300
