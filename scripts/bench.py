"""Benchmark raftkv against a 3-member etcd 3.4 cluster on this machine.

    .venv/bin/python scripts/bench.py                 # full run, about 3.5 minutes on 2 cores
    .venv/bin/python scripts/bench.py --quick         # about 1 minute
    .venv/bin/python scripts/bench.py --json-out bench.json --processes 4 --in-flight 64
    .venv/bin/python scripts/bench.py --tls           # TLS vs plaintext, for raftkv and etcd alike (below)

What is measured, each for raftkv and etcd in the same run:

1. sequential put: 1 process, 1 request in flight, each put waits for its ack (p50/p99);
2. concurrent put: P processes x M requests in flight (ops/s, p99);
3. linearizable get, and raftkv `leader`/`follower` gets beside etcd serializable gets;
4. batches of N puts: one raftkv `Client.batch` within one partition vs one etcd txn;
5. fsync durability: a second raftkv cluster with `durability = "fsync"` vs etcd
   (which fsyncs every commit);
6. the disk's ceiling with no Raft: rocksdict put / WriteBatch / sync put rates and
   `os.fdatasync` latency in the benchmark's data dir.

How: 3 etcd members and 3 raftkv nodes on loopback, data under one temp dir, so
clients and servers share this machine's cores. etcd runs throughout; the raftkv
cluster in `lose-last-second` durability runs beside it (the rows that name no
mode), then one in fsync mode (raftkv's default since 0.2). Each
scenario runs for etcd and then for raftkv back to back, so that load from other
processes on the machine hits both alike (each figure reports that load; the
idle cluster of the other system costs a few percent of a core). Before the
scenarios every key of the key space is written once. The load generator
(bench_load.py) drives both systems the same way: worker processes x asyncio
streams, 16-byte keys, 100-byte values, a warm-up then a measured window. raftkv
is driven through the asyncio core of `raftkv.Client`, etcd through etcd3aio (async
gRPC). Figures are printed as one table (with the raftkv/etcd ratio and the issue's
targets) and optionally written as JSON; docs/benchmarks.md has a measured run.
Benchmarks report; they never assert timings.

With --tls the run asks another question: what TLS costs each system. Four
clusters are up together: raftkv plaintext; raftkv with mutual TLS on client and
Raft connections, the clients being the user `admin` (role root; with TLS the
cluster checks every request's permissions); etcd plaintext; etcd with TLS on
client and peer URLs, each requiring a certificate its CA signed
(`--client-cert-auth`, `--peer-client-cert-auth`; etcd's own auth stays off).
Each cluster has its own CA, made with `raftkv.security.certs`. Scenarios 1 to 3
(sequential put, concurrent put, linearizable get) run for etcd plaintext, etcd
TLS, raftkv plaintext, raftkv TLS back to back; the batch, local-read, fsync and
disk-ceiling scenarios are left out to keep the run short (about 3 minutes; with
--quick about 70 s). The table gives each system's TLS/plaintext ratio and the
issue's target: TLS costs raftkv no more, as a ratio, than it costs etcd.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench_clusters import Running, ensure_etcd, ensure_etcd3aio, etcd_cluster, etcd_version, raftkv_cluster
from bench_host import disk_ceiling, machine, versions
from bench_load import Figures, Load, fill, run_load
from bench_run import config_arguments, drop_data_dir, header, start_run


@dataclass(frozen=True)
class Config:
    processes: int = 4
    in_flight: int = 64
    duration: float = 10.0  # measured seconds per scenario
    warmup: float = 2.0
    batch: int = 10
    keys: int = 10_000
    partitions: int = 8
    ceiling_seconds: float = 3.0


QUICK = Config(duration=2.0, warmup=0.5, ceiling_seconds=1.0)
NOISY_CORES = 0.25  # other load above this during a measurement marks its figure


@dataclass(frozen=True)
class Scenario:
    op: str  # "put", "get" or "batch"
    consistency: str = "linearizable"  # of reads; writes are always linearizable
    concurrent: bool = True  # Config.processes x Config.in_flight, else 1 x 1
    systems: tuple[str, ...] = ("etcd", "raftkv")


SCENARIOS = {  # in the order they run
    "seq_put": Scenario("put", concurrent=False),
    "put": Scenario("put"),
    "get_linearizable": Scenario("get"),
    "get_serializable": Scenario("get", "serializable", systems=("etcd",)),
    "get_leader": Scenario("get", "leader", systems=("raftkv",)),
    "get_follower": Scenario("get", "follower", systems=("raftkv",)),
    "batch": Scenario("batch"),
}
PHASES = {  # raftkv durability -> the scenarios run with that raftkv cluster beside etcd
    "lose-last-second": tuple(SCENARIOS),
    "fsync": ("seq_put", "put"),
}
TLS_PHASES = ("plaintext", "tls")  # --tls: each system without TLS, then with it
TLS_SCENARIOS = ("seq_put", "put", "get_linearizable")
ETCD_CLIENT = "etcd3aio (async gRPC, grpc.aio)"
MEASURED_ELSEWHERE = {  # rows whose set-up is a run of its own -> (the script, the target)
    "learner catch-up vs an etcd learner": ("scripts/bench_learner.py", "≤ 1.0×"),
    "change feed lag p99 at 5,000 writes/s": ("scripts/bench_learner.py", "≤ 100 ms"),
    "Spark read rows/s": ("scripts/bench_spark.py", "≥ 1,000,000"),
    "Spark write rows/s": ("scripts/bench_spark.py", "≥ 300,000"),
}


def run_scenario(name: str, system: str, cluster: Running, config: Config) -> Figures:
    """Run one named scenario against a running cluster and return its figures."""
    scenario = SCENARIOS[name]
    load = Load(
        system=system, endpoints=cluster.endpoints, op=scenario.op, consistency=scenario.consistency,
        processes=config.processes if scenario.concurrent else 1,
        in_flight=config.in_flight if scenario.concurrent else 1,
        duration=config.duration, warmup=config.warmup, batch=config.batch, keys=config.keys, tls=cluster.tls,
    )
    return run_load(load, cluster.pids)


def measure_all(config: Config, data_dir: Path, etcd_binary: str, console: Console) -> dict:
    """results[phase][system][scenario]: per phase, etcd and one raftkv cluster are up together."""
    results = {}
    with etcd_cluster(etcd_binary, data_dir / "etcd") as etcd:
        fill("etcd", etcd.endpoints, config.keys)
        for durability, names in PHASES.items():
            with raftkv_cluster(data_dir / f"raftkv-{durability}", config.partitions, durability) as raftkv:
                fill("raftkv", raftkv.endpoints, config.keys)
                results.update(measure({durability: {"etcd": etcd, "raftkv": raftkv}}, names, config, console))
    return results


def measure_tls(config: Config, data_dir: Path, etcd_binary: str, console: Console) -> dict:
    """results[phase][system][scenario], phase "plaintext" or "tls": the four clusters are up together."""
    clusters = {}
    with ExitStack() as stack:
        for phase in TLS_PHASES:
            tls = phase == "tls"
            clusters[phase] = {
                "etcd": stack.enter_context(etcd_cluster(etcd_binary, data_dir / f"etcd-{phase}", tls)),
                "raftkv": stack.enter_context(raftkv_cluster(data_dir / f"raftkv-{phase}", config.partitions, tls=tls)),
            }
            for system, cluster in clusters[phase].items():
                fill(system, cluster.endpoints, config.keys, cluster.tls)
        return measure(clusters, TLS_SCENARIOS, config, console)


def measure(clusters: dict[str, dict[str, Running]], names: tuple[str, ...], config: Config, console: Console):
    """results[phase][system][scenario] from clusters[phase][system].

    Each scenario runs for etcd then raftkv, each in every phase, back to back, so that load from
    elsewhere hits all alike.
    """
    results = {phase: {system: {} for system in by_system} for phase, by_system in clusters.items()}
    width = max(7, *map(len, clusters))
    for name in names:
        for system in SCENARIOS[name].systems:
            for phase, by_system in clusters.items():
                f = results[phase][system][name] = run_scenario(name, system, by_system[system], config)
                console.print(
                    f"[dim]{phase:>{width}} {system:>6} {name:<16} {f.ops_per_s:>8,.0f} ops/s  p50 {f.p50_ms:6.2f}  "
                    f"p99 {f.p99_ms:7.2f} ms  cores: servers {f.server_cpu:.2f}, clients {f.client_cpu:.2f}, "
                    f"other {f.other_cpu:.2f}  errors {f.errors}[/dim]"
                )
    return results


# -- the table ----------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    label: str
    metric: str  # a Figures field, or "keys_per_s" (puts per second in batches)
    raftkv: tuple[str, str]  # (phase, scenario)
    etcd: tuple[str, str]
    target: float | None = None  # ratio to reach: at most for latencies, at least for rates

    @property
    def lower_is_better(self) -> bool:
        return self.metric.endswith("_ms")


def rows(config: Config) -> list[Row]:
    def same(label: str, metric: str, scenario: str, target: float | None = None, phase: str = "lose-last-second") -> Row:
        return Row(label, metric, (phase, scenario), (phase, scenario), target)

    return [
        same("sequential put p50 (ms)", "p50_ms", "seq_put", 1.0),
        same("sequential put p99 (ms)", "p99_ms", "seq_put"),
        same("concurrent put ops/s", "ops_per_s", "put", 3.0),
        same("concurrent put p99 (ms)", "p99_ms", "put"),
        same("linearizable get ops/s", "ops_per_s", "get_linearizable", 1.5),
        same("linearizable get p99 (ms)", "p99_ms", "get_linearizable"),
        Row("raftkv leader get vs etcd serializable ops/s", "ops_per_s", ("lose-last-second", "get_leader"),
            ("lose-last-second", "get_serializable")),
        Row("raftkv follower get vs etcd serializable ops/s", "ops_per_s", ("lose-last-second", "get_follower"),
            ("lose-last-second", "get_serializable")),
        same(f"batch of {config.batch} puts: puts/s", "keys_per_s", "batch"),
        same(f"batch of {config.batch} puts: p99 (ms)", "p99_ms", "batch"),
        same("fsync mode: sequential put p50 (ms)", "p50_ms", "seq_put", phase="fsync"),
        same("fsync mode: concurrent put ops/s", "ops_per_s", "put", 1.0, phase="fsync"),
        same("fsync mode: concurrent put p99 (ms)", "p99_ms", "put", phase="fsync"),
    ]


def metric(figures: Figures, name: str, config: Config) -> float:
    return figures.ops_per_s * config.batch if name == "keys_per_s" else getattr(figures, name)


def fmt(value: float, latency: bool) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:,.2f}" if latency else f"{value:,.0f}"


def evaluate(row: Row, results: dict, config: Config) -> dict:
    """The row's two values, their ratio, and whether the target is met."""
    (raftkv_phase, raftkv_name), (etcd_phase, etcd_name) = row.raftkv, row.etcd
    entry = _columns({"raftkv": results[raftkv_phase]["raftkv"][raftkv_name],
                      "etcd": results[etcd_phase]["etcd"][etcd_name]}, row, config)
    ratio = _ratio(entry["raftkv"], entry["etcd"])
    met = None if row.target is None else _reaches(ratio, row.target, row.lower_is_better)
    return {"label": row.label, **entry, "ratio": ratio, "latency": row.lower_is_better, "target": row.target,
            "met": met}


