"""The chaos workloads: clients sending requests one at a time and recording each as an `Op`.

- register: reads (at the configured consistency), writes of unique ints (a
  global counter) and compare-and-set on a few keys at a time; every third
  register client only reads, so some clients keep asking the leader they
  know while others have moved on to a new one. A key is
  retired after `ops_per_key` ops or `infos_per_key` maybe-applied writes,
  and a fresh key takes its place: the linearizability search is
  exponential in concurrent info ops, so every key's history stays small.
- set: adds of unique ints to one set (a key per element, under `SET_PREFIX`);
  the runner reads the whole set back after healing (`read_all`).
- bank: reads of a bank's accounts and transfers between them in guarded
  batches (raftkv/chaos/bank.py); the runner reads each bank's final contents.

Every client runs as an asyncio task with an `AsyncClient` of its own, so
requests really are independent. An op whose outcome is unknown is recorded
as "info", and its client is retired like a crashed process: its request may
still be in flight, so the next request goes out under a new client id, on a
new connection (which also re-learns the leaders).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Sequence

from raftkv.chaos.bank import banks
from raftkv.client.async_client import AsyncClient
from raftkv.chaos.history import Op, load_history, op_line
from raftkv.core.errors import InvalidRequest, NotLeader, RaftKVError, StorageFull, Unavailable

SET_NAME = "set"
SET_PREFIX = b"s/"
REGISTER_MIX = (("read", 0.5), ("write", 0.3), ("cas", 0.2))
READER_MIX = (("read", 1.0),)  # every third register client only reads: it stays with the leader it knows


@dataclass(frozen=True)
class WorkloadConfig:
    endpoints: tuple[str, ...]
    clients: int = 8
    set_clients: int = 2  # of `clients`
    bank_clients: int = 0  # of `clients`; the rest run the register workload
    partitions: int = 1  # the cluster's: where the banks' keys go
    register_keys: int = 4  # keys in use at a time
    ops_per_key: int = 200
    infos_per_key: int = 3  # maybe-applied writes before a key is retired
    read_consistency: str = "linearizable"
    timeout: float = 3.0  # each client's request deadline
    seed: int = 0


def outcome(error: BaseException | None) -> str:
    """An op's status from what its request raised: only errors that mean "nothing was written" fail it."""
    if error is None:
        return "ok"
    if isinstance(error, (Unavailable, NotLeader, InvalidRequest, StorageFull)):
        return "fail"
    return "info"  # Undetermined, Timeout, a lost connection, anything unexpected


def set_key(element: int) -> bytes:
    return SET_PREFIX + b"%012d" % element


def _int(value: bytes | None) -> int | None:
    return None if value is None else int(value)


class History:
    """Every op recorded so far (thread-safe), with counts for a live display. With `spill`, the ops go
    to that file as they come instead of memory (~300 bytes an op: an hour's run would grow the harness
    by hundreds of MiB), and `ops()` reads them back."""

    def __init__(self, spill: Path | None = None):
        self._lock = threading.Lock()
        self._ops: list[Op] = []
        self._spill = open(spill, "w", encoding="utf-8") if spill is not None else None
        self._counts: Counter[tuple[str, str]] = Counter()  # (f, status) -> ops
        self._errors: Counter[str] = Counter()  # error class -> requests that raised it

    def add(self, op: Op, error: BaseException | None = None) -> None:
        with self._lock:
            if self._spill is not None:
                self._spill.write(op_line(op))
            else:
                self._ops.append(op)
            self._counts[op.f, op.status] += 1
            if error is not None:
                self._errors[type(error).__name__] += 1

    @property
    def counts(self) -> Counter[tuple[str, str]]:
        """Ops so far by (f, status)."""
        with self._lock:
            return self._counts.copy()

    @property
    def errors(self) -> Counter[str]:
        """Requests so far that raised, by error class."""
        with self._lock:
            return self._errors.copy()

    def ops(self) -> list[Op]:
        with self._lock:
            if self._spill is None:
                return list(self._ops)
            self._spill.flush()
            return load_history(self._spill.name)

    def close(self) -> None:
        if self._spill is not None:
            self._spill.close()

    def __len__(self) -> int:
        return sum(self._counts.values())


