"""The asyncio client: the same operations as `raftkv.Client`, awaited on your own event loop.

    async with raftkv.AsyncClient("127.0.0.1:7000") as kv:
        await kv.put(b"k", b"v")
        await kv.get(b"k")
        async for key, value in kv.scan(prefix=b"k"):
            ...

Concurrent operations bound for the same node are coalesced into one Execute
request, so thousands of operations in flight cost a few gRPC calls
(`raftkv.client.core`): one request per node is in flight, and up to `max_in_flight`
only while earlier ones are stuck (e.g. on a partition that lost its
leader). `raftkv.Client` runs one of these on a private loop.
"""

from __future__ import annotations

import asyncio
import heapq
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Callable, Iterable, Mapping, Sequence, TypedDict

from raftkv.api import kv_pb2 as pb
from raftkv.api.checkpoint_stream import ListedFile
from raftkv.client.core import ClientCore, NodeStatus
from raftkv.api.convert import consistency_from_name, op_from_command
from raftkv.core.commands import (
    Batch, Cas, CasResult, Command, DeleteRange, Guard, GuardedBatch, LearnerProgress, Limits, Mutation, PutMany,
    RegisterLearner, RemoveLearner,
)
from raftkv.core.command_kinds import check_command, routing_keys
from raftkv.storage.engine import Position, prefix_end
from raftkv.core.errors import InvalidRequest, Unavailable
from raftkv.core.partitioning import partition_for_key
from raftkv.meta.records import BeginMove, MetaCommand, NodeState, SetNodeState, encode_command
from raftkv.meta.wire import Topology, topology_of
from raftkv.security.tls import Tls

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
    commit_index: dict[int, int]  # partition -> the leader's commit index
    last_data_index: dict[int, int]  # partition -> the leader's last entry that was more than progress reports

    def lag(self, partition: int) -> int:
        """Entries the learner has yet to deliver, not counting progress reports after the last other one."""
        return max(0, self.last_data_index[partition] - self.progress[partition])


def parse_endpoints(endpoints: str | Sequence[str]) -> list[str]:
    if isinstance(endpoints, str):
        endpoints = [e.strip() for e in endpoints.split(",") if e.strip()]
    if not endpoints:
        raise InvalidRequest("give at least one endpoint (host:port of a node's API)")
    return list(endpoints)


class ClientOptions(TypedDict, total=False):
    """AsyncClient's keyword options, which `Client` passes on."""

    consistency: str
    timeout: float
    max_batch_ops: int
    max_in_flight: int
    tls: Tls | None
    token: str | None