def tls_rows(config: Config) -> list[Row]:
    """The rows of the main table whose scenario --tls measures."""
    return [row for row in rows(config)
            if row.raftkv == row.etcd and row.raftkv[0] == "lose-last-second" and row.raftkv[1] in TLS_SCENARIOS]


def tls_cost(row: Row, results: dict, config: Config) -> dict:
    """The row's value per system and phase, each system's TLS/plaintext ratio, and whether TLS costs
    raftkv no more than it costs etcd: raftkv's ratio no higher for a latency, no lower for a rate."""
    _, name = row.raftkv
    entry = _columns({f"{system}_{phase}": results[phase][system][name]
                      for system in ("raftkv", "etcd") for phase in TLS_PHASES}, row, config)
    ratios = {system: _ratio(entry[f"{system}_tls"], entry[f"{system}_plaintext"]) for system in ("raftkv", "etcd")}
    return {"label": row.label, **entry, "tls_ratio": ratios, "latency": row.lower_is_better,
            "met": _reaches(ratios["raftkv"], ratios["etcd"], row.lower_is_better)}


def _columns(figures: dict[str, Figures], row: Row, config: Config) -> dict:
    """The row's value in each column, with the errors and the noise mark `_cell` shows beside it."""
    return {**{column: metric(f, row.metric, config) for column, f in figures.items()},
            "errors": {column: f.errors for column, f in figures.items()},
            "noisy": {column: f.other_cpu > NOISY_CORES for column, f in figures.items()}}


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def _reaches(value: float, bound: float, lower_is_better: bool) -> bool:
    return value <= bound if lower_is_better else value >= bound


