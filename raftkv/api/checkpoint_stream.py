"""A checkpoint as `Admin.Checkpoint` streams it, written to a local folder file by file.

A voter sends its replica's checkpoint as chunks of its files (`raftkv.node.replica_copy`); a
node seeding a new replica receives them here, and `raftkv backup create` the files it asked for
(`Admin.CheckpointFiles`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path, PurePosixPath
from typing import Callable, NamedTuple

import grpc

from raftkv.core.errors import CorruptData
from raftkv.storage.engine import Position

SILENCE_SECONDS = 30.0  # a source that sends nothing for this long is given up (asyncio.TimeoutError)

LogEntry = tuple[bytes, int, int]  # (command, index, term) of a Raft log entry


class ListedFile(NamedTuple):
    """A file of a checkpoint as `Admin.CheckpointFiles` lists it."""

    path: str
    size: int
    sha256: str  # empty: not a table file, so not hashed by the source (CURRENT, MANIFEST, OPTIONS, the WAL)


async def receive_checkpoint(call, dest: Path,
                             received: Callable[[int], None]) -> tuple[Position, tuple[LogEntry, ...]]:
    """Write the files `call` streams under `dest`; the position they are exactly the state after, and the
    log entries the source sent with it (the two a seeded replica's log starts with, or none).
    `received(n)` hears of every n bytes."""
    first = await _read(call)
    if first is None:
        raise CorruptData("the checkpoint stream was empty")
    await receive_files(call, dest, received, first)
    return Position(first.index, first.term), tuple((e.command, e.index, e.term) for e in first.base)


async def receive_files(call, dest: Path, received: Callable[[int], None], first=None) -> None:
    """Write the files whose chunks `call` streams (after `first`, already read) under `dest`."""
    chunk, current, out = first, None, None
    try:
        while chunk is not None or (chunk := await _read(call)) is not None:
            if chunk.path != current:
                if out is not None:
                    out.close()
                target = dest / _relative(chunk.path)
                target.parent.mkdir(parents=True, exist_ok=True)
                out, current = open(target, "wb"), chunk.path
            await asyncio.to_thread(out.write, chunk.data)
            received(len(chunk.data))
            chunk = None
    finally:
        if out is not None:
            out.close()


async def _read(call):
    """The next message of `call`, or None at its end."""
    chunk = await asyncio.wait_for(call.read(), SILENCE_SECONDS)
    return None if chunk is grpc.aio.EOF else chunk


def _relative(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts:
        raise CorruptData(f"a checkpoint file named {name!r} would land outside the checkpoint")
    return path
