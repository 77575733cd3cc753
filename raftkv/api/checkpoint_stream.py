"""A checkpoint as `Admin.Checkpoint` streams it, written to a local folder file by file.

A voter sends its replica's checkpoint as chunks of its files (`raftkv.node.replica_copy`); a
node seeding a new replica and `raftkv backup create` receive them here.
"""

from __future__ import annotations

import asyncio
from pathlib import Path, PurePosixPath
from typing import Callable

import grpc

from raftkv.core.errors import CorruptData
from raftkv.storage.engine import Position

SILENCE_SECONDS = 30.0  # a source that sends nothing for this long is given up (asyncio.TimeoutError)

LogEntry = tuple[bytes, int, int]  # (command, index, term) of a Raft log entry


async def receive_checkpoint(call, dest: Path,
                             received: Callable[[int], None]) -> tuple[Position, tuple[LogEntry, ...]]:
    """Write the files `call` streams under `dest`; the position they are exactly the state after, and the
    log entries the source sent with it (the two a seeded replica's log starts with, or none).
    `received(n)` hears of every n bytes."""
    position, base = None, ()
    current, out = None, None
    try:
        while (chunk := await asyncio.wait_for(call.read(), SILENCE_SECONDS)) is not grpc.aio.EOF:
            if position is None:
                position = Position(chunk.index, chunk.term)
                base = tuple((e.command, e.index, e.term) for e in chunk.base)
            if chunk.path != current:
                if out is not None:
                    out.close()
                target = dest / _relative(chunk.path)
                target.parent.mkdir(parents=True, exist_ok=True)
                out, current = open(target, "wb"), chunk.path
            await asyncio.to_thread(out.write, chunk.data)
            received(len(chunk.data))
    finally:
        if out is not None:
            out.close()
    if position is None:
        raise CorruptData("the checkpoint stream was empty")
    return position, base


def _relative(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts:
        raise CorruptData(f"a checkpoint file named {name!r} would land outside the checkpoint")
    return path
