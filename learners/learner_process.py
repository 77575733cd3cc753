"""A learner process: readonly replicas of some partitions, a sink, and the feed pump.

Like a node, everything runs on one asyncio loop: the replicas' Raft
ticks (see raftkv.raft.syncobj_loop) and the pump; sink calls run in a worker
thread.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Callable, Mapping

import grpc
from prometheus_client import Counter, Gauge

from learners import learner_status
from learners.changelog_service import ChangeLogService, ChangeSource
from learners.feed_pump import FeedPump
from learners.learner_replica import LearnerReplica
from learners.sinks.base import Sink, load_sink
from learners.sinks.options import limits
from raftkv.core import metrics
from raftkv.api import kv_pb2_grpc
from raftkv.node.gatekeeper import Gatekeeper
from raftkv.node.group_commit import PartitionFrontend
from raftkv.node.peers import Peers
from raftkv.node.process import close_reporting
from raftkv.node.service import api_server
from raftkv.node.reads import LocalReads
from raftkv.node.service import KVService
from raftkv.raft.syncobj_group import GroupConfig, SyncObjGroup
from raftkv.client.async_client import AsyncClient
from raftkv.client.sync_client import Client, LearnerView
from raftkv.core.errors import ConfigError, CorruptData, RaftKVError, Unavailable
from raftkv.core.spec import ClusterSpec
from raftkv.meta.bootstrap import spec_meta
from raftkv.meta.records import ClusterMeta, raft_directory
from raftkv.raft.hub import RaftHub
from raftkv.security.tls import Tls, learner_tls, listen

log = logging.getLogger(__name__)

LAG_ENTRIES = Gauge("raftkv_learner_lag_entries", "Committed entries not yet delivered by the sink", ["partition"])
LAG_SECONDS = Gauge("raftkv_learner_lag_seconds", "Seconds since the feed last had every committed entry",
                    ["partition"])
DELIVERY_FAILURES = Counter("raftkv_learner_delivery_failures_total", "Failed sink deliveries (each retried)")
RESYNCS = Counter("raftkv_learner_resyncs_total", "Re-syncs through a snapshot (emitted as op=r events)")


def learner_folder(spec: ClusterSpec, name: str) -> Path:
    base = spec.path.resolve().parent if spec.path else Path.cwd()
    return base / "learners" / name


def registration(spec: ClusterSpec, name: str) -> LearnerView:
    """The learner's sink, options and partitions, as registered through the partitions' logs."""
    with Client([n.api_address for n in spec.nodes], timeout=10.0, tls=learner_tls(spec)) as client:
        learners = client.learners()
    if name not in learners:
        known = ", ".join(learners) or "none"
        raise ConfigError(f"learner {name!r} is not registered (registered: {known}); "
                          f"add it with `raftkv learner add --name {name} --sink ...`", source="learner start")
    return learners[name]


async def _serve_reads(spec: ClusterSpec, tls: Tls | None, topology: ClusterMeta, name: str,
                       replicas: dict[int, LearnerReplica], api_port: int, loop: asyncio.AbstractEventLoop, sink: Sink,
                       current: Callable[[], ClusterMeta]) -> grpc.aio.Server:
    """The node API over the learner's copies: follower reads and scans here, the rest forwarded to leaders
    (with the cluster's TLS a learner may only read, so writes must go to the nodes themselves).

    A sink that keeps the changes it received (the `changelog` sink) is served as the ChangeLog service.
    Its callers are checked against the users and roles of `current()` metadata.
    """
    frontends = {}
    for p, replica in replicas.items():
        by_address = {n.raft_address(p): n.id for n in topology.nodes}
        frontends[p] = PartitionFrontend(replica, loop, max_batch_ops=1, max_batch_bytes=1, request_timeout=1.0,
                                         leader_id_of=by_address.get)
    gate = Gatekeeper(enforce=spec.tls is not None, meta=current)
    service = KVService(spec, f"learner/{name}", frontends, LocalReads(frontends), lambda: topology,
                        Peers(lambda node_id: topology.node(node_id).api_address, tls), gate)
    server = api_server()
    kv_pb2_grpc.add_KVServicer_to_server(service, server)
    if isinstance(sink, ChangeSource):
        kv_pb2_grpc.add_ChangeLogServicer_to_server(ChangeLogService(sink, loop, gate), server)
    listen(server, f"127.0.0.1:{api_port}", tls)
    await server.start()
    return server


async def _topology(client: AsyncClient, spec: ClusterSpec) -> ClusterMeta:
    """Where the partitions' voters are now (replicas may have moved since the spec was written)."""
    meta = (await client.topology()).meta
    return meta if meta.epoch else spec_meta(spec)


async def serve(spec: ClusterSpec, name: str, sink_name: str, sink_options: Mapping[str, str],
                partitions: list[int], folder: Path, metrics_port: int | None = None,
                api_port: int | None = None) -> None:
    """Run until SIGTERM or SIGINT, or until a copy's files cannot be trusted (then raise why)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    failure: list[CorruptData] = []

    def stop_on(error: CorruptData) -> None:
        if not failure:
            log.error("stopping: %s", error)
            failure.append(error)
            stop.set()

    def corrupt(error: CorruptData) -> None:  # from a group's tick, or from RocksDB on any thread
        loop.call_soon_threadsafe(stop_on, error)
    sink = load_sink(sink_name)
    tls = learner_tls(spec)  # one for the process: its timer takes up renewed files (`_publish`)
    client = AsyncClient([n.api_address for n in spec.nodes], timeout=5.0, tls=tls)
    replicas: dict[int, LearnerReplica] = {}
    server: grpc.aio.Server | None = None
    tasks: list[asyncio.Task] = []
    hub: RaftHub | None = None
    try:
        topology = await _topology(client, spec)
        current = [topology, raft_directory(topology.nodes, spec.partitions)]  # the metadata, the hub's directory
        hub = RaftHub(loop, None, lambda: current[1], tls,
                      retry_seconds=spec.tuning.connection_retry_seconds,
                      dead_after=max(3.5, spec.tuning.election_timeout_max), compression=spec.tuning.wire_compression)
        hub.start()
        tasks.append(loop.create_task(_follow_meta(client, spec, current, stop)))
        await _open_sink(sink, {"learner": name, "cluster_id": topology.cluster_id, **sink_options,
                                **limits(spec.name, spec.max_key_bytes, spec.max_value_bytes)}, stop)
        for p in partitions:
            voters = [topology.node(n).raft_address(p) for n in topology.group_voters(p)]
            config = GroupConfig(partition=p, hub=hub, self_address=None, peers=tuple(voters),
                                 folder=folder / f"p{p:04d}", fsync=False,  # a learner can fetch again from the voters
                                 tuning=spec.tuning, on_corrupt=corrupt)
            replicas[p] = LearnerReplica(p, config.folder,
                                         open_group=lambda copy, config=config: SyncObjGroup(config, copy, loop),
                                         on_corrupt=corrupt)
        if metrics_port:
            metrics.serve("127.0.0.1", metrics_port)
        if api_port:
            server = await _serve_reads(spec, tls, topology, name, replicas, api_port, loop, sink, lambda: current[0])
        pump = FeedPump(spec.name, replicas, sink)
        learner_status.write(folder, {})
        tasks += [loop.create_task(_publish(pump, folder, tls, stop)), loop.create_task(_report_progress(client, name, pump, stop))]
        print(f"raftkv learner {name} ready: partitions {partitions}, sink {sink_name}", flush=True)
        await pump.run(stop)
    finally:
        for task in tasks:  # before the client closes: a report in flight would fail on the closed channel
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.stop(grace=1.0)
        for p, replica in replicas.items():
            close_reporting(f"partition {p}", replica.close)
        if hub is not None:
            await hub.close()
        sink.close()
        await client.close()
    if failure:
        raise failure[0]


async def _follow_meta(client: AsyncClient, spec: ClusterSpec, current: list, stop: asyncio.Event,
                       every: float = 1.0) -> None:
    """Keep `current` ([the metadata, the hub's directory of its nodes]) up to date: the voters of a
    partition may move to a node that joined since the learner started, and a user's roles change.

    It is also how the learner notices that no node answers, and says so once, not at every retry."""
    answered = True
    while not stop.is_set():
        await asyncio.sleep(every)
        try:
            meta = (await client.topology()).meta
        except Unavailable as exc:
            if answered:
                log.warning("no node of the cluster answers; retrying (%s)", exc)
                answered = False
            continue
        except RaftKVError:
            continue
        if not answered:
            log.info("the cluster answers again")
            answered = True
        if meta.epoch:
            directory = current[1] if meta.nodes == current[0].nodes else raft_directory(meta.nodes, spec.partitions)
            current[:] = [meta, directory]


async def _open_sink(sink: Sink, options: dict[str, str], stop: asyncio.Event) -> None:
    """Open the sink, waiting out an unreachable backend; a wrong option (ConfigError) fails at once."""
    backoff = 0.5
    while True:
        try:
            await asyncio.to_thread(sink.open, options)
            return
        except Unavailable as exc:
            log.warning("sink unavailable (%s); retrying in %.1fs", exc, backoff)
            try:
                await asyncio.wait_for(stop.wait(), backoff)
                raise Unavailable("stopped before the sink became available")
            except asyncio.TimeoutError:
                backoff = min(backoff * 2, 10.0)


async def _publish(pump: FeedPump, folder: Path, tls: Tls | None, stop: asyncio.Event) -> None:
    """Once a second: the feed's state to the status file and the metrics, and renewed TLS files taken up."""
    failures = resyncs = 0
    stopped: dict[int, str] = {}
    while not stop.is_set():
        if pump.stopped != stopped:
            stopped = dict(pump.stopped)
            learner_status.write(folder, stopped)
        for p, lag in pump.lag().items():
            LAG_ENTRIES.labels(p).set(lag)
        for p, seconds in pump.lag_seconds().items():
            LAG_SECONDS.labels(p).set(seconds)
        DELIVERY_FAILURES.inc(pump.failures - failures)
        RESYNCS.inc(pump.resyncs - resyncs)
        failures, resyncs = pump.failures, pump.resyncs
        if tls is not None:
            tls.refresh()
        await asyncio.sleep(1.0)


async def _report_progress(client: AsyncClient, name: str, pump: FeedPump, stop: asyncio.Event,
                           every: float = 1.0) -> None:
    """Tell the voters how far the sink has durably got; they replicate it and retain the log for us.

    Once per partition after the start, then only when more than progress reports was delivered since
    the last report: a report is an entry the learner delivers, and reporting that would keep every
    partition's log moving forever, learners lagging by one entry, with no client writing.
    A failure is logged when reports start failing, not at each retry (every second)."""
    reported: dict[int, int] = {}
    failing = False
    while not stop.is_set():
        delivered = {p: r.engine.position.index for p, r in pump.replicas.items()}
        changed = {p: i for p, i in delivered.items()
                   if i > reported.get(p, 0) and (p not in reported or pump.last_data_delivered.get(p, 0) > reported[p])}
        if changed:
            try:
                await client.report_progress(name, changed)
                reported.update(changed)
                failing = False
            except RaftKVError as exc:
                if not failing:
                    log.warning("could not report progress (%s); retrying", exc)
                failing = True
        await asyncio.sleep(every)