def verdict(met: bool) -> str:
    return "[green]met[/green]" if met else "[red]not met[/red]"


def target_text(entry: dict) -> str:
    if entry["target"] is None:
        return ""
    sign = "≤" if entry["latency"] else "≥"
    return f"{sign} {entry['target']:.1f}× {verdict(entry['met'])}"


def comparison_table(title: str, caption: str) -> Table:
    """The shape every raftkv-vs-etcd table here has: scenario, both systems, their ratio, the target."""
    return _table(title, caption, ("raftkv", "etcd", "raftkv/etcd"))


def _table(title: str, caption: str, figures: tuple[str, ...]) -> Table:
    """A table whose columns are the scenario, the `figures` (right-justified) and the target."""
    t = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    t.add_column("scenario")
    for name in figures:
        t.add_column(name, justify="right")
    t.add_column("target")
    return t


def _load_shape(config: Config) -> str:
    return (f"3 members each on loopback; concurrent = {config.processes} processes x {config.in_flight} in flight; "
            f"{config.duration:g} s windows")


def table(evaluated: list[dict], ceiling: dict, config: Config) -> Table:
    t = comparison_table(
        title=f"raftkv vs etcd 3.4, {_load_shape(config)}",
        caption=f"etcd client: {ETCD_CLIENT}. * = other processes on the machine (the idle cluster of the other "
        f"system included) used more than {NOISY_CORES} cores during that measurement.",
    )
    for entry in evaluated:
        t.add_row(entry["label"], _cell(entry, "raftkv"), _cell(entry, "etcd"), f"{entry['ratio']:.2f}×",
                  target_text(entry))
    t.add_section()
    for label, key in (("disk ceiling: rocksdict put/s", "rocksdict_put_per_s"),
                       ("disk ceiling: rocksdict WriteBatch puts/s", "rocksdict_write_batch_puts_per_s"),
                       ("disk ceiling: rocksdict sync put/s", "rocksdict_sync_put_per_s"),
                       ("disk ceiling: fdatasync p50 (ms)", "fdatasync_p50_ms"),
                       ("disk ceiling: fdatasync p99 (ms)", "fdatasync_p99_ms")):
        t.add_row(label, fmt(ceiling[key], key.endswith("_ms")), "", "", "")
    t.add_section()
    for label, (script, target) in MEASURED_ELSEWHERE.items():
        t.add_row(label, f"see {script}", "", "", target)
    return t


