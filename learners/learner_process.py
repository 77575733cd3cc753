"""A learner process: readonly replicas of some partitions, a sink, and the feed pump.

Like a node, everything runs on one asyncio loop: the replicas' pysyncobj
ticks (see raftkv.syncobj_loop) and the pump; sink calls run in a worker
thread.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Mapping

from prometheus_client import Counter, Gauge

from learners.feed_pump import FeedPump
from learners.learner_replica import LearnerReplica
from learners.sinks.base import load_sink
from raftkv import metrics
from raftkv.partitioning import replicas_for
from raftkv.spec import ClusterSpec

log = logging.getLogger(__name__)

LAG_ENTRIES = Gauge("raftkv_learner_lag_entries", "Committed entries not yet delivered by the sink", ["partition"])
DELIVERY_FAILURES = Counter("raftkv_learner_delivery_failures_total", "Failed sink deliveries (each retried)")


def learner_folder(spec: ClusterSpec, name: str) -> Path:
    base = spec.path.resolve().parent if spec.path else Path.cwd()
    return base / "learners" / name


async def serve(spec: ClusterSpec, name: str, sink_name: str, sink_options: Mapping[str, str],
                partitions: list[int], folder: Path, metrics_port: int | None = None) -> None:
    """Run until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sink = load_sink(sink_name)
    sink.open({"learner": name, **sink_options})
    replicas: dict[int, LearnerReplica] = {}
    try:
        for p in partitions:
            voters = [spec.node(n).raft_address(p) for n in replicas_for(p, spec.node_ids, spec.replication)]
            replicas[p] = LearnerReplica(partition=p, voter_addresses=voters, folder=folder / f"p{p:04d}",
                                         tuning=spec.tuning, loop=loop)
        if metrics_port:
            metrics.serve("127.0.0.1", metrics_port)
        pump = FeedPump(spec.name, replicas, sink)
        loop.create_task(_publish(pump, stop))
        print(f"raftkv learner {name} ready: partitions {partitions}, sink {sink_name}", flush=True)
        await pump.run(stop)
    finally:
        for replica in replicas.values():
            replica.close()
        sink.close()


async def _publish(pump: FeedPump, stop: asyncio.Event) -> None:
    reported = 0
    while not stop.is_set():
        for p, lag in pump.lag().items():
            LAG_ENTRIES.labels(p).set(lag)
        DELIVERY_FAILURES.inc(pump.failures - reported)
        reported = pump.failures
        await asyncio.sleep(1.0)
