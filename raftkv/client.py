"""The Python client.

    with raftkv.Client("127.0.0.1:7000") as kv:
        kv.put(b"k", b"v")
        kv.get(b"k")                      # linearizable by default
        kv.read(b"k", consistency="follower").applied_index

Thread-safe. Calls from many threads are coalesced: operations bound for the
same node travel in one Execute request (see `batching.GroupCommit`), so one
gRPC call carries many operations. Routing: the client computes each key's
partition, sends to the leader from its cached routing table, and refreshes
the table on NotLeader or a connection failure, retrying until the deadline.

Errors: InvalidRequest (nothing written), Unavailable (nothing written, no
leader reachable before the deadline), Undetermined (a write whose outcome is
unknown), Timeout (a read that did not finish), StorageFull.
"""

from __future__ import annotations

import asyncio
import heapq
import threading
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

from raftkv.api import kv_pb2 as pb
from raftkv.client_core import ClientCore, NodeStatus
from raftkv.codec import consistency_from_name, op_from_command
from raftkv.commands import (
    Batch,
    Cas,
    CasResult,
    Command,
    Delete,
    DeleteRange,
    LearnerProgress,
    Limits,
    Mutation,
    Put,
    RegisterLearner,
    RemoveLearner,
    check_command,
    routing_keys,
)
from raftkv.engine import prefix_end
from raftkv.errors import InvalidRequest
from raftkv.partitioning import partition_for_key

Bytes = bytes | str


def _b(value: Bytes) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise InvalidRequest(f"keys and values are bytes or str, not {type(value).__name__}")


@dataclass(frozen=True)
class Read:
    value: bytes | None
    applied_index: int


@dataclass(frozen=True)
class LearnerView:
    name: str
    sink: str
    options: dict[str, str]
    progress: dict[int, int]  # partition -> delivered index
    commit_index: dict[int, int]  # partition -> the leader's commit index (lag = commit - progress)


