"""The load generator shared by raftkv and etcd: N processes x M in-flight requests.

`run_load(load)` spawns `load.processes` worker processes. Each opens one
client (a driver below), waits at a barrier with the others, then runs
`load.in_flight` asyncio streams that each issue one request, wait for its
reply, and issue the next. Requests completing in the warm-up are discarded;
the figures are the requests that complete inside the measured window of
`load.duration` seconds after it.

Keys are 16 bytes (`bench/` + 10 digits) drawn uniformly from a key space of
`load.keys` keys; values are 100 bytes. With `load.tls` (the CA and the client
certificate's files), the drivers connect with mutual TLS. A third driver, `execute`,
sends bare Execute calls to one server (scripts/bench_grpc_frontends.py times gRPC front ends with it).
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import random
import time
import traceback
from array import array
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Iterator, Sequence

import raftkv
from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.client.channels import CHANNEL_OPTIONS
from raftkv.core.commands import Put
from raftkv.security.tls import open_channel

VALUE_BYTES = 100
START_TIMEOUT = 60.0
REQUEST_TIMEOUT = 10.0
FILL_CHUNK = 100  # below etcd's default --max-txn-ops (128)


def key(i: int) -> bytes:
    return b"bench/%010d" % i


@dataclass(frozen=True)
class Load:
    system: str  # "raftkv", "etcd" or "execute" (see DRIVERS)
    endpoints: tuple[str, ...]
    op: str  # "put", "get" or "batch"
    consistency: str = "linearizable"  # raftkv: linearizable/leader/follower; etcd: linearizable/serializable
    processes: int = 1
    in_flight: int = 1
    duration: float = 5.0
    warmup: float = 1.0
    batch: int = 10  # puts per batch (op == "batch")
    keys: int = 10_000
    tls: raftkv.Tls | None = None  # the cluster's CA and this client's certificate; None: plaintext


@dataclass
class Sample:
    """One worker's measured window."""

    latencies: array = field(default_factory=lambda: array("d"))
    errors: int = 0
    first_error: str = ""
    cpu: float = 0.0  # cores this worker process used

    def error(self, exc: BaseException) -> None:
        self.errors += 1
        self.first_error = self.first_error or f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Figures:
    ops: int  # requests completed in the window (a batch counts once)
    ops_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    first_error: str
    client_cpu: float  # cores used by the load processes
    server_cpu: float  # cores used by the cluster's processes
    other_cpu: float  # cores used by everything else on the machine meanwhile (noise)


# -- drivers: one client per worker process -----------------------------------------


class RaftkvDriver:
    """raftkv through `raftkv.AsyncClient` on the worker's own event loop (like EtcdDriver's etcd3aio).

    Each request in flight is one coroutine; concurrent ones bound for the
    same node are coalesced by the client into one Execute call.
    """

    def __init__(self, endpoints: Sequence[str], consistency: str, keys: int, tls: raftkv.Tls | None):
        self._endpoints = list(endpoints)
        self._consistency = consistency
        self._keys = keys
        self._tls = tls
        self._kv: raftkv.AsyncClient | None = None
        self._groups: list[list[bytes]] = []

    def run(self, main: Callable[[RaftkvDriver], Awaitable]):
        return asyncio.run(self._session(main))

    async def _session(self, main):
        async with raftkv.AsyncClient(self._endpoints, consistency=self._consistency,
                                      timeout=REQUEST_TIMEOUT, tls=self._tls) as kv:
            self._kv = kv
            by_partition: dict[int, list[bytes]] = defaultdict(list)
            for i in range(self._keys):
                by_partition[await kv.partition_of(key(i))].append(key(i))
            self._groups = list(by_partition.values())  # the key space, one list per partition
            return await main(self)

    def close(self) -> None:
        pass

    async def put(self, k: bytes, value: bytes) -> None:
        await self._kv.put(k, value)

    async def get(self, k: bytes) -> None:
        await self._kv.get(k)

    async def batch(self, pairs: list[tuple[bytes, bytes]]) -> None:
        """One atomic batch; every key must be in one partition (see `batch_keys`)."""
        await self._kv.batch(Put(k, v) for k, v in pairs)

    def batch_keys(self, rng: random.Random, count: int) -> list[bytes]:
        return rng.sample(rng.choice(self._groups), count)

    async def fill(self, value: bytes) -> None:
        chunks = [keys[i : i + FILL_CHUNK] for keys in self._groups for i in range(0, len(keys), FILL_CHUNK)]
        await asyncio.gather(*(self.batch([(k, value) for k in chunk]) for chunk in chunks))


