"""One chaos run: a fresh cluster, the workloads, the nemesis, then healing and every check.

    report = run_chaos(ChaosConfig(duration=60, faults=parse_faults("kill,partition")))
    report.ok, report.violations, report.run_dir

The run starts its own cluster from a fresh spec on free loopback ports and
removes every process, cgroup, nftables table and mount it made, also when it
fails or is interrupted (Ctrl-C, or SIGTERM where it runs in the main thread). Its
files (history.jsonl, timeline.json, violations.json, the nodes' logs and data dirs)
go to `config.out` or a temporary folder; the data dirs are kept only when a check
fails, and a temporary folder only then.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from raftkv.chaos.config import ChaosConfig
from raftkv.chaos.convergence import replica_differences, scan_any
from raftkv.chaos.engine_use import engine_counts
from raftkv.chaos.faults import FaultInjector, placement_of
from raftkv.chaos.feeds import Feed, feed_violations, start_feeds
from raftkv.chaos.bank import ACCOUNTS, OPENING_BALANCE
from raftkv.chaos.bank_check import check_bank
from raftkv.chaos.history import BANK_FUNCTIONS, REGISTER_FUNCTIONS, SET_FUNCTIONS, Op, Violation, dump_history
from raftkv.chaos.linearizability import check_register
from raftkv.chaos.nemesis import POWER_LOSS_DISK_FAULTS, FaultStep, choose_disk_node, schedule
from raftkv.chaos.hostcut import HostCut
from raftkv.chaos.netcut import NetCut
from raftkv.chaos.power_cuts import LOSS_BOUND_SECONDS, Cut, PowerCutLosses, explain_losses
from raftkv.chaos.resources import SETTLE_SECONDS, ResourceWatch, grown
from raftkv.chaos.recovery import WRITE_DEADLINE, lagging_replicas, writes_resume
from raftkv.chaos.set_check import check_set
from raftkv.chaos.small_disk import SmallDisk
from raftkv.chaos.timeline import FaultRecord, Timeline
from raftkv.chaos.workload import History, Workload, WorkloadConfig, read_banks, read_set
from raftkv.core.errors import ConfigError
from raftkv.dev.local_cluster import LocalCluster, free_port_block
from raftkv.dev.netns import Hosts
from raftkv.core.spec import FSYNC, ClusterSpec, NodeSpec, build_spec, ports_per_node
from raftkv.core.spec_toml import load_spec, save_spec
from raftkv.powerloss.disk import PowerLossDisk

FINAL_READ_CLIENT = 1 << 30  # a client id no workload client reaches
ENGINE_CHECK = "raft engine in use"  # with --raft-engine: the engines carried groups


@dataclass(frozen=True)
class CheckOutcome:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class ChaosReport:
    config: ChaosConfig
    op_counts: dict[tuple[str, str], int]  # (f, status) -> ops
    errors: dict[str, int]  # error class -> requests that raised it
    faults: tuple[FaultRecord, ...]
    checks: tuple[CheckOutcome, ...]
    violations: tuple[Violation, ...]
    unknown_keys: tuple[str, ...]  # register keys too costly to decide
    run_dir: Path | None  # where the run's files were kept (None: nothing kept)
    seconds: float
    power_cut_losses: PowerCutLosses | None = None  # default mode with power cuts: what they took
    memory_kib: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)  # RSS at start and end

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def ops(self) -> int:
        return sum(self.op_counts.values())

    @property
    def memory(self) -> str:
        """Each long-lived process's RSS at the start and the end, in MiB."""
        return ", ".join(f"{name} {start / 1024:.0f} -> {end / 1024:.0f}"
                         for name, (start, end) in self.memory_kib.items())


SPILLED_OPS = "ops.jsonl"


