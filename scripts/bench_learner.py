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
2. Change-feed lag. On the same raftkv cluster and learner: a writer process
   puts at a fixed rate (each value starts with `time.time_ns()` taken at
   send), a reader thread follows the changelog (`ChangeLog.Follow`, which
   pushes each synced delivery), and lag is the time the reader got an event
   minus the send time in its value. `warmup`
   seconds at the rate are discarded, then `duration` seconds are measured.

Every figure records the cores used meanwhile by the system under test, by the
benchmark's own processes, and by everything else; figures measured while
everything else used more than NOISY_CORES are marked `*`. Data goes to one
temp dir (the same disk for both systems), deleted at the end; every process
started here is stopped on exit, on an error, on Ctrl-C and on SIGTERM.
Benchmarks report; they never assert timings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import queue
import random
import shutil
import subprocess
import sys
import threading
import time
import traceback
from array import array
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import grpc
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import NOISY_CORES, comparison_table, header, start_run, verdict  # noqa: E402
from bench_clusters import (  # noqa: E402
    Running,
    ensure_etcd,
    ensure_etcd3aio,
    etcd_cluster,
    etcd_join_command,
    etcd_rpc,
    etcd_version,
    raftkv_cluster,
    raftkv_spec_path,
    started,
)
from bench_host import machine, versions  # noqa: E402
from bench_load import VALUE_BYTES, cpu_seconds, key, machine_busy_seconds, percentile  # noqa: E402

import raftkv  # noqa: E402
from learners.changelog_client import ChangeLogClient  # noqa: E402
from raftkv.api import kv_pb2 as pb  # noqa: E402
from raftkv.api import kv_pb2_grpc  # noqa: E402
from raftkv.core.errors import Unavailable  # noqa: E402
from raftkv.dev.local_cluster import free_port_block  # noqa: E402
from raftkv.core.partitioning import partition_for_key  # noqa: E402


@dataclass(frozen=True)
class Config:
    keys: int = 100_000
    partitions: int = 8
    chunk: int = 100  # keys per put_many / per etcd txn (etcd's default --max-txn-ops is 128)
    load_in_flight: int = 64
    rates: str = "1000,5000"  # writes/s of the change-feed lag runs
    duration: float = 10.0  # measured seconds per rate
    warmup: float = 2.0  # seconds per rate before the measured window
    poll: float = 0.020  # catch-up polling period (s)
    timeout: float = 300.0  # a learner not caught up after this many seconds is reported as such

    @property
    def rate_list(self) -> tuple[int, ...]:
        return tuple(int(r) for r in self.rates.split(","))


QUICK = Config(keys=20_000, duration=2.0, warmup=0.5)
LEARNER = "catchup"
ETCD_LEARNER = "learner"
ETCD_CLIENT = "etcd3aio 0.3.0 (load); plain gRPC stubs from etcd3aio's generated code (MemberAdd, Status)"
LAG_TARGET_MS, LAG_TARGET_RATE = 100.0, 5000
CATCH_UP_TARGET = 1.0  # raftkv/etcd, at most
REQUEST_TIMEOUT = 10.0
MAX_PENDING = 5000  # the paced writer skips a send when this many puts are outstanding
FAST_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 20), ("grpc.min_reconnect_backoff_ms", 20),
                  ("grpc.max_reconnect_backoff_ms", 100)]


# -- CPU accounting -------------------------------------------------------------------


@dataclass(frozen=True)
class Cores:
    servers: float  # the voters (raftkv nodes, etcd members)
    learner: float  # the learner process
    bench: float  # this process (poller, feed reader) and the paced writer
    other: float  # everything else on the machine (noise)

    @property
    def system(self) -> float:
        """The system under test: voters and learner."""
        return self.servers + self.learner

    @property
    def noisy(self) -> bool:
        return self.other > NOISY_CORES


