"""A node process: the replicas this node hosts, the gRPC API and metrics.

Everything runs on one asyncio loop (the main thread): the gRPC API, group
commit, and every replica's Raft ticks (see `raftkv.raft.syncobj_loop`). Only gRPC's
and RocksDB's own threads run beside it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket

import grpc

from raftkv.core import metrics
from raftkv.api import kv_pb2_grpc
from raftkv.core.errors import ConfigError, RaftKVError
from raftkv.node.group_commit import PartitionFrontend
from raftkv.core.partitioning import partitions_hosted_by, replicas_for
from raftkv.node.service import KVService
from raftkv.core.spec import ClusterSpec
from raftkv.node.replica import PartitionReplica
from raftkv.raft.group import AddressInUse, Role
from raftkv.raft.syncobj_group import GroupConfig, SyncObjGroup

log = logging.getLogger(__name__)

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]


class Node:
    def __init__(self, spec: ClusterSpec, node_id: str):
        self.spec = spec
        self.me = spec.node(node_id)
        self.hosted = partitions_hosted_by(node_id, spec.node_ids, spec.partitions, spec.replication)
        self.frontends: dict[int, PartitionFrontend] = {}
        self._server: grpc.aio.Server | None = None
        self._service: KVService | None = None
        self.failure: asyncio.Future | None = None  # set to the error that must stop the node (corrupt data)

    def replicas_of(self, partition: int) -> tuple[str, ...]:
        return replicas_for(partition, self.spec.node_ids, self.spec.replication)

    def _check_ports(self) -> None:
        """Fail fast, with the port's name, before anything starts."""
        ports = [("api_port", self.me.api_port), ("metrics_port", self.me.metrics_port)]
        ports += [(f"raft port of partition {p}", self.me.raft_port_base + p) for p in self.hosted]
        for name, port in ports:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((self.me.host, port))
                except OSError as exc:
                    raise ConfigError(
                        f"cannot listen on {self.me.host}:{port} ({name}): {exc.strerror}; "
                        "is another node or program using it?",
                        source=f"node {self.me.id}",
                    ) from None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.failure = loop.create_future()
        self._check_ports()
        self._server = grpc.aio.server(options=GRPC_OPTIONS)
        self._server.add_insecure_port(self.me.api_address)
        for p in self.hosted:
            self.frontends[p] = self._start_partition(p, loop)
        self._service = KVService(self.spec, self.me.id, self.frontends, self.replicas_of)
        kv_pb2_grpc.add_KVServicer_to_server(self._service, self._server)
        try:
            metrics.serve(self.me.host, self.me.metrics_port)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on port {self.me.metrics_port}: {exc.strerror}",
                              source=f"node {self.me.id} metrics_port") from None
        await self._server.start()
        loop.create_task(self._housekeeping())
        log.info("node %s serving %s; partitions %s", self.me.id, self.me.api_address, self.hosted)

    def _start_partition(self, p: int, loop: asyncio.AbstractEventLoop) -> PartitionFrontend:
        metrics.init_partition(p)
        by_address = {n.raft_address(p): n.id for n in self.spec.nodes}
        peers = [self.spec.node(i).raft_address(p) for i in self.replicas_of(p) if i != self.me.id]
        frontend: PartitionFrontend | None = None

        def on_role_changed(old: Role, new: Role) -> None:  # inside a tick, on the loop
            metrics.LEADER_CHANGES.labels(p).inc()
            metrics.IS_LEADER.labels(p).set(1 if new == Role.LEADER else 0)
            if old == Role.LEADER and frontend is not None:
                loop.call_soon(frontend.on_leadership_lost)

        folder = self.me.data_dir / f"p{p:04d}"
        config = GroupConfig(
            partition=p,
            self_address=self.me.raft_address(p),
            peers=tuple(peers),
            folder=folder,
            fsync=self.spec.durability == "fsync",
            tuning=self.spec.tuning,
            on_role_changed=on_role_changed,
        )
        try:
            replica = PartitionReplica(
                p, folder, self.spec.tuning,
                open_group=lambda state_machine: SyncObjGroup(config, state_machine, loop),
                on_corrupt=lambda error: loop.call_soon_threadsafe(self._fail, error),
            )
        except AddressInUse:
            raise ConfigError(
                f"cannot listen on {self.me.raft_address(p)} (Raft port of partition {p}): the port is in use",
                source=f"node {self.me.id} raft_port_base",
            ) from None
        except RaftKVError:
            raise
        except Exception as exc:
            if "/LOCK:" in str(exc):  # RocksDB's lock file (not "block checksum mismatch")
                raise ConfigError(
                    f"{self.me.data_dir} is in use by another process (is node {self.me.id} already running?)",
                    source=f"node {self.me.id}",
                ) from None
            raise
        frontend = PartitionFrontend(
            replica,
            loop,
            max_batch_ops=self.spec.tuning.max_batch_ops,
            max_batch_bytes=self.spec.tuning.max_batch_bytes,
            request_timeout=self.spec.tuning.request_timeout,
            leader_id_of=lambda address: by_address.get(address),
        )
        return frontend

    def _fail(self, error: Exception) -> None:
        """Stop serving: a replica ran into corrupt data, and nothing it holds can be trusted now."""
        if not self.failure.done():
            log.error("stopping: %s", error)
            self.failure.set_exception(error)

    async def _housekeeping(self) -> None:
        """Once a second: log compaction when due, and the gauges."""
        while True:
            for p, frontend in self.frontends.items():
                r = frontend.replica
                try:
                    r.maybe_compact()
                except Exception:  # one partition's trouble (a full disk) must not stop the others' compaction
                    log.exception("partition %d: housekeeping failed", p)
                metrics.TERM.labels(p).set(r.group.term)
                metrics.COMMIT_INDEX.labels(p).set(r.group.commit_index)
                metrics.APPLIED_INDEX.labels(p).set(r.applied_index)
            await asyncio.sleep(1.0)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=1.0)
        if self._service is not None:
            await self._service.close()
        for frontend in self.frontends.values():
            frontend.replica.close()


async def serve(spec: ClusterSpec, node_id: str) -> None:
    """Run a node until SIGTERM or SIGINT."""
    node = Node(spec, node_id)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    failure = None
    try:
        await node.start()
        print(f"raftkv node {node_id} ready on {node.me.api_address}", flush=True)
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([stopped, node.failure], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
    finally:
        if node.failure is not None and node.failure.done():
            failure = node.failure.exception()  # retrieved also when start() raised it itself
        try:
            await node.stop()
        except Exception:
            if failure is None:
                raise
            # closing a damaged database can fail too; the reason to stop is what the operator needs
            log.exception("while stopping after: %s", failure)
    if failure is not None:
        raise failure
