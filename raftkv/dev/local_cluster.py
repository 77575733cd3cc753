"""Run a cluster's node processes on this machine (dev up, tests, benchmarks).

Each node is a real `python -m raftkv node start` process with its output in
`<data_dir>/node.log` (or `<log_dir>/<node id>/node.log`, for data dirs on a
disk that a chaos run cuts the power of). Only the PIDs started here are ever
signalled. With `die_with_parent`, the nodes get SIGTERM when the process that
started them ends, however it ends (dev up closed with its terminal, or kill -9).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from raftkv.client.sync_client import Client
from raftkv.core.errors import RaftKVError, Unavailable
from raftkv.core.spec import ClusterSpec, NodeSpec
from raftkv.dev.netns import Hosts
from raftkv.security.tls import client_tls


CommandWrapper = Callable[[str, Sequence[str]], list[str]]

_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before any fork: the child only calls it


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn`: the child gets `sig` when the thread that starts it ends. So only for children
    started from a thread that lives as long as its process (dev up's main thread)."""
    parent = os.getpid()

    def preexec() -> None:
        _prctl(_PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
    return preexec


class LocalCluster:
    """`wrap_command(node_id, command)`, when given, returns the command that actually starts a node
    (e.g. one that first moves itself into a cgroup and then execs `command`, keeping its PID). `hosts`:
    the nodes' hosts of their own (`raftkv.dev.netns`), where each node starts unless `wrap_command` says."""

    def __init__(self, spec: ClusterSpec, spec_path: Path, env: dict[str, str] | None = None,
                 wrap_command: CommandWrapper | None = None, log_dir: Path | None = None,
                 die_with_parent: bool = False, hosts: Hosts | None = None, spares: Sequence[NodeSpec] = ()):
        """`spares`: nodes not in the spec, each with its ports and data dir, that `join` can add (a chaos
        run's membership faults)."""
        self.spec = spec
        self.tls = client_tls(spec)  # what its clients present: the spec's client certificate
        self.spec_path = Path(spec_path)
        self._log_dir = log_dir
        self._spares = {n.id: n for n in spares}
        self._joined: set[str] = set()  # spares that joined once: a removed one never comes back under its id
        self._started: dict[str, float] = {}  # when each node last started; one without its metadata replica
        # since then lost its data
        self.members = list(spec.node_ids)  # the nodes it runs: the spec's, then those joined, less those removed
        self.procs: dict[str, subprocess.Popen] = {}
        self._env = {**os.environ, **(env or {})}
        self.hosts = hosts
        self.wrap_command = wrap_command or (hosts.node_commands(spec) if hosts else None)
        self._die_with_parent = die_with_parent

    @property
    def endpoints(self) -> list[str]:
        return [self.node(n).api_address for n in self.members]

    @property
    def live_spec(self) -> ClusterSpec:
        """The spec with the members' nodes: what the cluster is now."""
        return dataclasses.replace(self.spec, nodes=tuple(self.node(n) for n in self.members))

    def node(self, node_id: str) -> NodeSpec:
        return self._spares[node_id] if node_id in self._spares else self.spec.node(node_id)

    def unused_spares(self) -> list[str]:
        return [n for n in self._spares if n not in self._joined]

    def log_path(self, node_id: str) -> Path:
        folder = self.node(node_id).data_dir if self._log_dir is None else self._log_dir / node_id
        return folder / "node.log"

    def join(self, node_id: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start spare `node_id` as a new member: `raftkv node start --join` through a running member."""
        self.members.append(node_id)
        self._joined.add(node_id)
        return self.start(node_id, env)

    def remove(self, node_id: str) -> None:
        """`node_id` is no member any more (decommissioned, or dead and wiped): never started again."""
        self.members.remove(node_id)

    def start(self, node_id: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start one node; `env` adds to the cluster's environment for this start only (fail points). A spare
        joins through a running member the first time, and restarts from what it was told after that."""
        node = self.node(node_id)
        node.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path(node_id).parent.mkdir(parents=True, exist_ok=True)
        seed = self._seed(node_id)
        if node_id in self._spares:  # (the first start, or after its data was lost, joins through `seed`)
            command = [sys.executable, "-m", "raftkv", "node", "start", "--node", node_id, "--host", node.host,
                       "--base-port", str(node.api_port), "--data-dir", str(node.data_dir)]
            command += ["--join", seed] if seed else []
        else:
            command = [sys.executable, "-m", "raftkv", "node", "start", "--config", str(self.spec_path),
                       "--node", node_id]
            if node_id in self._started and not node.meta_dir.exists() and seed:  # its data is gone: the
                command += ["--join", seed]  # members the spec names may be too (docs/chaos.md)
        self._started[node_id] = time.monotonic()
        if self.wrap_command is not None:
            command = self.wrap_command(node_id, command)
        with open(self.log_path(node_id), "ab") as log:
            proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**self._env, **(env or {})},
                preexec_fn=die_with_parent() if self._die_with_parent else None,
            )
        self.procs[node_id] = proc
        return proc

    def _seed(self, node_id: str) -> str | None:
        """The API address of the running member started longest ago (the likeliest to serve, and to know
        the current members), to learn the cluster's members from; None when no other member runs."""
        running = [n for n in self.members if n != node_id and n in self.procs and self.procs[n].poll() is None]
        return self.node(min(running, key=lambda n: self._started[n])).api_address if running else None

    def rss_kib(self) -> dict[str, int]:
        """Each running node's resident memory (KiB)."""
        found = {}
        for node_id, proc in self.procs.items():
            if proc.poll() is None and (kib := process_rss_kib(proc.pid)) is not None:
                found[node_id] = kib
        return found

    def start_all(self) -> None:
        for node_id in self.members:
            self.start(node_id)

    def signal(self, node_id: str, sig: int) -> None:
        proc = self.procs[node_id]
        if proc.poll() is None:
            proc.send_signal(sig)

    def kill(self, node_id: str) -> None:
        """kill -9, and reap."""
        self.signal(node_id, signal.SIGKILL)
        self.procs[node_id].wait()

    def stop(self, node_id: str, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        proc = self.procs.get(node_id)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop_all(self) -> None:
        for node_id in list(self.procs):
            self.signal(node_id, signal.SIGTERM)
        for node_id in list(self.procs):
            self.stop(node_id)

    def exited(self) -> dict[str, int]:
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def forget(self, node_id: str) -> None:
        """Stop tracking a node that exited and stays down."""
        del self.procs[node_id]

    def wait_ready(self, timeout: float = 60.0, tend: Callable[[], None] | None = None) -> None:
        """Until every running node answers and every partition has a leader that all of them agree on.
        A node that exits meanwhile fails the wait, unless `tend` is given: it is called every turn
        instead, and deals with such nodes itself (dev up restarts them, or lets them go)."""
        deadline = time.monotonic() + timeout
        last = "no status yet"
        with Client(self.endpoints, timeout=2.0, tls=self.tls) as client:
            while time.monotonic() < deadline:
                if tend is not None:
                    tend()
                elif dead := self.exited():
                    raise Unavailable(
                        f"node(s) exited during start-up: {dead}; see {self.log_path(next(iter(dead)))}"
                    )
                running = {n for n, p in self.procs.items() if p.poll() is None}
                try:
                    last = _not_ready(client, self.spec.partitions, running)
                except RaftKVError as exc:
                    last = str(exc)
                if not last:
                    return
                time.sleep(0.1)
        raise Unavailable(f"cluster not ready after {timeout:.0f}s: {last}")


def _not_ready(client: Client, partitions: int, running: set[str]) -> str:
    """'' when every running node answers and every partition has one leader that every reachable
    replica knows, else what is missing. A running node that does not answer yet is still starting:
    two nodes agree on every leader before the third listens."""
    leaders: dict[int, set[str]] = {p: set() for p in range(partitions)}
    known: dict[int, set[str]] = {p: set() for p in range(partitions)}
    statuses = client.status()
    if silent := sorted(s.node_id for s in statuses if not s.reachable and s.node_id in running):
        return f"running node(s) not answering yet: {silent}"
    for status in statuses:
        if not status.reachable:
            continue
        for ps in status.partitions:
            if ps.role == "leader":
                leaders[ps.partition].add(status.node_id)
            known[ps.partition].add(ps.leader)
    missing = [p for p in range(partitions) if len(leaders[p]) != 1 or known[p] != leaders[p]]
    return f"partitions without a leader known to all their replicas: {missing}" if missing else ""


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports: a listener there can lose its port."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def free_port_block(size: int) -> int:
    """A base port with `size` consecutive free loopback ports, below the ephemeral range, so that
    no outgoing connection takes one of them between this check and the listener's bind."""
    ephemeral_low, _ = _ephemeral_ports()
    top = min(ephemeral_low, 65535) - size
    for _ in range(500):
        base = random.randrange(10000, top)
        if all(port_free(base + i) for i in range(size)):
            return base
    raise RuntimeError(f"no block of {size} free ports below {ephemeral_low}")


def process_rss_kib(pid: int | str = "self") -> int | None:
    """A process's resident memory (KiB) from /proc; None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None
