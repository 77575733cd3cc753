"""A rolling upgrade from an older release to this build, node by node, under a write load and with a
Kafka learner, on real processes; exit 0 only when every check holds (docs/operations.md, "Upgrading").

    .venv/bin/python scripts/upgrade_check.py                       # from c191d37 (0.1.0, before the Raft engine)
    .venv/bin/python scripts/upgrade_check.py --partitions 2 --threads 2 --warmup 2

It makes a git worktree of --release in a temporary folder and runs that release with this interpreter
(its setup.cfg requirements must hold here; the check says which do not). The older release's CLI writes
the spec (`cluster init`, mutual TLS) and registers a Kafka learner feeding a tansu broker; its nodes
and learner start, writer threads put distinct keys, then each node in turn gets SIGTERM and is started
on this build, until it serves and every partition has a leader; then the learner (--learner-first:
before the nodes), until it delivers on every partition. It checks that every acknowledged write reads
back, no stretch without an acknowledgement passed --max-gap, the feed is complete and in order, every
node runs this build, the cluster version rose to it only after the last node, and every node keeps its
Raft log in the node log (raft-log/, no journal/ left, its writes counted on /metrics).
Files stay (the path is printed) when a check fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from upgrade_release import OldRelease, UsageError, commit_of, imported_from  # noqa: E402
from upgrade_steps import (LEARNER, Learner, Run, cli, delivered, fall_behind, until, upgrade_learner,  # noqa: E402
                           upgrade_node)

from learners.consumer import read_feed  # noqa: E402
from learners.feed_check import chain_breaks, replay  # noqa: E402
from raftkv.chaos.engine_use import engine_counts  # noqa: E402
from raftkv.client.sync_client import Client  # noqa: E402
from raftkv.core.errors import RaftKVError  # noqa: E402
from raftkv.core.release import VERSION  # noqa: E402
from raftkv.core.spec_toml import load_spec  # noqa: E402
from raftkv.dev.broker import TansuBroker  # noqa: E402
from raftkv.dev.local_cluster import LocalCluster, free_port_block  # noqa: E402
from raftkv.dev.metrics_scrape import samples  # noqa: E402
from raftkv.dev.write_load import WriteLoad  # noqa: E402
from raftkv.security.tls import client_tls  # noqa: E402

TOPIC = "raftkv-upgrade-feed"
PAUSE_SECONDS = 4.0  # an older node's, with --compact-every: long enough to be sent a snapshot
console = Console()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage block
        raise UsageError(f"{message} (see --help)")


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text} must be above 0")
        return value
    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog="\n".join(__doc__.splitlines()[1:]))
    parser.add_argument("--release", default="c191d37", help="the release to upgrade from: a commit of this "
                        "repository (default c191d37, 0.1.0)")
    parser.add_argument("--nodes", type=_positive(int), default=3, help="cluster nodes, 3 or more (default 3)")
    parser.add_argument("--partitions", type=_positive(int), default=4, help="default 4")
    parser.add_argument("--threads", type=_positive(int), default=4, help="writer threads (default 4)")
    parser.add_argument("--durability", choices=("default", "fsync"), default="default",
                        help="the mode as the old release names it (\"default\" is lose-last-second's former name)")
    parser.add_argument("--warmup", type=_positive(float), default=5.0,
                        help="seconds of load before the first node is upgraded, and after the last step (default 5)")
    parser.add_argument("--max-gap", type=_positive(float), default=5.0,
                        help="the longest time allowed without an acknowledged write (default 5 s)")
    parser.add_argument("--step-timeout", type=_positive(float), default=120.0,
                        help="seconds a restarted node or learner may take to serve (default 120)")
    parser.add_argument("--compact-every", type=_positive(int), default=None, metavar="ENTRIES",
                        help="[tuning] compaction_min_entries (and compaction_min_seconds 1): with few, a restarted "
                             "node is sent a snapshot by a node of the other release (default: the release's)")
    parser.add_argument("--learner-first", action="store_true",
                        help="upgrade the learner before the nodes (default: after them)")
    args = parser.parse_args(argv)
    if args.nodes < 3:
        parser.error("--nodes must be 3 or more: a rolling upgrade keeps a majority of 3 replicas up")
    return args


def _metrics(host: str, port: int) -> dict[str, float]:
    """Every sample on the node's /metrics, summed over labels."""
    sums: dict[str, float] = {}
    for sample in samples(f"{host}:{port}"):
        sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def _node_log_in_use(spec, fsync: bool) -> list[str]:
    """What says a node still keeps a replica's Raft journal of its own, one line each."""
    problems = []
    for node in spec.nodes:
        if not (node.data_dir / "raft-log").is_dir():
            problems.append(f"{node.id}: no raft-log/ in {node.data_dir}")
        if journals := sorted(str(p.relative_to(node.data_dir)) for p in node.data_dir.glob("*/journal")):
            problems.append(f"{node.id}: journals left: {', '.join(journals)}")
        sums = _metrics(node.host, node.metrics_port)
        if not sums.get("raftkv_journal_writes_total"):
            problems.append(f"{node.id}: raftkv_journal_writes_total is 0 (no write to the node log)")
        if fsync and not sums.get("raftkv_node_log_fsyncs_total"):
            problems.append(f"{node.id}: raftkv_node_log_fsyncs_total is 0")
        if sums.get("raftkv_journal_fsyncs_total"):
            problems.append(f"{node.id}: raftkv_journal_fsyncs_total is {sums['raftkv_journal_fsyncs_total']:.0f} "
                            "(a replica synced a journal of its own)")
    return problems


