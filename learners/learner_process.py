"""A learner process: readonly replicas of some partitions, a sink, and the feed pump.

Like a node, everything runs on one asyncio loop: the replicas' Raft
ticks (see raftkv.raft.syncobj_loop) and the pump; sink calls run in a worker
thread.

It starts at once (docs/learners.md, "Start-up"): the sink opens while the replicas' databases open
in a worker thread, and the pump feeds each replica as soon as it is open, not once all are. What only
the `--api-port` needs is imported only then (learner_reads).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Mapping

from prometheus_client import Counter, Gauge

from learners import learner_status, partition_heal
from learners.feed_pump import FeedPump
from learners.learner_replica import LearnerReplica
from learners.release_report import check_release, report_release
from learners.sinks.base import Sink, load_sink
from learners.sinks.options import limits
from raftkv.core import metrics
from raftkv.node.closing import close_reporting
from raftkv.raft.syncobj_group import GroupConfig, SyncObjGroup
from raftkv.client.async_client import AsyncClient, LearnerView
from raftkv.core.errors import ConfigError, CorruptData, LogContradiction, RaftKVError, Unavailable
from raftkv.core.spec import ClusterSpec
from raftkv.meta.bootstrap import spec_meta
from raftkv.meta.records import ClusterMeta, raft_directory
from raftkv.raft.group import RaftGroup, StateMachine
from raftkv.raft.hub import RaftHub
from raftkv.security.tls import Tls, learner_tls
from raftkv.storage import rocks_memory
from raftkv.storage.rocks_engine import RocksEngine

log = logging.getLogger(__name__)

LAG_ENTRIES = Gauge("raftkv_learner_lag_entries", "Committed entries not yet delivered by the sink", ["partition"])
LAG_SECONDS = Gauge("raftkv_learner_lag_seconds", "Seconds since the feed last had every committed entry",
                    ["partition"])
DELIVERY_FAILURES = Counter("raftkv_learner_delivery_failures_total", "Failed sink deliveries (each retried)")
RESYNCS = Counter("raftkv_learner_resyncs_total", "Re-syncs through a snapshot or, after a partition's log "
                  "contradicted its copy, from the cluster (emitted as op=r events)")
TROUBLED = Gauge("raftkv_learner_partitions_not_flowing", "Partitions the learner feeds no events from: stopped "
                 "(the sink refused an event; tried again later) or re-syncing (their log contradicted the copy)",
                 ["state"])
# Replicas' databases opened at the same time, in worker threads. One: rocksdict holds the GIL for most of
# an open (~25 ms here), so more at once only contend with the loop, and the first replica, which the feed
# starts with, opened later (first delivery 0.48 against 0.56 s with 4 at once: docs/learners.md).
OPENING_AT_ONCE = 1


def learner_folder(spec: ClusterSpec, name: str) -> Path:
    base = spec.path.resolve().parent if spec.path else Path.cwd()
    return base / "learners" / name


async def registration(spec: ClusterSpec, tls: Tls | None, name: str) -> LearnerView:
    """The learner's sink, options and partitions, as registered through the partitions' logs (waiting up to
    10 s for partitions that have no leader)."""
    async with AsyncClient([n.api_address for n in spec.nodes], timeout=10.0, tls=tls) as client:
        learners = await client.learners()
    if name not in learners:
        known = ", ".join(learners) or "none"
        raise ConfigError(f"learner {name!r} is not registered (registered: {known}); "
                          f"add it with `raftkv learner add --name {name} --sink ...`", source="learner start")
    return learners[name]


async def _topology(client: AsyncClient, spec: ClusterSpec) -> ClusterMeta:
    """Where the partitions' voters are now (replicas may have moved since the spec was written)."""
    meta = (await client.topology()).meta
    return meta if meta.epoch else spec_meta(spec)


