"""A steady write load on a running cluster (elastic tests, scripts/upgrade_check.py): writer threads
putting distinct keys, every acknowledged write kept with when it was acknowledged.

    with WriteLoad(endpoints, partitions, tls=tls) as load:
        ...                                   # move replicas, restart nodes
    load.longest_gap()                        # the longest time without an acknowledgement
    load.not_read_back()                      # acknowledged writes one scan does not return
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from typing import Sequence

from raftkv.client.sync_client import Client
from raftkv.core.partitioning import partition_for_key
from raftkv.security.tls import Tls


def longest_gap(times: Sequence[float], start: float | None = None, end: float | None = None) -> float:
    """The longest stretch between consecutive sorted `times`, and from `start` to the first and from the
    last to `end` when given (a window with no time in it at all is one gap). Pure."""
    inside = [t for t in times if (start is None or t >= start) and (end is None or t <= end)]
    edges = ([start] if start is not None else []) + inside + ([end] if end is not None else [])
    return max((b - a for a, b in zip(edges, edges[1:])), default=0.0)


class WriteLoad:
    """`threads` writers putting distinct keys `<prefix><worker>-<n>`; a write that fails is not counted,
    its error is (`errors`, by type), and the writer goes on with its next key."""

    def __init__(self, endpoints: list[str], partitions: int, threads: int = 8, tls: Tls | None = None,
                 prefix: bytes = b"w", timeout: float = 10.0):
        self.endpoints = endpoints
        self.partitions = partitions
        self.tls = tls
        self.prefix = prefix
        self.timeout = timeout
        self.acked: dict[bytes, bytes] = {}
        self.acks: list[tuple[float, int]] = []  # (time.monotonic() of the acknowledgement, partition)
        self.errors: Counter[str] = Counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._write, args=(i,), daemon=True) for i in range(threads)]

    def __enter__(self) -> WriteLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)

    def _write(self, worker: int) -> None:
        rng = random.Random(worker)
        with Client(self.endpoints, timeout=self.timeout, tls=self.tls) as kv:
            i = 0
            while not self._stop.is_set():
                key, value = self.prefix + b"%d-%07d" % (worker, i), b"%d" % rng.randrange(10**9)
                i += 1
                try:
                    kv.put(key, value)
                except Exception as exc:  # noqa: BLE001 - counted; Unavailable and Undetermined are expected
                    with self._lock:
                        self.errors[type(exc).__name__] += 1
                    continue
                now = time.monotonic()
                with self._lock:
                    self.acked[key] = value
                    self.acks.append((now, partition_for_key(key, self.partitions)))

    def ack_times(self, start: float | None = None, end: float | None = None) -> list[float]:
        with self._lock:
            return [t for t, _ in self.acks if (start is None or t >= start) and (end is None or t <= end)]

    def longest_gap(self, start: float | None = None, end: float | None = None) -> float:
        """The longest time in [start, end] without any acknowledged write."""
        return longest_gap(self.ack_times(start, end), start, end)

    @property
    def longest_partition_gap(self) -> dict[int, float]:
        """Per partition, the longest time between two of its acknowledged writes."""
        times: dict[int, list[float]] = defaultdict(list)
        with self._lock:
            for t, p in self.acks:
                times[p].append(t)
        return {p: longest_gap(ts) for p, ts in times.items()}

    def not_read_back(self) -> dict[bytes, bytes]:
        """Acknowledged writes that one linearizable scan of the prefix does not return as written (a get
        per key took a minute at a load of 30)."""
        with Client(self.endpoints, timeout=self.timeout, tls=self.tls) as kv:
            stored = dict(kv.scan(prefix=self.prefix, consistency="linearizable"))
        return {k: v for k, v in self.acked.items() if stored.get(k) != v}
