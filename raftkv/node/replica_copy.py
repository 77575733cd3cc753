"""A new replica's data, copied as checkpoint files from a voter over gRPC (`Admin.Checkpoint`).

The voter checkpoints its replica (hard links: milliseconds) and streams the files;
the new replica's node writes them to a scratch folder beside the replica's, which
becomes the replica's folder with the files as its database (`raftkv.raft.syncobj_seed`:
one copy, renamed into place). The replica then starts at the checkpoint's entry, and
the leader sends it only the entries after that one. The files never go
through the Raft loop, which pickles every snapshot chunk on the event loop all of a
node's replicas share and restarts a transfer whenever a connection drops.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path
from typing import AsyncIterator, Callable, Iterable

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.api.checkpoint_stream import receive_checkpoint
from raftkv import failpoints
from raftkv.core.errors import CorruptData, Unavailable
from raftkv.node.peers import Peers, brief_status
from raftkv.node.replica import Replica
from raftkv.raft.syncobj_seed import DATABASE, base_problem, seed
from raftkv.storage.engine import Position
from raftkv.storage.rocks_engine import RocksEngine

log = logging.getLogger(__name__)

CHUNK_BYTES = 1024 * 1024
SCRATCH_PREFIX = ".copy-"  # a copy lands beside the replica's folder first: <data_dir>/.copy-p0003


def drop_unfinished_copies(data_dir: Path) -> None:
    """At start-up: copies a crash interrupted before they were renamed into place (`syncobj_seed.seed`);
    their replicas' folders are still empty, so the copies start again."""
    for scratch in data_dir.glob(f"{SCRATCH_PREFIX}*"):
        shutil.rmtree(scratch, ignore_errors=True)


class ReplicaCopying:
    """A copy on its way to this node: the task, and the bytes received so far (`Admin.ReplicaProgress`)."""

    def __init__(self) -> None:
        self.received = 0
        self.task: asyncio.Task | None = None

    def count(self, n: int) -> None:
        self.received += n


async def checkpoint_chunks(replica: Replica[RocksEngine]) -> AsyncIterator[pb.CheckpointChunk]:
    """The replica's state, checkpointed now, as chunks of its files (the scratch copy is removed after):
    RocksDB's, which the receiving node opens as its replica's database. Every block is read first: a
    damaged one stops this node (`RocksEngine.verify`) and the caller asks another."""
    work = replica.engine.scratch()
    try:
        # Off the loop first what the checkpoint would flush holding the GIL (tens to hundreds of ms).
        await asyncio.to_thread(replica.engine.flush_memtable)
        position, base = take_checkpoint(replica, work / "db")
        await asyncio.to_thread(replica.engine.verify, work / "db")
        async for chunk in file_chunks(work / "db", files_under(work / "db"), position, base):
            yield chunk
    finally:
        shutil.rmtree(work, ignore_errors=True)


def take_checkpoint(replica: Replica[RocksEngine], dest: Path) -> tuple[Position, list[pb.LogEntry]]:
    """Checkpoint the replica into `dest` (hard links); the position it is the state after, and the log's
    entries at it (the base of a log seeded with it)."""
    # No await between these: the entries applied since the database's position changed nothing in it.
    # A replica still replaying its journal after a restart has applied less than its database holds
    # (issue 32): the base is then the log's entries at the database's position.
    position = replica.engine.checkpoint(dest)
    at = max(position.index, replica.group.last_applied)
    return position, [pb.LogEntry(command=c, index=i, term=t) for c, i, t in replica.group.log_base_at(at) or ()]


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


async def file_chunks(root: Path, files: list[Path], position: Position,
                      base: list[pb.LogEntry]) -> AsyncIterator[pb.CheckpointChunk]:
    """Chunks of `files` (under `root`, one after the other); the first carries `base`."""
    for path in files:
        name = path.relative_to(root).as_posix()
        with open(path, "rb") as f:
            while True:
                data = await asyncio.to_thread(_read_chunk, f)
                yield pb.CheckpointChunk(index=position.index, term=position.term, path=name, data=data, base=base)
                base = []
                if len(data) < CHUNK_BYTES:
                    break


def _read_chunk(f) -> bytes:
    failpoints.hit("checkpoint-read-before")  # in the reading thread: a delay slows the copy, not the loop
    return f.read(CHUNK_BYTES)


async def copy_replica(peers: Peers, sources: Iterable[str], partition: int, folder: Path, members: Iterable[str],
                       received: Callable[[int], None]) -> Position:
    """Seed `folder` (absent or empty) with a checkpoint from the first of `sources` that sends one whole.

    `received(n)` is told of every n bytes that arrive. Unavailable if no source could send one (naming
    each and why); OSError if this disk could not take it.
    """
    scratch = folder.with_name(f"{SCRATCH_PREFIX}{folder.name}")
    failures = []
    try:
        for node_id in await leader_last(peers, list(sources), partition):
            shutil.rmtree(scratch, ignore_errors=True)
            call = peers.admin(node_id).Checkpoint(pb.ReplicaRequest(group=partition))
            try:
                position, base = await receive_checkpoint(call, scratch / DATABASE, received)
                if position.index and (problem := base_problem(position, base)) is not None:
                    raise CorruptData(problem)
            except (grpc.aio.AioRpcError, asyncio.TimeoutError, CorruptData) as exc:
                call.cancel()
                failures.append(f"{node_id}: {_reason(exc)}")
                log.warning("partition %d: no checkpoint from %s (%s); trying another voter", partition, node_id,
                            _reason(exc))
                continue
            if position.index:  # an empty state: there is nothing to seed with
                await asyncio.to_thread(seed, scratch, folder, partition, position, base, members)
            return position
        raise Unavailable("; ".join(failures) or "no live voter to copy from")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


async def leader_last(peers: Peers, sources: list[str], partition: int) -> list[str]:
    """`sources`, the partition's leader last: the checkpoint, the read of its every block and the stream
    take the sender's event loop, which on the leader stalls every write (bench_move: 100-160 ms), and
    on a follower none while the other follower answers. A source that does not say keeps its place."""
    async def leads(node_id: str) -> bool:
        reply = await brief_status(peers, node_id)
        return reply is not None and any(ps.partition == partition and ps.role == "leader" for ps in reply.hosted)

    leading = await asyncio.gather(*(leads(node_id) for node_id in sources))
    return [n for n, lead in zip(sources, leading) if not lead] + [n for n, lead in zip(sources, leading) if lead]


def _reason(exc: Exception) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__