class RegisterKeys:
    """The register keys in use, each replaced by a fresh one once it has had its share of ops."""

    def __init__(self, slots: int, ops_per_key: int, infos_per_key: int):
        self._generation = itertools.count()
        self._keys = [self._fresh(slot) for slot in range(slots)]
        self._ops: Counter[str] = Counter()
        self._infos: Counter[str] = Counter()
        self._ops_per_key = ops_per_key
        self._infos_per_key = infos_per_key

    def _fresh(self, slot: int) -> str:
        return f"r/{slot}/{next(self._generation)}"

    def pick(self, rng: random.Random) -> str:
        return rng.choice(self._keys)

    def record(self, key: str, op: Op) -> None:
        self._ops[key] += 1
        if op.status == "info" and op.f != "read":
            self._infos[key] += 1
        if self._ops[key] >= self._ops_per_key or self._infos[key] >= self._infos_per_key:
            if key in self._keys:
                slot = self._keys.index(key)
                self._keys[slot] = self._fresh(slot)


class Workload:
    """Runs the clients on an event loop thread of their own until `stop()`."""

    def __init__(self, config: WorkloadConfig, history: History,
                 endpoints: Callable[[], Sequence[str]] | None = None):
        """`endpoints()`: the cluster's API addresses now (nodes join and leave under membership faults);
        each new client starts from them. Default: `config.endpoints`."""
        self.config = config
        self.history = history
        self._endpoints = endpoints or (lambda: config.endpoints)
        self._counter = itertools.count(1)  # unique values for writes, cas and adds
        self._client_ids = itertools.count()
        self._keys = RegisterKeys(config.register_keys, config.ops_per_key, config.infos_per_key)
        self._banks = banks(config.partitions)
        self._latest: dict[str, int | None] = {}  # register key -> the latest value an acknowledged op showed
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-workload", daemon=True)
        self._error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No new requests; returns once the ones in flight have finished (each within its timeout).
        Raises what broke the workload, once; stopping again does nothing."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(self.config.timeout * 3 + 30)
            if self._thread.is_alive():
                raise RuntimeError("the workload did not stop")
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # re-raised by stop()
            self._error = exc

    async def _main(self) -> None:
        c = self.config
        register_clients = c.clients - c.set_clients - c.bank_clients
        if c.bank_clients:
            await self._open_banks()

        def op_maker(i: int) -> Callable[..., Awaitable[Recorded]]:
            if i >= register_clients + c.set_clients:
                return self._bank_op
            if i >= register_clients:
                return self._add_op
            mix = READER_MIX if i % 3 == 2 else REGISTER_MIX
            return lambda kv, client_id, rng: self._register_op(kv, client_id, rng, mix)

        await asyncio.gather(*(self._client_loop(random.Random(f"{c.seed}/{i}"), op_maker(i)) for i in range(c.clients)))

    async def _client_loop(self, rng: random.Random, next_op: Callable[..., Awaitable[Recorded]]) -> None:
        """One workload client: a request at a time; a new client (id and connection) after an info op."""
        while not self._stopping.is_set():
            client_id = next(self._client_ids)
            async with AsyncClient(list(self._endpoints()), timeout=self.config.timeout) as kv:
                while not self._stopping.is_set():
                    op, error = await next_op(kv, client_id, rng)
                    self.history.add(op, error)
                    if op.status == "info":
                        break
                    if op.status == "fail":
                        await asyncio.sleep(0.05)  # nothing to do until a leader is back

    async def _register_op(self, kv: AsyncClient, client_id: int, rng: random.Random,
                           mix: tuple[tuple[str, float], ...]) -> Recorded:
        key = self._keys.pick(rng)
        f = rng.choices([f for f, _ in mix], [w for _, w in mix])[0]
        if f == "read":
            recorded = await _timed(client_id, f, key, None, lambda: kv.read(key, self.config.read_consistency),
                                    lambda r: _int(r.value))
        elif f == "write":
            value = next(self._counter)
            recorded = await _timed(client_id, f, key, value, lambda: kv.put(key, b"%d" % value), lambda _: None)
        else:
            expected = self._expected(key, rng)
            new = next(self._counter)
            recorded = await _timed(client_id, f, key, (expected, new),
                                    lambda: kv.cas(key, None if expected is None else b"%d" % expected, b"%d" % new),
                                    lambda r: r.succeeded)
        self._keys.record(key, recorded[0])
        self._remember(recorded[0])
        return recorded

    def _expected(self, key: str, rng: random.Random) -> int | None:
        """What a cas expects: usually the latest value an acknowledged op saw or wrote, sometimes a miss."""
        if rng.random() < 0.8:
            return self._latest.get(key)
        return rng.choice([None, next(self._counter)])

    def _remember(self, op: Op) -> None:
        if op.status != "ok":
            return
        if op.f == "read":
            self._latest[op.key] = op.result
        elif op.f == "write" or (op.f == "cas" and op.result):
            self._latest[op.key] = op.value if op.f == "write" else op.value[1]

    async def _open_banks(self) -> None:
        """Every bank's accounts, before its clients start (a guarded batch: a retry opens nothing twice)."""
        async with AsyncClient(list(self._endpoints()), timeout=self.config.timeout) as kv:
            for bank in self._banks:
                while not self._stopping.is_set():
                    try:
                        await kv.guarded_batch(*bank.opening())
                        if None not in await bank.balances(kv):
                            break
                    except RaftKVError:
                        await asyncio.sleep(0.2)

    async def _bank_op(self, kv: AsyncClient, client_id: int, rng: random.Random) -> Recorded:
        """A read of a bank; half the time, a transfer the read allows follows it (recorded as its own op)."""
        bank = rng.choice(self._banks)
        read = await _timed(client_id, "bank_read", bank.name, None, lambda: bank.balances(kv), lambda r: r)
        op, _ = read
        planned = bank.transfer(op.result, next(self._counter), rng) if (
            op.status == "ok" and None not in op.result and rng.random() < 0.5) else None
        if planned is None:
            return read
        self.history.add(*read)
        value, guards, writes = planned
        return await _timed(client_id, "transfer", bank.name, value, lambda: kv.guarded_batch(guards, writes),
                            lambda applied: applied)

    async def _add_op(self, kv: AsyncClient, client_id: int, rng: random.Random) -> Recorded:
        element = next(self._counter)
        return await _timed(client_id, "add", SET_NAME, element, lambda: kv.put(set_key(element), b""),
                            lambda _: None)


