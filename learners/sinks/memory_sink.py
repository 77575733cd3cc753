"""The Sink protocol in memory: for tests of what drives a sink (the feed pump), and nothing else.

Like the real sinks it is resumable and idempotent: `flush` makes what was
delivered since the last flush durable together with its positions, events
are kept by their id (partition, index, seq) so a redelivery changes nothing,
and `recover` returns the positions of the last flush. `fail_next` makes the
next calls of `deliver` or `flush` raise Unavailable, as a broker outage would,
and forgets what the failed transaction held.

It is not registered under `raftkv.sinks`: a learner process's memory is gone
when it stops, so it could never resume from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from learners.change_event import ChangeEvent
from learners.sinks.base import DeliveryBatch
from learners.sinks.options import OptionReader
from raftkv.core.errors import Unavailable


@dataclass(frozen=True)
class MemoryOptions:
    learner: str = "learner"

    @classmethod
    def parse(cls, config: Mapping[str, str]) -> MemoryOptions:
        read = OptionReader(config, "memory sink", known=())
        options = cls(learner=read.text("learner", "learner"))
        read.done()
        return options


class MemorySink:
    def __init__(self) -> None:
        self.options: MemoryOptions | None = None
        self.durable: dict[tuple[int, int, int], ChangeEvent] = {}
        self.positions: dict[int, int] = {}
        self.resyncs: dict[int, list[tuple[int, int]]] = {}  # partition -> (base, index) of each re-sync delivered
        self.flushes = 0
        self.fail_next = 0
        self._pending: list[DeliveryBatch] = []

    @property
    def events(self) -> list[ChangeEvent]:
        """What was made durable, in (partition, index, seq) order."""
        return [self.durable[key] for key in sorted(self.durable)]

    def open(self, config: Mapping[str, str]) -> None:
        self.options = MemoryOptions.parse(config)

    def recover(self) -> dict[int, int]:
        self._pending = []
        return dict(self.positions)

    def deliver(self, batch: DeliveryBatch) -> None:
        self._maybe_fail("deliver")
        self._pending.append(batch)

    def flush(self) -> None:
        self._maybe_fail("flush")
        for batch in self._pending:
            self.durable.update((event.event_id, event) for event in batch.events)
            self.positions.update(batch.positions)
            for partition, base in batch.resyncs.items():
                self.resyncs.setdefault(partition, []).append((base, batch.positions[partition]))
        self._pending = []
        self.flushes += 1

    def close(self) -> None:
        self._pending = []

    def _maybe_fail(self, stage: str) -> None:
        if self.fail_next > 0:
            self.fail_next -= 1
            self._pending = []
            raise Unavailable(f"memory sink: {stage} failed (injected); deliver again")
