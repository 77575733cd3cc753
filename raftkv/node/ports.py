"""The doors a node's gRPC services go through: what each service may ask of the node, and no more.

- `Proposals`: writes and read barriers to one partition this node holds a voter of
  (`group_commit.PartitionFrontend`); a service finds a partition's in a `Mapping[int, Proposals]`
  (`HostedReplicas.frontends`: no entry, no voter here).
- `ReadPort`: the read path (`reads.LocalReads`): which reads a replica here answers, what a read
  waits for at each consistency level and what it sees; and where the voters here stand (`Status`).
- `TopologyPort`: the cluster's topology as this node knows it, and changes to it (`process.Node`).
- `ReplicaAdminPort`: the replica verbs a move uses (`replica_admin.ReplicaAdmin`).

Each has its implementation on the node and an in-memory one in the tests (tests/test_kv_service.py).
The values that cross them are plain data, not protobuf, except the checkpoint's chunks, which are
its files as they travel.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Protocol

from raftkv.api import kv_pb2 as pb
from raftkv.core.commands import Command
from raftkv.core.errors import NotLeader
from raftkv.core.learner_registry import LearnerInfo
from raftkv.meta.records import ClusterMeta, MetaCommand
from raftkv.storage.engine import KeyRange, Position


class Proposals(Protocol):
    """Writes to one partition through this node's voter of it."""

    @property
    def is_leader(self) -> bool: ...

    def not_leader(self) -> NotLeader:
        """The error for a call that needs the leader, naming the leader this replica believes in."""

    def submit(self, command: Command) -> asyncio.Future:
        """Resolves to the command's result once applied; else NotLeader, StorageFull, Unavailable or
        Undetermined (it may have applied)."""

    def barrier(self) -> asyncio.Future:
        """Resolves once every write acknowledged before the call is applied here (a linearizable read
        waits for it); fails as `submit` does."""


@dataclass(frozen=True, slots=True)
class VoterStatus:
    """Where a voter of `partition` on this node stands (`KV.Status`)."""

    partition: int
    role: str  # `Role.label`
    leader: str  # the node this voter believes leads; "" when it knows none
    term: int
    commit_index: int
    applied_index: int
    last_log_index: int
    has_quorum: bool
    last_data_index: int
    learners: tuple[LearnerInfo, ...]
    members: tuple[str, ...]  # the group's voters as its Raft configuration here has them (node ids)


class ReadPort(Protocol):
    """Reads of the partitions this node holds. `consistency` is kv.proto's `Consistency`."""

    def holds(self, partition: int) -> bool:
        """A replica of `partition` here answers reads."""

    def serves(self, partition: int, consistency: int) -> bool:
        """A read of `partition` at `consistency` is answered here, not forwarded to the leader."""

    async def get(self, partition: int, key: bytes, consistency: int) -> tuple[bytes | None, int]:
        """`key`'s value (None: absent) and the applied index it was read at, once the level allows;
        NotLeader, or the barrier's error, when it does not."""

    async def scan(self, partition: int, key_range: KeyRange,
                   consistency: int) -> tuple[Position, Iterator[tuple[bytes, bytes]]]:
        """The applied position and the range's items from one view of it, as `get`."""

    def statuses(self) -> list[VoterStatus]:
        """The voters this node holds, by partition."""

    def leaderships(self) -> list[tuple[int, int]]:
        """(partition, term) of each voter here that believes it leads."""

    def learner_names(self) -> set[str]:
        """The learners registered in any partition held here."""


class TopologyPort(Protocol):
    @property
    def topology(self) -> ClusterMeta:
        """The newest topology this node knows."""

    def meta_leader_id(self) -> str | None:
        """The node that leads the metadata group, as this node believes; None when it knows none."""

    async def change_topology(self, command: MetaCommand) -> ClusterMeta:
        """The topology after `command`, applied by the metadata leader (this node or another):
        ChangeRefused when a rule refused it; grpc's error when the leader answered with one."""


@dataclass(frozen=True, slots=True)
class ReplicaProgress:
    """How far this node's replica of a group got (`Admin.ReplicaProgress`)."""

    mode: str  # "voter", "learner", "copying" (its checkpoint files on their way) or "none"
    applied_index: int = 0
    commit_index: int = 0
    term: int = 0
    guarded: bool = False  # a voter that lost its data and has not caught up with it yet (vote_guard)
    last_log_index: int = 0
    last_log_term: int = 0
    snapshot_bytes_received: int = 0
    leader: str = ""
    log_index_term: int = 0  # the term of the entry asked about; 0 when the log does not hold it
    base: tuple[tuple[bytes, int, int], ...] = ()  # the log's entries at the index asked about (`log_base_at`)


@dataclass(frozen=True, slots=True)
class Answer:
    """How a replica verb went, and the node that leads the group as far as this one knows ("": none)."""

    done: bool
    leader: str = ""


class ReplicaAdminPort(Protocol):
    """The replica verbs a move uses, on this node's replicas of a group (a partition, or `META`).
    ChangeRefused when the request breaks a rule (an unknown node; leadership to a non-voter)."""

    def progress(self, group: int, log_index: int) -> ReplicaProgress: ...

    async def change_membership(self, group: int, node_id: str, add: bool) -> Answer:
        """Add `node_id` to the group's voters or remove it, when this node leads the group; done once
        the change is committed (at once when it was made already)."""

    def transfer_leadership(self, group: int, node_id: str) -> Answer:
        """Hand leadership to `node_id`'s voter, best effort: done when asked (or it leads already)."""

    def compact(self, group: int) -> Answer:
        """Compact the log of this node's leader of partition `group` now."""

    def checkpoint(self, group: int) -> AsyncIterator[pb.CheckpointChunk]:
        """A checkpoint of this node's voter of partition `group` (one it holds), as its RocksDB files:
        the receiving node opens them as its replica's database."""

    def backup_checkpoint(self, group: int,
                          wanted: Callable[[], Awaitable[Iterable[str]]]) -> AsyncIterator[pb.CheckpointChunk]:
        """A checkpoint of this node's voter of partition `group` for a backup: first its listing (every
        file, the SHA-256 of each table file), then the chunks of the files `wanted()` names."""

    def reseed(self, group: int) -> Answer:
        """Drop the learner of a move here and copy a checkpoint afresh; not done when there is none."""