class EtcdDriver:
    """etcd through etcd3aio (grpc.aio), round-robin over the members as etcd3aio does by default."""

    def __init__(self, endpoints: Sequence[str], consistency: str, keys: int, tls: raftkv.Tls | None):
        if consistency not in ("linearizable", "serializable"):
            raise ValueError(f"etcd reads are linearizable or serializable, not {consistency!r}")
        self._endpoints = list(endpoints)
        self._serializable = consistency == "serializable"
        self._keys = [key(i) for i in range(keys)]
        self._tls = tls
        self._kv = None

    def run(self, main: Callable[[EtcdDriver], Awaitable]):
        return asyncio.run(self._session(main))

    async def _session(self, main):
        from etcd3aio import Etcd3Client

        async with Etcd3Client(self._endpoints, **self._tls_args()) as client:
            self._kv = client.kv
            return await main(self)

    def _tls_args(self) -> dict:
        """etcd3aio's TLS arguments. One channel balances over every member, so the name checked in their
        certificates is given: the host they share (their SAN)."""
        if self._tls is None:
            return {}
        host = self._endpoints[0].rsplit(":", 1)[0]
        return {"ca_cert": self._tls.ca.read_bytes(), "cert_chain": self._tls.cert.read_bytes(),
                "cert_key": self._tls.key.read_bytes(), "tls_server_name": host}

    def close(self) -> None:
        pass

    async def put(self, k: bytes, value: bytes) -> None:
        await self._kv.put(k, value, timeout=REQUEST_TIMEOUT)

    async def get(self, k: bytes) -> None:
        await self._kv.get(k, serializable=self._serializable, timeout=REQUEST_TIMEOUT)

    async def batch(self, pairs: list[tuple[bytes, bytes]]) -> None:
        """One txn with no compares whose success branch holds the puts."""
        await self._kv.txn([], [self._kv.txn_op_put(k, v) for k, v in pairs], timeout=REQUEST_TIMEOUT)

    def batch_keys(self, rng: random.Random, count: int) -> list[bytes]:
        return rng.sample(self._keys, count)

    async def fill(self, value: bytes) -> None:
        chunks = [self._keys[i : i + FILL_CHUNK] for i in range(0, len(self._keys), FILL_CHUNK)]
        await asyncio.gather(*(self.batch([(k, value) for k in chunk]) for chunk in chunks))


class ExecuteDriver:
    """One raftkv Execute call per get, through a bare grpc.aio KV stub on the first endpoint.

    No `raftkv.AsyncClient`: no coalescing, routing or retries, so each request in flight is one
    gRPC call. Every op names partition 0, which only a server that answers any Execute accepts
    (scripts/bench_grpc_frontends.py); gets only. A reply without exactly one result is an error.
    """

    def __init__(self, endpoints: Sequence[str], consistency: str, keys: int, tls: raftkv.Tls | None):
        self._address = endpoints[0]
        self._consistency = pb.Consistency.Value(consistency.upper())
        self._tls = tls
        self._execute = None

    def run(self, main: Callable[[ExecuteDriver], Awaitable]):
        return asyncio.run(self._session(main))

    async def _session(self, main):
        async with open_channel(self._address, self._tls, CHANNEL_OPTIONS) as channel:
            self._execute = kv_pb2_grpc.KVStub(channel).Execute
            return await main(self)

    def close(self) -> None:
        pass

    async def get(self, k: bytes) -> None:
        request = pb.ExecuteRequest(ops=[pb.Op(get=pb.Get(key=k))], consistency=self._consistency)
        reply = await self._execute(request, timeout=REQUEST_TIMEOUT)
        if len(reply.results) != 1:
            raise RuntimeError(f"{len(reply.results)} results for one op")


DRIVERS = {"raftkv": RaftkvDriver, "etcd": EtcdDriver, "execute": ExecuteDriver}


@contextmanager
def open_driver(load: Load, worker: int = 0) -> Iterator[RaftkvDriver | EtcdDriver | ExecuteDriver]:
    """A client whose endpoint list starts at member `worker` (mod 3), so that workers spread over the members.

    That matters for raftkv follower reads, which the client sends to its first endpoint.
    """
    first = worker % len(load.endpoints)
    endpoints = load.endpoints[first:] + load.endpoints[:first]
    driver = DRIVERS[load.system](endpoints, load.consistency, load.keys, load.tls)
    try:
        yield driver
    finally:
        driver.close()


