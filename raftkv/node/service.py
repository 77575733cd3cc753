"""The gRPC API of a node: route each operation to its partition, forward
what this node does not lead, and answer with one result per operation."""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from collections import defaultdict
from contextlib import asynccontextmanager
from itertools import accumulate, islice
from typing import AsyncIterator, Callable, Mapping

import grpc

from raftkv.core import metrics
from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.api.malformed import RejectMalformed
from raftkv.api.rpc_errors import error_metadata, never_sent
from raftkv.api.convert import command_from_op, result_from_error, result_from_write
from raftkv.core.commands import Command, Limits
from raftkv.storage.engine import KeyRange
from raftkv.core.errors import (InvalidRequest, NotLeader, PermissionDenied, RaftKVError, ResourceExhausted,
                                Unauthenticated, Unavailable, Undetermined)
from raftkv.meta.records import ClusterMeta, NodeState
from raftkv.node.client_limits import ClientLimits, ClientLoad, client_of
from raftkv.node.execute_stream import answer_stream
from raftkv.node.gatekeeper import Gatekeeper, op_requests
from raftkv.node.peers import Peers, answer_once_connected
from raftkv.node.ports import Proposals, ReadPort
from raftkv.raft.group import Role
from raftkv.core.release import VERSION
from raftkv.core.spec import ClusterSpec
from raftkv.security.permissions import Access, Identity, Request

log = logging.getLogger(__name__)

SCAN_CHUNK_ITEMS = 1024
SCAN_CHUNK_BYTES = 1 << 20
COLUMNS_CHUNK_BYTES = 4 << 20  # one Arrow batch in Spark: bigger is cheaper per row there
_SCAN_CODES = {NotLeader: grpc.StatusCode.FAILED_PRECONDITION, InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT}
_REFUSAL_CODES = {Unauthenticated: grpc.StatusCode.UNAUTHENTICATED, ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED}


GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]


def api_server() -> grpc.aio.Server:
    """The gRPC server of a node's or a learner's API (not yet listening)."""
    return grpc.aio.server(options=GRPC_OPTIONS, interceptors=[RejectMalformed()])