class AsyncClient:
    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        consistency: str = "linearizable",
        timeout: float = 10.0,
        max_batch_ops: int = 1024,
        max_in_flight: int = 4,
        tls: Tls | None = None,
        token: str | None = None,
    ):
        """`tls`: the cluster's CA and this client's certificate; None for a cluster without [tls].
        `token`: act as the user this bearer token belongs to (`raftkv user add --token`), not as the
        certificate's."""
        self._consistency = consistency_from_name(consistency)
        self._core = ClientCore(parse_endpoints(endpoints), timeout, max_batch_ops, max_in_flight, tls, token)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self._core.close()

    async def partitions(self) -> int:
        if not self._core.partitions:
            await self._core.refresh()
        return self._core.partitions

    async def partition_of(self, key: Bytes) -> int:
        """The partition a key lives in (a batch must stay within one)."""
        return partition_for_key(_b(key), await self.partitions())

    def _level(self, consistency: str | None) -> int:
        return consistency_from_name(consistency) if consistency else self._consistency

    async def _write(self, command: Command) -> pb.Result:
        keys = routing_keys(command)
        if not keys:
            raise InvalidRequest("a batch of only delete_ranges has no partition; use delete_range()")
        op = op_from_command(command, partition_for_key(keys[0], await self.partitions()))
        return await self._core.execute(op, self._consistency, is_write=True)

    async def _write_partitions(self, command: Command, partitions: Iterable[int] | None) -> None:
        """One command proposed in each of `partitions` (all when None), concurrently."""
        chosen = range(await self.partitions()) if partitions is None else partitions
        await asyncio.gather(
            *(self._core.execute(op_from_command(command, p), self._consistency, True) for p in chosen)
        )

    # -- writes -----------------------------------------------------------

    async def put(self, key: Bytes, value: Bytes) -> None:
        key = _b(key)  # the Op made here, not through a Put command: the client's commonest call, kept short
        op = pb.Op(partition=partition_for_key(key, self._core.partitions or await self.partitions()),
                   put=pb.Put(key=key, value=_b(value)))
        await self._core.execute(op, self._consistency, is_write=True)

    async def delete(self, key: Bytes) -> None:
        key = _b(key)
        op = pb.Op(partition=partition_for_key(key, self._core.partitions or await self.partitions()),
                   delete=pb.Delete(key=key))
        await self._core.execute(op, self._consistency, is_write=True)

    async def cas(self, key: Bytes, expected: Bytes | None, new: Bytes | None) -> CasResult:
        """Set key to `new` (delete if None) when its value is `expected` (absent if None)."""
        result = await self._write(
            Cas(_b(key), None if expected is None else _b(expected), None if new is None else _b(new))
        )
        return CasResult(result.cas_succeeded, result.value if result.found else None)

    async def batch(self, ops: Iterable[Mutation]) -> None:
        """Apply puts, deletes and delete_ranges atomically; all keys must be in one partition."""
        ops = tuple(ops)
        if not ops:
            raise InvalidRequest("a batch needs at least one operation")
        await self._write(Batch(ops))

    async def guarded_batch(self, guards: Mapping[Bytes, Bytes | None], ops: Iterable[Mutation]) -> bool:
        """Apply puts, deletes and delete_ranges atomically if every key of `guards` holds its value (None:
        is absent) when they are applied, else none; whether they were. All keys must be in one partition."""
        ops = tuple(ops)
        if not ops:
            raise InvalidRequest("a guarded batch needs at least one operation")
        command = GuardedBatch(tuple(Guard(_b(k), None if v is None else _b(v)) for k, v in guards.items()), ops)
        return (await self._write(command)).cas_succeeded

    async def put_many(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """Put every key to its value atomically; all keys must be in one partition.

        The bulk-load form of `batch`: the rows travel and are logged as two
        byte strings each, with no per-row message (docs/spark.md).
        """
        if not keys:
            raise InvalidRequest("put_many needs at least one key")
        await self._write(PutMany.of(keys, values))

    async def delete_range(self, start: Bytes, end: Bytes) -> None:
        """Delete [start, end) in every partition (atomic per partition, not across partitions)."""
        command = DeleteRange(_b(start), _b(end))
        check_command(command, Limits(max_key_bytes=1 << 30))
        await self._write_partitions(command, None)

    # -- reads ------------------------------------------------------------

    async def read(self, key: Bytes, consistency: str | None = None) -> Read:
        key = _b(key)
        op = pb.Op(partition=partition_for_key(key, self._core.partitions or await self.partitions()),
                   get=pb.Get(key=key))
        result = await self._core.execute(op, self._level(consistency), is_write=False)
        return Read(result.value if result.found else None, result.applied_index)

    async def get(self, key: Bytes, consistency: str | None = None) -> bytes | None:
        return (await self.read(key, consistency)).value

    async def scan_partition(self, partition: int, start: bytes = b"", end: bytes | None = None, *, limit: int = 0,
                             consistency: str | None = None, columnar: bool = False) -> AsyncIterator[pb.ScanChunk]:
        """One partition's scan as chunks, all from one view (each chunk carries its applied index).

        `columnar` chunks carry `columns` (Arrow's binary layout) instead of `items`.
        """
        request = pb.ScanRequest(partition=partition, start=start, end=end, limit=limit,
                                 consistency=self._level(consistency), columnar=columnar)
        async for chunk in self._core.scan_partition(partition, request):
            yield chunk

    async def checkpoint(self, partition: int, dest: Path) -> Position:
        """A partition's state as its leader's RocksDB checkpoint, written to `dest` (a folder that does not
        exist yet): the files and the Raft position they are exactly the state after. An admin verb."""
        return await self._core.checkpoint(partition, dest)

    async def checkpoint_files(self, partition: int, dest: Path,
                               choose: Callable[[list[ListedFile]], list[str]]) -> tuple[Position, list[ListedFile]]:
        """`checkpoint`, only the files `choose` names of the leader's listing (called with every file of
        the checkpoint: its path, size and, for a table file, SHA-256): the position, and the listing."""
        return await self._core.checkpoint_files(partition, dest, choose)

    async def split_keys(self, partition: int, start: bytes = b"", end: bytes | None = None, *,
                         every: int) -> list[bytes]:
        """Every `every`-th key of a partition's range, from one replica: boundaries for parallel scans."""
        request = pb.SplitKeysRequest(partition=partition, start=start, end=end, every=every)
        return list((await self._core.split_keys(request)).keys)

    async def scan(self, start: Bytes = b"", end: Bytes | None = None, *, prefix: Bytes | None = None,
                   limit: int = 0, consistency: str | None = None) -> AsyncIterator[tuple[bytes, bytes]]:
        """Keys in [start, end) (or with `prefix`) in key order, merged across partitions.

        Each partition is read from one consistent view; different partitions
        may be read at different moments.
        """
        start_b, end_b = scan_bounds(start, end, prefix)
        streams = [_items(self.scan_partition(p, start_b, end_b, limit=limit, consistency=consistency))
                   for p in range(await self.partitions())]
        count = 0
        async for item in _merge(streams):
            yield item
            count += 1
            if limit and count >= limit:
                return

    # -- learners and cluster ---------------------------------------------

    async def register_learner(self, name: str, sink: str, options: dict[str, str] | None = None,
                               partitions: Iterable[int] | None = None) -> None:
        """Register a learner through the log of each partition (all when None)."""
        command = RegisterLearner(name, sink, tuple(sorted((options or {}).items())))
        check_command(command, Limits())
        await self._write_partitions(command, partitions)

    async def remove_learner(self, name: str, partitions: Iterable[int] | None = None) -> None:
        command = RemoveLearner(name)
        check_command(command, Limits())
        await self._write_partitions(command, partitions)

    async def report_progress(self, name: str, delivered: dict[int, int]) -> None:
        """A learner's durably delivered index per partition, replicated in each partition's log."""
        await asyncio.gather(*(
            self._core.execute(op_from_command(LearnerProgress(name, index), p), self._consistency, True)
            for p, index in delivered.items()
        ))

    async def topology(self) -> Topology:
        """The nodes, each partition's voters and the moves under way, from the cluster's metadata."""
        reply = await self._core.administer("topology", lambda admin: admin.Topology(pb.TopologyRequest(), timeout=5.0))
        return topology_of(reply)

    async def change_topology(self, command: MetaCommand, everywhere: bool = False) -> Topology:
        """Apply one metadata command (raftkv.meta.records) on the metadata leader; ChangeRefused if a
        rule forbids it. `everywhere`: return once every node that answers has applied it too (a user
        added, a role granted: each node checks callers against its own copy)."""
        request = pb.ChangeTopologyRequest(command=encode_command(command))
        reply = await self._core.administer(type(command).__name__,
                                            lambda admin: admin.ChangeTopology(request, timeout=15.0))
        topology = topology_of(reply)
        if everywhere:
            await self._await_metadata(topology.meta.epoch)
        return topology

    async def _await_metadata(self, epoch: int) -> None:
        """Until every node that answers has applied the cluster metadata up to `epoch`, or the timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._core.timeout
        while True:
            behind = [s.node_id for s in await self.status() if s.reachable and s.meta_epoch < epoch]
            if not behind:
                return
            if loop.time() >= deadline:
                raise Unavailable(f"node(s) {', '.join(behind)} have not applied the change yet; they will")
            await asyncio.sleep(0.05)

    async def move_replica(self, partition: int, source: str, target: str) -> Topology:
        """Start moving partition's replica from node `source` to `target`; returns once the move is
        recorded (it runs on; `topology().meta.moves` shows it until it is done)."""
        return await self.change_topology(BeginMove(partition, source, target))

    async def decommission(self, node_id: str, force: bool = False) -> Topology:
        """Drain a node: its replicas and leaderships move away, then it is removed and its process exits."""
        return await self.change_topology(SetNodeState(node_id, NodeState.DRAINING, force))

    async def transfer_leadership(self, partition: int, node_id: str) -> None:
        """Ask partition's leader to hand leadership to `node_id` (best effort: see `status()` for the result)."""
        request = pb.TransferLeadershipRequest(group=partition, node=node_id)

        async def on_the_leader(admin) -> None:
            if not (await admin.TransferLeadership(request, timeout=5.0)).done:
                raise Unavailable(f"not the leader of partition {partition}")

        await self._core.administer("transfer leadership", on_the_leader, on_any_error=True)

    async def status(self) -> list[NodeStatus]:
        await self._core.refresh()
        return await self._core.statuses(timeout=2.0)

    async def learners(self) -> dict[str, LearnerView]:
        """Registered learners as the partitions' leaders see them, once every partition has a leader that
        answers (until the timeout): a partition left out would look like one the learner is not
        registered for, and a learner started from that view would never feed it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._core.timeout
        while True:
            statuses = await self.status()
            leading = {ps.partition: ps for s in statuses for ps in s.partitions if ps.role == "leader"}
            missing = sorted(set(range(self._core.partitions)) - leading.keys())
            if not missing:
                break
            if loop.time() >= deadline:
                raise Unavailable(f"partition(s) {', '.join(map(str, missing))} have no leader that answers, so "
                                  "their learners are unknown; try again once they have one")
            await asyncio.sleep(0.1)
        found: dict[str, LearnerView] = {}
        for ps in leading.values():
            for ls in ps.learners:
                view = found.setdefault(ls.name, LearnerView(ls.name, ls.sink, dict(ls.options), {}, {}, {}))
                view.progress[ps.partition] = ls.progress
                view.commit_index[ps.partition] = ps.commit_index
                view.last_data_index[ps.partition] = ps.last_data_index
        return found


def scan_bounds(start: Bytes, end: Bytes | None, prefix: Bytes | None) -> tuple[bytes, bytes | None]:
    if prefix is not None:
        return _b(prefix), prefix_end(_b(prefix))
    return _b(start), None if end is None else _b(end)


async def _items(chunks: AsyncIterator[pb.ScanChunk]) -> AsyncIterator[tuple[bytes, bytes]]:
    async for chunk in chunks:
        for kv in chunk.items:
            yield kv.key, kv.value


async def _merge(streams: list[AsyncIterator[tuple[bytes, bytes]]]) -> AsyncIterator[tuple[bytes, bytes]]:
    """Sorted streams merged by key (the async twin of heapq.merge)."""
    heap = []
    for i, stream in enumerate(streams):
        first = await anext(stream, None)
        if first is not None:
            heap.append((first[0], i, first[1]))
    heapq.heapify(heap)
    while heap:
        key, i, value = heap[0]
        yield key, value
        following = await anext(streams[i], None)
        if following is None:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (following[0], i, following[1]))
