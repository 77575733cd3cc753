"""The client's asyncio core: per-node coalescing, and the one retry loop.

Runs on the event loop of the `AsyncClient` (for the sync `raftkv.Client`, a
loop thread of its own). Each node gets one `_Link` per consistency level,
which coalesces the operations bound for it into Execute requests with the
same `GroupCommit` policy the server uses for proposals. Executes, scans and
split-key requests all go through `_retrying`: where to send comes from the
pure `routing.RoutingTable`, whether and when to try again from the pure
`retry.decide`.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable, TypeVar

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.api.checkpoint_stream import SILENCE_SECONDS, ListedFile, receive_checkpoint, receive_files
from raftkv.core.batching import GroupCommit
from raftkv.api.convert import error_from_result
from raftkv.api.rpc_errors import error_of, never_sent
from raftkv.client.channels import Channels
from raftkv.client.retry import decide
from raftkv.client.routing import RoutingTable
from raftkv.client.transport import NodeTransport, TransportError, refusal_error
from raftkv.core.errors import (ChangeRefused, CorruptData, InvalidRequest, NotLeader, RaftKVError, Unauthenticated,
                                Unavailable, Undetermined)
from raftkv.security.tls import Tls, refusal
from raftkv.storage.engine import Position

T = TypeVar("T")


@dataclass(frozen=True)
class NodeStatus:
    node_id: str
    address: str
    reachable: bool
    partitions: tuple[pb.PartitionStatus, ...] = ()
    error: str = ""
    meta_epoch: int = 0  # of the cluster metadata the node has applied
    version: str = ""  # the node's raftkv release


STALLED_AFTER = 0.1  # s: a request out this long may wait on a partition without a leader


class _Link:
    """Coalesces operations bound for one node and consistency into Execute requests.

    One request is in flight at a time, and what arrives meanwhile goes in
    the next one: every request costs the node a message on the node's stream
    (`transport.NodeTransport`; a gRPC call on an older node), and on a busy node
    more, smaller requests only queue longer (at 5,000 puts/s on 2 cores, 4 in
    flight doubled the put latency, docs/benchmarks.md). But one request can
    wait up to the timeout on a partition that lost its leader, and the
    node's other partitions must not wait with it: a request out for
    STALLED_AFTER lets the queue overtake it, up to `max_in_flight` requests.
    """

    def __init__(self, address: str, transport: NodeTransport, consistency: int, max_ops: int, max_in_flight: int):
        self._address = address
        self._transport = transport
        self._consistency = consistency
        self._max_in_flight = max_in_flight
        self._stalled: set[asyncio.Task] = set()  # requests out for longer than STALLED_AFTER
        self._policy: GroupCommit[tuple[pb.Op, asyncio.Future]] = GroupCommit(max_ops, 8 << 20, max_in_flight=1)

    def submit(self, op: pb.Op) -> asyncio.Future:
        """The op's OK result, or the error it stands for (a lost request: Undetermined if it was a write the
        node may have received, else Unavailable)."""
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

    def _lost(self, op: pb.Op, lost: TransportError) -> RaftKVError:
        if not lost.never_sent and op.WhichOneof("op") != "get":
            return Undetermined(f"lost the connection to {self._address} after sending the write: {lost}")
        return Unavailable(f"{self._address}: {lost}")

    def _widen(self) -> None:
        """One request in flight, plus one for each stalled one, up to max_in_flight."""
        for batch in self._policy.set_max_in_flight(min(self._max_in_flight, 1 + len(self._stalled))):
            self._start(batch)

    async def _send(self, batch: list[tuple[pb.Op, asyncio.Future]]) -> None:
        request = pb.ExecuteRequest(ops=[op for op, _ in batch], consistency=self._consistency)
        try:
            response = await self._transport.execute(request)
            for (op, future), result in zip(batch, response.results):
                if future.done():
                    continue
                if result.code == pb.OK:
                    future.set_result(result)
                else:
                    future.set_exception(error_from_result(result, op.partition))
        except RaftKVError as error:
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
        except TransportError as lost:
            for op, future in batch:
                if not future.done():
                    future.set_exception(self._lost(op, lost))
        finally:
            if (this := asyncio.current_task()) in self._stalled:
                self._stalled.discard(this)
                self._widen()  # narrows the limit again
            for next_batch in self._policy.completed():
                self._start(next_batch)


class ClientCore:
    """Everything that runs on the client's event loop: transport, and the one retry loop."""

    def __init__(self, endpoints: list[str], timeout: float, max_batch_ops: int, max_in_flight: int,
                 tls: Tls | None, token: str | None = None):
        if tls is not None:
            tls.check()  # an expired or foreign certificate of ours is a ConfigError now, not a refusal later
        self.tls = tls
        self.routing = RoutingTable(list(endpoints))
        self.timeout = timeout
        self.max_batch_ops = max_batch_ops
        self.max_in_flight = max_in_flight
        self._channels = Channels(tls, token, timeout)
        self._links: dict[tuple[str, int], _Link] = {}
        self._refreshing: asyncio.Task | None = None

    @property
    def partitions(self) -> int:
        return self.routing.partitions

    def stub(self, address: str) -> kv_pb2_grpc.KVStub:
        return self._channels.kv(address)

    def admin(self, address: str) -> kv_pb2_grpc.AdminStub:
        return self._channels.admin(address)

    async def administer(self, what: str, call: Callable[[kv_pb2_grpc.AdminStub], Awaitable[T]],
                         on_any_error: bool = False) -> T:
        """`call` on the first node that answers (with `on_any_error`, that `call` does not raise
        Unavailable for), again until the timeout; a refusal is final, and so is a first round in which
        no node could be connected to (as for reads and writes: the nodes are down or the endpoints wrong)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        first = True
        while True:
            refused, unreached = [], 0
            addresses = self.routing.known_addresses()
            for address in addresses:
                try:
                    return await call(self.admin(address))
                except grpc.aio.AioRpcError as exc:
                    if exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
                        raise ChangeRefused(exc.details()) from None
                    if (final := refusal_error(exc)) is not None:
                        raise final from None
                    last = f"{address}: {exc.code().name} {exc.details()}"
                    if why := refusal(exc.details() or "", self.tls):
                        refused.append(f"{address}: {why}")
                    unreached += never_sent(exc)
                except Unavailable as exc:
                    if not on_any_error:
                        raise
                    last = f"{address}: {exc}"
            if refused and len(refused) == len(addresses):
                raise Unauthenticated(refused[0])
            if first and unreached == len(addresses):
                raise Unavailable(f"{what}: no node answered at {', '.join(addresses)}; check the endpoints and "
                                  "that the nodes are running")
            first = False
            if loop.time() >= deadline:
                raise Unavailable(f"{what}: no node could answer (last: {last}); check that the nodes are running")
            await asyncio.sleep(0.2)

    def link(self, address: str, consistency: int) -> _Link:
        key = (address, consistency)
        if key not in self._links:
            self._links[key] = _Link(address, self._channels.transport(address), consistency, self.max_batch_ops,
                                     self.max_in_flight)
        return self._links[key]

    async def close(self) -> None:
        await self._channels.close()

    # -- routing ----------------------------------------------------------

    async def refresh(self) -> None:
        """Re-learn nodes and leaders; concurrent callers share one refresh."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self.statuses(timeout=min(2.0, self.timeout)))
        await asyncio.shield(self._refreshing)

    async def statuses(self, timeout: float) -> list[NodeStatus]:
        addresses = self.routing.known_addresses()
        replies = await asyncio.gather(
            *(self.stub(a).Status(pb.StatusRequest(), timeout=timeout) for a in addresses), return_exceptions=True
        )
        answered = [r for r in replies if not isinstance(r, BaseException)]
        self.routing.learn(answered)
        result = []
        for address, reply in zip(addresses, replies):
            if isinstance(reply, BaseException):
                detail = reply.details() if isinstance(reply, grpc.aio.AioRpcError) else str(reply)
                result.append(NodeStatus(self.routing.node_of(address), address, False,
                                         error=detail or type(reply).__name__))
            else:
                result.append(NodeStatus(reply.node_id, address, True, tuple(reply.hosted), meta_epoch=reply.meta_epoch,
                                         version=reply.version))
        if not answered:
            refused = [refusal(r.details() or "", self.tls) for r in replies if isinstance(r, grpc.aio.AioRpcError)]
            if refused and len(refused) == len(replies) and all(refused):
                raise Unauthenticated(f"{addresses[0]}: {refused[0]}")
            raise Unavailable(
                "no node answered at " + ", ".join(addresses) + "; check the endpoints and that the nodes are running"
            )
        return result

    async def _retrying(self, partition: int, consistency: int, is_write: bool, what: str,
                        attempt_at: Callable[[str], Awaitable[T]]) -> T:
        """`attempt_at(address)` until it succeeds, the error is final, or the deadline passes."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = now + self.timeout
        if not self.routing.partitions:
            await self.refresh()
        attempt = 0
        while True:
            if now >= self._channels.next_look:  # renewed TLS files, once a second: not a call per operation
                self._channels.look(now)
            attempt += 1
            try:
                return await attempt_at(self.routing.target(partition, attempt, consistency == pb.FOLLOWER))
            except RaftKVError as error:
                hinted = isinstance(error, NotLeader) and self.routing.hinted(partition, error.leader_hint)
                now = loop.time()
                decision = decide(error, attempt=attempt, now=now, deadline=deadline, is_write=is_write,
                                  hinted_new_leader=hinted, what=what, timeout=self.timeout)
            if not decision.retry:
                raise decision.error
            if decision.follow_hint:
                continue
            self.routing.forget_leader(partition)
            await asyncio.sleep(decision.delay)
            with contextlib.suppress(Unavailable):
                await self.refresh()

    # -- operations -------------------------------------------------------

    def execute(self, op: pb.Op, consistency: int, is_write: bool) -> Awaitable[pb.Result]:
        """Send one operation to its partition's leader, re-routing and retrying until the deadline. `is_write`:
        anything but a get. (No coroutine of its own, nor per attempt: an op's answer passes through as few
        frames as it can, docs/benchmarks.md "Step 6".)"""
        return self._retrying(op.partition, consistency, is_write, "write" if is_write else "read",
                              lambda address: self.link(address, consistency).submit(op))

    async def split_keys(self, request: pb.SplitKeysRequest) -> pb.SplitKeysResponse:
        """Asked of the partition's replicas in turn; any one's keys will do (they are only boundaries)."""

        async def at(address: str) -> pb.SplitKeysResponse:
            try:
                return await self.stub(address).SplitKeys(request, timeout=self.timeout)
            except grpc.aio.AioRpcError as exc:
                raise refusal_error(exc) or Unavailable(f"{address}: {exc.details() or exc.code().name}") from None

        return await self._retrying(request.partition, pb.LINEARIZABLE, False,
                                    f"split keys of partition {request.partition}", at)

    async def checkpoint(self, partition: int, dest: Path) -> Position:
        """A checkpoint of `partition` from its leader after a read barrier, so with every write acknowledged
        before the call (`Admin.Checkpoint`, an admin verb), its files written
        to `dest` (a folder that does not exist yet): the position they are exactly the state after. Tried
        again from the start, at the partition's replicas in turn, until the deadline; what a failed
        attempt wrote is removed."""

        async def at(address: str) -> Position:
            call = self.admin(address).Checkpoint(pb.ReplicaRequest(group=partition, linearizable=True))
            try:
                return (await receive_checkpoint(call, dest, lambda n: None))[0]
            except grpc.aio.AioRpcError as exc:  # FAILED_PRECONDITION: no voter of the partition there
                error = (error_of(exc, partition) or refusal_error(exc)
                         or Unavailable(f"{address}: {exc.details() or exc.code().name}"))
            except asyncio.TimeoutError:
                call.cancel()
                error = Unavailable(f"{address}: sent nothing for {SILENCE_SECONDS:.0f}s")
            shutil.rmtree(dest, ignore_errors=True)  # the next attempt starts afresh
            raise error

        return await self._retrying(partition, pb.LINEARIZABLE, False, f"checkpoint of partition {partition}", at)

    async def checkpoint_files(self, partition: int, dest: Path,
                               choose: Callable[[list[ListedFile]], list[str]]) -> tuple[Position, list[ListedFile]]:
        """`checkpoint`'s, for a backup: the leader lists the checkpoint's files first, `choose` (run in a
        thread: it may wait on storage) names the ones to fetch, and only those are written to `dest`.
        The position, and every file of the checkpoint. Tried again as `checkpoint` is."""

        async def at(address: str) -> tuple[Position, list[ListedFile]]:
            call = self.admin(address).CheckpointFiles()
            try:
                request = pb.ReplicaRequest(group=partition, linearizable=True)
                await call.write(pb.CheckpointFilesRequest(replica=request))
                first = await asyncio.wait_for(call.read(), SILENCE_SECONDS)
                if first is grpc.aio.EOF:
                    raise Unavailable(f"{address}: the checkpoint's listing never came")
                listed = [ListedFile(f.path, f.size, f.sha256) for f in first.files]
                try:
                    wanted = await asyncio.to_thread(choose, listed)
                except RaftKVError as exc:  # the caller's (its storage): not a reason to ask another node
                    raise _ChoiceFailed(exc) from exc
                await call.write(pb.CheckpointFilesRequest(paths=wanted))
                await call.done_writing()
                dest.mkdir(parents=True, exist_ok=True)
                await receive_files(call, dest, lambda n: None)
                _check_received(dest, listed, wanted)
                return Position(first.index, first.term), listed
            except grpc.aio.AioRpcError as exc:  # FAILED_PRECONDITION: no voter of the partition there
                error = (error_of(exc, partition) or refusal_error(exc) or _too_old(exc, address)
                         or Unavailable(f"{address}: {exc.details() or exc.code().name}"))
            except asyncio.TimeoutError:
                error = Unavailable(f"{address}: sent nothing for {SILENCE_SECONDS:.0f}s")
            except CorruptData as exc:
                error = exc
            except BaseException:
                call.cancel()
                raise
            call.cancel()
            shutil.rmtree(dest, ignore_errors=True)  # the next attempt starts afresh
            raise error

        try:
            return await self._retrying(partition, pb.LINEARIZABLE, False, f"checkpoint of partition {partition}", at)
        except _ChoiceFailed as failed:
            raise failed.error from None

    async def scan_partition(self, partition: int, request: pb.ScanRequest) -> AsyncIterator[pb.ScanChunk]:
        """Chunks of one partition's scan, all from one view; retried only before the first chunk."""

        async def at(address: str) -> tuple[str, grpc.aio.UnaryStreamCall, pb.ScanChunk]:
            call = self.stub(address).Scan(request, timeout=None)
            try:
                return address, call, await call.read()
            except grpc.aio.AioRpcError as exc:
                raise error_of(exc, partition) or refusal_error(exc) or Unavailable(f"{address}: {exc.details()}") from None
            except BaseException:
                call.cancel()  # this attempt is given up (a deadline): its call must not outlive it
                raise

        address, call, chunk = await self._retrying(partition, request.consistency, False,
                                                    f"scan of partition {partition}", at)
        try:
            while chunk is not grpc.aio.EOF:
                yield chunk
                try:
                    chunk = await call.read()
                except grpc.aio.AioRpcError as exc:
                    raise Unavailable(f"scan of partition {partition} broke off at {address}: {exc.details()}") from None
        finally:
            # A caller that stopped early, or a stream that broke: a call left open outlives the loop it
            # belongs to, and gRPC's poller then calls into that closed loop (the chaos bank workload).
            call.cancel()


class _ChoiceFailed(Exception):
    """`checkpoint_files`' chooser failed: raised past the retry loop, which would ask the other nodes."""

    def __init__(self, error: RaftKVError):
        super().__init__(str(error))
        self.error = error


def _too_old(exc: grpc.aio.AioRpcError, address: str) -> RaftKVError | None:
    if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
        return None
    return InvalidRequest(f"{address} runs a release without Admin.CheckpointFiles: upgrade the nodes first")


def _check_received(dest: Path, listed: list[ListedFile], wanted: list[str]) -> None:
    """Every file asked for arrived whole (a listing and its files come from one checkpoint)."""
    sizes = {f.path: f.size for f in listed}
    for name in wanted:
        local = dest / name
        if name not in sizes or not local.is_file() or local.stat().st_size != sizes[name]:
            raise CorruptData(f"the checkpoint's {name} did not arrive whole")
