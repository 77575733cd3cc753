"""The partition replicas a node hosts, kept to what the metadata gives it (`reconcile`): its voters,
the learners of moves to it and the copies of a checkpoint or backup that seed them. A replica that
moved away is closed and its data deleted. What to do is `replica_lifecycle`'s pure decision; this
module does it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from pathlib import Path
from typing import Callable

from raftkv.core import metrics
from raftkv.core.errors import ConfigError, CorruptData, RaftKVError, SnapshotContradiction, Unavailable
from raftkv.core.spec import ClusterSpec, NodeSpec
from raftkv.meta.records import ClusterMeta, NodeState
from raftkv.node.backup_seed import BackupCatalog, seed_from_backup
from raftkv.node.group_commit import PartitionFrontend
from raftkv.node.lost_data import LostData
from raftkv.node.peers import Peers
from raftkv.node.replica import PartitionReplica
from raftkv.node.replica_copy import ReplicaCopying, copy_replica, drop_unfinished_copies
from raftkv.node.replica_lifecycle import (Action, CancelCopy, Desired, ForgetCopy, Local, OpenLearner, OpenVoter,
                                           Promote, RemoveLearner, RemoveVoter, ReopenMeta, StartCopy, reconcile)
from raftkv.node.tasks import background
from raftkv.raft.group import Role
from raftkv.raft.hub import RaftHub
from raftkv.raft.replica_logs import ReplicaLogs
from raftkv.raft.syncobj_group import GroupConfig, SyncObjGroup
from raftkv.storage.rocks_engine import RocksEngine

log = logging.getLogger(__name__)


class HostedReplicas:
    """`on_change` is what the node does when its metadata changes; a copy that ended and a reseeded
    learner call it too, so that `reconcile` runs again."""

    def __init__(self, spec: ClusterSpec, node_id: str, topology: Callable[[], ClusterMeta], peers: Peers,
                 lost_data: LostData, backups: BackupCatalog | None,
                 node_at: Callable[[int, str | None], str | None], on_corrupt: Callable[[CorruptData], None],
                 on_change: Callable[[], None]):
        self.spec = spec
        self.me = spec.node(node_id)
        self._topology = topology
        self.peers = peers
        self.lost_data = lost_data
        self.backups = backups
        self.node_at = node_at
        self._corrupt = on_corrupt
        self._on_change = on_change
        self.frontends: dict[int, PartitionFrontend] = {}  # the partitions this node is a voter of
        self.learning: dict[int, PartitionReplica] = {}  # the partitions moving here, still catching up
        self.copying: dict[int, ReplicaCopying] = {}  # ... whose checkpoint files are on their way
        self._copy_tried: set[int] = set()  # ... copied (or not) already: they open as learners now
        self._loop: asyncio.AbstractEventLoop | None = None
        self.hub: RaftHub | None = None  # the node's, from `start`
        self.logs: ReplicaLogs | None = None  # ... and its Raft log of every group

    def start(self, loop: asyncio.AbstractEventLoop, hub: RaftHub, logs: ReplicaLogs) -> None:
        """From now on replicas open on `loop`, their Raft messages through `hub`, their logs in `logs`;
        first the copies a crash interrupted are deleted."""
        self._loop, self.hub, self.logs = loop, hub, logs
        drop_unfinished_copies(self.me.data_dir)

    def reconcile(self, topology: ClusterMeta, at_start: bool = False, meta_voter: bool | None = None,
                  reopen_meta: Callable[[bool], None] = lambda voting: None) -> None:
        """Run exactly the replicas the metadata gives this node: voters, and learners of moves to it
        (`replica_lifecycle.reconcile` decides). `meta_voter`: how this node's metadata replica runs
        (None: not open); `reopen_meta(voting)` reopens it, first, when that should change."""
        for action in reconcile(Desired.of(topology, self.me.id), self._local(topology, meta_voter)):
            if isinstance(action, ReopenMeta):
                reopen_meta(action.voting)
            else:
                self._run(action, at_start)

    def _local(self, topology: ClusterMeta, meta_voter: bool | None) -> Local:
        """What runs here; of the learners of moves here, which have no data yet."""
        hosted = self.frontends.keys() | self.learning.keys() | self.copying.keys()
        empty = frozenset(p for p in topology.learner_partitions(self.me.id) if p not in hosted and self._empty(p))
        return Local(frozenset(self.frontends), frozenset(self.learning), frozenset(self.copying),
                     frozenset(self._copy_tried), empty, meta_voter)

    def _run(self, action: Action, at_start: bool) -> None:
        p = action.partition
        if isinstance(action, (OpenVoter, Promote)):
            if isinstance(action, Promote):  # added to the group: the same data, now as a voter
                self.learning.pop(p).close()
            self.frontends[p] = self._frontend(self._open(p, voter=True))
            if not at_start:
                log.info("partition %d: now a voter here", p)
        elif isinstance(action, CancelCopy):
            self.copying.pop(p).task.cancel()
        elif isinstance(action, ForgetCopy):
            self._copy_tried.discard(p)
            if action.delete:  # copied, and the move ended before the replica opened
                self._delete(p)
        elif isinstance(action, StartCopy):
            self._copy_tried.add(p)
            copying = self.copying[p] = ReplicaCopying()
            copying.task = background(self._copy(p, copying), f"partition {p}: the copy of a checkpoint")
        elif isinstance(action, OpenLearner):
            self._copy_tried.discard(p)
            self.learning[p] = self._open(p, voter=False)
            log.info("partition %d: catching up here as a learner", p)
        elif isinstance(action, RemoveVoter):
            self.frontends.pop(p).close()
            self.lost_data.forget(p)
            self._delete(p)
        elif isinstance(action, RemoveLearner):
            self.learning.pop(p).close()
            self._delete(p)

    def reseed(self, p: int, why: str | None = None) -> bool:
        """Drop the learner of a move here and its data; `reconcile` then copies a checkpoint afresh.
        Asked by the mover when the learner made no progress while its leader went on."""
        replica = self.learning.pop(p, None)
        if replica is None:
            return False
        log.warning("%s; starting it again from a voter's checkpoint",
                    why or f"partition {p}: the learner here made no progress while its leader went on")
        replica.close()
        self._delete(p)
        self._copy_tried.discard(p)
        self._on_change()
        return True

    def start_over(self, error: SnapshotContradiction) -> bool:
        """The voter of `error.partition` here holds entries a power cut of the whole cluster took from the
        others, in its snapshot (lose-last-second mode): it cannot roll back below them, so its data is
        deleted and it opens empty, guarded as a wiped replica is (`LostData`), to catch up from its peers.
        The learner of a move here is copied afresh (`reseed`). False: neither here (the metadata's own group)."""
        p = error.partition
        if p in self.learning:
            return self.reseed(p, str(error))
        frontend = self.frontends.pop(p, None)
        if frontend is None:
            return False
        log.warning("%s; this replica's data is deleted and it catches up from its peers", error)
        frontend.close()
        self.lost_data.forget(p)
        self._delete(p)
        self.frontends[p] = self._frontend(self._open(p, voter=True))
        return True

    def _folder(self, p: int) -> Path:
        return partition_folder(self.me.data_dir, p)

    def _empty(self, p: int) -> bool:
        folder = self._folder(p)
        return not folder.exists() or not any(folder.iterdir())

    async def _copy(self, p: int, copying: ReplicaCopying) -> None:
        """Seed a new replica from the newest backup, or else with a voter's checkpoint files; then it
        opens as a learner (seeded or not)."""
        topology = self._topology()
        others = [v for v in topology.group_voters(p) if v != self.me.id]
        sources = [v for v in others if topology.node(v).state != NodeState.DEAD]
        members = [topology.node(v).raft_address(p) for v in others]
        try:
            if self.backups is None or not await self._seeded(p, sources, members, copying):
                position = await copy_replica(self.peers, sources, p, self._folder(p), members, copying.count)
                log.info("partition %d: copied a checkpoint at index %d here (%d bytes)", p, position.index,
                         copying.received)
        except asyncio.CancelledError:  # the move ended without this node, or the node stops
            shutil.rmtree(self._folder(p), ignore_errors=True)
            raise
        except (Unavailable, OSError) as exc:  # no voter could send one, or this disk could not take it
            shutil.rmtree(self._folder(p), ignore_errors=True)
            log.warning("partition %d: no checkpoint copied here (%s); catching up from the leader instead", p, exc)
        finally:
            if self.copying.get(p) is copying:
                del self.copying[p]
        self._on_change()

    async def _seeded(self, p: int, sources: list[str], members: list[str], copying: ReplicaCopying) -> bool:
        try:
            return await seed_from_backup(self.backups, self.peers, sources, p, self._folder(p), members,
                                          copying.count) is not None
        except (RaftKVError, OSError) as exc:  # the storage failed, a file was damaged, or this disk is full
            shutil.rmtree(self._folder(p), ignore_errors=True)
            log.warning("partition %d: not seeded from a backup (%s); copying from a voter", p, exc)
            return False

    def _delete(self, p: int) -> None:
        self.logs.drop(p)  # first: killed before the folder is gone, the next start empties it (replica_logs)
        shutil.rmtree(self._folder(p), ignore_errors=True)
        log.info("partition %d: no replica here any more; its data is deleted", p)

    def _open(self, p: int, voter: bool) -> PartitionReplica[RocksEngine]:
        """Partition p's replica: a voter of its group, or a learner catching up to become one."""
        topology = self._topology()
        loop = self._loop
        metrics.init_partition(p)

        def on_role_changed(old: Role, new: Role) -> None:  # inside a tick, on the loop
            metrics.LEADER_CHANGES.labels(p).inc()
            metrics.IS_LEADER.labels(p).set(1 if new == Role.LEADER else 0)
            frontend = self.frontends.get(p)
            if old == Role.LEADER and frontend is not None:
                loop.call_soon(frontend.on_leadership_lost)

        config = GroupConfig(
            partition=p,
            hub=self.hub,
            self_address=self.me.raft_address(p) if voter else None,
            peers=tuple(topology.node(i).raft_address(p) for i in topology.group_voters(p) if i != self.me.id),
            folder=self._folder(p),
            fsync=self.spec.durability == "fsync",
            tuning=self.spec.tuning,
            on_role_changed=on_role_changed if voter else None,
            membership_changes=True,
            on_corrupt=self._corrupt,
            guard=self.lost_data.guard(p, self._folder(p)) if voter else None,
            node_log=self.logs,
            engine=self.hub.engine,
            new_cluster=not topology.epoch,
        )
        with opening(self.me):
            return PartitionReplica(
                p, RocksEngine(config.folder, on_corrupt=self._corrupt), self.spec.tuning,
                open_group=lambda state_machine: SyncObjGroup(config, state_machine, loop),
                backup_index=(lambda: self.backups.index(p)) if self.backups is not None else lambda: 0,
            )

    def _frontend(self, replica: PartitionReplica) -> PartitionFrontend:
        tuning = self.spec.tuning
        return PartitionFrontend(
            replica, self._loop, max_batch_ops=tuning.max_batch_ops, max_batch_bytes=tuning.max_batch_bytes,
            request_timeout=tuning.request_timeout,
            leader_id_of=lambda address: self.node_at(replica.partition, address),
            cluster_version=lambda: self._topology().cluster_version,
        )


def partition_folder(data_dir: Path, p: int) -> Path:
    return data_dir / f"p{p:04d}"


def replica_folders(data_dir: Path) -> dict[int, Path]:
    """The partition replica folders in `data_dir`, by partition (the metadata's is the node's)."""
    return {int(path.name[1:]): path for path in data_dir.glob("p[0-9]*")
            if path.name[1:].isdigit() and path.is_dir()}


@contextlib.contextmanager
def opening(me: NodeSpec):
    """Opening a replica of node `me`: a data dir in use becomes the line that says so."""
    try:
        yield
    except RaftKVError:
        raise
    except Exception as exc:
        if "/LOCK:" in str(exc):  # RocksDB's lock file (not "block checksum mismatch")
            raise ConfigError(
                f"{me.data_dir} is in use by another process (is node {me.id} already running?)",
                source=f"node {me.id}",
            ) from None
        raise
