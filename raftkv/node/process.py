"""A node process: its start and stop, the gRPC API and metrics, and its duties on the cluster
metadata. The partition replicas it hosts are `hosted_replicas.HostedReplicas`.

Everything runs on one asyncio loop (the main thread): the gRPC API, group commit, and every replica's
Raft ticks (see `raftkv.raft.syncobj_loop`). Only gRPC's and RocksDB's own threads run beside it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.core import metrics
from raftkv.core.errors import ConfigError, CorruptData, RaftKVError, SnapshotContradiction, Unavailable
from raftkv.core.spec import ClusterSpec
from raftkv.core.spec_toml import spec_to_toml
from raftkv.meta.bootstrap import bootstrap_command, spec_meta
from raftkv.meta.cluster_version import ENGINE_REST_SINCE, NODE_ENGINE_SINCE, at_least
from raftkv.meta.records import (META, ClusterMeta, MetaCommand, MoveStep, NodeState, SetNodeState,
                                 encode_command, raft_directory)
from raftkv.meta.state_machine import stored_meta
from raftkv.meta.wire import topology_of
from raftkv.console.service import Console
from raftkv.node.admin_service import AdminService
from raftkv.node.console_host import console_url, start_console
from raftkv.node.gatekeeper import Gatekeeper
from raftkv.node.hosted_replicas import HostedReplicas, opening, replica_folders
from raftkv.node.lost_data import LostData
from raftkv.node.meta_replica import MetaReplica
from raftkv.node.mover import RPC_TIMEOUT, ReplicaMover
from raftkv.node.peer_stops import PeerStops, tell_others
from raftkv.node.peers import Peers, answer
from raftkv.node.preflight import check_ports, check_release
from raftkv.node.reads import LocalReads
from raftkv.node.rebalancer import Rebalancer
from raftkv.node.replica_admin import ReplicaAdmin
from raftkv.node.backup_seed import BackupCatalog
from raftkv.node.closing import close_reporting
from raftkv.node.service import KVService, api_server
from raftkv.node.tasks import background
from raftkv.raft.engine.node_engine import NodeEngine
from raftkv.raft.hub import Directory, RaftHub
from raftkv.raft.log_turn import LogTurn
from raftkv.raft.replica_logs import META_GROUP, ReplicaLogs
from raftkv.raft.syncobj_group import GroupConfig, SyncObjGroup
from raftkv.security.tls import listen, node_tls
from raftkv.storage import rocks_memory
from raftkv.storage.rocks_engine import RocksEngine

log = logging.getLogger(__name__)

LEADERLESS_ASK_SECONDS = 5  # a metadata group with no leader for this long: ask the members (`_ask_members`)

class Node:
    """`initial` is the topology until this node's copy of the metadata has one: the spec's for a
    node of the spec, the one its join was answered with for a node that joined. The node is the
    `ports.TopologyPort` of its services."""

    def __init__(self, spec: ClusterSpec, node_id: str, initial: ClusterMeta | None = None):
        self.spec = spec
        self.me = spec.node(node_id)
        self.me_id = node_id
        self.spec_toml = spec_to_toml(spec)
        self._initial = initial or spec_meta(spec)
        self._told = ClusterMeta()  # a newer topology than this node's copy, from a member (`_ask_members`)
        self.meta: MetaReplica | None = None
        self.tls = node_tls(spec, node_id)
        self.peers = Peers(self.address_of, self.tls)
        self.hub: RaftHub | None = None  # every replica's Raft messages, made in `start`
        self.logs: ReplicaLogs | None = None  # ... and their Raft logs
        self.lost_data = LostData(self.me.data_dir, node_id, self.peers, lambda: self.topology, self._fail)
        self.gate = Gatekeeper(enforce=spec.tls is not None, meta=lambda: self.topology)
        self._directory = (None, Directory())  # (the nodes it was made from, the hub's directory of them)
        self.mover = ReplicaMover(lambda: self.meta, lambda: self.topology, self.peers, spec.tuning.move_timeout)
        self.rebalancer = Rebalancer(spec.tuning, lambda: self.topology, self.peers, self.change_topology)
        self.removed = asyncio.Event()  # the metadata says this node is removed: the process exits
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task] = []
        self._bootstrapping = False
        self._next_rebalance = 0.0
        self._leaderless = 0  # seconds this node's metadata group has known no leader
        self._server: grpc.aio.Server | None = None
        self._kv: KVService | None = None
        self.console: Console | None = None  # the web console on the metrics port, made in `start`
        self.peer_stops = PeerStops(lambda *event: self.console.record(*event) if self.console else None)
        self.failure: asyncio.Future | None = None  # set to the error that must stop the node (corrupt data)
        self.backups = BackupCatalog(spec.backup, lambda: self.topology.cluster_id) if spec.backup else None
        self.replicas = HostedReplicas(spec, node_id, lambda: self.topology, self.peers, self.lost_data, self.backups,
                                       self.node_at, self._corrupt, self._on_meta_change)

    # -- topology ---------------------------------------------------------

    @property
    def topology(self) -> ClusterMeta:
        """The newest topology this node knows: its copy of the metadata, or a newer one a member
        told it (`_ask_members`), or the initial one until it has either."""
        meta = self.meta.meta if self.meta is not None else ClusterMeta()
        return max((meta, self._told), key=lambda m: m.epoch) if meta.epoch or self._told.epoch else self._initial

    def directory(self) -> Directory:
        nodes = self.topology.nodes
        if nodes is not self._directory[0] and nodes != self._directory[0]:
            self._directory = (nodes, raft_directory(nodes, self.spec.partitions))
        return self._directory[1]

    def address_of(self, node_id: str) -> str:
        return self.topology.node(node_id).api_address

    def node_at(self, group: int, raft_address: str | None) -> str | None:
        """The node whose Raft address for `group` this is."""
        return next((n.id for n in self.topology.nodes if n.raft_address(group) == raft_address), None)

    def meta_leader_id(self) -> str | None:
        return self.node_at(META, self.meta.leader_address) if self.meta is not None else None

    async def change_topology(self, command: MetaCommand) -> ClusterMeta:
        """Apply a metadata command on the metadata leader: here, or forwarded to it."""
        if self.meta.is_leader:
            return await self.meta.propose(command)
        leader = self.meta_leader_id()
        if leader is None or leader == self.me_id:
            raise Unavailable("the metadata group has no leader right now; retry")
        reply = await answer(self.peers.admin(leader).ChangeTopology(
            pb.ChangeTopologyRequest(command=encode_command(command)), timeout=RPC_TIMEOUT))
        return topology_of(reply).meta

    # -- start and stop ---------------------------------------------------

    async def start(self) -> None:
        if self.tls is not None:
            self.tls.check()
        loop = self._loop = asyncio.get_running_loop()
        self.failure = loop.create_future()
        rocks_memory.configure(self.spec.tuning.rocksdb_block_cache_mb, self.spec.tuning.rocksdb_memtables_mb)
        # Every port of the node's block, partitions it does not hold included: any may move here.
        check_ports(self.me.host, [("api_port", self.me.api_port), ("metrics_port", self.me.metrics_port)]
                    + [(f"raft port of partition {p}", self.me.raft_port_base + p) for p in range(self.spec.partitions)]
                    + [("metadata raft port", self.me.meta_port(self.spec.partitions))], self.me.id)
        tuning = self.spec.tuning
        self.hub = RaftHub(loop, self.me_id, self.directory, self.tls, retry_seconds=tuning.connection_retry_seconds,
                           dead_after=max(3.5, tuning.election_timeout_max), compression=tuning.wire_compression)
        # settled partitions through the node engine (docs/raft-engine.md); "auto": once every member has it
        self.hub.engine = None if self.me.raft_engine == "off" else NodeEngine(
            loop, self.hub, tuning, self.hub.flush_soon, offering=self.me.raft_engine == "steady", rests=False)
        metrics.ENGINE_ON.set(1 if self.hub.engine is not None and self.hub.engine.offering else 0)
        try:
            self.hub.listen(self.me.host, self.me.raft_port_base)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {self.me.host}:{self.me.raft_port_base} (Raft): {exc.strerror}",
                              source=f"node {self.me.id}") from None
        self.hub.start()
        self.logs = self._open_logs()
        LogTurn(self.logs.log, self.hub, self.logs.fsync, self._corrupt)  # one write and fsync a turn
        await self.lost_data.look()
        self.meta = self._open_meta()
        check_release(self.topology.cluster_version, self.me.id)  # as this node last knew it, then as it is
        if not await self._metadata_caught_up(timeout=5.0):
            await self._ask_members()
        check_release(self.topology.cluster_version, self.me.id)
        self._server = api_server()
        listen(self._server, self.me.api_address, self.tls)
        self.replicas.start(loop, self.hub, self.logs)
        self._reconcile(at_start=True)
        voters = self.replicas.frontends
        self._kv = KVService(self.spec, self.me.id, voters, LocalReads(voters), lambda: self.topology, self.peers,
                             self.gate)
        kv_pb2_grpc.add_KVServicer_to_server(self._kv, self._server)
        replica_admin = ReplicaAdmin(self.me_id, self.replicas, lambda: self.meta, lambda: self.topology)
        kv_pb2_grpc.add_AdminServicer_to_server(
            AdminService(self.me_id, self.spec_toml, self.gate, self, voters, replica_admin,
                         report=lambda: self.console.report(), stops=self.peer_stops), self._server)
        self.console = start_console(self)
        await self._server.start()
        self._tasks += [background(self._housekeeping(), "housekeeping"),
                        background(self._metadata_loop(), "metadata duties"),
                        background(self.console.run(), "console sampling")]
        self.lost_data.remember()
        if self.backups is not None:
            self._tasks.append(background(self.backups.watch(self.spec.tuning.backup_poll_seconds), "backup watch"))
        log.info("node %s serving %s; partitions %s", self.me.id, self.me.api_address, sorted(self.replicas.frontends))

    async def _metadata_caught_up(self, timeout: float) -> bool:
        """Until this node's copy of the metadata has what its group's leader committed (bounded: when the
        whole cluster starts, the group elects no leader before enough nodes are up). A node that was
        away must not open replicas that were moved off it meanwhile, and serve reads from them; nor
        open the others with the voters of its old copy: a voter that knows neither the leader nor any
        member that would connect to it waits alone until its elections disrupt the group.

        Its own commit index would not do: a copy that missed entries, or a wiped one, has applied
        all it knows to be committed before the leader's first message is even accepted."""
        deadline = time.monotonic() + timeout
        group = self.meta.group
        while time.monotonic() < deadline:
            committed = group.leader_commit_index
            if group.leader is not None and committed and group.last_applied >= committed:
                return True
            await asyncio.sleep(0.05)
        log.info("metadata not caught up after %.0fs (epoch %d here)", timeout, self.topology.epoch)
        return False

    async def _ask_members(self) -> None:
        """This node's metadata group has no leader: ask the other nodes for the topology. A newer one
        is used until this node's copy catches up; if it no longer counts this node among the metadata
        group's voters (removed while it was away: Raft does not tell), it rejoins the group as a learner."""
        others = [n for n in self.topology.members if n != self.me_id]
        replies = await asyncio.gather(*(self.peers.admin(n).Topology(pb.TopologyRequest(), timeout=2.0)
                                         for n in others), return_exceptions=True)
        newest = max((topology_of(r).meta for r in replies if isinstance(r, pb.TopologyResponse)),
                     key=lambda m: m.epoch, default=ClusterMeta())
        if newest.epoch <= self.topology.epoch:
            return
        log.info("a member knows a newer topology (epoch %d, this node's copy %d): using it", newest.epoch,
                 self.topology.epoch)
        self._told = newest
        if self.meta.voting and self.me_id not in newest.group_voters(META):
            self.meta.close()
            self.meta = self._open_meta(voting=False)
            log.info("metadata group: no longer a voter (removed while away); following it as a learner")

    def _open_logs(self) -> ReplicaLogs:
        """The node's Raft log of every group, its replica folders settled with it (replica_logs)."""
        logs = ReplicaLogs(self.me.data_dir / "raft-log", fsync=self.spec.durability == "fsync")
        folders = {META_GROUP: self._meta_folder} if self._meta_folder.is_dir() else {}
        logs.settle(folders | replica_folders(self.me.data_dir))
        return logs

    @property
    def _meta_folder(self):
        return self.me.meta_dir

    def _open_meta(self, voting: bool | None = None) -> MetaReplica:
        """This node's metadata replica; `voting` None (at start): a voter if its own copy of the metadata
        says so. The topology a node starts from (the spec's, or what it was told when it joined) does not
        count the nodes that joined the group since: opened as learners, a cluster restarted whole had too
        few voters to elect a metadata leader until every node's wait for it ran out (5 s), and no
        partition served meanwhile (docs/chaos.md, the lose-last-second hour of seed 1880499211)."""
        loop = self._loop
        with opening(self.me):
            engine = RocksEngine(self._meta_folder)
        topology = self.topology
        if voting is None:
            stored = stored_meta(engine)
            topology = stored if stored.epoch > topology.epoch else topology
            voting = self.me_id in topology.group_voters(META)
        config = GroupConfig(
            partition=META,
            hub=self.hub,
            self_address=topology.node(self.me_id).raft_address(META) if voting else None,
            peers=tuple(topology.node(n).raft_address(META) for n in topology.group_voters(META) if n != self.me_id),
            folder=self._meta_folder,
            fsync=self.spec.durability == "fsync",
            tuning=self.spec.tuning,
            membership_changes=True,
            on_corrupt=self._corrupt,
            guard=self.lost_data.guard(META, self._meta_folder) if voting else None,
            node_log=self.logs,
            new_cluster=not topology.epoch,
        )
        with opening(self.me):
            return MetaReplica(engine, lambda sm: SyncObjGroup(config, sm, loop),
                               on_change=lambda _meta: loop.call_soon(self._on_meta_change), voting=voting)

    def _on_meta_change(self) -> None:
        if self._server is None:  # still starting: `start` opens the replicas once its ports are checked
            return
        self.lost_data.remember()
        engine = self.hub.engine
        if engine is not None and not engine.offering and at_least(self.topology.cluster_version, NODE_ENGINE_SINCE):
            engine.offering = True
            metrics.ENGINE_ON.set(1)
            log.info("the node engine drives settled partitions: every member runs it (cluster version %s)",
                     self.topology.cluster_version)
        if engine is not None and not engine.rests and at_least(self.topology.cluster_version, ENGINE_REST_SINCE):
            engine.rests = True
        try:
            self._reconcile()
        except RaftKVError as error:  # a port taken since: the next metadata change or second tries again
            log.error("%s", error)
        self.mover.poke()
        if self.topology.has_node(self.me_id) and self.topology.node(self.me_id).state == NodeState.REMOVED:
            self.removed.set()

    def _reconcile(self, at_start: bool = False) -> None:
        """Run the metadata group's replica and the partitions' as the metadata gives them to this node."""
        topology = self.topology
        meta_voter = self.meta.voting if self.meta is not None else None
        self.replicas.reconcile(topology, at_start, meta_voter, self._reopen_meta)
        self._name_members(topology)

    def _reopen_meta(self, voting: bool) -> None:
        """The same data, now as a voter of the metadata group, or no longer one."""
        self.meta.close()
        self.meta = self._open_meta(voting=voting)
        log.info("metadata group: now a %s here", "voter" if voting else "learner")

    def _name_members(self, topology: ClusterMeta) -> None:
        """Tell each replica its group's members as the metadata has them: a replica whose journal replays
        an old removal of a member that was added back since would otherwise never hear from it."""
        def addresses(group: int) -> frozenset[str]:
            return frozenset(topology.node(n).raft_address(group) for n in topology.linked_voters(group))

        replicas = [f.replica for f in self.replicas.frontends.values()] + list(self.replicas.learning.values())
        for replica in replicas + ([self.meta] if self.meta is not None else []):
            replica.group.name_members(addresses(replica.partition))

    def _corrupt(self, error: CorruptData) -> None:
        """From any thread: a replica's files cannot be trusted (a damaged block, a contradicting log), or a
        partition's replica holds entries a power cut of the whole cluster lost (it starts over)."""
        self._loop.call_soon_threadsafe(self._on_corrupt, error)

    def _on_corrupt(self, error: CorruptData) -> None:
        if isinstance(error, SnapshotContradiction):
            if self.replicas.start_over(error):
                return
            error = CorruptData(f"{error}; the metadata replica cannot start over while the node runs: stop the "
                                f"node, move {self._meta_folder} away and restart it so it re-syncs from its peers")
        self._fail(error)

    def _fail(self, error: Exception) -> None:
        """Stop serving: a replica ran into corrupt data, and nothing it holds can be trusted now."""
        if not self.failure.done():
            log.error("stopping: %s", error)
            if self.console is not None:
                self.console.record("storage", f"node {self.me_id}", f"stopped: {error}")
            self.failure.set_exception(error)

    async def _metadata_duties(self, now: float) -> None:
        """Once a second, at `now`. Every node: act on the metadata (again, for what a failed attempt left
        to do), and report itself up once it serves. The metadata leader: bootstrap the metadata from
        the spec, run the moves, and every `rebalance_interval` judge liveness and rebalance."""
        self._on_meta_change()
        if self.meta.leader_address is None:
            self._leaderless += 1
            if self._leaderless % LEADERLESS_ASK_SECONDS == 0:
                await self._ask_members()
        else:
            self._leaderless = 0
        topology = self.topology
        me = topology.node(self.me_id) if topology.has_node(self.me_id) else None
        if me is not None and me.state == NodeState.JOINING and topology.epoch:
            await self._ask(SetNodeState(self.me_id, NodeState.UP))
        if not self.meta.is_leader:
            self.rebalancer.forget()
            return
        if not self.meta.meta.epoch and not self._bootstrapping:
            self._bootstrapping = True
            try:
                await self.meta.propose(bootstrap_command(self.spec))
            finally:
                self._bootstrapping = False
        elif now >= self._next_rebalance:
            interval = self.spec.tuning.rebalance_interval
            self._next_rebalance = now + (interval or 1.0)
            await self.rebalancer.run_once(rebalance=interval > 0, now=now)

    async def _ask(self, command: MetaCommand) -> None:
        try:
            await self.change_topology(command)
        except (RaftKVError, grpc.aio.AioRpcError) as exc:  # asked again a second later
            log.info("metadata change %s: %s", type(command).__name__, exc)

    async def _metadata_loop(self) -> None:
        while True:
            try:
                await self._metadata_duties(time.monotonic())  # the one clock read of the node's duties
            except Unavailable as exc:  # the metadata leader changed under a proposal (the bootstrap's)
                log.info("metadata duties: %s", exc)
            except Exception:
                log.exception("metadata duties failed; trying again in a second")
            await asyncio.sleep(1.0)

    async def _housekeeping(self) -> None:
        """Once a second: log compaction when due, renewed TLS files taken up, and the gauges (set when they
        change: an idle node with a thousand partitions spent a tenth of its time looking up their labels)."""
        shown: dict[int, tuple[int, int, int]] = {}
        while True:
            now = time.monotonic()
            moving_in = {m.group for m in self.topology.moves if m.step == MoveStep.CATCHING_UP}
            for p, frontend in list(self.replicas.frontends.items()):
                r = frontend.replica
                try:
                    r.maybe_compact(now, moving_in=p in moving_in)
                except Exception:  # one partition's trouble (a full disk) must not stop the others' compaction
                    log.exception("partition %d: housekeeping failed", p)
                values = (r.group.term, r.group.commit_index, r.applied_index)
                if shown.get(p) != values:
                    shown[p] = values
                    for gauge, value in zip((metrics.TERM, metrics.COMMIT_INDEX, metrics.APPLIED_INDEX), values):
                        gauge.labels(p).set(value)
            self.peer_stops.forget_back(self.hub.is_up)
            if self.tls is not None:
                self.tls.refresh()
            await asyncio.sleep(1.0)

    async def stop(self) -> None:
        """Fail what the calls in flight wait on first (the replicas, the calls forwarded to peers), so
        that they answer within the server's grace: grpc logs a traceback for each one it cancels after
        it. Each part closes even if another could not (a failed disk fails them all)."""
        if self._kv is not None:
            self._kv.end_streams()
        for task in self._tasks:
            task.cancel()
        self.lost_data.stop()
        for copying in self.replicas.copying.values():
            copying.task.cancel()
        for p, frontend in self.replicas.frontends.items():
            close_reporting(f"partition {p}", frontend.close)
        for p, replica in self.replicas.learning.items():
            close_reporting(f"partition {p} (learning)", replica.close)
        await self.mover.close()
        await self.peers.close()
        if self.meta is not None:
            close_reporting("the metadata replica", self.meta.close)
        if self.logs is not None:
            close_reporting("the node's Raft log", self.logs.close)
        if self.hub is not None:
            await self.hub.close()
        if self._server is not None:  # last: a close on a failed disk can block the loop for a second
            await self._server.stop(grace=1.0)