class Meter:
    """Cores used from now until `read()`: by the servers, the learner, this process, everything else."""

    def __init__(self, servers: Iterable[int], learner: int | None = None):
        self.servers, self.learner = list(servers), learner
        self._cpu0 = {pid: cpu_seconds([pid]) for pid in [*self.servers, *([learner] if learner else [])]}
        self._wall0, self._own0, self._busy0 = time.monotonic(), time.process_time(), machine_busy_seconds()

    def add_learner(self, pid: int) -> None:
        """The learner, started after the meter: all its CPU counts."""
        self.learner = pid

    def _used(self, pids: Iterable[int]) -> float:
        return sum(cpu_seconds([pid]) - self._cpu0.get(pid, 0.0) for pid in pids)

    def read(self) -> Cores:
        wall = time.monotonic() - self._wall0
        servers = self._used(self.servers) / wall
        learner = self._used([self.learner] if self.learner else []) / wall
        bench = (time.process_time() - self._own0) / wall
        busy = (machine_busy_seconds() - self._busy0) / wall
        return Cores(servers, learner, bench, max(0.0, busy - servers - learner - bench))


# -- loading the keys (a child process, like bench_load's fill) -----------------------


def load(system: str, endpoints: Sequence[str], config: Config) -> float:
    """Write keys 0..config.keys once; returns the seconds the writes took (values prepared before)."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=_load_child, args=(system, tuple(endpoints), config, results))
    try:
        proc.start()
        reply = _reply(proc, results, config.timeout + 60)
    finally:
        if proc.is_alive():
            proc.terminate()
        proc.join()
    if isinstance(reply, str):
        raise RuntimeError(f"loading {system} failed:\n{reply}")
    return reply


def _reply(proc, results, timeout: float):
    """The child's reply, or an error as soon as it exits without one (it printed its traceback)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return results.get(timeout=0.5)
        except queue.Empty:
            if not proc.is_alive():
                return f"the process exited with code {proc.exitcode} without a reply"
    return f"no reply within {timeout:.0f} s"


def _load_child(system: str, endpoints: tuple[str, ...], config: Config, results) -> None:
    try:
        loader = _load_raftkv if system == "raftkv" else _load_etcd
        results.put(asyncio.run(loader(endpoints, config)))
    except BaseException:
        results.put(traceback.format_exc())


def _pairs(keys: Iterable[bytes], rng: random.Random) -> list[tuple[bytes, bytes]]:
    return [(k, rng.randbytes(VALUE_BYTES)) for k in keys]


async def _in_flight(calls: list[Callable], limit: int) -> float:
    gate = asyncio.Semaphore(limit)

    async def one(call):
        async with gate:
            await call()

    started_at = time.perf_counter()
    await asyncio.gather(*(one(call) for call in calls))
    return time.perf_counter() - started_at


async def _load_raftkv(endpoints: tuple[str, ...], config: Config) -> float:
    """put_many per partition: keys grouped by partition_for_key, `chunk` keys a call."""
    rng = random.Random(0)
    async with raftkv.AsyncClient(list(endpoints), timeout=60.0) as kv:
        partitions = await kv.partitions()
        by_partition: dict[int, list[bytes]] = defaultdict(list)
        for i in range(config.keys):
            by_partition[partition_for_key(key(i), partitions)].append(key(i))
        chunks = [_pairs(keys[i:i + config.chunk], rng) for keys in by_partition.values()
                  for i in range(0, len(keys), config.chunk)]

        def call(pairs):
            return lambda: kv.put_many([k for k, _ in pairs], [v for _, v in pairs])

        return await _in_flight([call(pairs) for pairs in chunks], config.load_in_flight)


async def _load_etcd(endpoints: tuple[str, ...], config: Config) -> float:
    """One txn (no compares) of `chunk` puts per call, round-robin over the members (etcd3aio's default)."""
    from etcd3aio import Etcd3Client

    rng = random.Random(0)
    keys = [key(i) for i in range(config.keys)]
    chunks = [_pairs(keys[i:i + config.chunk], rng) for i in range(0, len(keys), config.chunk)]
    async with Etcd3Client(list(endpoints)) as client:
        kv = client.kv

        def call(pairs):
            return lambda: kv.txn([], [kv.txn_op_put(k, v) for k, v in pairs], timeout=60.0)

        return await _in_flight([call(pairs) for pairs in chunks], config.load_in_flight)