async def serve(spec: ClusterSpec, name: str, folder: Path | None = None,
                sink_overrides: Mapping[str, str] | None = None, metrics_port: int | None = None,
                api_port: int | None = None, host: str = "127.0.0.1") -> None:
    """Run the learner registered as `name` until SIGTERM or SIGINT, or until a copy's files cannot be
    trusted (then raise why). `sink_overrides` take the place of registered sink options; `folder`
    defaults to `learner_folder`; `host`: the address the API and metrics ports listen on."""
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

    def on_corrupt_data(error: CorruptData) -> None:
        if isinstance(error, LogContradiction) and error.partition in replicas and not stop.is_set():
            pump.between_steps(lambda: heal(error))
        else:
            stop_on(error)

    def corrupt(error: CorruptData) -> None:  # from a group's tick, or from RocksDB on any thread
        loop.call_soon_threadsafe(on_corrupt_data, error)

    def heal(error: LogContradiction) -> None:
        p, replica = error.partition, replicas[error.partition]
        log.warning("partition %d re-syncs from the cluster; the other partitions flow on (docs/learners.md): %s",
                    p, error)
        part = replica.engine.folder
        replica.close()
        rebuilding = p in pump.rebuilding
        try:
            aside = partition_heal.set_aside(part)
            replica.reopen(RocksEngine(part, on_corrupt=corrupt), open_group(p))
        except OSError as exc:
            stop_on(CorruptData(f"partition {p}: could not start its copy over ({exc}); {error}"))
            return
        if not rebuilding:
            pump.rebuild(p, RocksEngine(aside, on_corrupt=corrupt), str(error))
    rocks_memory.configure(spec.tuning.rocksdb_block_cache_mb, spec.tuning.rocksdb_memtables_mb)
    folder = folder or learner_folder(spec, name)
    tls = learner_tls(spec)  # one for the process: its timer takes up renewed files (`_publish`)
    client = AsyncClient([n.api_address for n in spec.nodes], timeout=5.0, tls=tls)
    sink: Sink | None = None
    replicas: dict[int, LearnerReplica] = {}
    opening: list[asyncio.Future] = []
    sink_open: asyncio.Future | None = None
    pumping: asyncio.Task | None = None
    pump: FeedPump | None = None
    served = None  # with --api-port: learner_reads' gRPC server and its KV service
    tasks: list[asyncio.Task] = []
    hub: RaftHub | None = None
    try:
        registered, topology = await asyncio.gather(registration(spec, tls, name), _topology(client, spec))
        check_release(topology)
        sink = load_sink(registered.sink)
        partitions = sorted(registered.progress)
        current = [topology, raft_directory(topology.nodes, spec.partitions)]  # the metadata, the hub's directory
        hub = RaftHub(loop, None, lambda: current[1], tls,
                      retry_seconds=spec.tuning.connection_retry_seconds,
                      dead_after=max(3.5, spec.tuning.election_timeout_max), compression=spec.tuning.wire_compression)
        hub.start()
        tasks.append(loop.create_task(_follow_meta(client, spec, current, stop)))
        tasks.append(loop.create_task(report_release(client, name, lambda: current[0], stop)))
        sink_open = asyncio.ensure_future(_open_sink(sink, {
            "learner": name, "cluster_id": topology.cluster_id, **registered.options, **(sink_overrides or {}),
            **limits(spec.name, spec.max_key_bytes, spec.max_value_bytes)}, stop))
        pump = FeedPump(spec.name, {}, sink, on_gap=on_corrupt_data)

        def open_group(p: int) -> Callable[[StateMachine], RaftGroup]:
            return lambda copy: SyncObjGroup(GroupConfig(
                partition=p, hub=hub, self_address=None, folder=folder / f"p{p:04d}",
                peers=tuple(current[0].node(n).raft_address(p) for n in current[0].group_voters(p)),
                fsync=False,  # a learner can fetch again from the voters
                tuning=spec.tuning, on_corrupt=corrupt, after_apply=lambda: pump.wake(p), resyncs_itself=True),
                copy, loop)

        partition_heal.remove_leftovers(folder)
        opening = _open_engines(loop, partitions, folder, corrupt)
        replicas_open = loop.create_task(_add_replicas(opening, replicas, pump, stop, open_group, corrupt))
        tasks.append(replicas_open)
        await sink_open
        if metrics_port:
            metrics.serve(host, metrics_port)
        learner_status.write(folder, {}, {})
        pumping = loop.create_task(pump.run(stop))
        await replicas_open
        if api_port:
            from learners.learner_reads import serve_reads  # the node's service stack, only when asked for
            served = await serve_reads(spec, tls, topology, name, replicas, f"{host}:{api_port}", loop, sink,
                                       lambda: current[0])
        tasks += [loop.create_task(_publish(pump, folder, tls, stop)), loop.create_task(_report_progress(client, name, pump, stop))]
        print(f"raftkv learner {name} ready: partitions {partitions}, sink {registered.sink}", flush=True)
        await pumping  # until stopped
    finally:
        stop.set()
        if pumping is not None:  # ends after its step: a delivery in flight must not meet a closed sink
            await asyncio.gather(pumping, return_exceptions=True)
        if sink_open is not None:  # stopped, it retries no more; an open in flight must end before the close
            await asyncio.gather(sink_open, return_exceptions=True)
        for task in tasks:  # before the client closes: a report in flight would fail on the closed channel
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if served is not None:
            served[1].end_streams()  # else the grace waits for the clients' streams
            await served[0].stop(grace=1.0)
        for p, replica in replicas.items():
            close_reporting(f"partition {p}", replica.close)
        if pump is not None:
            pump.close()
        await asyncio.gather(*opening, return_exceptions=True)
        for p, engine in _unused(opening, replicas):
            close_reporting(f"partition {p}", engine.close)
        if hub is not None:
            await hub.close()
        if sink is not None:
            sink.close()
        await client.close()
    if failure:
        raise failure[0]