class KVService(kv_pb2_grpc.KVServicer):
    """`proposals`: the partitions this node holds a voter of; `reads`: the read path."""

    def __init__(
        self,
        spec: ClusterSpec,
        node_id: str,
        proposals: Mapping[int, Proposals],
        reads: ReadPort,
        topology: Callable[[], ClusterMeta],
        peers: Peers,
        gate: Gatekeeper,
    ):
        self._spec = spec
        self._gate = gate
        self._node_id = node_id
        self._proposals = proposals
        self._reads = reads
        self._topology = topology
        self._limits = Limits(spec.max_key_bytes, spec.max_value_bytes, 2 * spec.tuning.max_batch_bytes)
        self._timeout = spec.tuning.request_timeout
        self._peers = peers
        tuning = spec.tuning
        self._load = ClientLoad(ClientLimits(tuning.max_calls_per_client, tuning.max_scans_per_client,
                                             tuning.max_writes_per_client), node_id)
        self._stopping = asyncio.Event()

    def end_streams(self) -> None:
        """Read no more requests on the ExecuteStreams: each ends once it answered what it read (the server's
        grace on stopping would otherwise wait for the clients' streams, which never end on their own)."""
        self._stopping.set()

    def _replicas_of(self, partition: int) -> tuple[str, ...]:
        return self._topology().placement[partition]

    # -- Execute ----------------------------------------------------------

    async def Execute(self, request: pb.ExecuteRequest, context) -> pb.ExecuteResponse:
        try:
            return await self._serve(request, context)
        except (Unauthenticated, ResourceExhausted) as error:
            await context.abort(_REFUSAL_CODES[type(error)], str(error), trailing_metadata=error_metadata(error))

    async def ExecuteStream(self, requests: AsyncIterator[pb.ExecuteRequest], context):
        """Execute's requests on one stream, each answered with its id once done (raftkv.node.execute_stream)."""
        async for response in answer_stream(requests, context, lambda request: self._answer(request, context),
                                            self._stopping):
            yield response

    async def _answer(self, request: pb.ExecuteRequest, context) -> pb.ExecuteResponse:
        """A request of the stream: a refusal answers this request alone, where Execute would end its call."""
        try:
            response = await self._serve(request, context)
        except (Unauthenticated, ResourceExhausted) as error:
            response = pb.ExecuteResponse(refused=result_from_error(error))
        response.id = request.id
        return response

    async def _serve(self, request: pb.ExecuteRequest, context) -> pb.ExecuteResponse:
        """One Execute request, whichever method brought it: counted, timed, its caller identified and limited.
        A caller refused whole raises Unauthenticated or ResourceExhausted."""
        metrics.API_REQUESTS.inc()
        metrics.API_OPS.inc(len(request.ops))
        started = time.perf_counter()
        try:
            caller = self._gate.caller(context)
            client = client_of(caller, context.peer(), request.forwarded)
            with self._load.call(client):
                if client is None:  # not limited: no need to count its writes
                    return await self._execute(request, caller, client, len(request.ops))
                writes = self._load.take_writes(client, sum(op.WhichOneof("op") != "get" for op in request.ops))
                try:
                    return await self._execute(request, caller, client, writes)
                finally:
                    self._load.return_writes(client, writes)
        finally:
            if not request.forwarded:  # timed and counted where the client sent it
                metrics.REQUEST_SECONDS.observe(time.perf_counter() - started)

    async def _execute(self, request: pb.ExecuteRequest, caller: Identity, client: str | None,
                       writes: int) -> pb.ExecuteResponse:
        """`writes`: how many of the request's write operations the client's limit lets through."""
        results: list[pb.Result | None] = [None] * len(request.ops)
        waits: list[tuple[int, asyncio.Future | asyncio.Task]] = []
        forwards: dict[str, list[int]] = defaultdict(list)
        asked_writes = 0
        for i, op in enumerate(request.ops):
            try:
                command = self._validated(op)
                if command is not None:
                    asked_writes += 1
                    if writes == 0:
                        raise self._load.refusal(client)
                    writes -= 1
                self._permit(caller, op, command)
                target = self._target(op, request)
                if target is None:
                    waits.append((i, self._local(op, command, request.consistency)))
                else:
                    forwards[target].append(i)
            except RaftKVError as error:
                results[i] = result_from_error(error)
        if not request.forwarded:
            metrics.CLIENT_WRITES.inc(asked_writes)
            metrics.CLIENT_READS.inc(len(request.ops) - asked_writes)
        for node_id, indexes in forwards.items():
            waits.append((indexes, asyncio.ensure_future(self._forward(node_id, request, indexes))))
        for where, fut in waits:
            try:
                value = await fut
            except RaftKVError as error:
                value = result_from_error(error)
            if isinstance(where, list):
                for i, r in zip(where, value):
                    results[i] = r
            else:
                results[where] = value
        return pb.ExecuteResponse(results=results)

    @asynccontextmanager
    async def _counted(self, client: str | None, context, scan: bool = False) -> AsyncIterator[None]:
        """One more call of `client` open on this node for the block, or the call ends here."""
        try:
            self._load.open(client, scan)
        except ResourceExhausted as error:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error),
                                trailing_metadata=error_metadata(error))
        try:
            yield
        finally:
            self._load.close(client, scan)

    def _validated(self, op: pb.Op) -> Command | None:
        """The write command an op carries (None for a read), checked where the op arrives: a bad op is
        INVALID on every node, not UNAVAILABLE on one that would have forwarded it during an election."""
        if op.WhichOneof("op") == "get":
            if not op.get.key:
                raise InvalidRequest("key must not be empty")
            return None
        return command_from_op(op, self._spec.partitions, self._limits)

    def _permit(self, caller: Identity, op: pb.Op, command: Command | None) -> None:
        """Each operation on its own: the client coalesces its callers' unrelated operations into one request.
        Nodes (forwarding what they checked) and clusters without TLS are not checked."""
        if not self._gate.checks(caller):
            return
        why = self._gate.refusal(caller, op_requests(op, command))
        if why is not None:
            raise PermissionDenied(why)

    def _target(self, op: pb.Op, request: pb.ExecuteRequest) -> str | None:
        """None when this node serves the op, else the node to forward it to."""
        p = op.partition
        self._check_partition(p)
        voter = self._proposals.get(p)
        if op.WhichOneof("op") == "get":
            here = self._reads.serves(p, request.consistency)
        else:
            here = voter is not None and voter.is_leader
        if here:
            return None
        if request.forwarded:
            raise voter.not_leader() if voter else NotLeader(p, self._replicas_of(p)[0])
        leader = voter.not_leader().leader_hint if voter else None
        if leader is None or leader == self._node_id:
            if voter is None:
                return self._replicas_of(p)[0]  # a replica knows the leader and forwards once more if needed
            raise Unavailable(f"partition {p} has no leader right now (election in progress); retry")
        return leader

    def _check_partition(self, partition: int) -> None:
        if partition >= self._spec.partitions:
            raise InvalidRequest(f"partition {partition} does not exist; the cluster has {self._spec.partitions}")

    def _local(self, op: pb.Op, command: Command | None, consistency: int) -> asyncio.Future:
        if command is None:
            return asyncio.ensure_future(self._get(op.partition, op.get.key, consistency))
        return _chain(self._proposals[op.partition].submit(command), result_from_write)

    async def _get(self, partition: int, key: bytes, consistency: int) -> pb.Result:
        value, applied_index = await self._reads.get(partition, key, consistency)
        return pb.Result(found=value is not None, value=value or b"", applied_index=applied_index)

    async def _forward(self, node_id: str, request: pb.ExecuteRequest, indexes: list[int]) -> list[pb.Result]:
        forwarded = pb.ExecuteRequest(
            ops=[request.ops[i] for i in indexes], consistency=request.consistency, forwarded=True
        )
        try:
            response = await answer_once_connected(
                lambda left: self._peers.stub(node_id).Execute(forwarded, timeout=left), self._timeout)
            return list(response.results)
        except grpc.aio.AioRpcError as exc:
            sent, why = not never_sent(exc), f"{exc.code().name} {exc.details()}"
        except (Unavailable, Undetermined) as exc:  # this node is stopping: its channels are closed
            sent, why = isinstance(exc, Undetermined), str(exc)
        reads_only = all(request.ops[i].WhichOneof("op") == "get" for i in indexes)
        code = pb.UNDETERMINED if sent and not reads_only else pb.UNAVAILABLE
        return [pb.Result(code=code, message=f"forwarding to {node_id} failed: {why}")] * len(indexes)

    # -- Scan -------------------------------------------------------------

    async def Scan(self, request: pb.ScanRequest, context):
        async with self._range_read(request, context):
            async for chunk in self._scan(request, context):
                yield chunk

    @asynccontextmanager
    async def _range_read(self, request: pb.ScanRequest | pb.SplitKeysRequest, context) -> AsyncIterator[None]:
        """A scan or split whose caller may read its range, counted as one of the client's scans."""
        end = request.end if request.HasField("end") else None
        caller = await self._gate.admit(context, Request(Access.READ, request.start, end))
        async with self._counted(client_of(caller, context.peer(), forwarded=False), context, scan=True):
            yield

    async def _scan(self, request: pb.ScanRequest, context):
        p = request.partition
        key_range = KeyRange(request.start, request.end if request.HasField("end") else None, request.limit)
        try:
            self._check_partition(p)
            if not self._reads.holds(p):
                raise NotLeader(p, self._replicas_of(p)[0])
            applied, items = await self._reads.scan(p, key_range, request.consistency)
        except RaftKVError as error:  # a damaged block or the node stopping as well: another replica may serve
            await context.abort(_SCAN_CODES.get(type(error), grpc.StatusCode.UNAVAILABLE), str(error),
                                trailing_metadata=error_metadata(error))
        next_chunk = _next_columns if request.columnar else _next_chunk
        sent_any = False
        try:
            while chunk := await asyncio.to_thread(next_chunk, items, applied.index):
                sent_any = True
                chunk.applied_term = applied.term
                yield chunk
        except RaftKVError as error:  # a damaged block (the node stops) or the node stopping: another replica may serve
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(error), trailing_metadata=error_metadata(error))
        if not sent_any:  # an empty range still reports its position
            yield pb.ScanChunk(applied_index=applied.index, applied_term=applied.term)

    async def SplitKeys(self, request: pb.SplitKeysRequest, context) -> pb.SplitKeysResponse:
        async with self._range_read(request, context):
            return await self._split_keys(request, context)

    async def _split_keys(self, request: pb.SplitKeysRequest, context) -> pb.SplitKeysResponse:
        if not self._reads.holds(request.partition) or request.every < 1:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"partition {request.partition} is not hosted here, or every < 1")
        key_range = KeyRange(request.start, request.end if request.HasField("end") else None)
        every = request.every
        try:  # split keys are only boundaries: any replica's will do
            _, items = await self._reads.scan(request.partition, key_range, pb.FOLLOWER)
            keys = await asyncio.to_thread(lambda: [key for key, _ in islice(items, every, None, every)])
        except RaftKVError as error:  # as in a scan
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(error), trailing_metadata=error_metadata(error))
        return pb.SplitKeysResponse(keys=keys)

    # -- Status -----------------------------------------------------------

    async def Status(self, request: pb.StatusRequest, context) -> pb.StatusResponse:
        learners: list[str] = []
        try:
            if request.brief:  # the metadata leader's poll, every round: at 1,024 partitions the full
                # answer is about 90 KB, and 6 ms of CPU to build
                hosted = [pb.PartitionStatus(partition=p, role=Role.LEADER.label, term=term)
                          for p, term in self._reads.leaderships()]
                learners = sorted(self._reads.learner_names())
            else:
                hosted = self._hosted()
        except RaftKVError as error:  # a replica closed under the call (the node stops), or damaged
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(error))
        return pb.StatusResponse(
            node_id=self._node_id,
            cluster=self._spec.name,
            partitions=self._spec.partitions,
            nodes=[pb.NodeInfo(id=n.id, api_address=n.api_address) for n in self._topology().nodes
                   if n.state != NodeState.REMOVED],
            hosted=hosted,
            meta_epoch=self._topology().epoch,
            version=VERSION,
            learners=learners,
        )

    def _hosted(self) -> list[pb.PartitionStatus]:
        return [
            pb.PartitionStatus(
                partition=s.partition, role=s.role, leader=s.leader, term=s.term, commit_index=s.commit_index,
                applied_index=s.applied_index, last_log_index=s.last_log_index, replicas=self._replicas_of(s.partition),
                has_quorum=s.has_quorum, last_data_index=s.last_data_index, members=s.members,
                learners=[pb.LearnerStatus(name=i.name, sink=i.sink, options=i.options, progress=i.progress)
                          for i in s.learners])
            for s in self._reads.statuses()
        ]