# -- catch-up -------------------------------------------------------------------------


@dataclass(frozen=True)
class CatchUp:
    system: str
    keys: int
    load_s: float  # writing the keys
    target_index: int  # raftkv: the leaders' commit indexes, summed over partitions; etcd: raftIndex
    serving_s: float  # start -> the learner first answered the progress query
    caught_up_s: float  # start -> caught up (nan: not within config.timeout)
    keys_on_learner: int  # counted afterwards, untimed
    from_snapshot: bool  # the learner got a snapshot rather than (only) log entries
    cores: Cores


def poll_catch_up(progress: Callable[[], bool | None], started_at: float, proc: subprocess.Popen,
                  config: Config, log: Path) -> tuple[float, float]:
    """(serving_s, caught_up_s): `progress()` is None while the learner does not answer, False while behind."""
    serving = math.nan
    while True:
        tick = time.monotonic()
        if proc.poll() is not None:
            raise RuntimeError(f"the learner exited with code {proc.returncode}; see {log}")
        if tick - started_at > config.timeout:
            return serving, math.nan
        done = progress()
        now = time.monotonic()
        if done is not None and math.isnan(serving):
            serving = now - started_at
        if done:
            return serving, now - started_at
        time.sleep(max(0.0, config.poll - (time.monotonic() - tick)))


def leader_commit_indexes(endpoints: Sequence[str]) -> dict[int, int]:
    with raftkv.Client(endpoints, timeout=5.0) as client:
        return {ps.partition: ps.commit_index for status in client.status() for ps in status.partitions
                if ps.role == "leader"}


def add_learner(spec_path: Path, name: str, changelog_dir: Path) -> None:
    subprocess.run([sys.executable, "-m", "raftkv", "learner", "add", "--name", name, "--sink", "changelog",
                    "--sink-option", f"path={changelog_dir}", "--config", str(spec_path)],
                   check=True, capture_output=True, timeout=60)


def learner_command(spec_path: Path, name: str, api_port: int) -> list[str]:
    return [sys.executable, "-m", "raftkv", "learner", "start", "--name", name, "--api-port", str(api_port),
            "--config", str(spec_path)]


def changelog_latest(stub: kv_pb2_grpc.ChangeLogStub) -> dict[int, int] | None:
    try:
        return {o.partition: o.latest for o in stub.Offsets(pb.OffsetsRequest(), timeout=1.0).partitions}
    except grpc.RpcError:
        return None


def count_changes(address: str, prefix: bytes) -> int:
    """Events in the learner's changelog whose key starts with `prefix` (each loaded key once)."""
    with ChangeLogClient(address, timeout=60) as log:
        return sum(change.key.startswith(prefix)
                   for offsets in log.offsets()
                   for chunk in log.read(offsets.partition, offsets.earliest, offsets.latest)
                   for change in chunk.changes)


@dataclass(frozen=True)
class RunningLearner:
    catch_up: CatchUp
    address: str  # its API (ChangeLog service)
    pid: int