def spare_nodes(duration: float) -> int:
    """Nodes a run of `duration` seconds may join (a join or replace fault each takes one)."""
    return min(2 + int(duration // 120), 30)  # the workload's ops as they come, while the run lasts


class RunStatus:
    """What a run is doing now, for a live display (read from another thread)."""

    def __init__(self):
        self.phase = "starting"
        self.history: History | None = None
        self.timeline: Timeline | None = None
        self.workload_started: float | None = None


def run_chaos(config: ChaosConfig, *, steps: tuple[FaultStep, ...] | None = None,
              status: RunStatus | None = None) -> ChaosReport:
    """Run the workloads against a fresh cluster under the nemesis `steps` (default: scheduled from the seed).

    Given `steps` are the whole plan: the run ends once the last is healed and the cluster has
    recovered, so that a loaded machine, where each fault takes longer, still runs all of them;
    `config.duration` then only caps it."""
    if problems := config.problems():
        raise ConfigError(problems, source="chaos run")
    started = time.monotonic()
    rng = random.Random(config.seed)
    scheduled = steps is None
    if scheduled:
        steps = schedule(config.faults, config.duration, config.partitions, rng)
    status = status or RunStatus()
    run_dir = Path(config.out) if config.out else Path(tempfile.mkdtemp(prefix="raftkv-chaos-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    run = _Run(config, steps, run_dir, status, rng, until_duration=scheduled)
    try:
        with ExitStack() as cleanup:
            _unwind_on_sigterm(cleanup)
            run.execute(cleanup)
    finally:
        run.write_files()
    report = run.report(time.monotonic() - started)
    if report.ok:
        shutil.rmtree(run_dir / "cluster", ignore_errors=True)
        shutil.rmtree(run_dir / "disks", ignore_errors=True)
        if config.out is None:
            shutil.rmtree(run_dir, ignore_errors=True)
            report = dataclasses.replace(report, run_dir=None)
    return report


def _unwind_on_sigterm(cleanup: ExitStack) -> None:
    """SIGTERM unwinds the run like Ctrl-C, so its cleanup runs; Python's default would exit at once and leave
    the nodes, the broker, a paused process and the mounts behind. Only the main thread can set a handler."""
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
        cleanup.callback(signal.signal, signal.SIGTERM, previous)


class _Run:
    def __init__(self, config: ChaosConfig, steps: tuple[FaultStep, ...], run_dir: Path, status: RunStatus,
                 rng: random.Random, until_duration: bool = True):
        self.config = config
        self.steps = steps
        self.until_duration = until_duration  # else the run ends after the last step
        self.run_dir = run_dir
        self.status = status
        self.history = status.history = History(spill=run_dir / SPILLED_OPS)
        self.timeline = status.timeline = Timeline()
        self.rng = rng
        self.disk_node: str | None = None  # the node whose data dir is a small tmpfs, for diskfull
        self.checks: list[CheckOutcome] = []
        self.violations: list[Violation] = []
        self.unknown: tuple[str, ...] = ()
        self.final_read: Op | None = None
        self.final_banks: list[Op] = []
        self.resources: ResourceWatch | None = None
        self.loop = asyncio.new_event_loop()  # for the harness's own requests, the whole run (recovery.writes_resume)
        self.power_cut_losses: PowerCutLosses | None = None
        self.memory_start: dict[str, int] = {}
        self.memory_end: dict[str, int] = {}

    # -- the run -----------------------------------------------------------

    def execute(self, cleanup: ExitStack) -> None:
        cleanup.callback(self.loop.close)
        hosts = None
        if self.config.hosts:  # removed last: after every process on them ended
            hosts = Hosts(self.config.nodes)
            cleanup.callback(hosts.close)
        spec, spares = self._new_spec(hosts)
        every_node = dataclasses.replace(spec, nodes=spec.nodes + spares)  # with those that may join
        netcut = None
        if any(s.fault == "partition" for s in self.steps):
            netcut = HostCut(spec, hosts) if hosts else NetCut(every_node)
            cleanup.callback(netcut.close)
        power_loss = any(s.fault in POWER_LOSS_DISK_FAULTS for s in self.steps)
        disk = None
        if any(s.fault == "diskfull" for s in self.steps):
            self.disk_node = choose_disk_node(spec.node_ids, self.rng)
            folder = self._backing(self.disk_node) if power_loss else spec.node(self.disk_node).data_dir
            disk = SmallDisk(folder, self.config.disk_mb)
            cleanup.callback(disk.close)
            cleanup.callback(self._keep_disk_node_data, spec)
        disks, spare_disks = {}, {}
        if power_loss:  # every data dir on a disk whose power can be cut (over the tmpfs, for diskfull)
            for node in every_node.nodes:  # a spare's is mounted when it joins
                power = PowerLossDisk(node.data_dir, self._backing(node.id))
                cleanup.callback(power.close)
                if node.id in spec.node_ids:
                    power.mount()
                    disks[node.id] = power
                else:
                    spare_disks[node.id] = power
        cluster = LocalCluster(spec, spec.path, wrap_command=netcut.command_for if netcut else None,
                               log_dir=self.run_dir / "logs", hosts=hosts, spares=spares)
        cleanup.callback(_kill_all, cluster)
        self.status.phase = "starting the cluster"
        cluster.start_all()
        cluster.wait_ready(timeout=60)
        feeds = start_feeds(spec, self.config.learners, cleanup)

        def processes() -> dict[str, int | str]:
            running = {node_id: proc.pid for node_id, proc in list(cluster.procs.items()) if proc.poll() is None}
            learners = {f"{feed.kind} learner": feed.process().pid for feed in feeds}
            return {**running, **learners, "harness": os.getpid()}

        self.resources = ResourceWatch(processes, self.config.sample_seconds, lambda: len(cluster.members))
        self.memory_start = {name: u.rss_kib for name, u in self.resources.sample().items()}
        self.resources.start()
        cleanup.callback(self.resources.stop)
        injector = FaultInjector(cluster, self.timeline, netcut, disk, self.disk_node, disks, spare_disks)
        workload = Workload(WorkloadConfig(endpoints=tuple(cluster.endpoints), clients=self.config.clients,
                                           set_clients=max(1, self.config.clients // 4),
                                           bank_clients=max(1, self.config.clients // 4),
                                           partitions=self.config.partitions,
                                           read_consistency=self.config.read_consistency,
                                           timeout=self.config.client_timeout, seed=self.config.seed),
                            self.history, endpoints=lambda: cluster.endpoints)
        cleanup.callback(workload.stop)
        self.status.phase = "running"
        self.status.workload_started = self.timeline.started = time.monotonic()
        workload.start()
        self._nemesis(injector)
        self.status.phase = "healing"
        self.memory_end = {name: u.rss_kib for name, u in self.resources.sample().items()}
        self.resources.stop()  # what the run held, not the checks: they read every feed in full
        injector.heal_everything()
        self._after_heal(injector, None, time.monotonic())
        workload.stop()
        self.status.phase = "checking"
        self._final_checks(cluster.live_spec, injector, feeds)

    def _backing(self, node_id: str) -> Path:
        return self.run_dir / "disks" / node_id

    def _new_spec(self, hosts: Hosts | None) -> tuple[ClusterSpec, tuple[NodeSpec, ...]]:
        """The cluster's spec, and the nodes that membership faults may join to it (none on hosts of
        their own): ports and data dirs of their own, in the spec's pattern."""
        c = self.config
        spares = 0 if hosts else spare_nodes(c.duration)
        base = free_port_block((c.nodes + spares) * ports_per_node(c.partitions))
        every = build_spec(nodes=c.nodes + spares, partitions=c.partitions, replication=3, base_port=base,
                           data_dir=self.run_dir / "cluster", durability=c.durability,
                           hosts=hosts.addresses if hosts else None)
        every = dataclasses.replace(every, tuning=c.tuning, nodes=tuple(
            dataclasses.replace(n, raft_engine=c.raft_engine) for n in every.nodes))
        spec = dataclasses.replace(every, nodes=every.nodes[:c.nodes])
        return load_spec(save_spec(spec, self.run_dir / "cluster" / "cluster.toml")), every.nodes[c.nodes:]

    def _nemesis(self, injector: FaultInjector) -> None:
        """Each step in turn: wait for its time, inject, hold, heal, check that the cluster recovers."""
        begin = self.status.workload_started
        end = begin + self.config.duration
        for step in self.steps:
            if not _sleep_until(begin + step.at, end) or time.monotonic() + step.hold > end:
                break
            record = injector.inject(step)
            _sleep_until(record.start + step.hold, end)
            injector.heal(record)
            self._after_heal(injector, record, record.healed)
        if self.until_duration:
            _sleep_until(end, end)

    def _after_heal(self, injector: FaultInjector, record: FaultRecord | None, healed_at: float) -> None:
        """Nodes that crashed are restarted; every partition must then take a write within
        WRITE_DEADLINE seconds of the heal, and every replica catch up."""
        where = record.name if record else "the end of the run"
        spec = injector.cluster.live_spec
        self._restart_crashed(injector, where)
        took = writes_resume(spec, healed_at, self.loop)
        if slow := {p: t for p, t in took.items() if t is None}:
            self.violations.append(Violation(
                "recovery", where, f"partitions {sorted(slow)} took no write within {WRITE_DEADLINE:.0f}s "
                                   f"after {where} was healed", ()))
        elif record is not None:
            record.recovered = healed_at + max(took.values())
        if behind := lagging_replicas(spec, each_round=lambda: self._restart_crashed(injector, where)):
            self.violations.append(Violation("recovery", where, f"after {where}: replicas did not catch up: "
                                                                f"{'; '.join(behind[:4])}", ()))
        self._restart_crashed(injector, where)

    def _restart_crashed(self, injector: FaultInjector, where: str) -> None:
        for node_id, code in injector.restart_crashed().items():
            self.violations.append(Violation("node-crashed", where, f"{node_id} exited with code {code} during "
                                                                    f"{where}; see {injector.cluster.log_path(node_id)}", ()))

    # -- checks ------------------------------------------------------------

    def _final_checks(self, spec, injector: FaultInjector, feeds: list[Feed]) -> None:
        ops = self.history.ops()
        endpoints = [n.api_address for n in spec.nodes]

        async def final_reads():
            return (await read_set(endpoints, client_id=FINAL_READ_CLIENT, timeout=30.0),
                    await read_banks(endpoints, spec.partitions, client_id=FINAL_READ_CLIENT, timeout=30.0))

        (self.final_read, error), banks_read = self.loop.run_until_complete(final_reads())
        self.final_banks = [op for op, _ in banks_read]
        set_ops = [op for op in ops if op.f in SET_FUNCTIONS] + [self.final_read]
        register_ops = [op for op in ops if op.f in REGISTER_FUNCTIONS]
        bank_ops = [op for op in ops if op.f in BANK_FUNCTIONS] + self.final_banks

        cuts = self._power_cuts_that_may_lose_writes()
        if not cuts:
            registers = check_register(register_ops)
            self.unknown = registers.unknown
            self._checked("linearizable registers", registers.violations,
                          f"{registers.keys_checked} keys, {registers.ops_checked} ops"
                          + (f"; {len(registers.unknown)} keys undecided" if registers.unknown else ""))
        sets = check_set(set_ops)
        read_note = f"final read of {len(self.final_read.result)} elements" if self.final_read.status == "ok" \
            else f"final read failed: {error}"
        set_violations = list(sets.violations)
        if cuts:
            set_violations = self._explain_power_cut_losses(set_violations, cuts)
        self._checked("set: no lost or phantom adds", set_violations, f"{sets.ops_checked} ops; {read_note}")

        banks = check_bank(bank_ops, ACCOUNTS, OPENING_BALANCE, may_lose=bool(cuts))
        transfers = sum(op.f == "transfer" and op.status == "ok" and op.result for op in bank_ops)
        self._checked("bank: money kept, no half transfer, transfers kept", banks.violations,
                      f"{banks.keys_checked} banks, {banks.ops_checked} ops, {transfers} transfers acknowledged"
                      + ("; acknowledged transfers a power cut may take not checked" if cuts else ""))

        placement = placement_of(spec, wait=60.0)
        differences = replica_differences(spec, placement,
                                          each_round=lambda: self._restart_crashed(injector, "the final checks"),
                                          placed=lambda: placement_of(spec, wait=10.0))
        self._checked("replicas equal", [Violation("replicas-equal", line.split(":")[0], line, ())
                                         for line in differences], f"{spec.partitions} partitions")
        for record in self.timeline.records():
            for problem in record.problems:
                self.violations.append(Violation("fault-handling", record.name, problem, ()))
        if feeds:
            final = self._final_contents(spec, placement_of(spec, wait=60.0))
            if isinstance(final, list):  # no replica answered: nothing to check the feeds against
                self._checked("feeds", final, ", ".join(feed.where for feed in feeds))
            for feed in feeds if isinstance(final, dict) else ():
                self._checked(f"{feed.kind} feed", feed_violations(feed, final), feed.where)
        if self.config.duration >= SETTLE_SECONDS + 2 * self.config.sample_seconds:
            growth = grown(self.resources.series)
            self._checked("resources steady", [Violation("resource-growth", line.split(":")[0], line, ())
                                               for line in growth],
                          f"{len(self.resources.series)} processes sampled every {self.config.sample_seconds:.0f} s")
        if self.config.raft_engine != "off":  # with a learner too: the engine feeds it (docs/raft-engine.md)
            counts = engine_counts(spec)
            # the cluster's: a node restarted near the end may not have been handed a group since
            idle = [] if any(taken and frames for taken, frames in counts.values()) else [
                Violation("raft-engine", "engine", "no node's engine took a group and sent frames", ())]
            self._checked(ENGINE_CHECK, idle, ", ".join(
                f"{node_id}: {taken:.0f} groups taken, {frames:,.0f} frames" for node_id, (taken, frames) in counts.items()))

    def _power_cuts_that_may_lose_writes(self) -> list[Cut]:
        """Power cuts in lose-last-second mode (fsync mode promises to lose nothing to them)."""
        if self.config.durability == FSYNC:
            return []
        return [Cut(r.start, r.healed) for r in self.timeline.records() if r.fault == "powerloss" and r.healed]

    def _explain_power_cut_losses(self, violations: list[Violation], cuts: list[Cut]) -> list[Violation]:
        """The set's lost adds that a cut explains are the mode's documented loss, not violations;
        the registers are not checked: a cut may take any key's last second of writes."""
        lost = [op for v in violations if v.check == "lost-write" for op in v.ops[:-1]]
        losses = self.power_cut_losses = explain_losses(lost, cuts)
        kept = [v for v in violations if v.check != "lost-write"]
        if losses.unexplained:
            values = ", ".join(str(op.value) for op in losses.unexplained[:10])
            kept.append(Violation("lost-write", "set", f"acknowledged adds lost that no power cut within "
                                                       f"{LOSS_BOUND_SECONDS:.1f}s explains: {values}",
                                  losses.unexplained))
        self.checks.append(CheckOutcome("lost to power cuts (default mode)", not losses.unexplained,
                                        f"{losses.summary()}; registers not checked"))
        return kept

    def _checked(self, name: str, violations, detail: str) -> None:
        violations = list(violations)
        self.violations += violations
        self.checks.append(CheckOutcome(name, not violations, detail if not violations else
                                        f"{len(violations)} violations; {detail}"))

    def _final_contents(self, spec, placement) -> dict[bytes, bytes] | list[Violation]:
        """Every partition's contents, which the feeds must replay to (or why they cannot be had)."""
        final: dict[bytes, bytes] = {}
        for p in range(spec.partitions):  # the replicas are equal by now: any one that answers will do
            contents = scan_any(spec, p, placement[p])
            if contents is None:
                return [Violation("feed", f"partition {p}", f"no replica of partition {p} ({', '.join(placement[p])}) "
                                                            "answered a scan to check the feeds against", ())]
            final.update(contents)
        return final

    # -- files and the report ----------------------------------------------

    def _keep_disk_node_data(self, spec) -> None:
        """The diskfull node's data lives on a tmpfs that is about to go: copy it out if a check failed."""
        if self.violations:
            data_dir = spec.node(self.disk_node).data_dir
            shutil.copytree(data_dir, data_dir.with_name(f"{self.disk_node}-tmpfs-copy"), dirs_exist_ok=True)

    def write_files(self) -> None:
        ops = self.history.ops() + ([self.final_read] if self.final_read else []) + self.final_banks
        dump_history(ops, self.run_dir / "history.jsonl")
        self.history.close()
        (self.run_dir / SPILLED_OPS).unlink(missing_ok=True)  # all in history.jsonl now
        self.timeline.dump(self.run_dir / "timeline.json")
        if self.resources is not None:
            (self.run_dir / "resources.json").write_text(json.dumps(
                {name: [dataclasses.asdict(u) for u in samples] for name, samples in self.resources.series.items()}))
        (self.run_dir / "violations.json").write_text(json.dumps(
            [{"check": v.check, "where": v.key, "detail": v.detail} for v in self.violations], indent=1))

    def report(self, seconds: float) -> ChaosReport:
        return ChaosReport(
            config=self.config,
            op_counts=dict(self.history.counts),
            errors=dict(self.history.errors),
            faults=tuple(self.timeline.records()),
            checks=tuple(self.checks),
            violations=tuple(self.violations),
            unknown_keys=self.unknown,
            run_dir=self.run_dir,
            seconds=seconds,
            power_cut_losses=self.power_cut_losses,
            memory_kib={name: (self.memory_start[name], self.memory_end[name])
                        for name in self.memory_start if self.memory_end.get(name)},
        )


def _sleep_until(moment: float, end: float) -> bool:
    """Sleep until `moment` (but not past `end`); False if `end` comes first."""
    wake = min(moment, end)
    if (left := wake - time.monotonic()) > 0:
        time.sleep(left)
    return moment <= end


def _kill_all(cluster: LocalCluster) -> None:
    """SIGCONT (a paused node), SIGKILL and reap every node process."""
    for node_id in list(cluster.procs):
        cluster.signal(node_id, signal.SIGCONT)
        cluster.kill(node_id)
