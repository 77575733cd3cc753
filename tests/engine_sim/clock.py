"""Virtual time: one scheduler runs every event of a simulation in order, and each member's event
loop is a view of it.

A step is one event: a member's tick, a message delivered, a fault, a client's proposal. Events at
the same virtual time run in the order they were scheduled. `virtual_time` points pysyncobj's clock
and randomness at the scheduler's, and puts them back afterwards; our Raft code is given the
scheduler's clock (`Scheduler.time`) as its `Clock` (raftkv/core/clock.py).
"""

from __future__ import annotations

import contextlib
import heapq
import random
from typing import Callable, Iterator

import pysyncobj.syncobj


class Handle:
    """A scheduled event; `cancel()` drops it (what asyncio's TimerHandle offers)."""

    __slots__ = ("when", "callback", "args", "loop", "member", "cancelled")

    def __init__(self, when: float, callback: Callable, args: tuple, loop: SimLoop | None, member: object):
        self.when = when
        self.callback = callback
        self.args = args
        self.loop = loop  # a dead loop's events never run (its process crashed)
        self.member = member  # whose state the event may change: what the checks look at after it
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Scheduler:
    def __init__(self):
        self.now = 0.0
        self.steps = 0
        self._queue: list[tuple[float, int, Handle]] = []
        self._seq = 0

    def time(self) -> float:
        return self.now

    def at(self, when: float, callback: Callable, *args, loop: SimLoop | None = None,
           member: object = None) -> Handle:
        handle = Handle(max(when, self.now), callback, args, loop, member)
        self._seq += 1
        heapq.heappush(self._queue, (handle.when, self._seq, handle))
        return handle

    def after(self, delay: float, callback: Callable, *args, member: object = None) -> Handle:
        return self.at(self.now + delay, callback, *args, member=member)

    def step(self) -> Handle | None:
        """Run the next live event; None when nothing is left."""
        queue = self._queue
        while queue:
            when, _, handle = heapq.heappop(queue)
            if handle.cancelled or handle.loop is not None and handle.loop.dead:
                continue
            self.now = when
            self.steps += 1
            handle.callback(*handle.args)
            return handle
        return None


class SimLoop:
    """The part of an asyncio loop a member's `Ticker` uses, on the scheduler. A crash kills it."""

    def __init__(self, scheduler: Scheduler, member: object):
        self._scheduler = scheduler
        self.member = member
        self.dead = False

    def time(self) -> float:
        return self._scheduler.now

    def call_soon(self, callback: Callable, *args) -> Handle:
        return self._scheduler.at(self._scheduler.now, callback, *args, loop=self, member=self.member)

    def call_later(self, delay: float, callback: Callable, *args) -> Handle:
        return self._scheduler.at(self._scheduler.now + delay, callback, *args, loop=self, member=self.member)


@contextlib.contextmanager
def virtual_time(scheduler: Scheduler, seed: int, create_journal: Callable) -> Iterator[None]:
    """pysyncobj's clock, its randomness (election timeouts) and its journal factory, pointed at the
    simulation's; restored on exit."""
    patches = [
        (pysyncobj.syncobj, "monotonicTime", scheduler.time),
        (pysyncobj.syncobj, "random", random.Random(seed)),
        (pysyncobj.syncobj, "createJournal", create_journal),
    ]
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    try:
        for module, name, value in patches:
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
