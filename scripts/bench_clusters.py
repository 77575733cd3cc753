"""The clusters under test: 3 raftkv nodes or 3 etcd members on loopback, stopped on exit.

Both are context managers that yield a `Running` (client endpoints, server PIDs,
and the client's TLS files when the cluster runs TLS) and stop every process they
started, whatever ends the block. With `tls=True`, each cluster gets its own CA and
certificates, made with raftkv's `raftkv.security.certs`.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

from raftkv.dev.local_cluster import LocalCluster
from raftkv.dev.local_cluster import free_port_block
from raftkv.dev.metrics_scrape import samples
from raftkv.core.spec import NodeSpec, Tuning, build_spec, ports_per_node
from raftkv.core.spec_toml import save_spec
from raftkv.security.certs import init_certs, with_certificates
from raftkv.security.tls import Tls

MEMBERS = 3
ETCD3AIO = "etcd3aio==0.3.0"  # checked against protobuf 7 / grpcio 1.85 (its generated code is 6.31 gencode)


@dataclass(frozen=True)
class Running:
    endpoints: tuple[str, ...]
    pids: tuple[int, ...]
    tls: Tls | None = None  # what a client presents and trusts; None: plaintext
    metrics: tuple[str, ...] = ()  # raftkv: each node's Prometheus endpoint (host:port)


# -- raftkv -------------------------------------------------------------------------


@contextmanager
def raftkv_cluster(data_dir: Path, partitions: int, durability: str = "lose-last-second",
                   tuning: Tuning | None = None, ready_timeout: float = 60, tls: bool = False,
                   raft_engine: str = NodeSpec.raft_engine) -> Iterator[Running]:
    """`tls`: mutual TLS on every connection, and the clients are the `admin` user (role root): a cluster
    with TLS enforces permissions. `raft_engine`: every node's setting (docs/raft-engine.md), by default
    what a node ships with."""
    spec = build_spec(
        nodes=MEMBERS, partitions=partitions, replication=MEMBERS, durability=durability,
        base_port=free_port_block(MEMBERS * ports_per_node(partitions)), data_dir=data_dir,
    )
    if tuning is not None:
        spec = replace(spec, tuning=tuning)
    spec = replace(spec, nodes=tuple(replace(n, raft_engine=raft_engine) for n in spec.nodes))
    if tls:
        spec = with_certificates(spec, data_dir)
    cluster = LocalCluster(spec, save_spec(spec, data_dir / "cluster.toml"))
    metrics = tuple(f"{n.host}:{n.metrics_port}" for n in spec.nodes)
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=ready_timeout)
        if raft_engine == "auto" and not tls:  # a TLS node serves its metrics over HTTPS, to a user
            wait_engines_on(metrics, ready_timeout)
        yield Running(tuple(cluster.endpoints), tuple(p.pid for p in cluster.procs.values()), cluster.tls, metrics)
    finally:
        cluster.stop_all()


def wait_engines_on(metrics: tuple[str, ...], timeout: float) -> None:
    """"auto" hands settled groups to the node engine once the metadata says every member runs it, seconds
    after a new cluster answers at 1,024 partitions: a load started before measures pysyncobj alone."""
    deadline = time.monotonic() + timeout
    while not all(any(s.name == "raftkv_engine_on" and s.value == 1 for s in samples(m)) for m in metrics):
        if time.monotonic() > deadline:
            sys.exit(f"the node engine was not on at every node {timeout:.0f} s after the cluster was ready")
        time.sleep(0.2)


# -- etcd ---------------------------------------------------------------------------


def ensure_etcd() -> str:
    """The etcd binary; installs Debian's etcd-server (etcd 3.4) when it is missing."""
    if not shutil.which("etcd"):
        install = ["apt-get", "install", "-y", "-q", "etcd-server"]
        if subprocess.run(install, stdout=subprocess.DEVNULL).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], stdout=subprocess.DEVNULL, check=True)
            subprocess.run(install, stdout=subprocess.DEVNULL, check=True)
    return shutil.which("etcd") or sys.exit("etcd is not on PATH after installing etcd-server")


def ensure_etcd3aio() -> None:
    """etcd3aio, the async gRPC etcd client, installed into this interpreter's environment if missing."""
    if importlib.util.find_spec("etcd3aio") is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", ETCD3AIO], check=True)


def etcd_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    return out.splitlines()[0].removeprefix("etcd Version: ") if out else "unknown"


def _member_command(binary: str, name: str, data_dir: Path, client_url: str, peer_url: str, cluster: str) -> list[str]:
    return [
        binary, "--name", name, "--data-dir", str(data_dir),
        "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", cluster, "--initial-cluster-state", "new", "--initial-cluster-token", "raftkv-bench",
    ]


ETCD_HOST = "127.0.0.1"
ETCD_CLIENT_USER = "bench"  # the CN of the etcd clients' certificate (etcd's own auth stays off)


