"""Shared fixtures: real node processes on free loopback ports."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable

import pytest

from raftkv import snapshot_file
from raftkv.errors import CorruptData
from raftkv.local_cluster import LocalCluster, free_port_block
from raftkv.spec import ClusterSpec, Tuning, build_spec, save_spec


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05):
    """Poll `predicate` until it returns a truthy value, or fail naming `what`."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # the condition may raise while the cluster settles
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last_exc})" if last_exc else ""))


def wait_for_compaction(cluster, partitions, past_index: int, except_node: str | None = None,
                        timeout: float = 30) -> None:
    """Until every voter (but `except_node`) has a snapshot beyond `past_index` for each partition.

    Voters decide to compact on a once-a-second check, so a test that needs the log compacted
    waits for it rather than assuming it happened.
    """

    def compacted(node, partition: int) -> bool:
        try:
            meta = snapshot_file.read_meta(node.data_dir / f"p{partition:04d}" / "raft.snapshot")
        except CorruptData:  # not written yet
            return False
        return meta.last_entry[1] > past_index

    wait_until(lambda: all(compacted(n, p) for n in cluster.spec.nodes if n.id != except_node for p in partitions),
               timeout, f"the voters to compact past index {past_index}")


@pytest.fixture
def make_cluster(tmp_path: Path):
    """make_cluster(nodes=3, partitions=4, **tuning) -> a started, ready LocalCluster."""
    clusters: list[LocalCluster] = []

    def make(nodes: int = 3, partitions: int = 4, replication: int = 3, durability: str = "default",
             start: bool = True, **tuning) -> LocalCluster:
        base = free_port_block(nodes * (partitions + 2))
        spec: ClusterSpec = build_spec(nodes=nodes, partitions=partitions, replication=replication,
                                       base_port=base, data_dir=tmp_path / f"c{len(clusters)}", durability=durability)
        spec = dataclasses.replace(spec, tuning=Tuning(**tuning))
        spec_path = save_spec(spec, tmp_path / f"c{len(clusters)}" / "cluster.toml")
        cluster = LocalCluster(spec, spec_path)
        clusters.append(cluster)
        if start:
            cluster.start_all()
            cluster.wait_ready(timeout=60)
        return cluster

    yield make
    for cluster in clusters:
        for node_id in list(cluster.procs):
            cluster.kill(node_id)
