"""Run the deterministic simulation of pysyncobj members (tests/engine_sim/) for long, or replay a seed.

    python scripts/raft_sim.py --seeds 1-200 --steps 20000 --nodes 5 --groups 8 --mode fsync
    python scripts/raft_sim.py --seed 23 --steps 1152 --mode default --trace   # what a failing seed printed

Prints one line per failing seed (with the command that replays it), then steps/s over all runs.
--trace prints the whole trace of each failing run; --minimize looks for the fewest steps that still fail.
Exits 1 if any seed broke a safety property (a seed that did not settle is printed, not a failure).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.engine_sim.faults import Faults  # noqa: E402
from tests.engine_sim.network import NetFaults  # noqa: E402
from tests.engine_sim.run import SimConfig, run  # noqa: E402


def _seeds(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def _options(parser: argparse.ArgumentParser, defaults) -> None:
    for field in dataclasses.fields(defaults):
        kind = type(getattr(defaults, field.name))
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=(lambda v: v.lower() == "true") if kind is bool
                            else kind, default=getattr(defaults, field.name), help=argparse.SUPPRESS)


def _config(args, seed: int, steps: int) -> SimConfig:
    net = NetFaults(**{f.name: getattr(args, f.name) for f in dataclasses.fields(NetFaults)})
    faults = Faults(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Faults)})
    return SimConfig(seed=seed, steps=steps, nodes=args.nodes, groups=args.groups, replicas=args.replicas,
                     fsync=args.mode == "fsync", net=net, faults=faults, engine=args.engine,
                     learners=args.learners)


def _minimize(args, seed: int, steps: int) -> int:
    """The fewest steps after which the seed still fails (the schedule up to a step does not depend on
    how many steps follow, but the settling phase does, so this bisects)."""
    low, high = 0, steps  # fails at high
    while high - low > 1:
        middle = (low + high) // 2
        if run(_config(args, seed, middle)).ok:
            low = middle
        else:
            high = middle
    return high


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, help="one seed (or use --seeds)")
    parser.add_argument("--seeds", default="1-20", help="a range of seeds, e.g. 1-200")
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--mode", choices=("default", "fsync"), default="default")
    parser.add_argument("--engine", action="store_true",
                        help="groups' steady state through the node engine, with hand-overs forced both ways")
    parser.add_argument("--learners", action="store_true",
                        help="a learner process, a read-only member of every even group (a change feed)")
    parser.add_argument("--trace", action="store_true", help="print the whole trace of a failing run")
    parser.add_argument("--digest", action="store_true", help="first print each run's trace digest (replays match)")
    parser.add_argument("--minimize", action="store_true", help="bisect a failing seed to its fewest steps")
    _options(parser, NetFaults())
    _options(parser, Faults())
    args = parser.parse_args()
    if not 1 <= args.nodes <= 9 or not 1 <= args.groups <= 64:
        parser.error("--nodes must be 1 to 9 and --groups 1 to 64")
    seeds = [args.seed] if args.seed is not None else _seeds(args.seeds)
    started, steps, failed, unsettled = time.perf_counter(), 0, 0, 0
    for seed in seeds:
        result = run(_config(args, seed, args.steps))
        steps += result.steps
        if args.digest:
            print(f"seed {seed}: {result.steps} steps, trace digest {result.trace.digest():08x}", flush=True)
        if result.ok:
            if result.liveness:
                unsettled += 1
                print(result.report(None if args.trace else 0), end="\n\n", flush=True)
            continue
        failed += 1
        if args.minimize:
            fewest = _minimize(args, seed, args.steps)
            result = run(_config(args, seed, fewest))
        print(result.report(None if args.trace else 60), end="\n\n", flush=True)
    wall = time.perf_counter() - started
    print(f"{len(seeds)} seeds, {failed} failed, {unsettled} did not settle; {steps} steps in {wall:.1f} s ({steps / wall:,.0f} steps/s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
