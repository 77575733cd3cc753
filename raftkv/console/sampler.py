"""Once a second on the node's loop: the node's counters into the ring buffer, the gauges the alert
rules need, and the events seen since the last turn (leaders, metadata, disks, learners)."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from prometheus_client import Metric

from raftkv.console.events import EventLog, topology_events
from raftkv.console.ring import Reading, Ring, sample
from raftkv.core import metrics
from raftkv.meta.records import ClusterMeta, group_name

DATA_BYTES_EVERY = 10  # seconds: walking the data directory costs more than the rest together (off the loop)
STALL_SECONDS = 30.0  # a learner with lag that delivered nothing this long is reported stalled


@dataclass(frozen=True)
class ReplicaView:
    """What the sampler reads of one hosted voter."""

    partition: int
    leading: bool
    term: int
    storage_full: bool
    live_voters: int = 0  # leading: the voters it is connected to, itself included
    last_data_index: int = 0  # leading: the last entry that was more than learners' progress reports
    learners: tuple[tuple[str, int], ...] = ()  # leading: (learner, delivered index)


def _total(metric, suffix: str = "_total") -> float:
    return sum(s.value for m in metric.collect() for s in m.samples if s.name.endswith(suffix))


def _buckets(histogram) -> tuple[tuple[float, float], ...]:
    family: Metric = histogram.collect()[0]
    return tuple((float(s.labels["le"]), s.value) for s in family.samples if s.name.endswith("_bucket"))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def tree_bytes(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # removed while walking (a compaction)
                pass
    return total


class Sampler:
    def __init__(self, me: str, data_dir: Path, events: EventLog, ring: Ring,
                 clock: Callable[[], float] = time.time):
        self._me, self._data_dir, self._events, self._ring, self._clock = me, data_dir, events, ring, clock
        self.started_at = clock()
        self._reading: Reading | None = None
        self._cpu = (time.monotonic(), sum(os.times()[:2]))
        self.cpu_percent = 0.0
        self.data_bytes = 0
        self.rss = 0
        self.disk_free = 0
        self._topology: ClusterMeta | None = None
        self._leading: dict[int, int] = {}  # partition -> term this node leads it in
        self._full: set[int] = set()
        self._shown: dict[tuple, float] = {}  # gauge series -> value set (set only when they change)
        self._moves: dict[int, float] = {}  # group -> when this node first saw its move
        self._delivered: dict[tuple[str, int], tuple[int, float, bool]] = {}  # -> (index, since, reported)

    def measured_data(self, size: int) -> None:
        """The data directory's size (`tree_bytes`, walked off the loop every DATA_BYTES_EVERY seconds)."""
        self.data_bytes = size
        self._set(metrics.DATA_BYTES, (), size)

    def rates(self) -> tuple[float, float]:
        """(writes, reads) per second over the last second."""
        row = self._ring.last()
        return (row[2], row[1]) if row is not None else (0.0, 0.0)

    def tick(self, topology: ClusterMeta, replicas: Iterable[ReplicaView]) -> None:
        now = self._clock()
        replicas = list(replicas)
        self._process(now)
        feed_lag = self._leaders_and_learners(now, replicas)
        ops = {s.labels["kind"]: s.value for s in metrics.CLIENT_OPS.collect()[0].samples if s.name.endswith("_total")}
        reading = Reading(now, ops.get("read", 0.0), ops.get("write", 0.0), _buckets(metrics.REQUEST_SECONDS),
                          _total(metrics.NODE_FSYNCS), _total(metrics.NODE_RAFT_BYTES_SENT), feed_lag)
        if self._reading is not None:
            self._ring.add(sample(self._reading, reading))
        self._reading = reading
        self._storage(now, replicas)
        self._metadata(now, topology)

    def _set(self, gauge, labels: tuple, value: float) -> None:
        key = (gauge, labels)
        if self._shown.get(key) != value:
            self._shown[key] = value
            (gauge.labels(*labels) if labels else gauge).set(value)

    def _drop(self, gauge, labels: tuple) -> None:
        if self._shown.pop((gauge, labels), None) is not None:
            gauge.remove(*labels)

    def _process(self, now: float) -> None:
        wall, cpu = time.monotonic(), sum(os.times()[:2])
        if wall > self._cpu[0]:
            self.cpu_percent = 100.0 * (cpu - self._cpu[1]) / (wall - self._cpu[0])
        self._cpu = (wall, cpu)
        usage = shutil.disk_usage(self._data_dir)
        self.disk_free = usage.free
        self._set(metrics.DISK_FREE, (), usage.free)
        self._set(metrics.DISK_SIZE, (), usage.total)
        self.rss = _rss()

    def _leaders_and_learners(self, now: float, replicas: list[ReplicaView]) -> int:
        """Leader-change events and the leaders' gauges; the largest learner lag over the partitions led here."""
        leading = {r.partition: r.term for r in replicas if r.leading}
        for p, term in leading.items():
            if self._leading.get(p) != term:
                self._events.record(now, "leader", f"partition {p}", f"{self._me} leads (term {term})")
        for p in set(self._leading) - set(leading):
            self._drop(metrics.LIVE_VOTERS, (p,))
        self._leading = leading
        worst, seen = 0, set()
        for r in replicas:
            if not r.leading:
                continue
            self._set(metrics.LIVE_VOTERS, (r.partition,), r.live_voters)
            for name, delivered in r.learners:
                lag = max(0, r.last_data_index - delivered)
                worst = max(worst, lag)
                seen.add((name, r.partition))
                self._set(metrics.LEARNER_LAG, (r.partition, name), lag)
                self._stall(now, name, r.partition, delivered, lag)
        for name, p in set(self._delivered) - seen:
            del self._delivered[(name, p)]
            self._drop(metrics.LEARNER_LAG, (p, name))
        return worst

    def _stall(self, now: float, name: str, p: int, delivered: int, lag: int) -> None:
        index, since, reported = self._delivered.get((name, p), (delivered, now, False))
        if delivered != index or lag == 0:
            if reported:
                self._events.record(now, "learner", f"learner {name}", f"partition {p}: delivering again")
            self._delivered[(name, p)] = (delivered, now, False)
            return
        if not reported and now - since >= STALL_SECONDS:
            self._events.record(now, "learner", f"learner {name}",
                                f"partition {p}: nothing delivered for {now - since:.0f}s, {lag} entries behind")
            reported = True
        self._delivered[(name, p)] = (index, since, reported)

    def _storage(self, now: float, replicas: list[ReplicaView]) -> None:
        full = {r.partition for r in replicas if r.storage_full}
        for p in full - self._full:
            self._events.record(now, "storage", f"partition {p}", f"disk full on {self._me}: writes refused")
        for p in self._full - full:
            self._events.record(now, "storage", f"partition {p}", f"{self._me} writes again")
        self._full = full
        self._set(metrics.STORAGE_FULL, (), len(full))

    def _metadata(self, now: float, topology: ClusterMeta) -> None:
        if self._topology is not None and topology.epoch != self._topology.epoch:
            self._events.extend(topology_events(self._topology, topology, now))
        self._topology = topology
        self._set(metrics.REPLICATION_FACTOR, (), topology.replication)
        self._set(metrics.MOVES, (), len(topology.moves))
        under_way = {m.group for m in topology.moves}
        for g in under_way:
            first = self._moves.setdefault(g, now)
            metrics.MOVE_AGE.labels(group_name(g)).set(now - first)
        for g in set(self._moves) - under_way:
            del self._moves[g]
            metrics.MOVE_AGE.remove(group_name(g))
