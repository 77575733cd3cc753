"""The network between `MemoryGroup` members: one queue, delivered when the test says.

Messages to a member that is down are lost, and so is what was in flight on
a member's connections when it went down (`drop`). `isolate` cuts a member off
until `heal`. Time is `tick()`: every running member ticks, then every message
is delivered.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Protocol


class Member(Protocol):
    closed: bool

    def receive(self, src: str, message: dict) -> None: ...

    def tick(self) -> None: ...


class MemoryNetwork:
    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)
        self.members: dict[str, Member] = {}
        self.queue: deque[tuple[str, str, dict]] = deque()
        self._cut: set[str] = set()

    def send(self, src: str, dst: str, message: dict) -> None:
        member = self.members.get(dst)
        if src not in self._cut and dst not in self._cut and member is not None and not member.closed:
            self.queue.append((src, dst, message))

    def drop(self, address: str) -> None:
        self.queue = deque(m for m in self.queue if address not in m[:2])

    def deliver(self) -> int:
        """Deliver every message queued so far (not those they cause); how many were delivered."""
        count = 0
        for _ in range(len(self.queue)):
            src, dst, message = self.queue.popleft()
            member = self.members.get(dst)
            if member is not None and not member.closed and dst not in self._cut:
                member.receive(src, message)
                count += 1
        return count

    def stabilize(self, rounds: int = 1000) -> None:
        """Deliver until no message is in flight."""
        for _ in range(rounds):
            if not self.queue:
                return
            self.deliver()
        raise RuntimeError("messages still in flight after %d rounds" % rounds)

    def tick(self, times: int = 1) -> None:
        for _ in range(times):
            for member in list(self.members.values()):
                if not member.closed:
                    member.tick()
            self.stabilize()

    def isolate(self, address: str) -> None:
        self._cut.add(address)

    def heal(self) -> None:
        self._cut.clear()
