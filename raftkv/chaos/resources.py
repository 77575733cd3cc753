"""What a chaos run's processes hold over time, and whether a long-lived one keeps growing (issue 30).

Every SAMPLE_SECONDS while the workload runs (not while the final checks read every
feed in full), the run records each process's resident memory, open file
descriptors and threads (the nodes, the learners, the harness itself), and how many
nodes the cluster has then. A process restarted by a fault is a new series: only
its own life is compared. `grown` (pure) judges a series from SETTLE_SECONDS into
the process's life (caches, pools and the first compactions settle by then) to its
end, on the samples taken with as many nodes as at the end (a learner and the
harness hold connections to every node, so a join is not a leak): the peak of the
later half more than GROWTH_LIMIT above the peak of the earlier half, and by more
than a small floor (a few descriptors come and go with connections), is a leak to
find. Peaks, not the first and last samples: memtables fill and flush, and a
learner's memory swings by half between those without growing.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

SAMPLE_SECONDS = 60.0
SETTLE_SECONDS = 600.0
GROWTH_LIMIT = 0.20
FLOORS = {"rss_kib": 8 * 1024, "fds": 16, "threads": 4}  # growth below these is noise, whatever the ratio


@dataclass(frozen=True)
class Usage:
    at: float  # seconds into the run
    rss_kib: int
    fds: int
    threads: int
    nodes: int = 0  # the cluster's nodes when sampled


def usage(pid: int | str, at: float, nodes: int = 0) -> Usage | None:
    """The process's usage now, from /proc; None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    if "VmRSS" not in fields:  # a zombie: exited, not reaped yet
        return None
    return Usage(at, int(fields["VmRSS"].split()[0]), fds, int(fields["Threads"]), nodes)


def grown(series: Mapping[str, Sequence[Usage]], settle: float = SETTLE_SECONDS,
          limit: float = GROWTH_LIMIT) -> list[str]:
    """One line for each series that grew past `limit` from `settle` seconds into its life to its end."""
    problems = []
    for name, samples in series.items():
        settled = [s for s in samples if s.at - samples[0].at >= settle]
        alike = [s for s in settled if s.nodes == settled[-1].nodes] if settled else []
        if len(alike) < 2:
            continue
        earlier, later = alike[:len(alike) // 2], alike[len(alike) // 2:]
        for what, floor in FLOORS.items():
            first = max(earlier, key=lambda s: getattr(s, what))
            last = max(later, key=lambda s: getattr(s, what))
            before, after = getattr(first, what), getattr(last, what)
            if after > before * (1 + limit) and after - before > floor:
                problems.append(f"{name}: {what} grew from {before:,} to {after:,} (+{after / before - 1:.0%}) "
                                f"between {first.at:.0f} s and {last.at:.0f} s into the run")
    return problems


class ResourceWatch:
    """Samples `processes()` (name -> pid) now and then every `every` seconds on a thread, until `stop`;
    `nodes()` is how many nodes the cluster has."""

    def __init__(self, processes: Callable[[], Mapping[str, int | str]], every: float = SAMPLE_SECONDS,
                 nodes: Callable[[], int] = lambda: 0):
        self._processes = processes
        self._nodes = nodes
        self._every = every
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self.series: dict[str, list[Usage]] = {}  # "<name> (pid <pid>)" -> its samples
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-resources", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> dict[str, Usage]:
        """Each process's usage now, by name (also kept in its series)."""
        at = time.monotonic() - self._started
        now, nodes = {}, self._nodes()
        for name, pid in self._processes().items():
            if (found := usage(pid, at, nodes)) is not None:
                now[name] = found
                with self._lock:
                    self.series.setdefault(f"{name} (pid {pid})", []).append(found)
        return now

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.sample()