def _final_checks(run: Run, args, spec, load: WriteLoad, broker: TansuBroker, kv: Client, first_ack: float,
                  load_end: float, cluster_version_seconds: float | None) -> None:
    missing = load.not_read_back()
    run.check("no acknowledged write lost", not missing,
              f"{len(load.acked):,} acknowledged, {len(missing)} not read back by a scan"
              + (f": {sorted(missing)[:3]}" if missing else ""))
    failed = ", ".join(f"{name} {count}" for name, count in load.errors.most_common()) or "none"
    run.check("writes fail only as Unavailable or Undetermined",
              not set(load.errors) - {"Unavailable", "Undetermined"}, f"failed writes: {failed}")
    gap = load.longest_gap(first_ack, load_end)
    run.check(f"no write gap over {args.max_gap:g} s", gap <= args.max_gap, f"longest {gap:.2f} s")
    final = dict(kv.scan())
    events = read_feed(broker.bootstrap, TOPIC)
    deadline = time.monotonic() + 120  # for the learner to deliver what the last writes left
    while replay(events) != final and time.monotonic() < deadline:
        time.sleep(1.0)
        events = read_feed(broker.bootstrap, TOPIC)
    breaks = chain_breaks(events)
    table = replay(events)
    run.check("feed complete and in order", not breaks and table == final,
              f"{len(events):,} events replay to {len(table):,} keys of {len(final):,}; {len(breaks)} chain breaks"
              + (f": {breaks[0]}" if breaks else ""))
    versions = {s.node_id: (s.version if s.reachable else f"unreachable ({s.error})") for s in kv.status()}
    run.check(f"every node runs {VERSION}", set(versions.values()) == {VERSION},
              ", ".join(f"{n} {v}" for n, v in sorted(versions.items())))
    run.check(f"cluster version {VERSION}", cluster_version_seconds is not None,
              f"{kv.topology().meta.cluster_version}" + (f", {cluster_version_seconds:.1f} s after the last member it counts"
                                                         if cluster_version_seconds is not None else ""))
    engine = engine_counts(spec)
    run.check("the node engine in use", engine and all(taken and frames for taken, frames in engine.values()),
              ", ".join(f"{n}: {taken:.0f} groups taken, {frames:,.0f} frames" for n, (taken, frames) in engine.items()))
    problems = _node_log_in_use(spec, args.durability == "fsync")
    run.check("node log in use", not problems, "; ".join(problems) or
              "raft-log/ on every node, no journal/, its writes counted"
              + (" and synced" if args.durability == "fsync" else ""))


