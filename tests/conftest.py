"""Shared fixtures: real node processes on free loopback ports."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

import raftkv  # noqa: F401  before anything imports grpc: it sets how gRPC treats a fork (raftkv/__init__.py)
from learners.changelog_client import ChangeLogClient
from raftkv.raft import snapshot_file
from raftkv.client.sync_client import Client
from raftkv.core.errors import CorruptData, Timeout, Unavailable, Undetermined
from raftkv.core.release import VERSION
from raftkv.dev.local_cluster import LocalCluster, free_port_block
from raftkv.dev.netns import Hosts
from raftkv.core.spec import BackupConfig, ClusterSpec, NodeSpec, Tuning, build_spec, ports_per_node
from raftkv.core.spec_toml import save_spec
from raftkv.meta.records import ClusterMeta
from raftkv.security.certs import with_certificates
from tests import node_logs


def random_write(kv, rng: random.Random, keys: int, deletes: float) -> None:
    """A put, or with probability `deletes` a delete, of one of `keys` keys. The feed tests that
    write this way check the feed against the final state: a write the cluster could not settle
    is part of the load, not a failure."""
    key = b"key-%04d" % rng.randrange(keys)
    try:
        if rng.random() < deletes:
            kv.delete(key)
        else:
            kv.put(key, b"v%d" % rng.randrange(10**9))
    except (Unavailable, Undetermined):
        pass


class Writer(threading.Thread):
    """Puts distinct keys until stopped; remembers every acknowledged one. Also a context manager."""

    def __init__(self, endpoints: list[str]):
        super().__init__(daemon=True)
        self.endpoints = endpoints
        self.acked: dict[bytes, bytes] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        with Client(self.endpoints, timeout=10.0) as kv:
            i = 0
            while not self.stopping.is_set():
                key, value = b"w-%06d" % i, b"v%d" % i
                try:
                    kv.put(key, value)
                    self.acked[key] = value
                except (Unavailable, Undetermined, Timeout):
                    pass
                i += 1

    def stop(self) -> dict[bytes, bytes]:
        self.stopping.set()
        self.join(timeout=30)
        return self.acked

    def __enter__(self) -> Writer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


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


async def until(condition: Callable[[], object], timeout: float = 30.0, what: str = "the condition") -> None:
    """`wait_until` inside an event loop: poll `condition` without blocking the loop, or fail naming `what`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(0.01)


def settled_topology(kv: Client) -> ClusterMeta:
    """The metadata once bootstrapped and at this build's cluster version: its one raise after start-up
    (raftkv/meta/cluster_version.py) is not a change the test made."""
    def settled():
        meta = kv.topology().meta
        return meta if meta.epoch and meta.cluster_version == VERSION else None
    return wait_until(settled, 30, f"the metadata to be bootstrapped and at cluster version {VERSION}")


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


