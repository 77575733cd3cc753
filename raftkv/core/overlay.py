"""An engine's view plus writes not yet in it. Pure over `read` (and `scan`).

The state machine reads through one while it applies a proposal (a Cas after
a Put of the same key in one entry sees the Put), and the learner's change
capture through one while it turns a batch of entries into events before any
of them reaches its copy. A PutMany's rows are spelled out only when someone
reads: most proposals holding one never do, and a bulk load would pay for a
dict of every row on every replica.
"""

from __future__ import annotations

from typing import Callable, Iterator

from raftkv.core.command_kinds import write_mutation
from raftkv.core.commands import Mutation

Read = Callable[[bytes], bytes | None]
Scan = Callable[[bytes, bytes], Iterator[tuple[bytes, bytes]]]  # stored items in [start, end), in key order


class Overlay:
    def __init__(self, read: Read, scan: Scan | None = None):
        self._read = read
        self._scan = scan
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
        if any(start <= key < end for start, end in self._ranges):
            return None
        return self._read(key)

    def items_in(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Live keys in [start, end) in this view, in key order (needs `scan`)."""
        self._catch_up()
        keys = {k for k, _ in self._scan(start, end)} | {k for k in self._values if start <= k < end}
        for key in sorted(keys):
            value = self.get(key)
            if value is not None:
                yield key, value

    def _catch_up(self) -> None:
        for m in self.mutations[self._unread:]:
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
