"""Chaos runs with N seeds back to back, and one table: seed, faults injected (by kind), ops, violations, checks.

    .venv/bin/python scripts/chaos_seeds.py --seeds 10 --duration 300
    .venv/bin/python scripts/chaos_seeds.py --seeds 3 --faults kill,failpoint --durability fsync --first-seed 7
    .venv/bin/python scripts/chaos_seeds.py --seeds 4 --raft-engine steady --durability fsync

Each run is what `raftkv chaos run` does, on a fresh cluster; a run with a violation keeps its files
(the table says where). Exit code 1 if any run had a violation. Needs root, as `raftkv chaos run` does.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter

from rich.console import Console
from rich.table import Table

from raftkv.chaos.config import ChaosConfig
from raftkv.chaos.feeds import LEARNERS
from raftkv.chaos.nemesis import FAULTS, parse_faults
from raftkv.chaos.runner import run_chaos
from raftkv.core.spec import DURABILITY_MODES, FSYNC, RAFT_ENGINES, NodeSpec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="runs, one seed each (default 5)")
    parser.add_argument("--first-seed", type=int, default=None, help="then first+1, ... (default: random)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of faults per run (default 60)")
    parser.add_argument("--faults", default=",".join(FAULTS), help="as raftkv chaos run --faults (default: all)")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--durability", choices=DURABILITY_MODES, default=FSYNC)
    parser.add_argument("--learner", choices=LEARNERS, action="append", default=[], help="repeat for both")
    parser.add_argument("--raft-engine", choices=RAFT_ENGINES, default=NodeSpec.raft_engine)
    args = parser.parse_args(argv)
    try:
        faults = parse_faults(args.faults)
    except ValueError as exc:
        parser.error(f"--faults: {exc}")
    first = args.first_seed if args.first_seed is not None else random.randrange(1 << 31)
    console = Console()
    table = Table(title=f"{args.seeds} chaos runs of {args.duration:.0f} s, faults {args.faults}")
    for column in ("seed", "faults", "by kind", "ops", "violations", "checks passed", "kept in"):
        table.add_column(column, justify="right" if column in ("faults", "ops", "violations") else "left")
    kinds: Counter = Counter()
    checks: Counter = Counter()  # by name: the runs it passed in, and the runs it was made in
    runs_of: Counter = Counter()
    total_ops = total_violations = 0
    for seed in range(first, first + args.seeds):
        config = ChaosConfig(nodes=args.nodes, partitions=args.partitions, duration=args.duration, faults=faults,
                             learners=tuple(args.learner), seed=seed, durability=args.durability, raft_engine=args.raft_engine)
        if problems := config.problems():
            parser.error("; ".join(problems))
        report = run_chaos(config)
        run_kinds = Counter(record.fault for record in report.faults)
        kinds += run_kinds
        total_ops += report.ops
        total_violations += len(report.violations)
        console.print(f"seed {seed}: {len(report.faults)} faults, {report.ops:,} ops, "
                      f"{len(report.violations)} violations in {report.seconds:.0f} s")
        console.print(f"  memory (RSS MiB, start -> end): {report.memory}", soft_wrap=True)
        for v in report.violations:  # the table keeps only counts; these lines say what to look at
            console.print(f"  {v.check} {v.key}: {v.detail}", markup=False, highlight=False)
        table.add_row(str(seed), str(len(report.faults)), _kinds(run_kinds), f"{report.ops:,}",
                      str(len(report.violations)), _checks(report.checks), str(report.run_dir or ""))
        checks += Counter(c.name for c in report.checks if c.ok)
        runs_of += Counter(c.name for c in report.checks)
    table.add_row("all", str(sum(kinds.values())), _kinds(kinds), f"{total_ops:,}", str(total_violations),
                  f"{sum(checks.values())}/{sum(runs_of.values())}", "", style="bold")
    console.print(table)
    return 1 if total_violations else 0


def _checks(checks) -> str:
    """"7/7", or which failed: the feeds and the replicas are among them."""
    failed = [c.name for c in checks if not c.ok]
    return f"{len(checks) - len(failed)}/{len(checks)}" + (f" (failed: {', '.join(failed)})" if failed else "")


def _kinds(counts: Counter) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()))


if __name__ == "__main__":
    sys.exit(main())
