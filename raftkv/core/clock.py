"""Time as an input (etcd's `Tick()`): a decision takes `now`; only what drives it reads a clock.

A part that runs a loop of its own reads the clock once a turn and hands `now` down. A part driven
by callbacks (the Raft hub, a group's ticker, the adapter over the Raft library, the node engine) is
given a `Clock` when it is made, and each callback reads it once. In production every clock is
`time.monotonic`, which the Raft library reads too (raft/syncobj_patches.py points it there): the
adapter writes deadlines the library compares with its own reads, so they must be on one clock
(docs/architecture.md). Tests pass a fake one.
"""

from __future__ import annotations

from typing import Callable

Clock = Callable[[], float]  # seconds on a monotonic clock


class Throttle:
    """At most once every `every` seconds: for a log line a fault would repeat on every message."""

    def __init__(self, every: float):
        self._every = every
        self._last: float | None = None

    def due(self, now: float) -> bool:
        """Whether to act now; if so, the next time is `every` seconds from now."""
        if self._last is not None and now - self._last < self._every:
            return False
        self._last = now
        return True