def _open_engines(loop: asyncio.AbstractEventLoop, partitions: list[int], folder: Path,
                  corrupt: Callable[[CorruptData], None]) -> list[asyncio.Future]:
    """The replicas' databases, opened off the loop, OPENING_AT_ONCE at a time: (partition, RocksEngine)."""
    opener = ThreadPoolExecutor(max_workers=min(OPENING_AT_ONCE, len(partitions) or 1), thread_name_prefix="open")
    try:
        return [loop.run_in_executor(opener, lambda p=p: (p, RocksEngine(folder / f"p{p:04d}", on_corrupt=corrupt)))
                for p in partitions]
    finally:
        opener.shutdown(wait=False)  # its threads end after the last open


async def _add_replicas(opening: list[asyncio.Future], replicas: dict[int, LearnerReplica], pump: FeedPump,
                        stop: asyncio.Event, open_group: Callable[[int], Callable[[StateMachine], RaftGroup]],
                        corrupt: Callable[[CorruptData], None]) -> None:
    """Each database, as it opens, joins its Raft group and the pump: the first partition's entries
    are fed while the others still open. A re-sync a stop cut short goes on (partition_heal.py)."""
    for opened in asyncio.as_completed(opening):
        p, engine = await opened
        if stop.is_set():
            return
        replicas[p] = LearnerReplica(p, engine, open_group=open_group(p))
        pump.add(replicas[p])
        aside = partition_heal.aside_of(engine.folder)
        if aside.exists():
            pump.rebuild(p, RocksEngine(aside, on_corrupt=corrupt), "a re-sync the learner's stop cut short")
        await asyncio.sleep(0)  # what arrived for the replicas opened so far, before the next one joins


def _unused(opening: list[asyncio.Future], replicas: dict[int, LearnerReplica]) -> list[tuple[int, RocksEngine]]:
    """Databases that opened but were never handed to a replica (the start failed or stopped meanwhile)."""
    return [future.result() for future in opening
            if future.done() and not future.cancelled() and future.exception() is None
            and future.result()[0] not in replicas]


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
    written: tuple[dict[int, str], dict[int, str]] = ({}, {})
    while not stop.is_set():
        now = (dict(pump.stopped), {p: r.why for p, r in pump.rebuilding.items()})
        if now != written:
            written = now
            learner_status.write(folder, *now)
        for state, partitions in zip(learner_status.STATES, now):
            TROUBLED.labels(state).set(len(partitions))
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


PADDING_PER_ROUND = 1000  # reports a re-syncing partition gets in one round, one after another


async def _report_progress(client: AsyncClient, name: str, pump: FeedPump, stop: asyncio.Event,
                           every: float = 1.0) -> None:
    """Tell the voters how far the sink has durably got; they replicate it and retain the log for us.

    Once per partition after the start, then only when more than progress reports was delivered since
    the last report: a report is an entry the learner delivers, and reporting that would keep every
    partition's log moving forever, learners lagging by one entry, with no client writing. A partition
    whose re-sync waits for the cluster's log to pass what the sink has gets one report after another
    (the rebuilt copy's index) until it does: an idle partition would otherwise wait for a client's write.
    A failure is logged when reports start failing, not at each retry (every second)."""
    reported: dict[int, int] = {}
    failing = False
    while not stop.is_set():
        delivered = {p: r.engine.position.index for p, r in pump.replicas.items() if p not in pump.rebuilding}
        changed = {p: i for p, i in delivered.items()
                   if i > reported.get(p, 0) and (p not in reported or pump.last_data_delivered.get(p, 0) > reported[p])}
        try:
            if changed:
                await client.report_progress(name, changed)
                reported.update(changed)
            for p in list(pump.rebuilding):  # each report one entry: a re-sync waits for the log to pass the sink
                for _ in range(min(pump.log_short_of(p), PADDING_PER_ROUND)):
                    await client.report_progress(name, {p: pump.replicas[p].engine.position.index})
            failing = False
        except RaftKVError as exc:
            if not failing:
                log.warning("could not report progress (%s); retrying", exc)
            failing = True
        await asyncio.sleep(every)