@contextmanager
def raftkv_learner_caught_up(cluster: Running, cluster_dir: Path, config: Config,
                             console: Console) -> Iterator[RunningLearner]:
    """Load the keys, add the learner, time its start until caught up; it runs until the block ends."""
    load_s = load("raftkv", cluster.endpoints, config)
    spec_path = raftkv_spec_path(cluster_dir)
    add_learner(spec_path, LEARNER, cluster_dir / "changelog")
    target = leader_commit_indexes(cluster.endpoints)
    port = free_port_block(1)
    address, log = f"127.0.0.1:{port}", cluster_dir / "learner.log"
    meter = Meter(cluster.pids)
    started_at = time.monotonic()
    with started(learner_command(spec_path, LEARNER, port), log) as proc:
        meter.add_learner(proc.pid)
        with grpc.insecure_channel(address, options=FAST_RECONNECT) as channel:
            stub = kv_pb2_grpc.ChangeLogStub(channel)

            def progress() -> bool | None:
                latest = changelog_latest(stub)
                return None if latest is None else all(latest.get(p, 0) >= i for p, i in target.items())

            serving_s, caught_up_s = poll_catch_up(progress, started_at, proc, config, log)
        cores = meter.read()
        catch_up = CatchUp("raftkv", config.keys, load_s, sum(target.values()), serving_s, caught_up_s,
                           count_changes(address, b"bench/"),
                           "re-synced from a snapshot" in log.read_text(errors="replace"), cores)
        _progress(console, catch_up)
        yield RunningLearner(catch_up, address, proc.pid)


def etcd_catch_up(binary: str, data_dir: Path, config: Config, console: Console) -> CatchUp:
    rpc, stubs = etcd_rpc()
    with etcd_cluster(binary, data_dir) as etcd:
        load_s = load("etcd", etcd.endpoints, config)
        base = free_port_block(2)
        client_url, peer_url = f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"
        added = _etcd_add_learner(stubs, rpc, etcd.endpoints[0], peer_url)
        initial = ",".join(f"{m.name or ETCD_LEARNER}={m.peerURLs[0]}" for m in added.members)
        target = max(_etcd_status(stubs, rpc, endpoint).raftIndex for endpoint in etcd.endpoints)
        member_dir = data_dir / ETCD_LEARNER
        log = member_dir / "etcd.log"
        command = etcd_join_command(binary, ETCD_LEARNER, member_dir / "data", client_url, peer_url, initial)
        meter = Meter(etcd.pids)
        started_at = time.monotonic()
        with started(command, log) as proc:
            meter.add_learner(proc.pid)
            with grpc.insecure_channel(client_url.removeprefix("http://"), options=FAST_RECONNECT) as channel:
                maintenance = stubs.MaintenanceStub(channel)

                def progress() -> bool | None:
                    try:
                        status = maintenance.Status(rpc.StatusRequest(), timeout=1.0)
                    except grpc.RpcError:
                        return None
                    return status.raftAppliedIndex >= target

                serving_s, caught_up_s = poll_catch_up(progress, started_at, proc, config, log)
                cores = meter.read()
                count = stubs.KVStub(channel).Range(
                    rpc.RangeRequest(key=b"bench/", range_end=b"bench0", count_only=True, serializable=True),
                    timeout=30).count
    snapshot = "applied incoming snapshot" in log.read_text(errors="replace")
    result = CatchUp("etcd", config.keys, load_s, target, serving_s, caught_up_s, count, snapshot, cores)
    _progress(console, result)
    return result


def _etcd_add_learner(stubs, rpc, endpoint: str, peer_url: str, timeout: float = 30.0):
    """Cluster.MemberAdd(isLearner=true), retried while etcd answers "unhealthy cluster".

    etcd refuses membership changes (--strict-reconfig-check, on by default) until every voter has
    been connected to the others for 5 s, which a cluster started and loaded quickly may not be yet.
    """
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(endpoint) as channel:
        while True:
            try:
                return stubs.ClusterStub(channel).MemberAdd(
                    rpc.MemberAddRequest(peerURLs=[peer_url], isLearner=True), timeout=10)
            except grpc.RpcError as exc:
                if "unhealthy cluster" not in (exc.details() or "") or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def _etcd_status(stubs, rpc, endpoint: str):
    with grpc.insecure_channel(endpoint) as channel:
        return stubs.MaintenanceStub(channel).Status(rpc.StatusRequest(), timeout=5)


def _cores_text(cores: Cores) -> str:
    return (f"voters {cores.servers:.2f}, learner {cores.learner:.2f}, bench {cores.bench:.2f}, "
            f"other {cores.other:.2f}")


