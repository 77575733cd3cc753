"""The storage engine a partition's state machine writes to.

`Engine` is the small interface the state machine and the read path need;
`rocks_engine.RocksEngine` implements it on RocksDB and `MemoryEngine` is its
in-memory twin for tests. Writes are a closed set (Put, Delete, DeleteRange)
applied atomically together with the Raft position they came from.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from typing import Iterator, Mapping, Protocol, Sequence

from raftkv.core.command_kinds import write_mutation
from raftkv.core.commands import Mutation


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

    def scan(self, key_range: KeyRange) -> tuple[Position, Iterator[tuple[bytes, bytes]]]:
        """Items in key order from one consistent view, and the position of that view."""
        ...

    def close(self) -> None: ...


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
    """A dict-backed Engine for tests; same semantics as RocksEngine."""

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
        with self._lock:
            for key, value in (meta or {}).items():
                if value is None:
                    self._meta.pop(key, None)
                else:
                    self._meta[key] = value
            writer = _DictWriter(self._data)
            for m in mutations:
                write_mutation(m, writer)
            self._position = position

    def scan(self, key_range: KeyRange) -> tuple[Position, Iterator[tuple[bytes, bytes]]]:
        with self._lock:
            items = sorted(self._data.items())
            position = self._position
        lo = bisect.bisect_left(items, (key_range.start,))
        selected = [kv for kv in items[lo:] if key_range.end is None or kv[0] < key_range.end]
        if key_range.limit:
            selected = selected[: key_range.limit]
        return position, iter(selected)

    def close(self) -> None:
        pass
