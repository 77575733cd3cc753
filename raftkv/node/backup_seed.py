"""New replicas seeded from the cluster's backups (docs/elasticity.md §4).

With a `[backup]` URL in the spec, a node lists the backups there every
`tuning.backup_poll_seconds` and remembers, per partition, the newest copy this
cluster made (its metadata's `cluster_id`: never another cluster's of one
name) whose position has a term. Two uses:

- A node about to host a new replica (a move's target) seeds it from that copy
  when the partition's leader holds the copy's entry with the copy's term: by
  Raft's log matching the copy is then exactly the state after an entry of the
  leader's log, and the leader sends only the entries after it. Otherwise the
  node copies a voter's checkpoint (`replica_copy`).
- Each replica's compactions keep the log from that copy's entry on
  (`raftkv.core.retention.kept_for_seeds`), so a seed finds the log it needs.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.backup.manifest import BackupInfo, PartitionCopy
from raftkv.backup.store import BackupStore, parse_storage_options
from raftkv.core.errors import RaftKVError
from raftkv.core.spec import BackupConfig
from raftkv.node.peers import Peers
from raftkv.node.replica_copy import SCRATCH_PREFIX
from raftkv.raft.syncobj_seed import DATABASE, LogEntry, seed
from raftkv.storage.engine import Position

log = logging.getLogger(__name__)

ASK_TIMEOUT = 5.0


@dataclass(frozen=True)
class SeedCopy:
    backup: BackupInfo
    copy: PartitionCopy


class BackupCatalog:
    """The newest usable backup copy of each partition, as of the last listing."""

    def __init__(self, config: BackupConfig, cluster_id: Callable[[], str]):
        self.store = BackupStore(config.url, parse_storage_options(config.storage), source="spec backup.url")
        self.seeding = config.seed
        self._cluster_id = cluster_id
        self.newest: dict[int, SeedCopy] = {}
        self._problem = ""

    def index(self, partition: int) -> int:
        """The entry the newest copy of `partition` ends at; 0 when there is none."""
        found = self.newest.get(partition)
        return found.copy.position.index if found else 0

    def refresh(self) -> None:
        """List the backups again (blocking: storage calls)."""
        cluster_id = self._cluster_id()
        newest = {}
        for info in self.store.backups() if cluster_id else ():  # oldest first: the newest copy wins
            if info.cluster_id == cluster_id:
                newest.update((c.partition, SeedCopy(info, c)) for c in info.copies if c.position.term)
        found = {s.backup.id for s in newest.values()} - {s.backup.id for s in self.newest.values()}
        self.newest = newest
        for backup_id in sorted(found):
            log.info("backups: %s is the newest copy of partitions %s", backup_id,
                     sorted(p for p, s in newest.items() if s.backup.id == backup_id))

    async def watch(self, every: float) -> None:
        """Refresh every `every` seconds until cancelled; a failing storage is logged once, not fatal."""
        while True:
            try:
                await asyncio.to_thread(self.refresh)
                problem = ""
            except RaftKVError as exc:
                problem = str(exc)
            if problem != self._problem:
                if problem:
                    log.warning("backups: %s; new replicas are copied from voters until it answers", problem)
                else:
                    log.info("backups: listing %s again", self.store.url)
                self._problem = problem
            await asyncio.sleep(every)


async def seed_from_backup(catalog: BackupCatalog, peers: Peers, voters: Iterable[str], partition: int,
                           folder: Path, members: Iterable[str], received: Callable[[int], None]) -> Position | None:
    """Seed `folder` (absent or empty) from the newest backup copy of `partition` if its leader (among
    `voters`) holds that copy's entry with its term; None when there is no such copy, or it did not."""
    found = catalog.newest.get(partition) if catalog.seeding else None
    if found is None:
        return None
    position, voters = found.copy.position, list(voters)
    if await _leaders_base(peers, voters, partition, position) is None:
        log.info("partition %d: the leader's log holds no entry %d of term %d, where backup %s ends (compacted "
                 "away, or another history); copying from a voter", partition, position.index, position.term,
                 found.backup.id)
        return None
    scratch = folder.with_name(f"{SCRATCH_PREFIX}{folder.name}")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        await asyncio.to_thread(catalog.store.download, found.backup, partition, scratch / DATABASE, received)
        base = await _leaders_base(peers, voters, partition, position)  # still there after the download?
        if base is None:
            log.info("partition %d: the leader compacted past backup %s while it downloaded; copying from a voter",
                     partition, found.backup.id)
            return None
        await asyncio.to_thread(seed, scratch, folder, partition, position, base, members)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    log.info("partition %d: seeded from backup %s at index %d", partition, found.backup.id, position.index)
    return position


async def _leaders_base(peers: Peers, voters: list[str], partition: int,
                        position: Position) -> tuple[LogEntry, LogEntry] | None:
    """The partition's leader's entries `position.index - 1` and `position.index`, as its voters tell,
    if the latter has term `position.term`: by Raft's log matching the copy is then the state after
    an entry of the leader's log. None otherwise."""
    request = pb.ReplicaRequest(group=partition, log_index=position.index)
    states: dict[str, pb.ReplicaState] = {}
    for node_id in voters:
        try:
            states[node_id] = await peers.admin(node_id).ReplicaProgress(request, timeout=ASK_TIMEOUT)
        except grpc.aio.AioRpcError:
            continue
    for leader in {s.leader for s in states.values() if s.leader} & states.keys():
        state = states[leader]
        if state.log_index_term == position.term and len(state.base) == 2:
            prev, last = state.base
            return (prev.command, prev.index, prev.term), (last.command, last.index, last.term)
    return None