def tls_table(evaluated: list[dict], config: Config) -> Table:
    t = _table(
        title=f"TLS vs plaintext: raftkv (mutual TLS, clients as user admin, permissions checked) and etcd 3.4 "
        f"(client and peer TLS, client certificates required), {_load_shape(config)}",
        caption=f"TLS/plain = the figure with TLS over the one without. Target: TLS costs raftkv no more than it "
        f"costs etcd (raftkv's ratio no higher for a latency, no lower for a rate). etcd client: {ETCD_CLIENT}. "
        f"* = other processes on the machine (the three idle clusters included) used more than {NOISY_CORES} cores "
        "during that measurement.",
        figures=("raftkv", "raftkv TLS", "TLS/plain", "etcd", "etcd TLS", "TLS/plain"),
    )
    for entry in evaluated:
        cells = [cell for system in ("raftkv", "etcd") for cell in (
            _cell(entry, f"{system}_plaintext"), _cell(entry, f"{system}_tls"), f"{entry['tls_ratio'][system]:.2f}×")]
        sign = "≤" if entry["latency"] else "≥"
        t.add_row(entry["label"], *cells, f"raftkv {sign} etcd {verdict(entry['met'])}")
    return t


def _cell(entry: dict, column: str) -> str:
    text = fmt(entry[column], entry["latency"])
    if entry["errors"][column]:
        text += f" [red]({entry['errors'][column]} errors)[/red]"
    return text + (" *" if entry["noisy"][column] else "  ")


