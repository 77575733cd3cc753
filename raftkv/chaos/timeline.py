"""The nemesis timeline: every fault injected, whom it hit, when, when it was healed, and what was seen."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class FaultRecord:
    fault: str  # kill, pause, partition, ...
    variant: str
    targets: tuple[str, ...]
    start: float  # time.monotonic()
    healed: float | None = None
    recovered: float | None = None  # every partition took a write again
    notes: list[str] = field(default_factory=list)  # what the injector did and saw
    problems: list[str] = field(default_factory=list)  # what the cluster did wrong (reported as violations)

    @property
    def name(self) -> str:
        return f"{self.fault}:{self.variant}"


class Timeline:
    """Fault records in the order they were injected (thread-safe)."""

    def __init__(self):
        self.started = time.monotonic()  # the runner resets it when the workload starts
        self._lock = threading.Lock()
        self._records: list[FaultRecord] = []
        self.current: FaultRecord | None = None  # the fault in force, for a live display

    def begin(self, fault: str, variant: str, targets: tuple[str, ...]) -> FaultRecord:
        record = FaultRecord(fault, variant, targets, time.monotonic())
        with self._lock:
            self._records.append(record)
        self.current = record
        return record

    def healed(self, record: FaultRecord) -> None:
        record.healed = time.monotonic()
        self.current = None

    def records(self) -> list[FaultRecord]:
        with self._lock:
            return list(self._records)

    def dump(self, path: Path) -> None:
        """JSON: each record with its times also given in seconds since the run started."""

        def relative(t: float | None) -> float | None:
            return None if t is None else round(t - self.started, 3)

        doc = {
            "started_monotonic": self.started,
            "faults": [
                {**asdict(r), "start_s": relative(r.start), "healed_s": relative(r.healed),
                 "recovered_s": relative(r.recovered)}
                for r in self.records()
            ],
        }
        Path(path).write_text(json.dumps(doc, indent=1))
