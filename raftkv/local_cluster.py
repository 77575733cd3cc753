"""Run a cluster's node processes on this machine (dev up, tests, benchmarks).

Each node is a real `python -m raftkv node start` process with its output in
`<data_dir>/node.log`. Only the PIDs started here are ever signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from raftkv.client import Client
from raftkv.errors import RaftKVError, Unavailable
from raftkv.spec import ClusterSpec


class LocalCluster:
    def __init__(self, spec: ClusterSpec, spec_path: Path, env: dict[str, str] | None = None):
        self.spec = spec
        self.spec_path = Path(spec_path)
        self.procs: dict[str, subprocess.Popen] = {}
        self._env = {**os.environ, **(env or {})}

    @property
    def endpoints(self) -> list[str]:
        return [n.api_address for n in self.spec.nodes]

    def log_path(self, node_id: str) -> Path:
        return self.spec.node(node_id).data_dir / "node.log"

    def start(self, node_id: str) -> subprocess.Popen:
        node = self.spec.node(node_id)
        node.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path(node_id), "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "raftkv", "node", "start", "--config", str(self.spec_path), "--node", node_id],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env,
            )
        self.procs[node_id] = proc
        return proc

    def start_all(self) -> None:
        for node_id in self.spec.node_ids:
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

    def wait_ready(self, timeout: float = 60.0, nodes: list[str] | None = None) -> None:
        """Until every partition has a leader that all running replicas agree on."""
        deadline = time.monotonic() + timeout
        last = "no status yet"
        with Client(self.endpoints, timeout=2.0) as client:
            while time.monotonic() < deadline:
                dead = {n: rc for n, rc in self.exited().items() if nodes is None or n in nodes}
                if dead:
                    raise Unavailable(
                        f"node(s) exited during start-up: {dead}; see {self.log_path(next(iter(dead)))}"
                    )
                try:
                    last = _leaderless(client, self.spec.partitions)
                except RaftKVError as exc:
                    last = str(exc)
                if not last:
                    return
                time.sleep(0.1)
        raise Unavailable(f"cluster not ready after {timeout:.0f}s: {last}")


def _leaderless(client: Client, partitions: int) -> str:
    """'' when every partition has one leader that every reachable replica knows, else what is missing."""
    leaders: dict[int, set[str]] = {p: set() for p in range(partitions)}
    known: dict[int, set[str]] = {p: set() for p in range(partitions)}
    for status in client.status():
        if not status.reachable:
            continue
        for ps in status.partitions:
            if ps.role == "leader":
                leaders[ps.partition].add(status.node_id)
            known[ps.partition].add(ps.leader)
    missing = [p for p in range(partitions) if len(leaders[p]) != 1 or known[p] != leaders[p]]
    return f"partitions without a leader known to all their replicas: {missing}" if missing else ""
