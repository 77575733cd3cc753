"""Where a node's CPU goes under concurrent puts: py-spy samples one node of a 3-node cluster.

    .venv/bin/python scripts/profile_put.py                          # 8 partitions, 15 s
    .venv/bin/python scripts/profile_put.py --partitions 256 --gil --stacks /tmp/put.folded
    .venv/bin/python scripts/profile_put.py --partitions 1024 --idle   # what an idle node still does

It starts a cluster (bench_clusters.raftkv_cluster), writes every key once, and runs the concurrent
put load of scripts/bench.py (bench_load: processes x requests in flight). Meanwhile py-spy samples
the first node for `--duration` seconds. With `--gil` it keeps only samples that hold the GIL, which
is Python's own work. Without it, it also counts time in C with the GIL released: RocksDB, fsync and
socket writes. With `--idle` no load runs: what the node does with nothing to do.

It prints the functions with the most samples, by self time and by total time, and the load's put
rate. `--native` adds the C and Rust frames under the Python ones (gRPC's core, protobuf, RocksDB);
it has to pause the node for each sample, so the put rate it prints is lower. `--stacks` writes the collapsed stacks, which flamegraph.pl and speedscope read. py-spy is a
profiler, not a dependency (`pip install py-spy`); figures go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench_clusters import raftkv_cluster
from bench_load import Load, fill, run_load

_LINE = re.compile(r":\d+\)$")  # "func (file.py:123)" -> "func (file.py)": one row per function


def tally(folded: str) -> tuple[collections.Counter, collections.Counter, int]:
    """(self samples, total samples) per function, and all samples, from py-spy's collapsed stacks."""
    own: collections.Counter = collections.Counter()
    total: collections.Counter = collections.Counter()
    samples = 0
    for line in folded.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = [_LINE.sub(")", frame) for frame in stack.split(";") if not frame.startswith(("process ", "thread "))]
        if not frames:
            continue
        n = int(count)
        samples += n
        own[frames[-1]] += n
        for frame in set(frames):
            total[frame] += n
    return own, total, samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds sampled (the load runs 2 s longer)")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--gil", action="store_true", help="only samples holding the GIL")
    parser.add_argument("--idle", action="store_true", help="sample the node with no load")
    parser.add_argument("--native", action="store_true",
                        help="C and Rust frames too (gRPC's core, protobuf, RocksDB); pauses the node per sample")
    parser.add_argument("--rate", type=int, default=200, help="samples a second")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--stacks", type=Path, help="write the collapsed stacks here")
    args = parser.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        parser.error("py-spy is not installed: pip install py-spy")
    console = Console()
    with tempfile.TemporaryDirectory(prefix="raftkv-profile-") as tmp:
        with raftkv_cluster(Path(tmp) / "c", args.partitions, ready_timeout=60 + args.partitions * 0.3) as cluster:
            keys = max(args.keys, args.partitions * 4)
            fill("raftkv", cluster.endpoints, keys)
            if args.idle:
                time.sleep(10)  # every group rests by then
            load = Load("raftkv", cluster.endpoints, "put", processes=args.processes, in_flight=args.in_flight,
                        duration=args.duration + 2, keys=keys)
            folded = Path(tmp) / "stacks.folded"
            command = [py_spy, "record", "--pid", str(cluster.pids[0]), "--duration", str(int(args.duration)),
                       "--rate", str(args.rate), "--format", "raw", "--output", str(folded)]
            command += ["--native"] if args.native else ["--nonblocking"]
            if args.gil:
                command.append("--gil")
            time.sleep(0.5)
            spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            rate = "idle" if args.idle else f"{run_load(load, cluster.pids).ops_per_s:,.0f} puts/s"
            _, spy_errors = spy.communicate(timeout=args.duration + 60)
            if spy.returncode != 0 or not folded.exists():
                console.print(f"py-spy failed: {spy_errors.strip()}")
                return 1
            text = folded.read_text()
    if args.stacks:
        args.stacks.write_text(text)
    own, total, samples = tally(text)
    console.print(f"{args.partitions} partitions, {args.processes} x {args.in_flight} in flight: "
                  f"{rate}; {samples:,} samples of node 1"
                  f"{' holding the GIL' if args.gil else ''}")
    for title, counts in (("self", own), ("total", total)):
        table = Table(title=f"by {title} time")
        table.add_column("share", justify="right")
        table.add_column("function")
        for frame, n in counts.most_common(args.top):
            table.add_row(f"{n / samples:.1%}", frame)
        console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
