"""An engine's view plus writes not yet in it. Pure over `read` (and `scan`, `read_many`).

The state machine reads through one while it applies a proposal (a Cas after
a Put of the same key in one entry sees the Put), and the learner's change
capture through one while it turns a batch of entries into events before any
of them reaches its copy, a batch of keys at a time (`get_many`). A PutMany's
rows are spelled out only when someone reads: most proposals holding one never
do, and a bulk load would pay for a dict of every row on every replica.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

from raftkv.core.command_kinds import write_mutation
from raftkv.core.commands import Mutation, PutMany

Read = Callable[[bytes], bytes | None]
ReadMany = Callable[[list[bytes]], list[bytes | None]]  # Read of each key, in one call
Scan = Callable[[bytes, bytes], Iterator[tuple[bytes, bytes]]]  # stored items in [start, end), in key order


class Overlay:
    def __init__(self, read: Read, scan: Scan | None = None, read_many: ReadMany | None = None):
        self._read = read
        self._scan = scan
        self._read_many = read_many
        self.mutations: list[Mutation] = []  # every write recorded, in order
        self._values: dict[bytes, bytes | None] = {}  # None: deleted here
        self._ranges: list[tuple[bytes, bytes]] = []
        self._unread = 0  # mutations recorded but not yet spelled out into _values/_ranges

    def record(self, m: Mutation) -> None:
        self.mutations.append(m)

    def get(self, key: bytes) -> bytes | None:
        self._catch_up()
        if key in self._values:
            return self._values[key]
        if self._ranges and self._range_deleted(key):
            return None
        return self._read(key)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """`get` of each key, with one `read_many` for the keys no recorded write decides (needs `read_many`)."""
        self._catch_up()
        values, ranges = self._values, self._ranges
        unread = [k for k in keys if k not in values and not (ranges and self._range_deleted(k))]
        stored = self._read_many(unread)
        if len(unread) == len(keys):
            return stored
        found = dict(zip(unread, stored))  # lacks the keys a recorded delete-range removed: None
        return [values[k] if k in values else found.get(k) for k in keys]

    def items_in(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Live keys in [start, end) in this view, in key order (needs `scan`)."""
        self._catch_up()
        stored = dict(self._scan(start, end))
        for key in sorted(stored.keys() | {k for k in self._values if start <= k < end}):
            if key in self._values:
                value = self._values[key]
            else:
                value = None if self._range_deleted(key) else stored[key]
            if value is not None:
                yield key, value

    def _range_deleted(self, key: bytes) -> bool:
        return any(start <= key < end for start, end in self._ranges)

    def _catch_up(self) -> None:
        for m in self.mutations[self._unread:]:
            if type(m) is PutMany:  # its rows in one go, not a put() each
                self._values.update(m.pairs())
            else:
                write_mutation(m, self)
        self._unread = len(self.mutations)

    # -- commands.Writer, for spelling the recorded mutations out ------------

    def put(self, key: bytes, value: bytes) -> None:
        self._values[key] = value

    def delete(self, key: bytes) -> None:
        self._values[key] = None

    def delete_range(self, start: bytes, end: bytes) -> None:
        self._ranges.append((start, end))
        for key in self._values:
            if start <= key < end:
                self._values[key] = None
