"""Group commit policy: propose at once when idle, accumulate while busy.

Pure bookkeeping, no I/O and no threads: the caller owns the sending. The
same policy drives the server's proposals (one Raft entry per batch) and the
client's coalescing of concurrent calls into one request per leader.

    policy = GroupCommit(max_ops=1000, max_bytes=1 << 20, max_in_flight=1)
    for batch in policy.add(item, size):   # usually [[item]] when idle, [] when busy
        send(batch)
    ...
    for batch in policy.completed():       # when a sent batch finished
        send(batch)
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class GroupCommit(Generic[T]):
    def __init__(self, max_ops: int, max_bytes: int, max_in_flight: int = 1):
        if max_ops < 1 or max_bytes < 1 or max_in_flight < 1:
            raise ValueError("max_ops, max_bytes and max_in_flight must be positive")
        self.max_ops = max_ops
        self.max_bytes = max_bytes
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self._pending: deque[tuple[T, int]] = deque()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def add(self, item: T, size: int) -> list[list[T]]:
        """Queue an item; returns the batches to send now."""
        self._pending.append((item, size))
        return self._ready()

    def completed(self) -> list[list[T]]:
        """A sent batch finished (either way); returns the batches to send now."""
        if self.in_flight == 0:
            raise RuntimeError("completed() without a batch in flight")
        self.in_flight -= 1
        return self._ready()

    def set_max_in_flight(self, max_in_flight: int) -> list[list[T]]:
        """Change how many batches may be in flight; returns the batches that may go now."""
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be positive")
        self.max_in_flight = max_in_flight
        return self._ready()

    def abandon(self) -> list[T]:
        """Drop everything queued (e.g. on losing leadership) and return it."""
        items = [item for item, _ in self._pending]
        self._pending.clear()
        return items

    def _ready(self) -> list[list[T]]:
        batches = []
        while self._pending and self.in_flight < self.max_in_flight:
            batches.append(self._take())
            self.in_flight += 1
        return batches

    def _take(self) -> list[T]:
        batch: list[T] = []
        total = 0
        while self._pending and len(batch) < self.max_ops:
            item, size = self._pending[0]
            if batch and total + size > self.max_bytes:
                break
            self._pending.popleft()
            batch.append(item)
            total += size
        return batch