def _tracebacks(text: str) -> list[str]:
    """The exception line that ends each traceback in `text`."""
    found = []
    for block in text.split("Traceback (most recent call last):")[1:]:
        ends = [line for line in block.splitlines() if line and not line[0].isspace()]
        found.append(ends[0] if ends else "(cut off)")
    return found


def _log_checks(run: Run, release: str) -> None:
    """A traceback this build logged fails the run; one the older release logged is a note (it is released)."""
    ours, installs = [], []
    for step in (s for s in run.steps if s.upgrade):
        text = step.log.read_bytes()
        installs.append(f"{step.name} {text[:step.new_from].count(b'installed a snapshot')}/"
                        f"{text[step.new_from:].count(b'installed a snapshot')}")
        ours += [f"{step.name}: {line}" for line in _tracebacks(text[step.new_from:].decode(errors="replace"))]
        run.notes += [f"{step.name} on {release} logged a traceback: {line}"
                      for line in _tracebacks(text[:step.new_from].decode(errors="replace"))]
    run.notes.append(f"snapshots installed (on {release}/on this build): {', '.join(installs)}")
    run.check("no traceback in what this build logged", not ours, "; ".join(ours) or f"{len(installs)} logs")


def upgrade(args, work: Path, run: Run) -> None:
    with ExitStack() as stack:
        commit = commit_of(ROOT, args.release)
        old = stack.enter_context(OldRelease(ROOT, commit, work / f"release-{commit[:12]}"))
        if unmet := old.unmet():
            raise UsageError(f"{args.release} needs what this environment lacks: {'; '.join(unmet)}; run the check "
                             "from a venv that has them")
        os.chdir(work)  # no raftkv here: `python -m` puts the working directory before PYTHONPATH
        new = {"PYTHONPATH": str(ROOT)}
        runs_old, runs_new = imported_from(old.env, work), imported_from(new, work)
        if not run.check("each release imports its own tree", runs_old == old.tree and runs_new == ROOT,
                         f"{args.release}: {runs_old}; this build: {runs_new}"):
            return

        data = work / "data"
        base = free_port_block(args.nodes * (args.partitions + 3))
        cli(old.env, "cluster", "init", "--nodes", str(args.nodes), "--partitions", str(args.partitions),
            "--base-port", str(base), "--data-dir", str(data), "--durability", args.durability,
            "-o", str(data / "cluster.toml"))
        if args.compact_every:
            with open(data / "cluster.toml", "a") as spec_file:
                every = max(2, args.compact_every)  # the learner's retention too: it would hold the log back
                spec_file.write(f"\n[tuning]\ncompaction_min_entries = {every}\ncompaction_min_seconds = 1.0\n"
                                f"learner_retention_entries = {every}\n")
        spec = load_spec(data / "cluster.toml")
        # Not die_with_parent: its preexec_fn makes subprocess fork (not vfork), and gRPC's fork handlers
        # abort 1-10 % of children before they exec while the load's clients are busy (docs/operations.md).
        cluster = LocalCluster(spec, spec.path, env=old.env)
        stack.callback(cluster.stop_all)
        cluster.start_all()
        cluster.wait_ready(args.step_timeout)
        broker = TansuBroker(log_path=work / "tansu.log").start()
        stack.callback(broker.stop)
        cli(old.env, "learner", "add", "--name", LEARNER, "--sink", "kafka", "--config", str(spec.path),
            "--sink-option", f"bootstrap.servers={broker.bootstrap}", "--sink-option", f"topic={TOPIC}",
            "--sink-option", "timeout.ms=5000")
        learner = Learner(spec.path, work / "learner.log")
        learner.start(old.env)
        stack.callback(learner.stop)
        kv = stack.enter_context(Client(cluster.endpoints, timeout=10.0, tls=client_tls(spec)))
        releases = {s.node_id: s.version for s in kv.status()}
        if not run.check(f"the cluster runs {args.release}", set(releases.values()) == {old.reports},
                         f"releases reported: {releases} (0.1 reports none)"):
            return

        run.phase("the older release's cluster and learner started")
        load = WriteLoad(cluster.endpoints, spec.partitions, threads=args.threads, tls=client_tls(spec))
        stack.enter_context(load)
        if not run.check("the old learner delivers", until(lambda: len(delivered(kv)) == spec.partitions and
                                                            all(delivered(kv).values()), args.step_timeout),
                         f"delivered {delivered(kv)}"):
            return
        first_ack = min(load.ack_times() or [time.monotonic()])
        time.sleep(args.warmup)
        run.phase("warm-up")
        cluster_version_seconds, early = None, []
        order = ["learner", *spec.node_ids] if args.learner_first else [*spec.node_ids, "learner"]
        # a learner of 0.2 or later reports its release, and the cluster version waits for it too
        last_counted = order[-1] if old.reports else spec.node_ids[-1]
        for name in order:
            if not (upgrade_learner(run, learner, kv, new, args.step_timeout) if name == "learner" else
                    upgrade_node(run, cluster, name, new, args.step_timeout)):
                return
            if args.compact_every and name == spec.node_ids[0] and not fall_behind(
                    run, cluster, kv, name, spec.node_ids[1], PAUSE_SECONDS, args.step_timeout):
                return
            if name in spec.node_ids[:-1]:
                early.append(f"after {name}: {kv.topology().meta.cluster_version}")
            if name == spec.node_ids[-1]:
                run.check("the cluster version waits for every node", not any(e.endswith(f": {VERSION}") for e in early),
                          "; ".join(early))
            if name == last_counted:
                last_node = time.monotonic()
                if until(lambda: kv.topology().meta.cluster_version == VERSION, 60):
                    cluster_version_seconds = time.monotonic() - last_node
                    if not args.learner_first and not old.reports:
                        run.notes.append(f"the cluster version reached {VERSION} while the learner still ran "
                                         f"{args.release}: learners are not counted (docs/operations.md)")
        time.sleep(args.warmup)
        run.phase("upgrade")
        load.stop()
        load_end = time.monotonic()
        for earlier, later in zip(run.steps, run.steps[1:]):
            earlier.ended_at = later.stopped_at
        run.steps[-1].ended_at = load_end
        upgraded = [s for s in run.steps if s.upgrade]
        run.check("every node and the learner stopped on SIGTERM", all(s.exit_code == 0 for s in upgraded),
                  ", ".join(f"{s.name} {'killed after 30 s' if s.exit_code is None else f'exit {s.exit_code}'}"
                            for s in upgraded))
        _final_checks(run, args, spec, load, broker, kv, first_ack, load_end, cluster_version_seconds)
        run.phase("checks")
        _log_checks(run, args.release)
        _report(run, load)


