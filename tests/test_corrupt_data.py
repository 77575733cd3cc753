"""A node never serves damaged files: it stops with one clear line, and wiped, it re-syncs from its peers.

Found by the chaos harness (docs/chaos.md): a damaged snapshot used to leave a replica running that
never applied another entry, and a damaged RocksDB block was reported as "in use by another process"
at start, or made scans end early without a word.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from raftkv import Client
from tests.conftest import wait_for_compaction, wait_until


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


def wipe_and_resync(cluster, node_id: str, expected: dict[bytes, bytes]) -> None:
    for item in cluster.spec.node(node_id).data_dir.iterdir():
        if item.is_dir():
            shutil.rmtree(item)
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


def test_a_damaged_snapshot_stops_the_node_with_one_line(make_cluster):
    cluster = make_cluster(nodes=3, partitions=1, compaction_min_entries=200)
    written = load(cluster, 600)
    wait_for_compaction(cluster, [0], past_index=300)
    cluster.kill("n1")
    flip(cluster.spec.node("n1").data_dir / "p0000" / "raft.snapshot", 600)  # inside meta.json
    cluster.start("n1")
    line = the_error_line(cluster, "n1")
    assert "raft.snapshot is corrupt" in line and "move" in line and "re-syncs from its peers" in line
    wipe_and_resync(cluster, "n1", written)


def test_a_damaged_database_block_stops_the_node_with_one_line_never_a_short_answer(make_cluster):
    cluster = make_cluster(nodes=3, partitions=1, compaction_min_entries=200)
    written = load(cluster, 600)
    wait_for_compaction(cluster, [0], past_index=300)  # a checkpoint flushes the data into table files
    cluster.kill("n1")
    for sst in (cluster.spec.node("n1").data_dir / "p0000" / "db").glob("*.sst"):
        flip(sst, 10)  # inside the first data block: the database still opens
    cluster.start("n1")
    with Client([cluster.spec.node("n1").api_address], timeout=3) as kv:
        try:  # a follower read or scan on n1 reaches the damaged block, if the start did not
            list(kv.scan(consistency="follower"))
        except Exception:
            pass
    line = the_error_line(cluster, "n1")
    assert "is corrupt" in line and "in use by another process" not in line
    wipe_and_resync(cluster, "n1", written)
