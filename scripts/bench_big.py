"""Ten million keys (issue 31 item 6): what each operation of a cluster costs at a size users feel.

    .venv/bin/python scripts/bench_big.py                       # 10,000,000 keys of 100 B, about 1.2 GB
    .venv/bin/python scripts/bench_big.py --keys 1000000 --json-out big-1m.json   # the same at a tenth

One 4-node cluster (replication 3, 8 partitions, the shipped defaults: fsync, the node engine), on this
machine, through these steps in turn, each a row: the load (`put_many` of `chunk` keys, `in_flight`
calls at once, from one process); a full Spark read (local[2], `leader` consistency into the `noop`
sink); a replica move of partition 0 to the node without one; `backup create` into a folder; a restore
of that backup into a new single-node cluster until it serves; a node killed (-9) and restarted until
every partition has a leader again; a learner (the `changelog` sink) from zero until it has everything.
Every node's resident memory and data on disk are sampled every second throughout; each row gives
their highest during the step. RocksDB's memory is two budgets per process (docs/operations.md,
"Memory"), so nothing but the disk should grow with the keys: run it at two sizes and compare the
per-key figures (docs/benchmarks.md). Benchmarks report; they never assert timings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_clusters import started  # noqa: E402
from bench_move import until  # noqa: E402
from bench_learner_config import Config  # noqa: E402
from learner_catchup import add_learner, changelog_latest, leader_commit_indexes, learner_command, load  # noqa: E402

import grpc  # noqa: E402

import raftkv  # noqa: E402
from learners.backup_restore import restore  # noqa: E402
from learners.cluster_backup import backup_cluster  # noqa: E402
from raftkv.api import kv_pb2_grpc  # noqa: E402
from raftkv.backup.store import BackupStore  # noqa: E402
from raftkv.core.spec import Tuning, build_spec, ports_per_node  # noqa: E402
from raftkv.core.spec_toml import save_spec  # noqa: E402
from raftkv.dev.local_cluster import LocalCluster, free_port_block, process_rss_kib  # noqa: E402

PARTITIONS, NODES, REPLICATION = 8, 4, 3


@dataclass
class Row:
    step: str
    seconds: float
    rate: str  # what the step moved per second
    rss_mib: dict[str, float]  # each process's highest resident memory during the step
    disk_mb: dict[str, float]  # each node's data at the step's end


class Sampler:
    """Each node's RSS and data size, once a second, on a thread; `window()` gives the highest since."""

    def __init__(self, cluster: LocalCluster):
        self._cluster = cluster
        self._peak: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.sample()

    def sample(self) -> None:
        for node_id, proc in list(self._cluster.procs.items()):
            if (kib := process_rss_kib(proc.pid)) is not None:
                self._peak[node_id] = max(self._peak.get(node_id, 0.0), kib / 1024)

    def window(self) -> dict[str, float]:
        """The peaks since the last call."""
        self.sample()
        peak, self._peak = self._peak, {}
        return {n: round(v, 1) for n, v in sorted(peak.items())}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def folder_mb(folder: Path) -> float:
    """Each file counted once however many hard links it has (a snapshot's checkpoint shares the database's)."""
    sizes = {(s.st_dev, s.st_ino): s.st_size for s in (f.stat() for f in folder.rglob("*") if f.is_file())}
    return round(sum(sizes.values()) / 1e6, 1)


def step(rows: list[Row], console: Console, sampler: Sampler, cluster: LocalCluster, name: str,
         run: Callable[[], float], per_second: Callable[[float], str]) -> None:
    """Time `run` (its own figure, if it returns one, is used instead of the wall clock)."""
    sampler.window()
    started_at = time.perf_counter()
    measured = run()
    seconds = measured or time.perf_counter() - started_at
    rows.append(Row(name, round(seconds, 2), per_second(seconds), sampler.window(),
                    {n.id: folder_mb(n.data_dir) for n in cluster.spec.nodes}))
    console.print(f"[dim]{name}: {seconds:.1f} s, {rows[-1].rate}; RSS MiB {rows[-1].rss_mib}; "
                  f"disk MB {rows[-1].disk_mb}[/dim]")