def fill(system: str, endpoints: Sequence[str], keys: int, tls: raftkv.Tls | None = None) -> None:
    """Write every key of the key space once, so that reads find values.

    In a child process, like the loads: this process never runs an asyncio gRPC client.
    """
    load = Load(system, tuple(endpoints), "put", keys=keys, tls=tls)
    proc = multiprocessing.get_context("spawn").Process(target=_fill, args=(load,))
    try:
        proc.start()
        proc.join()
    finally:
        if proc.is_alive():
            proc.terminate()
            proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"filling the {system} key space failed (exit code {proc.exitcode}; traceback above)")


def _fill(load: Load) -> None:
    with open_driver(load) as driver:
        driver.run(lambda d: d.fill(random.Random(0).randbytes(VALUE_BYTES)))


# -- one worker process -------------------------------------------------------------


def _operation(driver, load: Load, rng: random.Random, value: bytes) -> Callable[[], Awaitable]:
    if load.op == "put":
        return lambda: driver.put(key(rng.randrange(load.keys)), value)
    if load.op == "get":
        return lambda: driver.get(key(rng.randrange(load.keys)))
    if load.op == "batch":
        return lambda: driver.batch([(k, value) for k in driver.batch_keys(rng, load.batch)])
    raise ValueError(f"unknown op {load.op!r}")


async def _drive(driver, load: Load, seed: int) -> Sample:
    rng = random.Random(seed)
    operation = _operation(driver, load, rng, rng.randbytes(VALUE_BYTES))
    sample = Sample()
    wall0, cpu0 = time.monotonic(), time.process_time()
    t0 = wall0 + load.warmup
    t1 = t0 + load.duration

    async def stream() -> None:
        while (start := time.monotonic()) < t1:
            try:
                await operation()
            except Exception as exc:  # counted and reported, never fatal: a benchmark reports what it saw
                sample.error(exc)
                continue
            end = time.monotonic()
            if t0 <= end < t1:
                sample.latencies.append(end - start)

    await asyncio.gather(*(stream() for _ in range(load.in_flight)))
    sample.cpu = (time.process_time() - cpu0) / (time.monotonic() - wall0)
    return sample


def _worker(load: Load, seed: int, barrier, results) -> None:
    try:
        with open_driver(load, worker=seed) as driver:
            barrier.wait(START_TIMEOUT)
            results.put(driver.run(lambda d: _drive(d, load, seed)))
    except BaseException:
        barrier.abort()
        results.put(traceback.format_exc())


# -- the parent ---------------------------------------------------------------------


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds of the given live processes."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent not idle (and not waiting for I/O) since boot."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run_load(load: Load, server_pids: Sequence[int] = ()) -> Figures:
    """Run one load and return its figures; `server_pids` are the cluster's processes (for CPU use)."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(load.processes + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(load, i, barrier, results), daemon=True) for i in range(load.processes)]
    try:
        for proc in procs:
            proc.start()
        try:
            barrier.wait(START_TIMEOUT)
        except Exception:
            raise RuntimeError(f"a {load.system} load worker failed to start:\n{results.get(timeout=5)}") from None
        wall0, server0, busy0 = time.monotonic(), cpu_seconds(server_pids), machine_busy_seconds()
        samples = [_receive(results, load) for _ in procs]
        wall = time.monotonic() - wall0
        server_cpu = (cpu_seconds(server_pids) - server0) / wall
        busy = (machine_busy_seconds() - busy0) / wall
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join()
    return _figures(samples, load.duration, server_cpu, busy)


def _receive(results, load: Load) -> Sample:
    reply = results.get(timeout=START_TIMEOUT + load.warmup + load.duration + REQUEST_TIMEOUT)
    if isinstance(reply, str):
        raise RuntimeError(f"a {load.system} load worker failed:\n{reply}")
    return reply


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (nan when empty)."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else math.nan


def _figures(samples: list[Sample], duration: float, server_cpu: float, busy: float) -> Figures:
    latencies = sorted(x for s in samples for x in s.latencies)
    client_cpu = sum(s.cpu for s in samples)
    return Figures(
        ops=len(latencies),
        ops_per_s=len(latencies) / duration,
        p50_ms=percentile(latencies, 0.50) * 1e3,
        p99_ms=percentile(latencies, 0.99) * 1e3,
        errors=sum(s.errors for s in samples),
        first_error=next((s.first_error for s in samples if s.first_error), ""),
        client_cpu=client_cpu,
        server_cpu=server_cpu,
        other_cpu=max(0.0, busy - server_cpu - client_cpu),
    )
