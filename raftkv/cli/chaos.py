"""raftkv chaos run: a fault-injection run against a fresh local cluster, then the history checks."""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from pathlib import Path

import click
from click.core import ParameterSource
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from raftkv.chaos.config import ChaosConfig, runnable_faults, unavailable_faults
from raftkv.chaos.feeds import LEARNERS
from raftkv.chaos.nemesis import FAULTS, VARIANTS, parse_faults
from raftkv.chaos.runner import ChaosReport, RunStatus, run_chaos
from raftkv.cli.output import console, err_console
from raftkv.api.convert import CONSISTENCY_BY_NAME
from raftkv.core.errors import ConfigError
from raftkv.core.spec import DURABILITY_MODES, FSYNC, RAFT_ENGINES, NodeSpec



@click.group()
def chaos() -> None:
    """Fault injection: workloads under kill -9, pauses, partitions, disk full and corruption, checked."""


_FAULT_HELP = "Comma-separated faults, each KIND or KIND:VARIANT. " + "; ".join(
    f"{kind}: {'|'.join(variants)}" for kind, variants in VARIANTS.items())


@chaos.command()
@click.option("--nodes", type=click.IntRange(3, 9), default=3, show_default=True)
@click.option("--partitions", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--duration", type=click.FloatRange(5), default=60.0, show_default=True,
              help="Seconds of workload under faults (healing and checks come after).")
@click.option("--clients", type=click.IntRange(2, 256), default=8, show_default=True,
              help="Concurrent workload clients, one request each at a time.")
@click.option("--faults", default=",".join(FAULTS), show_default=True, help=_FAULT_HELP)
@click.option("--learner", "learners", type=click.Choice(LEARNERS), multiple=True,
              help="Also run a learner of this kind (repeat for both): kafka feeds a local tansu broker, changelog "
                   "keeps its events on disk; each feed is checked against the final contents.")
@click.option("--seed", type=int, default=None, help="Replays the same fault schedule (default: a random seed, printed).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the history, the timeline and (on a violation) the data dirs go; default: a temporary "
                   "folder, kept only on a violation.")
@click.option("--read-consistency", type=click.Choice(sorted(CONSISTENCY_BY_NAME)), default="linearizable",
              show_default=True, help="Of the register reads (leader or follower reads may be stale: the checker "
                                      "should then report violations).")
@click.option("--durability", type=click.Choice(DURABILITY_MODES), default=FSYNC, show_default=True,
              help="The cluster's durability mode (docs/durability.md).")
@click.option("--raft-engine", type=click.Choice(RAFT_ENGINES), default=NodeSpec.raft_engine, show_default=True,
              help="Every node's Raft engine (docs/raft-engine.md); the default is a node's.")
@click.option("--hosts", is_flag=True, default=False,
              help="Each node on a host of its own: a network namespace with its own address (needs root); "
                   "partitions are then cut by address in each namespace.")
def run(nodes, partitions, duration, clients, faults, learners, seed, out, read_consistency, durability,
        raft_engine, hosts) -> None:
    """Run a workload against a fresh local cluster under faults; exit 1 on any violation.

    Needs root for partitions (cgroup v2 and nftables) and disk full (a tmpfs), and FUSE for powerloss
    and disk. Without --faults, the faults this machine cannot inject are skipped (and named).
    """
    try:
        fault_choices = parse_faults(faults)
    except ValueError as exc:
        raise ConfigError(str(exc), source="--faults") from None
    if click.get_current_context().get_parameter_source("faults") is ParameterSource.DEFAULT:
        fault_choices, skipped = runnable_faults(fault_choices,
                                                 unavailable_faults((f.fault for f in fault_choices), hosts))
        if skipped:
            console.print("skipping faults this machine cannot inject: " + "; ".join(
                f"{', '.join(kinds)} ({why})" for why, kinds in skipped.items())
                + " (README.md, Fault injection, lists what each needs)", soft_wrap=True, markup=False)
    config = ChaosConfig(nodes=nodes, partitions=partitions, duration=duration, clients=clients,
                         faults=fault_choices, learners=learners,
                         seed=seed if seed is not None else random.randrange(1 << 31), out=out,
                         read_consistency=read_consistency, durability=durability, raft_engine=raft_engine,
                         hosts=hosts)
    console.print(f"chaos run: seed {config.seed}, faults {', '.join(map(str, config.faults))}")
    status = RunStatus()
    with Live(get_renderable=lambda: _progress(status, config), console=console, transient=True):
        report = run_chaos(config, status=status)
    _summary(report)
    if not report.ok:
        err_console.print(Text.assemble((f"{len(report.violations)} violations", "bold red"),
                                        f"; history, timeline and data dirs kept in {report.run_dir}"), soft_wrap=True)
        sys.exit(1)
    where = f"; history and timeline in {report.run_dir}" if report.run_dir else ""
    console.print(Text.assemble(("no violations", "bold green"), f" in {report.ops:,} ops{where}"), soft_wrap=True)


