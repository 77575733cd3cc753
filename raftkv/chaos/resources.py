"""What a chaos run's processes hold over time, and whether a long-lived one keeps growing (issue 30).

Every SAMPLE_SECONDS the run records each process's resident memory, open file
descriptors and threads (the nodes, the learner, the harness itself). A process
restarted by a fault is a new series: only its own life is compared. `grown` (pure)
judges a series from its first sample SETTLE_SECONDS into the process's life
(caches, pools and the first compactions settle by then) to its last: more than
GROWTH_LIMIT up, and by more than a small floor (a few descriptors come and go
with connections), is a leak to find.
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


def usage(pid: int | str, at: float) -> Usage | None:
    """The process's usage now, from /proc; None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    if "VmRSS" not in fields:  # a zombie: exited, not reaped yet
        return None
    return Usage(at, int(fields["VmRSS"].split()[0]), fds, int(fields["Threads"]))


def grown(series: Mapping[str, Sequence[Usage]], settle: float = SETTLE_SECONDS,
          limit: float = GROWTH_LIMIT) -> list[str]:
    """One line for each series that grew past `limit` from `settle` seconds into its life to its end."""
    problems = []
    for name, samples in series.items():
        settled = [s for s in samples if s.at - samples[0].at >= settle]
        if len(settled) < 2:
            continue
        first, last = settled[0], settled[-1]
        for what, floor in FLOORS.items():
            before, after = getattr(first, what), getattr(last, what)
            if after > before * (1 + limit) and after - before > floor:
                problems.append(f"{name}: {what} grew from {before:,} to {after:,} (+{after / before - 1:.0%}) "
                                f"between {first.at:.0f} s and {last.at:.0f} s into the run")
    return problems


class ResourceWatch:
    """Samples `processes()` (name -> pid) now and then every `every` seconds on a thread, until `stop`."""

    def __init__(self, processes: Callable[[], Mapping[str, int | str]], every: float = SAMPLE_SECONDS):
        self._processes = processes
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
        now = {}
        for name, pid in self._processes().items():
            if (found := usage(pid, at)) is not None:
                now[name] = found
                with self._lock:
                    self.series.setdefault(f"{name} (pid {pid})", []).append(found)
        return now

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.sample()
