"""The client's asyncio core: routing table, per-node coalescing, retries.

Runs on the event loop the sync `raftkv.Client` owns (one thread). Each node
gets one `_Link` per consistency level, which coalesces the operations bound
for it into Execute requests with the same `GroupCommit` policy the server
uses for proposals. `ClientCore.execute` routes one operation to its
partition's leader, re-routes on NotLeader or a connection failure, and
retries until the deadline.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.core.batching import GroupCommit
from raftkv.api.convert import error_from_result
from raftkv.api.rpc_errors import never_sent
from raftkv.core.errors import NotLeader, RaftKVError, Timeout, Unavailable, Undetermined


# Columnar scan chunks are up to 4 MiB (server.COLUMNS_CHUNK_BYTES): above gRPC's default receive limit.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 16 * 1024 * 1024)]


@dataclass(frozen=True)
class NodeStatus:
    node_id: str
    address: str
    reachable: bool
    partitions: tuple[pb.PartitionStatus, ...] = ()
    error: str = ""


class _TransportError(Exception):
    def __init__(self, never_sent: bool, detail: str):
        self.never_sent = never_sent
        super().__init__(detail)


STALLED_AFTER = 0.1  # s: a request out this long may wait on a partition without a leader


class _Link:
    """Coalesces operations bound for one node and consistency into Execute requests.

    One request is in flight at a time, and what arrives meanwhile goes in
    the next one: every request costs the node a gRPC call, and on a busy node
    more, smaller requests only queue longer (at 5,000 puts/s on 2 cores, 4 in
    flight doubled the put latency, docs/benchmarks.md). But one request can
    wait up to the timeout on a partition that lost its leader, and the
    node's other partitions must not wait with it: a request out for
    STALLED_AFTER lets the queue overtake it, up to `max_in_flight` requests.
    """

    def __init__(self, stub: kv_pb2_grpc.KVStub, consistency: int, timeout: float, max_ops: int, max_in_flight: int):
        self._stub = stub
        self._consistency = consistency
        self._timeout = timeout
        self._max_in_flight = max_in_flight
        self._stalled: set[asyncio.Task] = set()  # requests out for longer than STALLED_AFTER
        self._policy: GroupCommit[tuple[pb.Op, asyncio.Future]] = GroupCommit(max_ops, 8 << 20, max_in_flight=1)

    def submit(self, op: pb.Op) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        for batch in self._policy.add((op, future), op.ByteSize()):
            self._start(batch)
        return future

    def _start(self, batch: list[tuple[pb.Op, asyncio.Future]]) -> None:
        sent = asyncio.ensure_future(self._send(batch))
        asyncio.get_running_loop().call_later(STALLED_AFTER, self._mark_stalled, sent)

    def _mark_stalled(self, sent: asyncio.Task) -> None:
        if not sent.done():
            self._stalled.add(sent)
            self._widen()

    def _widen(self) -> None:
        """One request in flight, plus one for each stalled one, up to max_in_flight."""
        for batch in self._policy.set_max_in_flight(min(self._max_in_flight, 1 + len(self._stalled))):
            self._start(batch)

    async def _send(self, batch: list[tuple[pb.Op, asyncio.Future]]) -> None:
        request = pb.ExecuteRequest(ops=[op for op, _ in batch], consistency=self._consistency)
        try:
            response = await self._stub.Execute(request, timeout=self._timeout)
            for (_, future), result in zip(batch, response.results):
                if not future.done():
                    future.set_result(result)
        except grpc.aio.AioRpcError as exc:
            error = _TransportError(never_sent(exc), f"{exc.code().name}: {exc.details()}")
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
        finally:
            if (this := asyncio.current_task()) in self._stalled:
                self._stalled.discard(this)
                self._widen()  # narrows the limit again
            for next_batch in self._policy.completed():
                self._start(next_batch)


class ClientCore:
    """Everything that runs on the client's event loop."""

    def __init__(self, endpoints: list[str], timeout: float, max_batch_ops: int, max_in_flight: int):
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self.max_batch_ops = max_batch_ops
        self.max_in_flight = max_in_flight
        self.partitions = 0
        self.addresses: dict[str, str] = {}  # node id -> api address
        self.leaders: dict[int, str] = {}  # partition -> node id
        self.replicas: dict[int, tuple[str, ...]] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, kv_pb2_grpc.KVStub] = {}
        self._links: dict[tuple[str, int], _Link] = {}
        self._refreshing: asyncio.Task | None = None

    def stub(self, address: str) -> kv_pb2_grpc.KVStub:
        if address not in self._stubs:
            self._channels[address] = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            self._stubs[address] = kv_pb2_grpc.KVStub(self._channels[address])
        return self._stubs[address]

    def link(self, address: str, consistency: int) -> _Link:
        key = (address, consistency)
        if key not in self._links:
            self._links[key] = _Link(self.stub(address), consistency, self.timeout, self.max_batch_ops, self.max_in_flight)
        return self._links[key]

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()

    # -- routing ----------------------------------------------------------

    async def refresh(self) -> None:
        """Re-learn nodes and leaders; concurrent callers share one refresh."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh())
        await asyncio.shield(self._refreshing)

    async def _refresh(self) -> None:
        statuses = await self.statuses(timeout=min(2.0, self.timeout))
        best_term: dict[int, int] = {}
        for status in statuses:
            if not status.reachable:
                continue
            for ps in status.partitions:
                self.replicas[ps.partition] = tuple(ps.replicas)
                if ps.leader and ps.term >= best_term.get(ps.partition, -1):
                    best_term[ps.partition] = ps.term
                    self.leaders[ps.partition] = ps.leader

    async def statuses(self, timeout: float) -> list[NodeStatus]:
        addresses = dict.fromkeys(list(self.addresses.values()) + self.endpoints)
        replies = await asyncio.gather(
            *(self.stub(a).Status(pb.StatusRequest(), timeout=timeout) for a in addresses), return_exceptions=True
        )
        result = []
        for address, reply in zip(addresses, replies):
            if isinstance(reply, BaseException):
                detail = reply.details() if isinstance(reply, grpc.aio.AioRpcError) else str(reply)
                node_id = next((i for i, a in self.addresses.items() if a == address), "?")
                result.append(NodeStatus(node_id, address, False, error=detail or type(reply).__name__))
                continue
            self.partitions = reply.partitions
            self.addresses.update({n.id: n.api_address for n in reply.nodes})
            result.append(NodeStatus(reply.node_id, address, True, tuple(reply.hosted)))
        if not any(s.reachable for s in result):
            raise Unavailable(
                "no node answered at " + ", ".join(addresses) + "; check the endpoints and that the nodes are running"
            )
        return result

    def target(self, partition: int, attempt: int, consistency: int = pb.LINEARIZABLE) -> str:
        """The address to send a partition's operations to.

        Follower reads go to the first endpoint the client was given (a nearby
        replica or a learner; it forwards what it cannot serve), the rest to leaders.
        """
        if consistency == pb.FOLLOWER and attempt == 1:
            return self.endpoints[0]
        leader = self.leaders.get(partition)
        if leader in self.addresses:
            return self.addresses[leader]
        candidates = [self.addresses[n] for n in self.replicas.get(partition, ()) if n in self.addresses]
        candidates = candidates or list(self.addresses.values()) or self.endpoints
        return candidates[attempt % len(candidates)]

    # -- operations -------------------------------------------------------

    async def execute(self, op: pb.Op, consistency: int, is_write: bool) -> pb.Result:
        """Send one operation to its partition's leader, re-routing and retrying until the deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        if not self.partitions:
            await self.refresh()
        last_error: Exception | None = None
        attempt = 0
        while True:
            attempt += 1
            address = self.target(op.partition, attempt, consistency)
            try:
                # No per-op timer: the request carrying the op has the gRPC deadline `timeout`.
                result = await self.link(address, consistency).submit(op)
            except _TransportError as exc:
                if is_write and not exc.never_sent:
                    raise Undetermined(f"lost the connection to {address} after sending the write: {exc}") from None
                error: RaftKVError = Unavailable(f"{address}: {exc}")
            else:
                error = error_from_result(result, op.partition)
                if error is None:
                    return result
            if not isinstance(error, (NotLeader, Unavailable, Timeout, Undetermined)) or (
                is_write and isinstance(error, Undetermined)
            ):
                raise error
            last_error = error
            hint = error.leader_hint if isinstance(error, NotLeader) else None
            if hint and hint != self.leaders.get(op.partition):
                self.leaders[op.partition] = hint
                continue
            self.leaders.pop(op.partition, None)
            await asyncio.sleep(min(0.02 * attempt, 0.3))
            if loop.time() >= deadline:
                raise self._give_up(is_write, maybe_sent=False, last_error=last_error)
            try:
                await self.refresh()
            except Unavailable:
                pass

    def _give_up(self, is_write: bool, maybe_sent: bool, last_error: Exception | None) -> RaftKVError:
        why = f" (last error: {last_error})" if last_error else ""
        if not is_write:
            return Timeout(f"read did not complete within {self.timeout}s{why}")
        if maybe_sent:
            return Undetermined(f"write not confirmed within {self.timeout}s{why}")
        return Unavailable(f"no leader accepted the write within {self.timeout}s{why}")

    async def split_keys(self, request: pb.SplitKeysRequest) -> pb.SplitKeysResponse:
        """Asked of the partition's replicas in turn; any one's keys will do (they are only boundaries)."""
        if not self.partitions:
            await self.refresh()
        details = ""
        for attempt in range(1, 4):
            try:
                return await self.stub(self.target(request.partition, attempt)).SplitKeys(request, timeout=self.timeout)
            except grpc.aio.AioRpcError as exc:
                details = exc.details() or exc.code().name
        raise Unavailable(f"no replica of partition {request.partition} answered for its split keys: {details}")

    async def scan_partition(self, partition: int, request: pb.ScanRequest):
        """Chunks of one partition's scan, all from one view; retried only before the first chunk."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        if not self.partitions:
            await self.refresh()
        attempt = 0
        while True:
            attempt += 1
            address = self.target(partition, attempt, request.consistency)
            call = self.stub(address).Scan(request, timeout=None)
            try:
                first = True
                async for chunk in call:
                    first = False
                    yield chunk
                return
            except grpc.aio.AioRpcError as exc:
                if not first:
                    raise Unavailable(f"scan of partition {partition} broke off at {address}: {exc.details()}") from None
                details = exc.details() or ""
                if details.startswith("NOT_LEADER:") and (hint := details.split(":")[1]) and hint != self.leaders.get(partition):
                    self.leaders[partition] = hint
                else:
                    self.leaders.pop(partition, None)
                    if loop.time() >= deadline:
                        raise Unavailable(f"scan of partition {partition} found no serving replica: {details}") from None
                    await asyncio.sleep(min(0.02 * attempt, 0.3))
                    try:
                        await self.refresh()
                    except Unavailable:
                        pass