def _progress(console: Console, c: CatchUp) -> None:
    console.print(
        f"[dim]catch-up {c.system:>6}: load {c.keys / c.load_s:,.0f} keys/s; learner answers after "
        f"{c.serving_s:.2f} s, caught up after {c.caught_up_s:.2f} s (index {c.target_index:,}, "
        f"{c.keys_on_learner:,} keys on the learner{', via a snapshot' if c.from_snapshot else ''}); cores: "
        f"{_cores_text(c.cores)}[/dim]"
    )


# -- change-feed lag ------------------------------------------------------------------


@dataclass(frozen=True)
class Writes:
    """The paced writer's measured window (puts whose send time falls in it)."""

    sent: int
    acked: int
    skipped: int  # sends left out because MAX_PENDING puts were outstanding
    errors: int
    first_error: str
    put_p50_ms: float
    put_p99_ms: float
    cpu_seconds: float  # the writer process, over its whole run


@dataclass(frozen=True)
class Lag:
    rate: int  # target writes/s
    achieved: float  # acknowledged writes/s in the window
    events: int  # window events the reader got
    missing: int  # acknowledged window writes the reader never got
    p50_ms: float
    p99_ms: float
    max_ms: float
    put_p50_ms: float
    put_p99_ms: float
    skipped: int
    errors: int
    first_error: str
    cores: Cores


def _writer_child(endpoints, rate, warmup, duration, prefix, inbox, results) -> None:
    try:
        results.put(asyncio.run(_paced_puts(endpoints, rate, warmup, duration, prefix, inbox, results)))
    except BaseException:
        results.put(traceback.format_exc())


async def _paced_puts(endpoints, rate: int, warmup: float, duration: float, prefix: bytes, inbox, results) -> Writes:
    """Send `rate` puts a second from `start_at` (from the inbox), each on its own, many in flight."""
    pad = b"x" * (VALUE_BYTES - 20)
    latencies = array("d")
    counts = {"sent": 0, "acked": 0, "skipped": 0, "errors": 0}
    first_error = ""
    async with raftkv.AsyncClient(list(endpoints), timeout=REQUEST_TIMEOUT) as kv:
        await kv.partitions()
        results.put("ready")
        start_at = await asyncio.to_thread(inbox.get, True, 60)
        w0 = int((start_at + warmup) * 1e9)
        w1 = w0 + int(duration * 1e9)

        async def put(i: int) -> None:
            nonlocal first_error
            sent = time.time_ns()
            measured = w0 <= sent < w1
            counts["sent"] += measured
            try:
                await kv.put(prefix + b"%011d" % i, b"%020d" % sent + pad)
            except Exception as exc:  # counted and reported: a benchmark reports what it saw
                counts["errors"] += 1
                first_error = first_error or f"{type(exc).__name__}: {exc}"
                return
            if measured:
                counts["acked"] += 1
                latencies.append((time.time_ns() - sent) / 1e6)

        begin = time.monotonic() + (start_at - time.time())
        end = begin + warmup + duration
        await asyncio.sleep(max(0.0, begin - time.monotonic()))
        cpu0, outstanding, issued = time.process_time(), set(), 0
        while (now := time.monotonic()) < end:
            while issued < int((now - begin) * rate):
                issued += 1
                if len(outstanding) >= MAX_PENDING:
                    counts["skipped"] += w0 <= time.time_ns() < w1
                    continue
                task = asyncio.create_task(put(issued))
                outstanding.add(task)
                task.add_done_callback(outstanding.discard)
            await asyncio.sleep(0.001)
        if outstanding:
            await asyncio.wait(outstanding, timeout=REQUEST_TIMEOUT + 5)
        cpu = time.process_time() - cpu0
    ordered = sorted(latencies)
    return Writes(counts["sent"], counts["acked"], counts["skipped"], counts["errors"], first_error,
                  percentile(ordered, 0.5), percentile(ordered, 0.99), cpu)


