"""A backup's checkpoint of a voter, only the files the backup asks for (`Admin.CheckpointFiles`).

The voter checkpoints its replica (hard links), lists every file with its size and the
SHA-256 of each table file, and waits for the caller to name the files its store lacks;
it sends those, and the checkpoint goes with the call. A table file never changes and a
checkpoint hard-links it, so its hash is remembered from one backup to the next
(`FileDigests`, per partition): an unchanged database is not read again. A checkpoint
with a table file not hashed before has every block read first (`RocksEngine.verify`),
so the store never takes a file damaged on this disk; one read before keeps, in the
store, the content it had then. The small files
that change (CURRENT, MANIFEST, OPTIONS, the WAL) are not hashed here; a backup always
fetches them.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable, Iterable

from raftkv.api import kv_pb2 as pb
from raftkv.backup.digests import IMMUTABLE, FileDigests
from raftkv.node.replica import Replica
from raftkv.node.replica_copy import file_chunks, files_under, take_checkpoint
from raftkv.storage.rocks_engine import RocksEngine


async def backup_checkpoint(replica: Replica[RocksEngine], digests: FileDigests,
                            wanted: Callable[[], Awaitable[Iterable[str]]]) -> AsyncIterator[pb.CheckpointChunk]:
    """The listing of a checkpoint taken now, then the chunks of the files `wanted()` names of it."""
    work = replica.engine.scratch()
    try:
        root = work / "db"
        position, base = take_checkpoint(replica, root)
        files = files_under(root)
        table_files = [f for f in files if f.suffix in IMMUTABLE]
        if not digests.all_known(table_files):  # a stored file keeps the content it had when first read
            await asyncio.to_thread(replica.engine.verify, root)
        tables = await asyncio.to_thread(digests.of, table_files)
        listed = {f.relative_to(root).as_posix(): f for f in files}
        yield pb.CheckpointChunk(index=position.index, term=position.term, base=base, files=[
            pb.CheckpointFile(path=name, size=f.stat().st_size, sha256=tables.get(f, ("", 0))[0])
            for name, f in listed.items()])
        names = set(await wanted())
        async for chunk in file_chunks(root, [f for name, f in listed.items() if name in names], position, []):
            yield chunk
    finally:
        shutil.rmtree(work, ignore_errors=True)
