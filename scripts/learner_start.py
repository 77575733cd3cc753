"""How long a learner takes from its process start to its first delivery, and where the time goes.

    .venv/bin/python scripts/learner_start.py                       # jsonl sink, 5 runs
    .venv/bin/python scripts/learner_start.py --sink kafka --runs 7 # a tansu broker (raftkv/dev/broker.py)
    .venv/bin/python scripts/learner_start.py --sink changelog --json-out start.json

A 3-node cluster on loopback (`partitions` partitions) gets `keys` keys. Then, `runs` times: a new
learner is registered (`start-<run>`, the chosen sink, all partitions), `raftkv learner start` is
started through scripts/learner_start_trace.py (the same command, with a timestamped trace of its
milestones on stderr), and stopped right after its first delivery (the sink's first deliver + flush
returned); the learner is then removed. Each milestone is timed from just before the process was
spawned. `jsonl` is the example plugin (examples/jsonl_sink: a file, nothing to import): the
lightest sink there is, which is what start-up alone costs. The CPU seconds are the learner
process's, user + system, until it exited (its stop included). The script compiles the packages'
bytecode first, as installing a wheel does: where PYTHONDONTWRITEBYTECODE is set (this project's
machines), a checkout's learner otherwise compiles every module of ours at each start (0.16 s here).

Benchmarks report; they never assert timings.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_clusters import raftkv_cluster, raftkv_spec_path  # noqa: E402
from bench_load import VALUE_BYTES, key  # noqa: E402

import raftkv  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TRACE = Path(__file__).resolve().parent / "learner_start_trace.py"
FIRST_DELIVERY = "first delivery:end"


def sink_options(sink: str, run: int, data_dir: Path, bootstrap: str | None) -> dict[str, str]:
    if sink == "jsonl":
        return {"path": str(data_dir / f"start-{run}.jsonl")}
    if sink == "changelog":
        return {"path": str(data_dir / f"changelog-{run}")}
    if sink == "kafka":
        return {"bootstrap.servers": bootstrap, "topic": f"start-{run}"}
    raise SystemExit(f"unknown sink {sink!r}: jsonl, changelog or kafka")


def one_run(spec_path: Path, name: str, timeout: float, log_path: Path) -> dict:
    """{"marks": {milestone: seconds after the spawn}, "cpu_marks": {milestone: the learner's CPU seconds
    by then}, "cpu_s": the learner process's CPU seconds until it exited}."""
    command = [sys.executable, str(TRACE), "learner", "start", "--name", name, "--config", str(spec_path)]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    spawned = time.time()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    marks: dict[str, float] = {}
    cpu_marks: dict[str, float] = {}  # the learner's CPU seconds at each milestone
    delivered = threading.Event()

    def read() -> None:
        with open(log_path, "ab") as log:
            for line in proc.stdout:
                now = time.time()
                log.write(line)
                text = line.decode(errors="replace").strip()
                if text.startswith("TRACE "):
                    milestone, at, cpu_at = text[6:].rsplit(" ", 2)
                    marks.setdefault(milestone, float(at) - spawned)
                    cpu_marks.setdefault(milestone, float(cpu_at))
                    if milestone == FIRST_DELIVERY:
                        delivered.set()
                elif f"learner {name} ready" in text:
                    marks.setdefault("ready (printed)", now - spawned)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not delivered.wait(timeout):
            raise SystemExit(f"no delivery within {timeout:.0f} s; see {log_path}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return {"marks": marks, "cpu_marks": cpu_marks, "cpu_s": cpu}


def measure(args: argparse.Namespace, data_dir: Path) -> dict:
    broker = None
    if args.sink == "kafka":
        from raftkv.dev.broker import TansuBroker
        broker = TansuBroker(log_path=data_dir / "tansu.log").start()
    loads, runs = [os.getloadavg()], []
    try:
        with raftkv_cluster(data_dir / "cluster", args.partitions) as cluster:
            spec_path = raftkv_spec_path(data_dir / "cluster")
            with raftkv.Client(list(cluster.endpoints), timeout=30.0) as kv:
                by_partition: dict[int, list[bytes]] = {}
                for i in range(args.keys):
                    by_partition.setdefault(kv.partition_of(key(i)), []).append(key(i))
                for keys in by_partition.values():  # a put_many stays within one partition
                    for start in range(0, len(keys), 1000):
                        chunk = keys[start:start + 1000]
                        kv.put_many(chunk, [os.urandom(VALUE_BYTES) for _ in chunk])
                for run in range(args.runs):
                    name = f"start-{run}"
                    kv.register_learner(name, args.sink, sink_options(args.sink, run, data_dir,
                                                                      broker.bootstrap if broker else None))
                    runs.append(one_run(spec_path, name, args.timeout, data_dir / f"{name}.log"))
                    kv.remove_learner(name)
                    loads.append(os.getloadavg())
                    print(f"run {run}: first delivery {runs[-1]['marks'][FIRST_DELIVERY]:.3f} s, learner CPU "
                          f"{runs[-1]['cpu_s']:.3f} s, load {loads[-1][0]:.2f}", flush=True)
    finally:
        if broker is not None:
            broker.stop()
    return {"sink": args.sink, "keys": args.keys, "partitions": args.partitions, "runs": runs,
            "load_averages": loads}


def report(result: dict) -> None:
    runs = result["runs"]
    names = sorted({m for r in runs for m in r["marks"]}, key=lambda m: statistics.median(
        r["marks"][m] for r in runs if m in r["marks"]))
    print(f"\nlearner start-up, sink {result['sink']}, {result['partitions']} partitions, {result['keys']:,} keys; "
          f"median (min–max) of {len(runs)} runs:")
    print(f"  {'milestone':<40} {'s after the spawn':>24}   {'its CPU s by then':>22}")
    for m in names:
        values = [r["marks"][m] for r in runs if m in r["marks"]]
        cpu = [r["cpu_marks"][m] for r in runs if m in r["cpu_marks"]]
        cpu_text = f"{statistics.median(cpu):7.3f}  ({min(cpu):.3f}–{max(cpu):.3f})" if cpu else ""
        print(f"  {m:<40} {statistics.median(values):7.3f}  ({min(values):.3f}–{max(values):.3f})   {cpu_text}")
    cpu = [r["cpu_s"] for r in runs]
    print(f"  {'learner CPU seconds (until it exited)':<40} {statistics.median(cpu):7.3f}  "
          f"({min(cpu):.3f}–{max(cpu):.3f})")
    loads = result["load_averages"]
    print(f"  load average (1 min) before and after the runs: {loads[0][0]:.2f} … {loads[-1][0]:.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sink", default="jsonl", choices=("jsonl", "changelog", "kafka"))
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--keys", type=int, default=1000, help="loaded before the learners start")
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a run may take to its first delivery")
    p.add_argument("--json-out", type=Path, help="also write every run's milestones here")
    p.add_argument("--keep-data", action="store_true", help="keep the temp dir (the learners' logs are there)")
    args = p.parse_args(argv)
    for package in ("raftkv", "learners", "examples"):
        compileall.compile_dir(ROOT / package, quiet=1)
    data_dir = Path(tempfile.mkdtemp(prefix="raftkv-learner-start-"))
    try:
        result = measure(args, data_dir)
    finally:
        if args.keep_data:
            print(f"data and logs kept in {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
    report(result)
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
