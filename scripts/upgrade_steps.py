"""upgrade_check.py, part 2: the steps of a rolling upgrade and what each measured.

    run = Run()
    upgrade_node(run, cluster, "n1", new_env, timeout)     # SIGTERM, start on the new release, until it serves
    fall_behind(run, cluster, kv, "n1", "n2", 4.0, timeout) # pause an older node while a new one leads
    upgrade_learner(run, learner, kv, new_env, timeout)    # SIGTERM, start, until it delivers on every partition
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from raftkv.client.sync_client import Client
from raftkv.core.errors import RaftKVError
from raftkv.core.release import VERSION
from raftkv.dev.local_cluster import LocalCluster

LEARNER = "feed"


@dataclass
class Step:
    name: str
    log: Path
    stopped_at: float  # when SIGTERM (or SIGSTOP) was sent
    upgrade: bool = True  # False: paused, not upgraded (fall_behind)
    new_from: int = 0  # where this build's output begins in `log` (before it: the older release's)
    exit_code: int | None = None  # None: it did not exit within the grace and was killed
    down_seconds: float = 0.0
    started_at: float = 0.0
    serving_seconds: float | None = None  # None: it did not serve (or catch up) within --step-timeout
    ended_at: float = 0.0  # when the next step began (the last: when the load stopped)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Run:
    steps: list[Step] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what a reader should know that no check decides
    phases: dict[str, float] = field(default_factory=dict)  # seconds each part of the run took
    _mark: float = field(default_factory=time.monotonic)

    def phase(self, name: str) -> None:
        """The part of the run that ended now."""
        now = time.monotonic()
        self.phases[name], self._mark = now - self._mark, now

    def check(self, name: str, ok: bool, detail: str) -> bool:
        self.checks.append(Check(name, ok, detail))
        return ok


class Learner:
    """The learner process, started from one release or the other."""

    def __init__(self, spec_path: Path, log_path: Path):
        self.spec_path = spec_path
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, env: dict[str, str]) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "raftkv", "learner", "start", "--name", LEARNER, "--config", str(self.spec_path)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, **env})

    def stop(self, grace: float = 30.0) -> int | None:
        return terminate(self.proc, grace) if self.proc else None


def terminate(proc: subprocess.Popen, grace: float) -> int | None:
    """SIGTERM; its exit code, or None if it had to be killed after `grace` seconds."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def cli(env: dict[str, str], *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "raftkv", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"raftkv {' '.join(args[:2])} failed ({done.returncode}): {done.stderr.strip()}")


def until(predicate, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except RaftKVError:  # the cluster may not answer while a node restarts
            pass
        time.sleep(interval)
    return False


def upgrade_node(run: Run, cluster: LocalCluster, node_id: str, env: dict[str, str], timeout: float) -> bool:
    step = Step(node_id, cluster.log_path(node_id), time.monotonic())
    run.steps.append(step)
    step.exit_code = terminate(cluster.procs[node_id], 30.0)
    step.new_from = step.log.stat().st_size
    step.started_at = time.monotonic()
    step.down_seconds = step.started_at - step.stopped_at
    cluster.start(node_id, env=env)
    try:
        cluster.wait_ready(timeout)
    except RaftKVError as exc:
        return run.check(f"{node_id} serves on {VERSION}", False, str(exc))
    step.serving_seconds = time.monotonic() - step.started_at
    return True


def delivered(kv: Client) -> dict[int, int]:
    view = kv.learners().get(LEARNER)
    return dict(view.progress) if view else {}


def upgrade_learner(run: Run, learner: Learner, kv: Client, env: dict[str, str], timeout: float) -> bool:
    step = Step("learner", learner.log_path, time.monotonic())
    run.steps.append(step)
    step.exit_code = learner.stop()
    step.new_from = step.log.stat().st_size
    step.started_at = time.monotonic()
    step.down_seconds = step.started_at - step.stopped_at
    before = delivered(kv)
    learner.start(env)
    moved = until(lambda: (now := delivered(kv)) and all(now[p] > before.get(p, 0) for p in now), timeout)
    if not moved:
        return run.check(f"learner delivers on {VERSION}", False, f"no partition's delivered index moved past "
                         f"{before} within {timeout:.0f} s; see {learner.log_path}")
    step.serving_seconds = time.monotonic() - step.started_at
    return True




def fall_behind(run: Run, cluster: LocalCluster, kv: Client, leader_id: str, old_id: str, seconds: float,
                timeout: float) -> bool:
    """`old_id`, still on the older release, is paused (SIGSTOP) for `seconds` while `leader_id`, on this
    build, is asked to lead every partition: with compaction every few entries, what `old_id` is sent
    to catch up is a snapshot this build made."""
    def led() -> int:
        mine = next(s for s in kv.status() if s.node_id == leader_id)
        for ps in mine.partitions:
            if ps.role != "leader":
                try:
                    kv.transfer_leadership(ps.partition, leader_id)
                except RaftKVError:  # asked again on the next turn
                    pass
        return sum(ps.role == "leader" for ps in mine.partitions)

    until(lambda: led() == kv.partitions, 15.0, interval=0.5)  # the rebalancer may take some back: noted
    leading = led()
    step = Step(f"{old_id} paused", cluster.log_path(old_id), time.monotonic(), upgrade=False)
    run.steps.append(step)
    pid = cluster.procs[old_id].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)
    step.exit_code = 0
    step.started_at = time.monotonic()
    step.down_seconds = step.started_at - step.stopped_at
    committed = {ps.partition: ps.commit_index for s in kv.status() if s.reachable
                 for ps in s.partitions if ps.role == "leader"}

    def caught_up() -> bool:
        mine = next(s for s in kv.status() if s.node_id == old_id)
        return mine.reachable and all(ps.applied_index >= committed.get(ps.partition, 0) for ps in mine.partitions)

    if not until(caught_up, timeout):
        return run.check(f"{old_id} catches up after its pause", False, f"not within {timeout:.0f} s")
    step.serving_seconds = time.monotonic() - step.started_at
    run.notes.append(f"{old_id} paused {seconds:g} s while {leader_id} led {leading} of {kv.partitions} partitions")
    return True
