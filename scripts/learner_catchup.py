"""bench_learner.py, part 1: load a cluster, add a learner, time its catch-up (raftkv and etcd 3.4)."""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import queue
import random
import subprocess
import sys
import time
import traceback
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import grpc
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import NOISY_CORES  # noqa: E402
from bench_clusters import Running, etcd_cluster, etcd_join_command, etcd_rpc, raftkv_spec_path, started  # noqa: E402
from bench_load import VALUE_BYTES, cpu_seconds, key, machine_busy_seconds  # noqa: E402

import raftkv  # noqa: E402
from learners.changelog_client import ChangeLogClient  # noqa: E402
from raftkv.api import kv_pb2 as pb  # noqa: E402
from raftkv.api import kv_pb2_grpc  # noqa: E402
from raftkv.dev.local_cluster import free_port_block  # noqa: E402
from raftkv.core.partitioning import partition_for_key  # noqa: E402
from bench_learner_config import Config, ETCD_LEARNER, FAST_RECONNECT, LEARNER  # noqa: E402

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
