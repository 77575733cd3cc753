"""What the fuzzers (tests/test_fuzz_*.py) share: how many inputs to send, and the tally of what was sent.

`make test` runs them short (each test's own count, at least 10,000 inputs in all). `scripts/fuzz.py`
runs the same tests with RAFTKV_FUZZ_SCALE (say 10) and reads the tally they append, one JSON line
per target, to RAFTKV_FUZZ_REPORT. docs/security.md §7 says which inputs go where and why.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

from hypothesis import HealthCheck, settings

SCALE = float(os.environ.get("RAFTKV_FUZZ_SCALE", "1"))
REPORT = os.environ.get("RAFTKV_FUZZ_REPORT")


def inputs(short: int) -> int:
    """How many inputs a target gets: `short` in `make test`, scaled in a long run."""
    return max(1, round(short * SCALE))


def hypothesis_settings(short: int) -> settings:
    """A hypothesis run of `inputs(short)` examples; no example database (a fresh clone has none)."""
    return settings(max_examples=inputs(short), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


class Tally:
    """Inputs sent to one target, how they ended (optional), and the findings: what an input made fail
    that should not have."""

    def __init__(self, target: str):
        self.target = target
        self.sent = 0
        self.outcomes: Counter[str] = Counter()
        self.findings: list[str] = []

    def add(self, count: int = 1, outcome: str | None = None) -> None:
        self.sent += count
        if outcome is not None:
            self.outcomes[outcome] += count

    def finding(self, what: str) -> None:
        self.findings.append(what)


@contextmanager
def tally(target: str) -> Iterator[Tally]:
    """Count a target's inputs; on leaving, append the count (and the time it took) to the report."""
    counted = Tally(target)
    started = time.monotonic()
    try:
        yield counted
    finally:
        if REPORT:
            line = {"target": target, "inputs": counted.sent, "seconds": round(time.monotonic() - started, 1),
                    "outcomes": dict(counted.outcomes.most_common()), "findings": counted.findings}
            with open(REPORT, "a") as report:
                report.write(json.dumps(line) + "\n")
