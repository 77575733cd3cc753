"""A node never serves damaged files: it stops with one clear line, and wiped, it re-syncs from its peers.

Found by the chaos harness (docs/chaos.md): a damaged snapshot used to leave a replica running that
never applied another entry, and a damaged RocksDB block was reported as "in use by another process"
at start, or made scans end early without a word.
"""

from __future__ import annotations

import re
import shutil
import urllib.request
from pathlib import Path

from rocksdict import AccessType, Options, Rdict

from raftkv import Client
from tests.conftest import wait_for_compaction, wait_until
from raftkv.storage.rocks_files import checkpoint_position, read_every_block
from tests.raft_admin import lead, statuses


def flip(path: Path, offset: int, count: int = 8) -> None:
    data = bytearray(path.read_bytes())
    data[offset:offset + count] = bytes(b ^ 0xFF for b in data[offset:offset + count])
    path.write_bytes(bytes(data))


def the_error_line(cluster, node_id: str) -> str:
    """The node exited with code 2 and wrote exactly one 'error:' line, which is returned."""
    wait_until(lambda: node_id in cluster.exited(), 30, f"{node_id} to stop")
    assert cluster.exited()[node_id] == 2
    errors = [line for line in cluster.log_path(node_id).read_text().splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, errors
    return errors[0]


def stopped_gauge(cluster, on: str, about: str) -> float | None:
    """What node `on` exports of `about` having stopped on bad storage (None: nothing)."""
    node = cluster.spec.node(on)
    with urllib.request.urlopen(f"http://{node.host}:{node.metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = re.search(rf'^raftkv_node_stopped_on_bad_storage{{node="{about}"}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else None


def wipe(cluster, node_id: str) -> None:
    for item in cluster.spec.node(node_id).data_dir.iterdir():
        if item.is_dir():
            shutil.rmtree(item)


def wipe_and_resync(cluster, node_id: str, expected: dict[bytes, bytes]) -> None:
    wipe(cluster, node_id)
    cluster.start(node_id)
    address = [cluster.spec.node(node_id).api_address]
    with Client(address, timeout=5) as kv:
        wait_until(lambda: all(kv.get(k, consistency="follower") == v for k, v in expected.items()), 60,
                   f"{node_id} to re-sync from its peers")


def load(cluster, count: int) -> dict[bytes, bytes]:
    written = {b"k%04d" % i: b"v%d" % i for i in range(count)}
    with Client(cluster.endpoints) as kv:
        for key, value in written.items():
            kv.put(key, value)
    return written


def damage_table_files(db: Path, holding) -> list[Path]:
    """Flip bytes inside the first data block of every table file whose first key satisfies `holding`.

    The database still opens: RocksDB checks a block only when it reads it.
    """
    opened = Rdict(str(db), Options(raw_mode=True), column_families={"raftkv": Options(raw_mode=True)},
                   access_type=AccessType.read_only())
    try:
        damaged = [db / f["name"].lstrip("/") for f in opened.live_files() if holding(f["start_key"])]
    finally:
        opened.close()
    for sst in damaged:
        flip(sst, 10)
    return damaged


def loaded_and_stopped(make_cluster):
    """A 3-node cluster whose 600 keys and Raft position are all in table files, none only in the
    write-ahead log; n1 killed. Returns (cluster, written)."""
    cluster = make_cluster(nodes=3, partitions=1, compaction_min_entries=200, compaction_min_seconds=1.0)
    written = load(cluster, 600)
    last_write = max(ps.applied_index for _, ps in statuses(cluster.endpoints))
    # a snapshot's checkpoint flushes the database; one past the last write leaves nothing in the log
    wait_for_compaction(cluster, [0], past_index=last_write - 1)
    cluster.kill("n1")
    return cluster, written


def test_a_damaged_raft_position_stops_the_node_at_start_with_one_line(make_cluster):
    cluster, written = loaded_and_stopped(make_cluster)
    assert damage_table_files(cluster.spec.node("n1").data_dir / "p0000" / "db", lambda key: key == b"position")
    cluster.start("n1")
    line = the_error_line(cluster, "n1")
    assert "is corrupt" in line and "in use by another process" not in line
    wipe_and_resync(cluster, "n1", written)


def test_a_damaged_data_block_stops_the_node_with_one_line_never_a_short_answer(make_cluster):
    """The node opens its database fine (its Raft position is intact) and serves. A follower scan sent
    to it reads the damaged block: the node stops, and the client gets every key from another replica."""
    cluster, written = loaded_and_stopped(make_cluster)
    assert damage_table_files(cluster.spec.node("n1").data_dir / "p0000" / "db", lambda key: key.startswith(b"k"))
    cluster.start("n1")
    address = cluster.spec.node("n1").api_address
    wait_until(lambda: statuses([address]), 60, "n1 to serve")
    with Client([address], timeout=10) as kv:  # a follower read goes to the first endpoint first
        assert list(kv.scan(consistency="follower")) == sorted(written.items())
    line = the_error_line(cluster, "n1")  # only the scan reads the damaged block
    assert "is corrupt" in line and "block checksum mismatch" in line
    assert stopped_gauge(cluster, "n2", "n1") == 1.0  # it told the others why, before it exited: the alert's
    wipe_and_resync(cluster, "n1", written)
    wait_until(lambda: stopped_gauge(cluster, "n2", "n1") == 0.0, 30, "n2 to see n1 back")


def test_a_damaged_snapshot_stops_the_node_with_one_line(make_cluster):
    cluster, written = loaded_and_stopped(make_cluster)
    flip(cluster.spec.node("n1").data_dir / "p0000" / "raft.snapshot", 600)  # inside meta.json
    cluster.start("n1")
    line = the_error_line(cluster, "n1")
    assert "raft.snapshot is corrupt" in line and "move" in line and "re-syncs from its peers" in line
    wipe_and_resync(cluster, "n1", written)


def test_a_leader_with_a_damaged_block_stops_before_its_checkpoint_leaves_and_another_sends_one(make_cluster, tmp_path):
    """A chaos run: a leader shipped a table file damaged on its disk, in a block it had never read, to two
    learners, which installed it and stopped. Every block of a checkpoint is read before it leaves (a
    replica copy's, a backup's, a client's, a snapshot's): the leader stops and the next one sends."""
    cluster, written = loaded_and_stopped(make_cluster)
    assert damage_table_files(cluster.spec.node("n1").data_dir / "p0000" / "db", lambda key: key.startswith(b"k"))
    cluster.start("n1")
    wait_until(lambda: statuses([cluster.spec.node("n1").api_address]), 60, "n1 to serve")
    lead(cluster, 0, "n1")
    with Client(cluster.endpoints, timeout=60) as kv:
        position = kv.checkpoint(0, tmp_path / "checkpoint")
    line = the_error_line(cluster, "n1")
    assert "p0000/db is corrupt" in line and "block checksum mismatch" in line and "move" in line
    read_every_block(tmp_path / "checkpoint", tmp_path / "checkpoint")  # another leader's, whole
    assert checkpoint_position(tmp_path / "checkpoint") == position
    checkpoint = Rdict(str(tmp_path / "checkpoint"), Options(raw_mode=True),
                       column_families={"raftkv": Options(raw_mode=True)}, access_type=AccessType.read_only())
    try:
        assert {k: v for k, v in checkpoint.items() if k.startswith(b"k")} == written
    finally:
        checkpoint.close()