async def serve(spec: ClusterSpec, node_id: str, initial: ClusterMeta | None = None) -> None:
    """Run a node until SIGTERM or SIGINT, or until the cluster removed it (decommissioned)."""
    node = Node(spec, node_id, initial)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await node.start()
        print(f"raftkv node {node_id} ready on {node.me.api_address}; console {console_url(node)}", flush=True)
        stopped = asyncio.ensure_future(stop.wait())
        removed = asyncio.ensure_future(node.removed.wait())
        await asyncio.wait([stopped, removed, node.failure], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        removed.cancel()
        if node.removed.is_set():
            print(f"raftkv node {node_id} was removed from the cluster (decommissioned); exiting. To bring it "
                  "back, start it with an empty --data-dir and --join", flush=True)
    finally:
        stopping = _failure(node) or _bad_storage(sys.exc_info()[1])
        if stopping is not None:
            await tell_others(node.peers, node_id, [n.id for n in node.topology.nodes if n.id != node_id], stopping)
        try:
            await node.stop()
        except Exception:
            if _failure(node) is None:
                raise
            # closing a damaged database can fail too; the reason to stop is what the operator needs
            log.exception("while stopping after: %s", _failure(node))
        # Read after the stop: a replica's thread reports it through the loop, so when start() raised it
        # itself the report lands later, and asyncio would log it as an exception never retrieved.
        failure = _failure(node)
    if failure is not None:
        raise failure


def _bad_storage(error: BaseException | None) -> BaseException | None:
    """`error` if it stops the node for its storage (corrupt data, a failed disk), else None."""
    return error if isinstance(error, CorruptData) else None  # DiskFailed is one too


def _failure(node: Node) -> BaseException | None:
    """The error that must stop the node, if one was reported (retrieved, from then on)."""
    return node.failure.exception() if node.failure is not None and node.failure.done() else None