class FeedReader(threading.Thread):
    """Follows the changelog (`ChangeLog.Follow`: pushed after each synced flush of the learner's sink).

    Keeps, for events whose key starts with `prefix` and whose send time is in
    `window` (ns), the time it got them minus that send time.
    """

    def __init__(self, address: str, prefix: bytes):
        super().__init__(name="feed-reader", daemon=True)
        self._log = ChangeLogClient(address)
        self._prefix = prefix
        self.window = (0, 0)
        self.lags_ns = array("q")
        self.errors, self.first_error = 0, ""

    def stop(self) -> None:
        self._log.close()  # ends the Follow call
        if self.is_alive():
            self.join(10)

    def run(self) -> None:
        try:
            for chunk in self._log.follow():
                got = time.time_ns()
                w0, w1 = self.window
                for change in chunk.changes:
                    if change.key.startswith(self._prefix) and change.HasField("after"):
                        sent = int(change.after[:20])
                        if w0 <= sent < w1:
                            self.lags_ns.append(got - sent)
        except Unavailable as exc:
            self.errors += 1
            self.first_error = str(exc)


def feed_lag(cluster: Running, learner_pid: int, address: str, rate: int, run: int, config: Config,
             console: Console) -> Lag:
    """One paced run at `rate` writes/s; keys `lag<run>/` + 11 digits (16 bytes), each written once."""
    prefix = b"lag%d/" % run
    ctx = multiprocessing.get_context("spawn")
    inbox, results = ctx.Queue(), ctx.Queue()
    writer = ctx.Process(target=_writer_child, daemon=True,
                         args=(tuple(cluster.endpoints), rate, config.warmup, config.duration, prefix, inbox, results))
    reader = FeedReader(address, prefix)
    try:
        writer.start()
        if (ready := _reply(writer, results, 60)) != "ready":
            raise RuntimeError(f"the paced writer failed to start:\n{ready}")
        start_at = time.time() + 0.2
        w0 = start_at + config.warmup
        reader.window = (int(w0 * 1e9), int((w0 + config.duration) * 1e9))
        reader.start()
        inbox.put(start_at)
        time.sleep(max(0.0, w0 - time.time()))
        meter = Meter(cluster.pids, learner_pid)
        time.sleep(max(0.0, w0 + config.duration - time.time()))
        cores = meter.read()
        writes = _reply(writer, results, REQUEST_TIMEOUT + 30)
        if isinstance(writes, str):
            raise RuntimeError(f"the paced writer failed:\n{writes}")
        writer_cores = writes.cpu_seconds / (config.warmup + config.duration)  # its average over the run
        cores = replace(cores, bench=cores.bench + writer_cores, other=max(0.0, cores.other - writer_cores))
        deadline = time.monotonic() + 10.0  # let the feed deliver what was acknowledged
        while len(reader.lags_ns) < writes.acked and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        reader.stop()
        if writer.is_alive():
            writer.terminate()
        writer.join()
    lags = sorted(x / 1e6 for x in reader.lags_ns)
    result = Lag(rate, writes.acked / config.duration, len(lags), max(0, writes.acked - len(lags)),
                 percentile(lags, 0.5), percentile(lags, 0.99), lags[-1] if lags else math.nan,
                 writes.put_p50_ms, writes.put_p99_ms, writes.skipped, writes.errors + reader.errors,
                 writes.first_error or reader.first_error, cores)
    console.print(
        f"[dim]feed lag {rate:>6,} writes/s: achieved {result.achieved:,.0f}/s, lag p50 {result.p50_ms:.1f} "
        f"p99 {result.p99_ms:.1f} max {result.max_ms:.1f} ms over {result.events:,} events "
        f"({result.missing} missing, {result.skipped} skipped, {result.errors} errors); put ack p50 "
        f"{result.put_p50_ms:.1f} p99 {result.put_p99_ms:.1f} ms; cores: {_cores_text(cores)}[/dim]"
    )
    return result


