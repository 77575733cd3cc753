"""One simulation run: a seed, a number of steps, a cluster's shape and its faults, and what came of it.

After the steps the faults stop, the network heals and every node restarts; the run goes on until
every group has a leader that every member has caught up with (or `settle_seconds` of virtual time
pass: a liveness failure). Then every member of a group must hold the same applied history, and every
acknowledged proposal must be in it, unless a power cut of the default mode took it from a majority
(counted in `lost_acknowledged`, not a failure).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from tests.engine_sim.checker import Checker
from tests.engine_sim.clock import Scheduler, virtual_time
from tests.engine_sim.cluster import SimCluster
from tests.engine_sim.faults import Faults, Nemesis
from tests.engine_sim.network import NetFaults, SimNetwork
from tests.engine_sim.trace import Trace

_LOGGERS = ("raftkv.raft", "pysyncobj")
_SHM = Path("/dev/shm")


@dataclass(frozen=True)
class SimConfig:
    seed: int = 1
    steps: int = 5000
    nodes: int = 3
    groups: int = 2
    replicas: int = 3
    fsync: bool = False
    net: NetFaults = NetFaults()
    faults: Faults = Faults()
    settle_seconds: float = 60.0
    engine: bool = False  # groups' steady state through the node engine, hand-overs both ways
    learners: bool = False  # a learner process, a read-only member of every even group (cluster.LEARNER)

    def command(self) -> str:
        """The command line that replays this run."""
        words = [f"--seed {self.seed} --steps {self.steps} --nodes {self.nodes} --groups {self.groups}",
                 f"--mode {'fsync' if self.fsync else 'default'}"]
        if self.engine:
            words.append("--engine")
        if self.learners:
            words.append("--learners")
        if self.replicas != 3:
            words.append(f"--replicas {self.replicas}")
        for name, value, default in _changed(self.net, NetFaults()) + _changed(self.faults, Faults()):
            words.append(f"--{name.replace('_', '-')} {value}")
        return "python scripts/raft_sim.py " + " ".join(words)


def _changed(options, defaults) -> list[tuple[str, object, object]]:
    return [(f.name, getattr(options, f.name), getattr(defaults, f.name)) for f in fields(options)
            if getattr(options, f.name) != getattr(defaults, f.name)]


@dataclass
class Result:
    config: SimConfig
    violations: list[str]
    liveness: list[str]
    trace: Trace
    steps: int = 0
    virtual_seconds: float = 0.0
    wall_seconds: float = 0.0
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Safe. A group that did not settle (`liveness`) is reported, not a failure: pysyncobj walks a
        diverged follower back one entry per heartbeat, and a member that does not know it was removed
        disrupts the others (docs/raft-engine.md, "The simulation, as built")."""
        return not self.violations

    def report(self, trace_lines: int | None = 400) -> str:
        """What failed, the command that replays it and the trace's last `trace_lines` lines (None: all; 0: none)."""
        what = self.violations or self.liveness
        if trace_lines == 0:
            return "\n".join([self.report(1).split("\ntrace")[0]])
        return "\n".join([
            f"seed {self.config.seed}: {'safety violation' if self.violations else 'did not settle'} at step "
            f"{self.steps} ({self.virtual_seconds:.2f} s of virtual time)",
            *(f"  {line}" for line in what),
            f"replay: {self.config.command()} --trace",
            f"trace ({'last ' + str(trace_lines) if trace_lines else 'all'} lines):",
            self.trace.render(trace_lines),
        ])


def run(config: SimConfig) -> Result:
    started = time.perf_counter()
    scheduler = Scheduler()
    trace = Trace(scheduler)
    checker = Checker(trace)
    result = Result(config, checker.violations, [], trace)
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="raft-sim-", dir=_SHM if _SHM.is_dir() else None)))
        stack.enter_context(_logs_into(trace, checker))
        cluster = SimCluster(
            config.nodes, config.groups, config.replicas, config.fsync, config.seed, folder, scheduler,
            lambda directory: SimNetwork(scheduler, config.seed, config.net, directory, trace), trace, checker,
            engine=config.engine, learners=config.learners)
        stack.enter_context(virtual_time(scheduler, config.seed, cluster.create_journal))
        cluster.start()
        nemesis = Nemesis(cluster, config.faults, config.seed)
        while scheduler.steps < config.steps and not checker.violations:
            handle = scheduler.step()  # never None: the faults and the client are always due
            cluster.check(handle.member)
        if not checker.violations:
            nemesis.stop()
            _settle(config, scheduler, cluster, result)
        result.steps, result.virtual_seconds = scheduler.steps, scheduler.now
        result.stats = cluster.stats()
    result.wall_seconds = time.perf_counter() - started
    return result


def _settle(config: SimConfig, scheduler: Scheduler, cluster: SimCluster, result: Result) -> None:
    deadline = scheduler.now + config.settle_seconds
    checker = cluster.checker
    while not checker.violations and scheduler.now < deadline:
        for _ in range(200):
            handle = scheduler.step()
            if handle is None:  # every group rests, and nothing else is due
                break
            cluster.check(handle.member)
        for group in list(cluster.unsure):
            cluster.reconcile(group)
        if not cluster.unsettled():
            break
    if checker.violations:
        return
    waiting = cluster.unsettled()
    result.liveness.extend(waiting.values())
    cluster.check_final([g for g in cluster.groups if g not in waiting])


@contextlib.contextmanager
def _logs_into(trace: Trace, checker: Checker):
    """Warnings of our Raft code and pysyncobj go into the trace; an error is a failure (a tick that raised,
    a replica that stopped, a refused append). They do not reach the test's own log handlers."""
    handler = _Handler(trace, checker)
    saved = []
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.propagate, logger.level))
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, propagate, level in saved:
            logger.removeHandler(handler)
            logger.propagate = propagate
            logger.setLevel(level)


class _Handler(logging.Handler):
    def __init__(self, trace: Trace, checker: Checker):
        super().__init__(logging.WARNING)
        self._trace = trace
        self._checker = checker

    def emit(self, record: logging.LogRecord) -> None:
        text = f"{record.name}: {record.getMessage()}"
        if record.exc_info:
            text += f" ({record.exc_info[0].__name__}: {record.exc_info[1]})"
        if record.levelno >= logging.ERROR:
            self._checker.fail(f"{record.levelname} logged: {text}")
        else:
            self._trace.add("log", text)
