"""The console's time series: a fixed ring of one-second samples, and the arithmetic that turns two
readings of a node's counters into one sample. Pure: the sampler (sampler.py) reads the counters."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Sequence

FIELDS = ("at", "reads", "writes", "p50_ms", "p99_ms", "feed_lag", "fsyncs", "raft_bytes")
HOUR = 3600


@dataclass(frozen=True)
class Reading:
    """The node's counters at one moment: totals since start, but `feed_lag`, a level."""

    at: float  # unix seconds
    reads: float
    writes: float
    buckets: tuple[tuple[float, float], ...]  # the latency histogram: (upper bound, cumulative count), +Inf last
    fsyncs: float
    raft_bytes: float
    feed_lag: float


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The q-quantile of cumulative buckets, interpolated within its bucket as Prometheus'
    `histogram_quantile` does; None without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank and count > below:
            if math.isinf(bound):
                return lower  # the highest finite bound: nothing better is known
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def sample(before: Reading, now: Reading) -> tuple[float | None, ...]:
    """One row of FIELDS: the rates between two readings, latencies in milliseconds."""
    seconds = now.at - before.at

    def rate(a: float, b: float) -> float:
        return max(0.0, b - a) / seconds if seconds > 0 else 0.0

    window = [(bound, max(0.0, c - c0)) for (bound, c), (_, c0) in zip(now.buckets, before.buckets)]
    p50, p99 = (quantile(q, window) for q in (0.5, 0.99))
    return (now.at, rate(before.reads, now.reads), rate(before.writes, now.writes),
            None if p50 is None else p50 * 1000, None if p99 is None else p99 * 1000, now.feed_lag,
            rate(before.fsyncs, now.fsyncs), rate(before.raft_bytes, now.raft_bytes))


class Ring:
    """The newest `capacity` rows; older ones fall off."""

    def __init__(self, capacity: int = HOUR):
        self._rows: deque[tuple] = deque(maxlen=capacity)

    def add(self, row: tuple) -> None:
        self._rows.append(row)

    def last(self) -> tuple | None:
        return self._rows[-1] if self._rows else None

    def since(self, at: float) -> list[tuple]:
        """The rows sampled after `at` (unix seconds), oldest first."""
        rows = []
        for row in reversed(self._rows):
            if row[0] <= at:
                break
            rows.append(row)
        rows.reverse()
        return rows
