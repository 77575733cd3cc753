"""The soak: a long chaos run per durability mode, every fault kind in turn, and whether anything grew.

    .venv/bin/python scripts/soak.py --minutes 60                  # an hour per mode: fsync, then lose-last-second
    .venv/bin/python scripts/soak.py --minutes 15 --modes fsync --seed 7

Each run is `raftkv chaos run` on a fresh cluster of `--nodes` (5) with a Kafka and a changelog learner, every fault
kind this machine can inject cycling in a shuffled order from the seed (random unless given), the
bank, register and set workloads, and every check; runs of 12 minutes or more also check that no
process (node, learner, harness) grew its memory, descriptors or threads by more than 20 % after its
first 10 minutes (raftkv/chaos/resources.py). It prints each run's faults by kind, ops, checks and
memory, and exits 1 on any violation (the run's files are then kept; the line says where).
Needs root, as `raftkv chaos run` does. Figures go in docs/chaos.md.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter

from rich.console import Console

from raftkv.chaos.config import ChaosConfig, runnable_faults, unavailable_faults
from raftkv.chaos.feeds import LEARNERS
from raftkv.chaos.nemesis import FAULTS, FaultChoice
from raftkv.chaos.runner import run_chaos
from raftkv.core.spec import DURABILITY_MODES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="of faults per mode (default 60)")
    parser.add_argument("--modes", default=",".join(DURABILITY_MODES), help="durability modes, in turn (default: both)")
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--seed", type=int, default=None, help="of the first run; the next adds 1 (default: random)")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if unknown := [m for m in modes if m not in DURABILITY_MODES]:
        parser.error(f"--modes: {', '.join(unknown)} not among {', '.join(DURABILITY_MODES)}")
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    every = tuple(FaultChoice(f) for f in FAULTS)
    faults, skipped = runnable_faults(every, unavailable_faults({c.fault for c in every}))
    console = Console()
    for why, kinds in skipped.items():
        console.print(f"left out: {', '.join(kinds)} ({why})")
    violations = 0
    for offset, mode in enumerate(modes):
        config = ChaosConfig(nodes=args.nodes, partitions=args.partitions, duration=args.minutes * 60, faults=faults,
                             learners=LEARNERS, seed=seed + offset, durability=mode)
        if problems := config.problems():
            parser.error("; ".join(problems))
        console.print(f"[bold]{mode}[/]: {args.minutes:g} min, seed {seed + offset}, {args.nodes} nodes, "
                      f"faults {', '.join(str(f) for f in faults)}")
        report = run_chaos(config)
        violations += len(report.violations)
        kinds = Counter(record.fault for record in report.faults)
        console.print(f"  {len(report.faults)} faults ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}), "
                      f"{report.ops:,} ops, {len(report.violations)} violations, {report.seconds / 60:.0f} min")
        for check in report.checks:
            console.print(f"  {'ok ' if check.ok else 'BAD'} {check.name}: {check.detail}", markup=False,
                          highlight=False)
        console.print(f"  memory (RSS MiB, start -> end): {report.memory}", soft_wrap=True)
        for v in report.violations:
            console.print(f"  {v.check} {v.key}: {v.detail}", markup=False, highlight=False)
        if report.run_dir:
            console.print(f"  files kept in {report.run_dir}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
