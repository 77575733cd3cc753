"""Whether a node's data dir held its cluster's data before, and the vote guards of the voter replicas
that open without theirs (raftkv/raft/vote_guard.py).

A data dir that never held the cluster's data is fresh. One that did (it has the identity file,
written once the metadata exists), or whose cluster exists already (another node has metadata: the
dir was wiped), opens each empty voter replica guarded: it votes again only once a voter that kept
its data says how far the group got.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Callable

from raftkv.api import kv_pb2 as pb
from raftkv.core.durable import replace_file
from raftkv.core.errors import CorruptData
from raftkv.meta.records import ClusterMeta, group_name
from raftkv.node.peers import Peers
from raftkv.node.tasks import background
from raftkv.raft.vote_guard import VoteGuard, VoterAnswer, answers_needed, floor_from

log = logging.getLogger(__name__)

SHORT_LOG_SECONDS = 15.0  # how often a replica still waiting for answers says so
RELEARN_SECONDS = 5.0  # how often a replica that has its floor but not its data asks again (`VoteGuard.lower`)
IDENTITY_FILE = "cluster_id"  # written once the metadata exists: this data dir belongs to that cluster


class LostData:
    def __init__(self, data_dir: Path, node_id: str, peers: Peers, topology: Callable[[], ClusterMeta],
                 fail: Callable[[Exception], None]):
        """`fail(error)` stops the node (a vote floor its disk could not keep)."""
        self.guards: dict[int, VoteGuard] = {}  # voter replicas that opened without their data
        self._data_dir = data_dir
        self._node_id = node_id
        self._peers = peers
        self._topology = topology
        self._fail = fail
        self._had_data = False  # decided by `look`, before any replica opens
        self._remembered = False
        self._tasks: list[asyncio.Task] = []

    async def look(self) -> None:
        self._had_data = (self._data_dir / IDENTITY_FILE).exists() or await self._cluster_exists()

    def guard(self, group: int, folder: Path) -> VoteGuard:
        """The vote guard of a voter replica: waiting when it opens without data in a cluster that had it."""
        guard = self.guards[group] = VoteGuard(
            folder, guarded=self._had_data and (not folder.exists() or not any(folder.iterdir())))
        if guard.recovering:
            self._tasks.append(background(self._learn_vote_floor(group, guard), f"{group_name(group)}: the vote floor"))
        if guard.waiting:
            log.warning("%s: this replica's data is gone; it votes again once its peers say what was committed",
                        group_name(group))
        return guard

    def forget(self, group: int) -> None:
        """The replica of `group` was closed and deleted here."""
        self.guards.pop(group, None)

    def remember(self) -> None:
        """Once the metadata exists, the data dir records it: an empty replica later means lost data."""
        if self._remembered or not self._topology().epoch:
            return
        identity = self._data_dir / IDENTITY_FILE
        if not identity.exists():
            replace_file(identity, (self._topology().cluster_id or "bootstrapped").encode())
        self._remembered = True

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()

    async def _cluster_exists(self) -> bool:
        """Whether another node has this cluster's metadata: then this data dir, without an identity file,
        was wiped (a new node joins with --join, and the nodes of a new cluster start with none)."""
        others = [n.id for n in self._topology().nodes if n.id != self._node_id]
        replies = await asyncio.gather(*(self._peers.admin(n).Topology(pb.TopologyRequest(), timeout=2.0)
                                         for n in others), return_exceptions=True)
        return any(isinstance(r, pb.TopologyResponse) and r.epoch for r in replies)

    async def _learn_vote_floor(self, group: int, guard: VoteGuard) -> None:
        """Ask the group's other voters until enough that did not lose their data answer (vote_guard); then
        again now and then until this replica has caught up, to lower a floor no log reaches any more."""
        short_since = time.monotonic()
        while guard.recovering and self.guards.get(group) is guard:  # (a replica opened since has its own)
            others = [n for n in self._topology().group_voters(group) if n != self._node_id]
            replies = await asyncio.gather(*(self._peers.admin(n).ReplicaProgress(pb.ReplicaRequest(group=group),
                                                                                  timeout=2.0) for n in others),
                                           return_exceptions=True)
            known = {n: _answer(r) for n, r in zip(others, replies)
                     if isinstance(r, pb.ReplicaState) and r.mode == "voter"}
            floor = floor_from(list(known.values()), len(others) + 1)
            if floor is None:
                if time.monotonic() - short_since >= SHORT_LOG_SECONDS:
                    short_since = time.monotonic()
                    kept = sorted(n for n, a in known.items() if not a.recovering)
                    log.warning("%s: waits to vote until %d of its other voters %s that kept their data answer, or "
                                "all of them (answered: %s; of those, kept their data: %s)", group_name(group),
                                answers_needed(len(others) + 1), others, sorted(known) or "none", kept or "none")
                await asyncio.sleep(1.0)
                continue
            was = guard.floor
            try:
                if not guard.learn(floor):
                    await asyncio.sleep(RELEARN_SECONDS)
                    continue
            except CorruptData as error:  # the fsync failed: this disk cannot be trusted
                self._fail(error)
                return
            except OSError as exc:  # a full disk: asked again next round
                log.warning("%s: cannot keep its vote floor (%s); trying again", group_name(group), exc.strerror)
                await asyncio.sleep(1.0)
                continue
            log.info("%s: votes again, in terms after %d and for logs up to %s at least%s", group_name(group),
                     guard.floor.term, guard.floor.describe(),
                     f" (lowered from {was.describe()}, which no log of {sorted(known)} reaches)" if was else "")
            await asyncio.sleep(RELEARN_SECONDS)


def _answer(reply: pb.ReplicaState) -> VoterAnswer:
    last_log = (reply.last_log_term, reply.last_log_index) if reply.HasField("last_log_index") else None
    return VoterAnswer(reply.term, reply.commit_index, last_log, recovering=reply.guarded)
