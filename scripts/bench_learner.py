"""Learner catch-up (raftkv vs an etcd 3.4 learner) and raftkv's change-feed lag, in one run.

    .venv/bin/python scripts/bench_learner.py                 # full run, about 1 minute on 2 cores
    .venv/bin/python scripts/bench_learner.py --quick         # about 25 s
    .venv/bin/python scripts/bench_learner.py --raftkv-only --keys 20000 --json-out learner.json

1. Catch-up. Each system, alone on the machine: a 3-member cluster on loopback
   gets `keys` keys (16-byte keys, 100-byte values, `chunk` keys per request,
   `load_in_flight` requests in flight, from a separate process), then a learner
   joins and is timed from its start until it has everything committed before
   it started:
   - raftkv: `raftkv learner add --sink changelog`, then `raftkv learner start
     --api-port P`; the bulk load is `AsyncClient.put_many`, one partition per
     call. Caught up when the changelog's `Offsets` gives, for every partition,
     `latest` >= the partition leader's commit index read just before the start.
   - etcd: `Cluster.MemberAdd(isLearner=true)` on the running cluster (plain
     synchronous gRPC stubs from the generated code etcd3aio ships; no etcdctl),
     then a 4th `etcd` with `--initial-cluster-state existing` and all four
     members in `--initial-cluster`; the bulk load is txns of puts through
     etcd3aio. Caught up when the learner's `Maintenance.Status` gives
     `raftAppliedIndex` >= the highest `raftIndex` (commit index) of the voters
     read just before the start. (An etcd learner answers only once it has
     published itself through the log, so its "answers" time is close to its
     caught-up time.)
   Both are polled every `poll` seconds over a gRPC channel that reconnects
   within 20-100 ms, so neither side waits on gRPC's default reconnect backoff.
   The commit index is read once before the start because the raftkv learner
   reports its progress through the log every second, which would move a
   target read live. Afterwards (untimed) the keys on each learner are
   counted: events in the raftkv changelog, a serializable count on etcd's.
2. Change-feed lag. On the same raftkv cluster and learner: writer processes
   (one per `writer_rate` writes/s, each with its own client) put at a fixed
   rate in all (each value starts with `time.time_ns()` taken at send), a
   reader thread follows the changelog (`ChangeLog.Follow`, which pushes each
   synced delivery), and lag is the time the reader got an event minus the
   send time in its value. `warmup` seconds at the rate are discarded, then
   `duration` seconds are measured. etcd's counterpart is a watch: the same
   writers (etcd3aio puts, round-robin over the members) on a 3-member etcd
   cluster of its own, and a reader watching the prefix at one member; its lag
   is the time the watch delivered the event minus the send time. Both
   clusters run the nodes' default settings (`--raft-engine` to change raftkv's).

Every figure records the cores used meanwhile by the system under test, by the
benchmark's own processes, and by everything else; figures measured while
everything else used more than NOISY_CORES are marked `*`. Data goes to one
temp dir (the same disk for both systems), deleted at the end; every process
started here is stopped on exit, on an error, on Ctrl-C and on SIGTERM.
Benchmarks report; they never assert timings.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import NOISY_CORES, comparison_table, verdict  # noqa: E402
from bench_clusters import ensure_etcd, ensure_etcd3aio, etcd_version, raftkv_cluster  # noqa: E402
from bench_host import machine, versions  # noqa: E402
from bench_run import config_arguments, drop_data_dir, header, start_run  # noqa: E402

from bench_learner_config import (  # noqa: E402
    CATCH_UP_TARGET, Config, ETCD_CLIENT, LAG_ETCD_TARGET, LAG_TARGET_MS, LAG_TARGET_RATE, QUICK,
)
from learner_catchup import CatchUp, Cores, etcd_catch_up, raftkv_learner_caught_up  # noqa: E402
from learner_lag import Lag, etcd_watch_lags, feed_lag  # noqa: E402


def measure_raftkv(config: Config, data_dir: Path, console: Console) -> tuple[CatchUp, list[Lag]]:
    """The raftkv side: catch-up, then the lag runs on the same cluster and learner."""
    with raftkv_cluster(data_dir, config.partitions, raft_engine=config.raft_engine) as cluster:
        with raftkv_learner_caught_up(cluster, data_dir, config, console) as learner:
            lags = [feed_lag(cluster, learner.pid, learner.address, rate, run, config, console)
                    for run, rate in enumerate(config.rate_list)]
    return learner.catch_up, lags


# -- the table ------------------------------------------------------------------------


def _num(value: float, digits: int = 2, noisy: bool = False) -> str:
    text = "n/a" if math.isnan(value) else f"{value:,.{digits}f}"
    return text + (" *" if noisy else "  ")


def _cores_cell(cores: Cores) -> str:
    return f"{cores.servers:.2f} / {cores.learner:.2f} / {cores.other:.2f}  "


def _ratio(value: float) -> str:
    return "" if math.isnan(value) else f"{value:,.2f}×"


def _problems(lag: Lag) -> str:
    problems = [f"{count} {what}" for count, what in ((lag.missing, "missing"), (lag.errors, "errors"),
                                                      (lag.skipped, "skipped")) if count]
    return f" [red]({', '.join(problems)})[/red]" if problems else ""


def table(raftkv_up: CatchUp, etcd_up: CatchUp | None, lags: list[Lag], config: Config, loads: str,
          etcd_lags: list[Lag] | None = None) -> Table:
    t = comparison_table(
        title=f"Learner catch-up over {config.keys:,} keys (raftkv vs etcd 3.4, 3 voters each on loopback, "
        f"{config.partitions} raftkv partitions) and raftkv's change-feed lag",
        caption=f"* = other processes on the machine used more than {NOISY_CORES} cores during that measurement. "
        f"Load average (1/5/15 min): {loads}. etcd's lag is a watch on the written prefix's.",
    )

    def etcd_cell(get: Callable[[CatchUp], str]) -> str:
        return get(etcd_up) if etcd_up else "skipped"

    ratio = raftkv_up.caught_up_s / etcd_up.caught_up_s if etcd_up else math.nan
    target = "" if math.isnan(ratio) else f"≤ {CATCH_UP_TARGET:.1f}× {verdict(ratio <= CATCH_UP_TARGET)}"
    t.add_row("learner catch-up: start → caught up (s)", _num(raftkv_up.caught_up_s, noisy=raftkv_up.cores.noisy),
              etcd_cell(lambda c: _num(c.caught_up_s, noisy=c.cores.noisy)), _ratio(ratio), target)
    t.add_row("  of which start → learner answers (s)", _num(raftkv_up.serving_s),
              etcd_cell(lambda c: _num(c.serving_s)), "", "")
    t.add_row("  index to reach (raftkv: Σ partitions' commit index)", f"{raftkv_up.target_index:,}  ",
              etcd_cell(lambda c: f"{c.target_index:,}  "), "", "")
    t.add_row("  keys on the learner afterwards", f"{raftkv_up.keys_on_learner:,}  ",
              etcd_cell(lambda c: f"{c.keys_on_learner:,}  "), "", f"{config.keys:,}")
    t.add_row("  via a snapshot", str(raftkv_up.from_snapshot) + "  ", etcd_cell(lambda c: str(c.from_snapshot) + "  "),
              "", "")
    t.add_row("  cores meanwhile: voters / learner / other", _cores_cell(raftkv_up.cores),
              etcd_cell(lambda c: _cores_cell(c.cores)), "", "")
    load_ratio = (config.keys / raftkv_up.load_s) / (config.keys / etcd_up.load_s) if etcd_up else math.nan
    t.add_row(f"bulk load before it, keys/s ({config.chunk} a request, {config.load_in_flight} in flight)",
              _num(config.keys / raftkv_up.load_s, 0), etcd_cell(lambda c: _num(c.keys / c.load_s, 0)),
              _ratio(load_ratio), "")
    t.add_section()
    etcd_by_rate = {lag.rate: lag for lag in etcd_lags or ()}
    for lag in lags:
        label = f"feed at {lag.rate:,} writes/s:"
        watch = etcd_by_rate.get(lag.rate)

        def etcd_lag(get: Callable[[Lag], str]) -> str:
            return get(watch) if watch else "skipped"

        t.add_row(f"{label} achieved writes/s ({lag.writers} writer processes)",
                  _num(lag.achieved, 0, lag.cores.noisy) + _problems(lag),
                  etcd_lag(lambda w: _num(w.achieved, 0, w.cores.noisy) + _problems(w)), "", "")
        t.add_row(f"{label} lag p50 (ms)", _num(lag.p50_ms, 1, lag.cores.noisy),
                  etcd_lag(lambda w: _num(w.p50_ms, 1, w.cores.noisy)),
                  _ratio(lag.p50_ms / watch.p50_ms) if watch else "", "")
        targets = []
        if lag.rate == LAG_TARGET_RATE:
            reached = lag.achieved >= 0.95 * lag.rate
            met = reached and not lag.missing and lag.p99_ms <= LAG_TARGET_MS
            targets.append(f"≤ {LAG_TARGET_MS:.0f} ms {verdict(met)}" + ("" if reached else " (rate not reached)"))
        ratio = lag.p99_ms / watch.p99_ms if watch else math.nan
        if watch:
            targets.append(f"≤ {LAG_ETCD_TARGET:.1f}× {verdict(ratio <= LAG_ETCD_TARGET)}")
        t.add_row(f"{label} lag p99 (ms)", _num(lag.p99_ms, 1, lag.cores.noisy),
                  etcd_lag(lambda w: _num(w.p99_ms, 1, w.cores.noisy)), _ratio(ratio), "; ".join(targets))
        t.add_row(f"{label} put ack p50 / p99 (ms)", f"{lag.put_p50_ms:,.1f} / {lag.put_p99_ms:,.1f}  ",
                  etcd_lag(lambda w: f"{w.put_p50_ms:,.1f} / {w.put_p99_ms:,.1f}  "), "", "")
        t.add_row(f"{label} cores: voters / learner / other", _cores_cell(lag.cores),
                  etcd_lag(lambda w: _cores_cell(w.cores)), "", "")
    return t


# -- main -----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    config_arguments(p, Config(), QUICK, "fewer keys and short windows: about 1 minute")
    p.add_argument("--raftkv-only", action="store_true", help="skip etcd (no etcd needed)")
    p.add_argument("--json-out", type=Path, help="also write every figure to this JSON file")
    p.add_argument("--data-dir", type=Path, help="where the clusters keep their data, kept at the end "
                   "(default: a new temp dir, deleted at the end)")
    p.add_argument("--keep-data", action="store_true", help="do not delete the temp dir at the end")
    return p.parse_args(argv)


def _load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config, console, data_dir = start_run(args, Config(), QUICK, "raftkv-bench-learner-", width=160)
    started_at = time.monotonic()
    etcd_up, etcd_lags = None, None
    try:
        etcd_binary = None if args.raftkv_only else ensure_etcd()
        ensure_etcd3aio()
        host = machine(data_dir)
        vers = versions(etcd_version(etcd_binary) if etcd_binary else "skipped", ETCD_CLIENT)
        header(console, host, vers, config, data_dir)
        if etcd_binary:
            etcd_up = etcd_catch_up(etcd_binary, data_dir / "etcd", config, console)
            etcd_lags = etcd_watch_lags(etcd_binary, data_dir / "etcd-watch", config, console)
        raftkv_up, lags = measure_raftkv(config, data_dir / "raftkv", console)
    except KeyboardInterrupt:
        console.print("[red]interrupted; every started process has been stopped[/red]")
        return 130
    finally:
        drop_data_dir(args, data_dir)
    loads = f"{host['load_average']} before, {_load_average()} after"
    console.print(table(raftkv_up, etcd_up, lags, config, loads, etcd_lags))
    elapsed = time.monotonic() - started_at
    console.print(f"Total time {elapsed:.0f} s.")
    if args.json_out:
        report = {"machine": host, "versions": vers, "config": asdict(config), "elapsed_s": elapsed,
                  "load_average_after": _load_average(), "catch_up": {"raftkv": asdict(raftkv_up),
                                                                      "etcd": asdict(etcd_up) if etcd_up else None},
                  "feed_lag": [asdict(lag) for lag in lags],
                  "etcd_watch_lag": [asdict(lag) for lag in etcd_lags] if etcd_lags else None}
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