def _progress(status: RunStatus, config: ChaosConfig) -> Text:
    line = Text(f"{status.phase}")
    if status.workload_started is not None:
        elapsed = min(time.monotonic() - status.workload_started, config.duration)
        line.append(f"  {elapsed:5.1f}/{config.duration:.0f}s")
    if status.history is not None:
        by_status = Counter()
        for (_, state), count in status.history.counts.items():
            by_status[state] += count
        line.append(f"  ops {sum(by_status.values()):,} (ok {by_status['ok']:,}, fail {by_status['fail']:,}, "
                    f"info {by_status['info']:,})")
    if status.timeline is not None:
        current = status.timeline.current
        fault = f"{current.name} on {','.join(current.targets)}" if current else "none"
        line.append(f"  faults {len(status.timeline.records())}  now: ", style="")
        line.append(fault, style="bold yellow" if current else "dim")
    return line


def _summary(report: ChaosReport) -> None:
    ops = Table(title=f"operations ({report.ops:,} in {report.config.duration:.0f}s)")
    for column in ("op", "ok", "fail", "info"):
        ops.add_column(column, justify="left" if column == "op" else "right")
    for f in sorted({f for f, _ in report.op_counts}):
        ops.add_row(f, *(f"{report.op_counts.get((f, s), 0):,}" for s in ("ok", "fail", "info")))
    faults = Table(title=f"faults ({len(report.faults)})")
    for column in ("fault", "injected", "recovered within (s)"):
        faults.add_column(column, justify="left" if column == "fault" else "right")
    by_name: dict[str, list] = {}
    for record in report.faults:
        by_name.setdefault(record.name, []).append(record)
    for name, records in sorted(by_name.items()):
        took = [r.recovered - r.healed for r in records if r.recovered is not None and r.healed is not None]
        faults.add_row(name, str(len(records)), f"{max(took):.1f}" if took else "-")
    checks = Table(title="checks")
    for column in ("check", "result", "detail"):
        checks.add_column(column)
    for check in report.checks:
        checks.add_row(check.name, Text("ok", style="green") if check.ok else Text("VIOLATED", style="bold red"),
                       check.detail)
    parts = [ops, faults, checks]
    if report.memory_kib:  # a node restarted by a fault started again from nothing
        parts.append(Text("memory (RSS MiB at the start and the end of the faults): " + ", ".join(
            f"{name} {start / 1024:.0f} -> {end / 1024:.0f}" for name, (start, end) in report.memory_kib.items())))
    if report.errors:
        parts.append(Text("errors seen by clients: " + ", ".join(f"{k} {v:,}" for k, v in sorted(report.errors.items()))))
    if report.violations:
        violations = Table(title="violations")
        for column in ("check", "where", "detail"):
            violations.add_column(column)
        for v in report.violations[:20]:
            violations.add_row(v.check, v.key, v.detail)
        parts.append(violations)
        if len(report.violations) > 20:
            parts.append(Text(f"... and {len(report.violations) - 20} more"))
    console.print(Group(*parts))