LOG_TAIL_LINES = 40


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report ends with the tail of every process log under its tmp_path: CI keeps no
    files, and a wait that timed out says nothing of what the nodes were doing."""
    report = (yield).get_result()
    root = item.funcargs.get("tmp_path") if hasattr(item, "funcargs") else None
    if report.when != "call" or not report.failed or root is None:
        return
    for log in sorted(Path(root).glob("**/*.log")):
        if log.parent.name in ("db", "raft-log") or log.name == "raft.log" or not log.is_file():
            continue  # RocksDB's write-ahead logs, the node's Raft log, a learner's journals
        tail = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        report.sections.append((f"{log.relative_to(root)} (last {len(tail)} lines)", "\n".join(tail)))


@pytest.fixture(autouse=True)
def quiet_process_logs(request):
    """After a test whose processes write logs under its tmp_path (set up first, so checked after they
    stopped): fail on a traceback or an unretrieved exception in them that the test does not expect
    (`@pytest.mark.expected_log(pattern, ...)`, tests/node_logs.py)."""
    root = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if root is None:
        return
    expected = [p for marker in request.node.iter_markers("expected_log") for p in marker.args]
    if found := node_logs.report(root, expected):
        pytest.fail(f"tracebacks in the processes' logs that the test does not expect:\n{found}", pytrace=False)


# every node's raft_engine in the clusters `cluster_maker` starts, unless a test names one:
# RAFTKV_TEST_RAFT_ENGINE=off|auto|steady runs the real-process suites with it (docs/raft-engine.md)
RAFT_ENGINE = os.environ.get("RAFTKV_TEST_RAFT_ENGINE", NodeSpec.raft_engine)


@contextlib.contextmanager
def cluster_maker(root: Path) -> Iterator[Callable[..., LocalCluster]]:
    """make(nodes=3, partitions=4, backup=None, tls=False, **tuning) -> a started, ready LocalCluster under
    `root`; tls="metrics" serves the metrics port (and the console) over HTTPS too; hosts=True runs each
    node on a host of its own (a network namespace with its own address, `raftkv.dev.netns`; the cluster's
    `hosts` makes more, for nodes that join). Every process is killed, and every host removed, on leaving."""
    clusters: list[LocalCluster] = []
    made_hosts: list[Hosts] = []

    def make(nodes: int = 3, partitions: int = 4, replication: int = 3, durability: str = "lose-last-second",
             start: bool = True, backup: BackupConfig | None = None, tls: bool | str = False,
             raft_engine: str = RAFT_ENGINE, hosts: bool = False, **tuning) -> LocalCluster:
        base = free_port_block(nodes * ports_per_node(partitions))
        own_hosts = None
        if hosts:
            own_hosts = Hosts(nodes)
            made_hosts.append(own_hosts)
        spec: ClusterSpec = build_spec(nodes=nodes, partitions=partitions, replication=replication,
                                       base_port=base, data_dir=root / f"c{len(clusters)}", durability=durability,
                                       hosts=own_hosts.addresses if own_hosts else None)
        spec = dataclasses.replace(spec, tuning=Tuning(**tuning), backup=backup, nodes=tuple(
            dataclasses.replace(n, raft_engine=raft_engine) for n in spec.nodes))
        folder = root / f"c{len(clusters)}"
        if tls:
            spec = with_certificates(spec, folder)
        if tls == "metrics":
            spec = dataclasses.replace(spec, tls=dataclasses.replace(spec.tls, metrics=True))
        spec_path = save_spec(spec, folder / "cluster.toml")
        cluster = LocalCluster(spec, spec_path, hosts=own_hosts)
        clusters.append(cluster)
        if start:
            cluster.start_all()
            cluster.wait_ready(timeout=60)
        return cluster

    try:
        yield make
    finally:
        for cluster in clusters:
            for node_id in list(cluster.procs):
                cluster.kill(node_id)
        for hosts in made_hosts:
            hosts.close()


@pytest.fixture
def make_cluster(tmp_path: Path):
    """A test's own clusters (`cluster_maker`), under its tmp_path."""
    with cluster_maker(tmp_path) as make:
        yield make


@pytest.fixture(scope="module")
def make_module_cluster(tmp_path_factory):
    """Clusters a module's tests share (`cluster_maker`): for tests that leave the cluster as they found it
    (each its own keys and users), where a start per test would cost more than the test."""
    root = tmp_path_factory.mktemp("shared")
    with cluster_maker(root) as make:
        yield make
    if found := node_logs.report(root, []):
        pytest.fail(f"tracebacks in the shared cluster's logs:\n{found}", pytrace=False)


BUCKET = "raftkv-backups"  # the bucket the `s3` fixture makes


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 endpoint with BUCKET, and fake credentials in this process (and its children) only."""
    from tests.s3_server import s3_server  # it imports wait_until from here

    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        with s3_server(BUCKET, tmp_path_factory.mktemp("moto") / "moto.log") as endpoint:
            yield endpoint


@pytest.fixture(params=["file", "s3"])
def target(request, tmp_path) -> tuple[str, dict[str, str]]:
    """(url, backup sink options) of an empty backup location: a folder, or a prefix in the `s3` bucket."""
    if request.param == "file":
        return (tmp_path / "backups").as_uri(), {}
    endpoint = request.getfixturevalue("s3")
    return f"s3://{BUCKET}/{tmp_path.name}", {"storage.endpoint_url": endpoint}


@pytest.fixture
def changelog_learner(tmp_path):
    """start(cluster) -> the API address of a learner running the changelog sink."""
    procs: list[subprocess.Popen] = []
    logs = []

    def start(cluster) -> str:
        port = free_port_block(1)
        config = ["--config", str(cluster.spec_path)]
        subprocess.run([sys.executable, "-m", "raftkv", "learner", "add", "--name", "changes", "--sink", "changelog",
                        "--sink-option", f"path={tmp_path / 'changelog'}", *config],
                       check=True, capture_output=True, timeout=60)
        log = open(tmp_path / "learner.log", "ab")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, "-m", "raftkv", "learner", "start", "--name", "changes",
                                       "--api-port", str(port), *config],
                                      stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        return f"127.0.0.1:{port}"

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
    for log in logs:
        log.close()


def changelog_caught_up(cluster, address: str) -> bool:
    """Whether the learner's changelog has every entry the cluster committed."""
    with Client(cluster.endpoints, tls=cluster.tls) as client:
        committed = {p.partition: p.commit_index for s in client.status() for p in s.partitions if p.role == "leader"}
    with ChangeLogClient(address, timeout=5, tls=cluster.tls) as log:
        latest = {o.partition: o.latest for o in log.offsets()}
    return all(latest.get(p, 0) >= index for p, index in committed.items())