def _next_chunk(items, applied_index: int) -> pb.ScanChunk | None:
    chunk, size = [], 0
    for key, value in items:
        chunk.append(pb.KeyValue(key=key, value=value))
        size += len(key) + len(value)
        if len(chunk) >= SCAN_CHUNK_ITEMS or size >= SCAN_CHUNK_BYTES:
            break
    return pb.ScanChunk(items=chunk, applied_index=applied_index) if chunk else None


def _next_columns(items, applied_index: int) -> pb.ScanChunk | None:
    keys: list[bytes] = []
    values: list[bytes] = []
    size = 0
    for key, value in items:
        keys.append(key)
        values.append(value)
        size += len(key) + len(value)
        if size >= COLUMNS_CHUNK_BYTES:
            break
    if not keys:
        return None
    columns = pb.Columns(count=len(keys), keys=b"".join(keys), key_offsets=_offsets(keys),
                         values=b"".join(values), value_offsets=_offsets(values))
    return pb.ScanChunk(applied_index=applied_index, columns=columns)


def _offsets(items: list[bytes]) -> bytes:
    return array("i", accumulate(map(len, items), initial=0)).tobytes()


def _chain(future: asyncio.Future, convert: Callable) -> asyncio.Future:
    """A future resolving to convert(result) of `future`, without a coroutine per operation."""
    out = future.get_loop().create_future()

    def done(f: asyncio.Future) -> None:
        error = f.exception()  # read even when nobody waits any more: asyncio logs an error never read
        if out.done():  # the request was cancelled (its client gave up)
            return
        if error is not None:
            out.set_exception(error)
        else:
            out.set_result(convert(f.result()))

    future.add_done_callback(done)
    return out