@contextmanager
def etcd_cluster(binary: str, data_dir: Path, tls: bool = False) -> Iterator[Running]:
    """Three etcd members on 127.0.0.1, each with its own data dir, client port and peer port.

    `tls`: https client and peer URLs, and a certificate the cluster's CA signed required of
    clients and peers alike (`--client-cert-auth`, `--peer-client-cert-auth`).
    """
    base = free_port_block(2 * MEMBERS)
    scheme = "https" if tls else "http"
    names = [f"e{i + 1}" for i in range(MEMBERS)]
    clients = [f"{scheme}://{ETCD_HOST}:{base + 2 * i}" for i in range(MEMBERS)]
    peers = [f"{scheme}://{ETCD_HOST}:{base + 2 * i + 1}" for i in range(MEMBERS)]
    initial = ",".join(f"{n}={p}" for n, p in zip(names, peers))
    client_tls = _etcd_certs(data_dir / "certs", names) if tls else None
    procs: list[subprocess.Popen] = []
    try:
        for name, client_url, peer_url in zip(names, clients, peers):
            member_dir = data_dir / name
            member_dir.mkdir(parents=True, exist_ok=True)
            with open(member_dir / "etcd.log", "ab") as log:
                command = _member_command(binary, name, member_dir / "data", client_url, peer_url, initial)
                if client_tls:
                    command += _etcd_tls_flags(client_tls.ca.parent, name)
                procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        _wait_etcd_ready(clients, procs, data_dir, client_tls)
        yield Running(tuple(u.removeprefix(f"{scheme}://") for u in clients), tuple(p.pid for p in procs), client_tls)
    finally:
        _stop(procs)


def _etcd_certs(out: Path, names: list[str]) -> Tls:
    """A CA, a certificate per member (server and peer alike, SAN 127.0.0.1) and the clients' one, in `out`;
    returns the clients' TLS.

    raftkv's issuer makes them (a learner certificate comes too, unused): an etcd member is a node to it.
    """
    init_certs(out, None, [ETCD_CLIENT_USER], days=30, nodes=[(name, ETCD_HOST) for name in names])
    return Tls(out / "ca.pem", out / f"user-{ETCD_CLIENT_USER}.pem", out / f"user-{ETCD_CLIENT_USER}.key")


def _etcd_tls_flags(certs: Path, name: str) -> list[str]:
    ca, cert, key = str(certs / "ca.pem"), str(certs / f"node-{name}.pem"), str(certs / f"node-{name}.key")
    return ["--client-cert-auth", "--trusted-ca-file", ca, "--cert-file", cert, "--key-file", key,
            "--peer-client-cert-auth", "--peer-trusted-ca-file", ca, "--peer-cert-file", cert, "--peer-key-file", key]


def _wait_etcd_ready(clients: list[str], procs: list[subprocess.Popen], data_dir: Path, tls: Tls | None,
                     timeout: float = 60):
    """Until every member's /health says it has a leader and serves requests."""
    context = tls.client_context() if tls else None
    deadline = time.monotonic() + timeout
    while not all(_healthy(url, context) for url in clients):
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"an etcd member exited during start-up; see {data_dir}/e*/etcd.log")
        if time.monotonic() > deadline:
            raise RuntimeError(f"etcd not healthy after {timeout:.0f}s; see {data_dir}/e*/etcd.log")
        time.sleep(0.2)


def _healthy(client_url: str, context: ssl.SSLContext | None) -> bool:
    try:
        with urllib.request.urlopen(client_url + "/health", timeout=2, context=context) as response:
            return json.load(response).get("health") == "true"
    except (OSError, ValueError):
        return False


def _stop(procs: list[subprocess.Popen], timeout: float = 10.0) -> None:
    """SIGTERM each process we started, then SIGKILL whatever is still running after `timeout`."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- single processes and joining members (scripts/bench_learner.py) -------------------


def raftkv_spec_path(data_dir: Path) -> Path:
    """Where `raftkv_cluster(data_dir, ...)` saves the cluster spec (what `raftkv ... --config` takes)."""
    return data_dir / "cluster.toml"


@contextmanager
def started(command: list[str], log_path: Path) -> Iterator[subprocess.Popen]:
    """One process with its output in `log_path`; stopped like the cluster members, whatever ends the block."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        _stop([proc])


def etcd_join_command(binary: str, name: str, data_dir: Path, client_url: str, peer_url: str,
                      cluster: str) -> list[str]:
    """A member joining a running cluster that already lists it (Cluster.MemberAdd first): the
    `--initial-cluster` has every member, this one included, and the state is `existing`."""
    command = _member_command(binary, name, data_dir, client_url, peer_url, cluster)
    command[command.index("--initial-cluster-state") + 1] = "existing"
    return command


def etcd_rpc():
    """(rpc_pb2, rpc_pb2_grpc): etcd's v3 API as generated code, from the copy etcd3aio ships.

    Lets a caller use plain (synchronous) gRPC stubs, e.g. `rpc_pb2_grpc.ClusterStub(channel)`.
    """
    ensure_etcd3aio()
    from etcd3aio import _protobuf  # puts etcd3aio's generated modules (package `etcd.api...`) on sys.path

    return _protobuf.rpc_pb2, _protobuf.rpc_pb2_grpc
