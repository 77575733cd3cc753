"""What one put and one Raft entry cost, step by step: the counters behind the Raft engine's targets.

    .venv/bin/python scripts/bench_steps.py                              # default and fsync, 8 and 256 partitions
    .venv/bin/python scripts/bench_steps.py --durability fsync --partitions 1024 --json-out steps.json
    .venv/bin/python scripts/bench_steps.py --raft-engine steady --learner   # with a Kafka learner (a change feed)

For each durability mode and partition count, a fresh 3-node cluster (RF 3) on loopback takes a put
load (`bench_load.py`, as scripts/bench.py drives it) while every node's Prometheus counters are read
before and after. The deltas, summed over the three nodes, are divided by the puts the nodes received
and by the Raft entries their leaders proposed: entries per put, then per entry the messages sent,
ticks, socket writes, journal writes, fsyncs, RocksDB writes (applies), and the server CPU in µs (all
three nodes together, and per node); the client's CPU per put from the load processes. Issue 28 wants
server CPU per entry per node at or under 30 µs (docs/raft-engine.md, docs/benchmarks.md). Benchmarks
report; they never assert timings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from raftkv.core.spec import RAFT_ENGINES, NodeSpec
from raftkv.core.spec_toml import load_spec
from raftkv.dev.local_feed import LocalFeed
from raftkv.dev.metrics_scrape import samples

from bench_clusters import MEMBERS, raftkv_cluster, raftkv_spec_path
from bench_load import Load, fill, run_load

# sample name -> what the table calls it (each summed over labels and nodes)
STEPS = {
    "raftkv_raft_messages_total": "messages",
    "raftkv_raft_ticks_total": "ticks",
    "raftkv_raft_socket_writes_total": "socket writes",
    "raftkv_journal_writes_total": "journal writes",
    "raftkv_journal_fsyncs_total": "fsyncs (per replica journal)",
    "raftkv_node_log_fsyncs_total": "fsyncs (node log)",
    "raftkv_apply_seconds_count": "RocksDB writes",
    "raftkv_engine_frames_total": "engine frames",
    "raftkv_engine_handovers_total": "engine hand-overs",
    "raftkv_engine_rests_total": "engine rests",
    "raftkv_leader_changes_total": "role changes",
}
PUTS, ENTRIES, CPU = "raftkv_api_ops_total", "raftkv_proposals_total", "process_cpu_seconds_total"


@dataclass(frozen=True)
class Steps:
    durability: str
    partitions: int
    puts: float
    entries: float
    per_entry: dict[str, float]  # STEPS' names, for the whole cluster
    server_us_per_entry: float  # all nodes
    server_us_per_put: float
    client_us_per_put: float
    put_ops_per_s: float


def scrape(addresses: tuple[str, ...]) -> Counter:
    """Every sample of every node, summed by name (labels and nodes together); received messages left out."""
    totals: Counter = Counter()
    for address in addresses:
        for sample in samples(address):
            if sample.labels.get("direction") != "received":
                totals[sample.name] += sample.value
    return totals


def measure(durability: str, partitions: int, args: argparse.Namespace, work: Path) -> Steps:
    data_dir = work / f"{durability}-{partitions}"
    with raftkv_cluster(data_dir, partitions, durability=durability,
                        ready_timeout=60 + partitions * 0.3, raft_engine=args.raft_engine) as cluster, \
            contextlib.ExitStack() as feed:
        if args.learner:  # a Kafka learner on every partition, as a change feed runs
            feed.callback(LocalFeed(load_spec(raftkv_spec_path(data_dir)), "bench-feed", "bench-feed").start().stop)
        keys = max(args.keys, partitions * 4)
        fill("raftkv", cluster.endpoints, keys)
        load = Load("raftkv", cluster.endpoints, "put", processes=args.processes, in_flight=args.in_flight,
                    duration=args.duration, keys=keys)
        before = scrape(cluster.metrics)
        figures = run_load(load, cluster.pids)
        delta = scrape(cluster.metrics) - before
    puts, entries = delta[PUTS], delta[ENTRIES] or float("nan")
    server_us = delta[CPU] * 1e6
    window = load.warmup + load.duration  # the counters' window; the load's figures cover `duration` only
    return Steps(durability, partitions, puts, entries,
                 {name: delta[sample] / entries for sample, name in STEPS.items()},
                 server_us / entries, server_us / puts, figures.client_cpu * window * 1e6 / puts,
                 figures.ops_per_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--durability", default="lose-last-second,fsync", help="comma-separated modes")
    parser.add_argument("--partitions", default="8,256", help="comma-separated counts")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of the measured put window")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--raft-engine", default=NodeSpec.raft_engine, choices=RAFT_ENGINES,
                        help="every node's setting (default: what a node ships with)")
    parser.add_argument("--learner", action="store_true", help="a Kafka learner (tansu) on every partition")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    console = Console()
    rows = []
    with tempfile.TemporaryDirectory(prefix="raftkv-bench-steps-") as tmp:
        for durability in args.durability.split(","):
            for count in sorted({int(c) for c in args.partitions.split(",")}):
                rows.append(measure(durability, count, args, Path(tmp)))
                console.print(rows[-1])
    table = Table(title=f"{MEMBERS} nodes, RF {MEMBERS}: per put and per Raft entry (the whole cluster)")
    table.add_column("")
    for r in rows:
        table.add_column(f"{r.durability}, {r.partitions} p.", justify="right")
    lines = {"put ops/s": [f"{r.put_ops_per_s:,.0f}" for r in rows],
             "entries per put": [f"{r.entries / r.puts:.3f}" for r in rows],
             **{f"{name} per entry": [f"{r.per_entry[name]:.2f}" for r in rows] for name in STEPS.values()},
             "server CPU µs per entry": [f"{r.server_us_per_entry:,.0f}" for r in rows],
             "... per node": [f"{r.server_us_per_entry / MEMBERS:,.0f}" for r in rows],
             "server CPU µs per put": [f"{r.server_us_per_put:,.1f}" for r in rows],
             "client CPU µs per put": [f"{r.client_us_per_put:,.1f}" for r in rows]}
    for name, cells in lines.items():
        table.add_row(name, *cells)
    console.print(table)
    if args.json_out:
        args.json_out.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