# -- main ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    config_arguments(p, Config(), QUICK, "short windows: about 1 minute in all")
    p.add_argument("--tls", action="store_true", help="TLS vs plaintext for raftkv and etcd (scenarios 1-3 only)")
    p.add_argument("--json-out", type=Path, help="also write every figure to this JSON file")
    p.add_argument("--data-dir", type=Path, help="where the clusters keep their data, kept at the end "
                   "(default: a new temp dir, deleted at the end)")
    p.add_argument("--keep-data", action="store_true", help="do not delete the temp dir at the end")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config, console, data_dir = start_run(args, Config(), QUICK, "raftkv-bench-", width=150)
    started = time.monotonic()
    try:
        etcd_binary = ensure_etcd()
        ensure_etcd3aio()
        host, vers = machine(data_dir), versions(etcd_version(etcd_binary), ETCD_CLIENT)
        header(console, host, vers, config, data_dir)
        run = tls_run if args.tls else default_run
        result_table, figures = run(config, data_dir, etcd_binary, console)
    except KeyboardInterrupt:
        console.print("[red]interrupted; every started process has been stopped[/red]")
        return 130
    finally:
        drop_data_dir(args, data_dir)
    console.print(result_table)
    elapsed = time.monotonic() - started
    console.print(f"Total time {elapsed:.0f} s.")
    if args.json_out:
        report = {"machine": host, "versions": vers, "config": asdict(config), "elapsed_s": elapsed, **figures}
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def default_run(config: Config, data_dir: Path, etcd_binary: str, console: Console) -> tuple[Table, dict]:
    """raftkv vs etcd: the table, and the figures for --json-out."""
    results = measure_all(config, data_dir, etcd_binary, console)
    ceiling = disk_ceiling(data_dir / "ceiling", config.ceiling_seconds)
    evaluated = [evaluate(row, results, config) for row in rows(config)]
    return table(evaluated, ceiling, config), {
        "results": _as_dicts(results), "ceiling": ceiling, "rows": evaluated,
        "measured_elsewhere": {label: script for label, (script, _) in MEASURED_ELSEWHERE.items()}}


def tls_run(config: Config, data_dir: Path, etcd_binary: str, console: Console) -> tuple[Table, dict]:
    """What TLS costs raftkv and etcd: the table, and the figures for --json-out."""
    results = measure_tls(config, data_dir, etcd_binary, console)
    evaluated = [tls_cost(row, results, config) for row in tls_rows(config)]
    return tls_table(evaluated, config), {"tls": True, "results": _as_dicts(results), "rows": evaluated}


def _as_dicts(results: dict) -> dict:
    return {
        phase: {system: {name: asdict(f) for name, f in figures.items()} for system, figures in by_system.items()}
        for phase, by_system in results.items()
    }


if __name__ == "__main__":
    sys.exit(main())