Recorded = tuple[Op, BaseException | None]  # an op and the error its request raised, if any


async def _timed(client_id: int, f: str, key: str, value: object, request: Callable[[], Awaitable],
                 result_of: Callable[[object], object]) -> Recorded:
    invoke = time.monotonic_ns()
    try:
        answer = await request()
    except Exception as error:
        status = outcome(error)
        complete = time.monotonic_ns() if status == "fail" else None
        return Op(client_id, f, key, value, None, invoke, complete, status), error
    return Op(client_id, f, key, value, result_of(answer), invoke, time.monotonic_ns(), "ok"), None


async def read_set(endpoints: Sequence[str], client_id: int, timeout: float) -> Recorded:
    """The final read of the whole set: a linearizable scan of every partition."""

    async def scan() -> frozenset[int]:
        async with AsyncClient(list(endpoints), timeout=timeout) as kv:
            return frozenset([int(key[len(SET_PREFIX):]) async for key, _ in kv.scan(prefix=SET_PREFIX)])

    return await _timed(client_id, "read_all", SET_NAME, None, scan, lambda elements: elements)


async def read_banks(endpoints: Sequence[str], partitions: int, client_id: int, timeout: float) -> list[Recorded]:
    """The final read of every bank: its balances and the transfers recorded, from one view each."""
    async with AsyncClient(list(endpoints), timeout=timeout) as kv:
        return [await _timed(client_id, "bank_final", bank.name, None, lambda bank=bank: bank.contents(kv),
                             lambda r: r) for bank in banks(partitions)]
