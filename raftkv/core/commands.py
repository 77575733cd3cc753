"""Write commands: frozen dataclasses, nothing else.

How each kind is encoded, checked, routed, permitted and applied is in its `Kind`
(raftkv/core/command_kinds.py), registered under the tag it has in the log.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from itertools import accumulate
from typing import Iterator, Sequence, Union


@dataclass(frozen=True, slots=True)
class Put:
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class Delete:
    key: bytes


@dataclass(frozen=True, slots=True)
class DeleteRange:
    """Delete every key in [start, end)."""

    start: bytes
    end: bytes


@dataclass(frozen=True, slots=True)
class Cas:
    """Set `key` to `new` (or delete it when `new` is None) if its value is `expected`.

    `expected=None` means the key must be absent.
    """

    key: bytes
    expected: bytes | None
    new: bytes | None


@dataclass(frozen=True, slots=True)
class PutMany:
    """Puts of one partition applied atomically, in Arrow's binary layout: what bulk loaders send.

    Keys and values are concatenated; each offsets field holds count + 1
    int32 little-endian positions into them. Nothing is built per row until
    the rows are written, which makes a bulk load several times cheaper than
    a Batch of Puts (docs/spark.md).
    """

    keys: bytes
    key_offsets: bytes
    values: bytes
    value_offsets: bytes

    @classmethod
    def of(cls, keys: Sequence[bytes], values: Sequence[bytes]) -> PutMany:
        return cls(b"".join(keys), _offsets(keys), b"".join(values), _offsets(values))

    def split(self) -> tuple[list[bytes], list[bytes]]:
        return _slices(self.keys, self.key_offsets), _slices(self.values, self.value_offsets)

    def pairs(self) -> Iterator[tuple[bytes, bytes]]:
        return zip(*self.split())


@dataclass(frozen=True, slots=True)
class IngestSst:
    """A sorted RocksDB table file of puts to one partition, ingested whole: what a leader logs in place
    of a large PutMany (docs/bulk-ingest.md). Built by the leader, never sent by a client."""

    data: bytes
    sha256: bytes  # of `data`: checked on every replica before anything is written
    rows: int


Mutation = Union[Put, Delete, DeleteRange, PutMany, IngestSst]


@dataclass(frozen=True, slots=True)
class Batch:
    """Mutations of one partition applied atomically."""

    ops: tuple[Put | Delete | DeleteRange, ...]


@dataclass(frozen=True, slots=True)
class Guard:
    """`key` holds `expected` (None: the key is absent)."""

    key: bytes
    expected: bytes | None


@dataclass(frozen=True, slots=True)
class GuardedBatch:
    """Mutations of one partition applied atomically if every guard holds when the entry is applied;
    otherwise none. A transfer between two accounts reads both balances, then writes both only if
    neither changed meanwhile. Its result says whether it applied (`bool`)."""

    guards: tuple[Guard, ...]
    ops: tuple[Put | Delete | DeleteRange, ...]


@dataclass(frozen=True, slots=True)
class RegisterLearner:
    """Make `name` a learner of this partition, feeding `sink` configured by `options`."""

    name: str
    sink: str
    options: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class RemoveLearner:
    name: str


@dataclass(frozen=True, slots=True)
class LearnerProgress:
    """Learner `name` has durably delivered this partition's entries up to `index`."""

    name: str
    index: int


LearnerCommand = Union[RegisterLearner, RemoveLearner, LearnerProgress]
Command = Union[Put, Delete, DeleteRange, Cas, Batch, GuardedBatch, PutMany, IngestSst, RegisterLearner,
                RemoveLearner, LearnerProgress]


@dataclass(frozen=True, slots=True)
class CasResult:
    succeeded: bool
    current: bytes | None  # the value after the command


@dataclass(frozen=True, slots=True)
class Limits:
    max_key_bytes: int = 4096
    max_value_bytes: int = 1024 * 1024
    # One request's write is one Raft entry, which must stay below what the Raft layer sends whole
    # (4 * tuning.max_batch_bytes; docs/security.md, "request size"): the node sets 2 *.
    max_write_bytes: int = 4 * 1024 * 1024


def _offsets(items: Sequence[bytes]) -> bytes:
    return array("i", accumulate(map(len, items), initial=0)).tobytes()


def _slices(data: bytes, offsets: bytes) -> list[bytes]:
    bounds = array("i")
    bounds.frombytes(offsets)
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]