class Client:
    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        consistency: str = "linearizable",
        timeout: float = 10.0,
        max_batch_ops: int = 1024,
        max_in_flight: int = 4,
    ):
        if isinstance(endpoints, str):
            endpoints = [e.strip() for e in endpoints.split(",") if e.strip()]
        if not endpoints:
            raise InvalidRequest("give at least one endpoint (host:port of a node's API)")
        self._consistency = consistency_from_name(consistency)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="raftkv-client", daemon=True)
        self._thread.start()
        self._core = ClientCore(list(endpoints), timeout, max_batch_ops, max_in_flight)
        self._closed = False

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        asyncio.run_coroutine_threadsafe(self._core.close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _partitions(self) -> int:
        if not self._core.partitions:
            await self._core.refresh()
        return self._core.partitions

    def _write(self, command: Command) -> pb.Result:
        async def go():
            partitions = await self._partitions()
            keys = routing_keys(command)
            if not keys:
                raise InvalidRequest("a batch of only delete_ranges has no partition; use delete_range()")
            op = op_from_command(command, partition_for_key(keys[0], partitions))
            return await self._core.execute(op, self._consistency, is_write=True)

        return self._run(go())

    # -- writes -----------------------------------------------------------

    def put(self, key: Bytes, value: Bytes) -> None:
        self._write(Put(_b(key), _b(value)))

    def delete(self, key: Bytes) -> None:
        self._write(Delete(_b(key)))

    def cas(self, key: Bytes, expected: Bytes | None, new: Bytes | None) -> CasResult:
        """Set key to `new` (delete if None) when its value is `expected` (absent if None)."""
        result = self._write(
            Cas(_b(key), None if expected is None else _b(expected), None if new is None else _b(new))
        )
        return CasResult(result.cas_succeeded, result.value if result.found else None)

    def batch(self, ops: Iterable[Mutation]) -> None:
        """Apply puts, deletes and delete_ranges atomically; all keys must be in one partition."""
        ops = tuple(ops)
        if not ops:
            raise InvalidRequest("a batch needs at least one operation")
        self._write(Batch(ops))

    def delete_range(self, start: Bytes, end: Bytes) -> None:
        """Delete [start, end) in every partition (atomic per partition, not across partitions)."""
        command = DeleteRange(_b(start), _b(end))
        check_command(command, Limits(max_key_bytes=1 << 30))
        self._write_partitions(command, None)

    def _write_partitions(self, command: Command, partitions: Iterable[int] | None) -> None:
        """One command proposed in each of `partitions` (all when None), concurrently."""

        async def go():
            chosen = range(await self._partitions()) if partitions is None else partitions
            await asyncio.gather(
                *(self._core.execute(op_from_command(command, p), self._consistency, True) for p in chosen)
            )

        self._run(go())

    # -- learners ---------------------------------------------------------

    def register_learner(self, name: str, sink: str, options: dict[str, str] | None = None,
                         partitions: Iterable[int] | None = None) -> None:
        """Register a learner through the log of each partition (all when None)."""
        command = RegisterLearner(name, sink, tuple(sorted((options or {}).items())))
        check_command(command, Limits())
        self._write_partitions(command, partitions)

    def remove_learner(self, name: str, partitions: Iterable[int] | None = None) -> None:
        command = RemoveLearner(name)
        check_command(command, Limits())
        self._write_partitions(command, partitions)

    def report_progress(self, name: str, delivered: dict[int, int]) -> None:
        """A learner's durably delivered index per partition, replicated in each partition's log."""

        async def go():
            await asyncio.gather(*(
                self._core.execute(op_from_command(LearnerProgress(name, index), p), self._consistency, True)
                for p, index in delivered.items()
            ))

        self._run(go())

    def learners(self) -> dict[str, LearnerView]:
        """Registered learners as the partitions' leaders see them."""
        found: dict[str, LearnerView] = {}
        for status in self.status():
            for ps in status.partitions:
                if ps.role != "leader":
                    continue
                for ls in ps.learners:
                    view = found.setdefault(ls.name, LearnerView(ls.name, ls.sink, dict(ls.options), {}, {}))
                    view.progress[ps.partition] = ls.progress
                    view.commit_index[ps.partition] = ps.commit_index
        return found

    # -- reads ------------------------------------------------------------

    def read(self, key: Bytes, consistency: str | None = None) -> Read:
        level = consistency_from_name(consistency) if consistency else self._consistency
        key = _b(key)

        async def go():
            partitions = await self._partitions()
            op = pb.Op(partition=partition_for_key(key, partitions), get=pb.Get(key=key))
            return await self._core.execute(op, level, is_write=False)

        result = self._run(go())
        return Read(result.value if result.found else None, result.applied_index)

    def get(self, key: Bytes, consistency: str | None = None) -> bytes | None:
        return self.read(key, consistency).value

    def scan(
        self,
        start: Bytes = b"",
        end: Bytes | None = None,
        *,
        prefix: Bytes | None = None,
        limit: int = 0,
        consistency: str | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        """Keys in [start, end) (or with `prefix`) in key order, merged across partitions.

        Each partition is read from one consistent view; different partitions
        may be read at different moments.
        """
        start_b, end_b = _b(start), None if end is None else _b(end)
        if prefix is not None:
            start_b, end_b = _b(prefix), prefix_end(_b(prefix))
        partitions = self._run(self._partitions())
        streams = [
            self.scan_partition(p, start_b, end_b, limit=limit, consistency=consistency) for p in range(partitions)
        ]
        merged = heapq.merge(*streams, key=lambda kv: kv[0])
        for count, item in enumerate(merged, 1):
            yield item
            if limit and count >= limit:
                return

    def scan_partition(
        self,
        partition: int,
        start: bytes = b"",
        end: bytes | None = None,
        *,
        limit: int = 0,
        consistency: str | None = None,
        on_index=None,
    ) -> Iterator[tuple[bytes, bytes]]:
        """One partition's keys in order from one view; `on_index(i)` receives that view's applied index."""
        level = consistency_from_name(consistency) if consistency else self._consistency
        request = pb.ScanRequest(partition=partition, start=start, end=end, limit=limit, consistency=level)
        chunks = self._core.scan_partition(partition, request)
        while True:
            try:
                chunk = self._run(chunks.__anext__())
            except StopAsyncIteration:
                return
            if on_index is not None:
                on_index(chunk.applied_index)
                on_index = None
            for kv in chunk.items:
                yield kv.key, kv.value

    # -- cluster ----------------------------------------------------------

    def status(self) -> list[NodeStatus]:
        async def go():
            await self._core.refresh()
            return await self._core.statuses(timeout=2.0)

        return self._run(go())

    @property
    def partitions(self) -> int:
        return self._run(self._partitions())