def _report(run: Run, load: WriteLoad) -> None:
    table = Table(title=f"rolling upgrade to {VERSION}")
    for column in ("step", "down (s)", "serving after (s)", "longest write gap (s)", "acks"):
        table.add_column(column, justify="left" if column == "step" else "right")
    for s in run.steps:
        acks = len(load.ack_times(s.stopped_at, s.ended_at))
        table.add_row(s.name, f"{s.down_seconds:.1f}",
                      "-" if s.serving_seconds is None else f"{s.serving_seconds:.1f}",
                      f"{load.longest_gap(s.stopped_at, s.ended_at):.2f}", f"{acks:,}")
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="raftkv-upgrade-"))
    run = Run()
    try:
        upgrade(parse_args(argv), work, run)
    except UsageError as exc:
        shutil.rmtree(work, ignore_errors=True)
        print(f"upgrade_check: {exc}", file=sys.stderr)
        return 2
    except (RaftKVError, RuntimeError) as exc:  # a cluster that did not come up or answer
        run.check("the run reaches its checks", False, str(exc))
    finally:
        os.chdir(ROOT)
    for c in run.checks:
        console.print(f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}", markup=False, highlight=False,
                      soft_wrap=True)
    for note in run.notes:
        console.print(f"note {note}", markup=False, highlight=False, soft_wrap=True)
    ok = bool(run.checks) and all(c.ok for c in run.checks)
    parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in run.phases.items())
    console.print(f"{'passed' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s ({parts})", markup=False)
    if ok:
        shutil.rmtree(work, ignore_errors=True)
    else:
        console.print(f"logs and data kept in {work}", markup=False, highlight=False)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