def measure_raftkv(config: Config, data_dir: Path, console: Console) -> tuple[CatchUp, list[Lag]]:
    """The raftkv side: catch-up, then the lag runs on the same cluster and learner."""
    with raftkv_cluster(data_dir, config.partitions) as cluster:
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


def table(raftkv_up: CatchUp, etcd_up: CatchUp | None, lags: list[Lag], config: Config, loads: str) -> Table:
    t = comparison_table(
        title=f"Learner catch-up over {config.keys:,} keys (raftkv vs etcd 3.4, 3 voters each on loopback, "
        f"{config.partitions} raftkv partitions) and raftkv's change-feed lag",
        caption=f"* = other processes on the machine used more than {NOISY_CORES} cores during that measurement. "
        f"Load average (1/5/15 min): {loads}. The lag rows are raftkv only: the etcd side has no change feed here.",
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
    for lag in lags:
        label = f"feed at {lag.rate:,} writes/s:"
        problems = []
        if lag.missing:
            problems.append(f"{lag.missing} missing")
        if lag.errors:
            problems.append(f"{lag.errors} errors")
        if lag.skipped:
            problems.append(f"{lag.skipped} skipped")
        note = f" [red]({', '.join(problems)})[/red]" if problems else ""
        t.add_row(f"{label} achieved writes/s", _num(lag.achieved, 0, lag.cores.noisy) + note, "", "", "")
        t.add_row(f"{label} lag p50 (ms)", _num(lag.p50_ms, 1, lag.cores.noisy), "", "", "")
        lag_target = ""
        if lag.rate == LAG_TARGET_RATE:
            reached = lag.achieved >= 0.95 * lag.rate
            met = reached and not lag.missing and lag.p99_ms <= LAG_TARGET_MS
            lag_target = f"≤ {LAG_TARGET_MS:.0f} ms {verdict(met)}" + ("" if reached else " (rate not reached)")
        t.add_row(f"{label} lag p99 (ms)", _num(lag.p99_ms, 1, lag.cores.noisy), "", "", lag_target)
        t.add_row(f"{label} put ack p50 / p99 (ms)", f"{lag.put_p50_ms:,.1f} / {lag.put_p99_ms:,.1f}  ", "", "", "")
        t.add_row(f"{label} cores: voters / learner / other", _cores_cell(lag.cores), "", "", "")
    return t


# -- main -----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer keys and short windows: about 1 minute")
    for field in fields(Config):
        p.add_argument("--" + field.name.replace("_", "-"), type=type(field.default), default=None,
                       help=f"default {field.default}, --quick {getattr(QUICK, field.name)}")
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
    etcd_up = None
    try:
        etcd_binary = None if args.raftkv_only else ensure_etcd()
        ensure_etcd3aio()
        host = machine(data_dir)
        vers = versions(etcd_version(etcd_binary) if etcd_binary else "skipped", ETCD_CLIENT)
        header(console, host, vers, config, data_dir)
        if etcd_binary:
            etcd_up = etcd_catch_up(etcd_binary, data_dir / "etcd", config, console)
        raftkv_up, lags = measure_raftkv(config, data_dir / "raftkv", console)
    except KeyboardInterrupt:
        console.print("[red]interrupted; every started process has been stopped[/red]")
        return 130
    finally:
        if args.data_dir is None and not args.keep_data:
            shutil.rmtree(data_dir, ignore_errors=True)
    loads = f"{host['load_average']} before, {_load_average()} after"
    console.print(table(raftkv_up, etcd_up, lags, config, loads))
    elapsed = time.monotonic() - started_at
    console.print(f"Total time {elapsed:.0f} s.")
    if args.json_out:
        report = {"machine": host, "versions": vers, "config": asdict(config), "elapsed_s": elapsed,
                  "load_average_after": _load_average(), "catch_up": {"raftkv": asdict(raftkv_up),
                                                                      "etcd": asdict(etcd_up) if etcd_up else None},
                  "feed_lag": [asdict(lag) for lag in lags]}
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