def spark_read(endpoints: list[str]) -> float:
    """Seconds of a full read into Spark's `noop` sink (every row through, as bench_spark.py reads), after
    a warm-up read."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import spark_connector

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_connector.register(spark)
    try:
        reader = spark.read.format("raftkv").option("endpoints", ",".join(endpoints)).option("consistency", "leader")
        reader.load().limit(1000).write.format("noop").mode("overwrite").save()  # the JVM and workers warm
        started_at = time.perf_counter()
        reader.load().write.format("noop").mode("overwrite").save()
        return time.perf_counter() - started_at
    finally:
        spark.stop()


def run(args: argparse.Namespace, work: Path, console: Console) -> list[Row]:
    spec = build_spec(nodes=NODES, partitions=PARTITIONS, replication=REPLICATION, data_dir=work / "cluster",
                      base_port=free_port_block(NODES * ports_per_node(PARTITIONS)))
    spec = replace(spec, tuning=Tuning(rebalance_interval=0))  # this benchmark moves the replica itself
    cluster = LocalCluster(spec, save_spec(spec, work / "cluster" / "cluster.toml"))
    rows: list[Row] = []
    mb = args.keys * (16 + 100) / 1e6
    with ExitStack() as stack:
        stack.callback(cluster.stop_all)
        cluster.start_all()
        cluster.wait_ready(timeout=120)
        sampler = Sampler(cluster)
        stack.callback(sampler.stop)
        endpoints = cluster.endpoints
        kv = stack.enter_context(raftkv.Client(endpoints, timeout=60.0))
        config = Config(keys=args.keys, partitions=PARTITIONS, chunk=args.chunk, load_in_flight=args.in_flight,
                        timeout=args.keys / 1000)
        step(rows, console, sampler, cluster, "load", lambda: load("raftkv", endpoints, config),
             lambda s: f"{args.keys / s:,.0f} keys/s")
        step(rows, console, sampler, cluster, "Spark read (full)", lambda: spark_read(endpoints),
             lambda s: f"{args.keys / s:,.0f} rows/s")

        placement = kv.topology().meta.placement[0]
        source, target = placement[-1], next(n for n in spec.node_ids if n not in placement)
        size = folder_mb(spec.node(source).data_dir / "p0000")

        def move() -> float:
            kv.move_replica(0, source, target)
            until(lambda: not kv.topology().meta.moves, 1800, "the move to finish", poll=0.05)
            return 0.0
        step(rows, console, sampler, cluster, f"replica move (partition 0, {size:,.0f} MB)", move,
             lambda s: f"{size / s:,.0f} MB/s")

        store_url = (work / "backups").as_uri()
        backup_id: list[str] = []

        def backup() -> float:
            with tempfile.TemporaryDirectory(dir=work) as copies:
                info = backup_cluster(kv, "raftkv", BackupStore(store_url, {}), Path(copies),
                                      datetime.now(timezone.utc))
            backup_id.append(info.id)
            return 0.0
        step(rows, console, sampler, cluster, "backup create", backup, lambda s: f"{mb / s:,.0f} MB/s of data")

        def restored() -> float:
            one = build_spec(nodes=1, partitions=PARTITIONS, replication=1, data_dir=work / "restored",
                             base_port=free_port_block(ports_per_node(PARTITIONS)))
            started_at = time.perf_counter()
            restore(store_url, backup_id[0], one, {})
            copy = LocalCluster(one, save_spec(one, work / "restored" / "cluster.toml"))
            try:
                copy.start_all()
                copy.wait_ready(timeout=600)
                return time.perf_counter() - started_at
            finally:
                copy.stop_all()
        step(rows, console, sampler, cluster, "restore into a new cluster, until it serves", restored,
             lambda s: f"{mb / s:,.0f} MB/s of data")

        victim = spec.node_ids[0]

        def restart() -> float:
            cluster.kill(victim)
            started_at = time.perf_counter()
            cluster.start(victim)
            cluster.wait_ready(timeout=600)
            return time.perf_counter() - started_at
        step(rows, console, sampler, cluster, f"node {victim} killed, restarted, until all lead",
             restart, lambda s: "")

        step(rows, console, sampler, cluster, "learner from zero, until it has all",
             lambda: learner_catch_up(cluster, work), lambda s: f"{args.keys / s:,.0f} keys/s")
    return rows


def learner_catch_up(cluster: LocalCluster, work: Path) -> float:
    add_learner(cluster.spec_path, "big", work / "changelog")
    target = leader_commit_indexes(cluster.endpoints)
    port = free_port_block(1)
    started_at = time.perf_counter()
    with started(learner_command(cluster.spec_path, "big", port), work / "learner.log"), \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = kv_pb2_grpc.ChangeLogStub(channel)

        def caught_up() -> bool:
            latest = changelog_latest(stub)
            return latest is not None and all(latest.get(p, 0) >= i for p, i in target.items())
        until(caught_up, 3600, "the learner to catch up", poll=0.1)
        return time.perf_counter() - started_at


def table(rows: list[Row], keys: int) -> Table:
    t = Table(title=f"{keys:,} keys of 100 B, 4 nodes, replication 3, {PARTITIONS} partitions")
    for column in ("step", "seconds", "rate", "highest RSS per node (MiB)", "disk per node at its end (MB)"):
        t.add_column(column, justify="left" if column == "step" else "right")
    for r in rows:
        t.add_row(r.step, f"{r.seconds:,.1f}", r.rate, " ".join(f"{v:.0f}" for v in r.rss_mib.values()),
                  " ".join(f"{v:,.0f}" for v in r.disk_mb.values()))
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--chunk", type=int, default=1000, help="keys per put_many call (default 1000)")
    parser.add_argument("--in-flight", type=int, default=16, help="put_many calls at once (default 16)")
    parser.add_argument("--data-dir", type=Path, default=None, help="default: a temporary folder here, deleted")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    console = Console(width=max(150, Console().width))
    with tempfile.TemporaryDirectory(dir=args.data_dir or ".") as tmp:
        rows = run(args, Path(tmp).resolve(), console)
    console.print(table(rows, args.keys))
    if args.json_out:
        args.json_out.write_text(json.dumps({"keys": args.keys, "rows": [asdict(r) for r in rows]}, indent=1))


if __name__ == "__main__":
    main()
