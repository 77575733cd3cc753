"""What a partition costs: a 3-node cluster (RF 3) at 8, 64, 256 and 1,024 partitions, side by side.

    .venv/bin/python scripts/bench_scale.py                          # 8, 64, 256, 1024 partitions
    .venv/bin/python scripts/bench_scale.py --partitions 8,64 --json-out scale.json

For each count, a fresh cluster on loopback (`lose-last-second` durability), measured in this order:

1. idle: the cores the three node processes use over `--idle` seconds with no client (an idle group
   rests: it neither ticks nor heartbeats, docs/raft-transport.md), and each node's RSS;
2. put throughput: `--processes` x `--in-flight` puts of 100-byte values for `--duration` seconds
   (bench_load.py, as scripts/bench.py drives it), after each partition was written once.

Reported per count: idle cores (the cluster, and per 1,000 replicas), RSS per node, memory per replica
(the RSS above the smallest count's, over the replicas added), put ops/s and p99. Issue 16 wants the
idle cost near zero and puts at 1,024 partitions near those at 8; docs/benchmarks.md has the curve
before and after each change. Benchmarks report; they never assert timings.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench_clusters import MEMBERS, raftkv_cluster
from bench_load import Load, cpu_seconds, fill, run_load
from raftkv.core.errors import Unavailable
from raftkv.dev.local_cluster import process_rss_kib


@dataclass(frozen=True)
class Point:
    partitions: int
    idle_cores: float
    rss_mib: tuple[float, ...]  # per node, at the end of the idle window
    put_ops_per_s: float
    put_p99_ms: float
    put_errors: int


def measure(partitions: int, args: argparse.Namespace, work: Path) -> Point:
    with raftkv_cluster(work / f"p{partitions}", partitions, ready_timeout=60 + partitions * 0.3) as cluster:
        time.sleep(args.settle)  # elections and the metadata bootstrap are not idle cost
        before, started = cpu_seconds(cluster.pids), time.monotonic()
        time.sleep(args.idle)
        idle = (cpu_seconds(cluster.pids) - before) / (time.monotonic() - started)
        rss = tuple((process_rss_kib(pid) or 0) / 1024 for pid in cluster.pids)
        fill("raftkv", cluster.endpoints, max(args.keys, partitions * 4))
        load = Load("raftkv", cluster.endpoints, "put", processes=args.processes, in_flight=args.in_flight,
                    duration=args.duration, keys=max(args.keys, partitions * 4))
        put = run_load(load, cluster.pids)
    return Point(partitions, idle, rss, put.ops_per_s, put.p99_ms, put.errors)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="8,64,256,1024", help="comma-separated counts")
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of the idle window")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after start before the idle window")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of the measured put window")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    counts = sorted({int(c) for c in args.partitions.split(",")})
    console = Console()
    points = []
    with tempfile.TemporaryDirectory(prefix="raftkv-bench-scale-") as tmp:
        for count in counts:
            started = time.monotonic()
            try:
                points.append(measure(count, args, Path(tmp)))
            except Unavailable as exc:  # the cluster did not start: the curve ends here
                console.print(f"{count} partitions: {exc}")
                break
            console.print(f"{count} partitions: {points[-1]} ({time.monotonic() - started:.0f} s)")
    table = Table(title=f"{MEMBERS} nodes, RF {MEMBERS}: what a partition costs")
    for column in ("partitions", "idle cores", "idle cores per 1,000 replicas", "RSS per node (MiB)",
                   "MiB per replica", "put ops/s", "put p99 (ms)", "errors"):
        table.add_column(column, justify="right")
    base = points[0]
    for p in points:
        replicas_per_node = p.partitions  # RF = nodes: every node holds every partition
        added = replicas_per_node - base.partitions
        per_replica = ((sum(p.rss_mib) - sum(base.rss_mib)) / MEMBERS / added) if added else float("nan")
        table.add_row(str(p.partitions), f"{p.idle_cores:.2f}", f"{p.idle_cores / (p.partitions * MEMBERS) * 1000:.2f}",
                      " / ".join(f"{r:.0f}" for r in p.rss_mib), f"{per_replica:.2f}", f"{p.put_ops_per_s:,.0f}",
                      f"{p.put_p99_ms:.1f}", str(p.put_errors))
    console.print(table)
    if args.json_out:
        args.json_out.write_text(json.dumps([asdict(p) for p in points], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
