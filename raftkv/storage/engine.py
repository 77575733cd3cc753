"""The storage engine a partition's state machine writes to.

`Engine` is the small interface the state machine and the read path need;
`rocks_engine.RocksEngine` implements it on RocksDB and `MemoryEngine` is its
in-memory twin for tests. Writes are a closed set (Put, Delete, DeleteRange)
applied atomically together with the Raft position they came from.
`ReplicaEngine` adds what a replica's Raft state machine needs of the engine
it owns: durability, and its whole state as a directory (a snapshot's checkpoint)
and back. Both engines have it; a checkpoint is installed only into an engine of
its own kind. What must be RocksDB's files (a checkpoint streamed to another
node, which opens it as its database) takes a `RocksEngine`.
"""

from __future__ import annotations

import bisect
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Protocol, Sequence

from raftkv.core.command_kinds import write_mutation
from raftkv.core.commands import IngestSst, Mutation
from raftkv.storage import rocks_sst


@dataclass(frozen=True, slots=True)
class Position:
    """The Raft entry a state was produced by."""

    index: int
    term: int


ZERO = Position(0, 0)


@dataclass(frozen=True, slots=True)
class KeyRange:
    """[start, end) with `end=None` meaning unbounded; `limit=0` means no limit."""

    start: bytes = b""
    end: bytes | None = None
    limit: int = 0

    def contains(self, key: bytes) -> bool:
        return key >= self.start and (self.end is None or key < self.end)


class Engine(Protocol):
    @property
    def position(self) -> Position:
        """The last applied Raft entry."""
        ...

    def get(self, key: bytes) -> bytes | None: ...

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """`get` of each key, in one call."""
        ...

    def write(self, mutations: Sequence[Mutation], position: Position,
              meta: Mapping[bytes, bytes | None] | None = None) -> None:
        """Apply all mutations and metadata updates (None deletes) and record `position`, atomically."""
        ...

    def meta_get(self, key: bytes) -> bytes | None:
        """The state machine's metadata (learner registry), apart from user keys."""
        ...

    def meta_items(self) -> list[tuple[bytes, bytes]]: ...

    def scan(self, key_range: KeyRange, cache: bool = True) -> tuple[Position, Iterator[tuple[bytes, bytes]]]:
        """Items in key order from one consistent view, and the position of that view. `cache=False`: a bulk
        read, whose blocks are not kept in the block cache (they would push out those other reads need)."""
        ...

    def close(self) -> None: ...


class ReplicaEngine(Engine, Protocol):
    """The engine a replica's state machine owns."""

    @property
    def folder(self) -> Path | None:
        """Where a checkpoint on its way in is unpacked, beside the engine's files (so that installing it
        is a rename); None: anywhere."""

    @property
    def broken(self) -> bool:
        """A write failed (a full disk): writes fail until the engine recovers."""

    def flush(self) -> None:
        """Make everything written so far durable."""

    def flush_memtable(self) -> None:
        """From a worker thread, while writes go on: write out now what the next `checkpoint` would have
        to write itself."""

    def checkpoint(self, dest: Path) -> Position:
        """A consistent copy of the whole state at `dest` (a directory it creates), and its position."""

    def verify(self, checkpoint: Path) -> None:
        """Check a `checkpoint` of the state before it leaves the node: CorruptData if it is damaged."""

    def install(self, checkpoint_dir: Path | None) -> Position:
        """Replace the state with the `checkpoint` at `checkpoint_dir`, which it may move away (None: the
        empty state)."""


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with `prefix` (None: unbounded)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes((stripped[-1] + 1,))


class _DictWriter:
    """`commands.Writer` over a dict."""

    def __init__(self, data: dict[bytes, bytes]):
        self.data = data

    def put(self, key: bytes, value: bytes) -> None:
        self.data[key] = value

    def delete(self, key: bytes) -> None:
        self.data.pop(key, None)

    def delete_range(self, start: bytes, end: bytes) -> None:
        for key in [k for k in self.data if start <= k < end]:
            del self.data[key]


class MemoryEngine:
    """A dict-backed ReplicaEngine for tests; same semantics as RocksEngine. Its checkpoint is one file
    of its own (`_STATE_FILE`)."""

    folder = None
    broken = False

    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}
        self._meta: dict[bytes, bytes] = {}
        self._position = ZERO
        self._lock = threading.Lock()

    @property
    def position(self) -> Position:
        return self._position

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return list(map(self._data.get, keys))

    def meta_get(self, key: bytes) -> bytes | None:
        return self._meta.get(key)

    def meta_items(self) -> list[tuple[bytes, bytes]]:
        return sorted(self._meta.items())

    def write(self, mutations: Sequence[Mutation], position: Position,
              meta: Mapping[bytes, bytes | None] | None = None) -> None:
        for m in mutations:
            if type(m) is IngestSst:
                rocks_sst.check(m, "memory engine")  # nothing written when it does not match
        with self._lock:
            for key, value in (meta or {}).items():
                if value is None:
                    self._meta.pop(key, None)
                else:
                    self._meta[key] = value
            writer = _DictWriter(self._data)
            for m in mutations:
                write_mutation(rocks_sst.rows(m) if type(m) is IngestSst else m, writer)
            self._position = position

    def scan(self, key_range: KeyRange, cache: bool = True) -> tuple[Position, Iterator[tuple[bytes, bytes]]]:
        with self._lock:
            items = sorted(self._data.items())
            position = self._position
        lo = bisect.bisect_left(items, (key_range.start,))
        selected = [kv for kv in items[lo:] if key_range.end is None or kv[0] < key_range.end]
        if key_range.limit:
            selected = selected[: key_range.limit]
        return position, iter(selected)

    def flush(self) -> None:
        pass

    def flush_memtable(self) -> None:
        pass

    def checkpoint(self, dest: Path) -> Position:
        with self._lock:
            state = {"index": self._position.index, "term": self._position.term,
                     "data": [[k.hex(), v.hex()] for k, v in self._data.items()],
                     "meta": [[k.hex(), v.hex()] for k, v in self._meta.items()]}
        dest.mkdir(parents=True)
        (dest / _STATE_FILE).write_text(json.dumps(state))
        return Position(state["index"], state["term"])

    def verify(self, checkpoint: Path) -> None:
        """A dump written from memory a moment ago: no disk has had the time to damage it."""

    def install(self, checkpoint_dir: Path | None) -> Position:
        state = {"index": 0, "term": 0, "data": [], "meta": []}
        if checkpoint_dir is not None:
            state = json.loads((checkpoint_dir / _STATE_FILE).read_text())
        with self._lock:
            self._data = {bytes.fromhex(k): bytes.fromhex(v) for k, v in state["data"]}
            self._meta = {bytes.fromhex(k): bytes.fromhex(v) for k, v in state["meta"]}
            self._position = Position(state["index"], state["term"])
            return self._position

    def close(self) -> None:
        pass


_STATE_FILE = "memory-engine.json"
