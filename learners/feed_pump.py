"""The feed pump: committed entries → events → sink → only then the learner's copy.

One pump serves every partition of a learner, on the learner's event loop;
sink calls (which block: Kafka transactions, file fsyncs, uploads) run in a
worker thread. It steps while a step finds work, then sleeps until `wake`:
the learner's Raft groups call it after each apply step (`after_apply`), so
a committed entry is fed in the turn it is known, not at the next poll. Each step:

1. a partition with a stashed snapshot is handled alone: its `r` diff is
   delivered and flushed, then the snapshot is installed;
2. otherwise up to `max_entries` committed entries per partition are turned
   into events against a pending view, delivered, flushed, and then written to
   the copies with their positions.

Events at or below the position the sink recovered at start-up are computed
(their mutations are needed) but not delivered again: they were flushed just
before a crash that hit before the copy was written. A sink failure leaves
the copies untouched; the step is retried with backoff, and the journal
holds the entries meanwhile. A sink that refuses one event for good
(`Undeliverable`: retrying cannot help) stops that partition's feed only: it
is logged once, kept in `stopped` with its reason (`raftkv learner list` shows
it), and the other partitions' step is retried at once. The partition is tried
again after RETRY_STOPPED_SECONDS, twice as long after each refusal (up to
MAX_RETRY_STOPPED_SECONDS): once the sink takes the event (its limit raised),
the partition flows again without a restart.

A partition whose log contradicted its copy is rebuilt silently, then its
difference from the copy set aside is delivered as one re-sync
(learners/partition_heal.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

from learners import partition_heal
from learners.change_capture import EntryContext, capture_entry, capture_snapshot, pending_view
from learners.entry_events import EntryEvents, EventRows
from learners.learner_replica import LearnerReplica
from learners.sinks.base import DeliveryBatch, Sink
from raftkv import failpoints
from raftkv.core.errors import LogContradiction, Undeliverable
from raftkv.core.learner_registry import only_progress
from raftkv.core.overlay import Overlay
from raftkv.raft import snapshot_file
from raftkv.storage.engine import Position
from raftkv.storage.rocks_engine import RocksEngine

log = logging.getLogger(__name__)

COMPACT_AFTER_ENTRIES = 5000
RETRY_STOPPED_SECONDS = 30.0
MAX_RETRY_STOPPED_SECONDS = 600.0


@dataclass
class Rebuild:
    """A partition re-syncing after its log contradicted its copy (learners/partition_heal.py)."""

    aside: RocksEngine  # the old copy: what the sink has, the base of the difference delivered at the end
    why: str


@dataclass
class _Prepared:
    replica: LearnerReplica
    view: Overlay
    last: Position
    last_data: int  # the last of its entries that was more than progress reports (0: none)


class FeedPump:
    def __init__(self, cluster: str, replicas: dict[int, LearnerReplica], sink: Sink, *, max_entries: int = 2000,
                 clock: Callable[[], float] = time.time, on_gap: Callable[[LogContradiction], None] | None = None):
        """`on_gap(error)`: a partition's log begins after its copy (the learner re-syncs it, as for a
        contradiction); the other partitions flow on meanwhile."""
        self.cluster = cluster
        self._on_gap = on_gap
        self._gaps: set[int] = set()  # partitions whose gap was reported, until their log serves them again
        self.replicas = replicas
        self.sink = sink
        self.max_entries = max_entries
        self.clock = clock
        self.delivered_before_start: dict[int, int] = {}
        self.last_data_delivered: dict[int, int] = {}  # per partition: see `learner_registry.only_progress`
        self.failures = 0
        self.resyncs = 0
        self.stopped: dict[int, str] = {}  # partitions no longer fed, and why
        self._retry_stopped: dict[int, tuple[float, float]] = {}  # partition -> (when, the wait after that)
        self.rebuilding: dict[int, Rebuild] = {}  # partitions re-syncing after their log contradicted the copy
        self._between_steps: list[Callable[[], None]] = []
        self._caught_up_at = {p: clock() for p in replicas}
        self._news = asyncio.Event()

    def wake(self, partition: int | None = None) -> None:
        """Step soon: `partition`'s group ended an apply step (if it has entries or a snapshot the copy has
        not: a tick that applied nothing costs no step), or anything (None) may be new."""
        replica = self.replicas.get(partition) if partition is not None else None
        if partition is None or replica is not None and partition not in self.stopped and (
                replica.group.last_applied > replica.engine.position.index or replica.pending_snapshot is not None):
            self._news.set()

    async def run(self, stop: asyncio.Event, idle_wait: float = 1.0) -> None:
        """Step until `stop`; idle, wait for `wake` (or `idle_wait` seconds: a safety net, not the feed's pace)."""
        recovered = False
        backoff = 0.1
        while not stop.is_set():
            try:
                if not recovered:
                    self.delivered_before_start = await asyncio.to_thread(self.sink.recover)
                    recovered = True
                self._news.clear()  # before the step looks: a wake during it is kept
                progressed = await self.step()
                backoff = 0.1
            except Undeliverable as exc:
                self.failures += 1
                self._stop(exc)
                continue
            except Exception as exc:  # the sink is down or refused: retry, the journal holds the entries
                self.failures += 1
                log.warning("delivery failed (%s); retrying in %.1fs", exc, backoff)
                await _sleep_or_stop(stop, backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if not progressed:
                await _either(self._news, stop, idle_wait)

    def _stop(self, exc: Undeliverable) -> None:
        _, wait = self._retry_stopped.get(exc.partition, (0.0, RETRY_STOPPED_SECONDS / 2))
        wait = min(wait * 2, MAX_RETRY_STOPPED_SECONDS)
        self._retry_stopped[exc.partition] = (self.clock() + wait, wait)
        if exc.partition not in self.stopped:
            log.error("stopped feeding %s; the other partitions go on, and this one is tried again in %.0fs",
                      exc, wait)
        self.stopped[exc.partition] = str(exc)

    def _flowing_again(self, partition: int) -> None:
        if self.stopped.pop(partition, None) is not None:
            log.info("partition %d: the sink took what it refused; its feed goes on", partition)
        self._retry_stopped.pop(partition, None)

    def add(self, replica: LearnerReplica) -> None:
        """Feed one more partition (the learner adds each replica as its database opens)."""
        self.replicas[replica.partition] = replica
        self._caught_up_at[replica.partition] = self.clock()
        self.wake()

    def rebuild(self, partition: int, aside: RocksEngine, why: str) -> None:
        """Re-sync `partition`, whose replica started over, from the cluster; `aside` is its old copy
        (partition_heal.py). Its events are held back until the difference can be delivered."""
        self.rebuilding[partition] = Rebuild(aside, why)
        self.wake()

    def close(self) -> None:
        """The copies set aside for re-syncs, closed (their folders stay: a restart resumes the re-syncs)."""
        for rebuild in self.rebuilding.values():
            rebuild.aside.close()

    def lag(self) -> dict[int, int]:
        """Committed entries not yet delivered, per partition."""
        return {p: max(0, r.group.last_applied - r.engine.position.index) for p, r in self.replicas.items()}

    def lag_seconds(self) -> dict[int, float]:
        """Per partition: how long since the feed last had every committed entry (0 while it has)."""
        now = self.clock()
        for p, entries in self.lag().items():
            if entries == 0:
                self._caught_up_at[p] = now
        return {p: now - t for p, t in self._caught_up_at.items()}

    def between_steps(self, action: Callable[[], None]) -> None:
        """Run `action` before the next step: a step in flight holds replicas it writes when its delivery ends."""
        self._between_steps.append(action)
        self.wake()

    async def step(self) -> bool:
        while self._between_steps:
            self._between_steps.pop(0)()
        for replica in self._fed():
            if replica.partition in self.rebuilding:
                if await self._rebuild_step(replica, self.rebuilding[replica.partition]):
                    return True
            elif replica.pending_snapshot is not None:
                await self._resync(replica)
                return True
        prepared, entries = self._prepare()
        if not prepared:
            return False
        await self._deliver(entries, {p.replica.partition: p.last for p in prepared})
        for p in prepared:
            p.replica.engine.write(p.view.mutations, p.last)
            p.replica.compact_when_longer_than(COMPACT_AFTER_ENTRIES)
            if p.last_data:
                self.last_data_delivered[p.replica.partition] = p.last_data
            self._flowing_again(p.replica.partition)
        return True

    def _prepare(self) -> tuple[list[_Prepared], list[EntryEvents]]:
        prepared, captured = [], []
        now_ms = int(self.clock() * 1000)
        for replica in self._fed():
            if replica.partition in self.rebuilding:
                continue
            partition, position = replica.partition, replica.engine.position
            entries = self._entries_after(replica, position.index)
            if not entries:
                continue
            view = pending_view(replica.engine)
            last_data = 0
            for index, term, commands in entries:
                ctx = EntryContext(self.cluster, partition, index, term, now_ms)
                events = capture_entry(view, commands, ctx)
                if events and index > self.delivered_before_start.get(partition, 0):
                    captured.append(events)
                if not only_progress(commands):
                    last_data = index
            last_index, last_term, _ = entries[-1]
            prepared.append(_Prepared(replica, view, Position(last_index, last_term), last_data))
        return prepared, captured

    def _entries_after(self, replica: LearnerReplica, index: int) -> list:
        """Committed entries after `index`; none if the log no longer holds them, which is reported once."""
        partition = replica.partition
        try:
            entries = replica.committed_entries(index, self.max_entries)
        except LookupError as exc:
            if partition not in self._gaps:
                self._gaps.add(partition)
                log.warning("partition %d: its copy is at entry %d and its log no longer holds the entries after "
                            "it (%s); the partition re-syncs from the cluster", partition, index, exc)
                if self._on_gap is not None:
                    self._on_gap(LogContradiction(partition, f"partition {partition}: its log begins after its "
                                                             f"copy's entry {index}"))
            return []
        self._gaps.discard(partition)
        return entries

    def _fed(self) -> list[LearnerReplica]:
        """The partitions to step: all but the stopped ones, which are tried again when their wait is over."""
        now = self.clock()
        return [r for p, r in self.replicas.items() if p not in self.stopped or now >= self._retry_stopped[p][0]]

    async def _rebuild_step(self, replica: LearnerReplica, rebuild: Rebuild) -> bool:
        """One step of a re-sync: the copy rebuilt from what the leader sent, delivering nothing, until it
        is past the copy set aside and has every entry the group committed; then the difference between
        the two delivered as one re-sync, and the copy set aside dropped. Whether it did anything."""
        partition, base = replica.partition, rebuild.aside.position
        sink_has = self.delivered_before_start.get(partition, 0)
        if base.index < sink_has and sink_has == replica.engine.position.index:
            self._rebuilt(partition, "its difference was delivered before the learner restarted")
            return True  # the sink moved past the copy set aside, which only the difference does
        if replica.pending_snapshot is not None:
            await self._install(replica)
            return True
        entries = self._entries_after(replica, replica.engine.position.index)
        if entries:
            view = pending_view(replica.engine)
            for index, term, commands in entries:
                capture_entry(view, commands, EntryContext(self.cluster, partition, index, term, 0))
            last_index, last_term, _ = entries[-1]
            replica.engine.write(view.mutations, Position(last_index, last_term))
            replica.compact_when_longer_than(COMPACT_AFTER_ENTRIES)
            return True
        position = replica.engine.position
        if position.index <= self._resync_floor(partition) or replica.group.last_applied > position.index:
            return False  # the cluster's log has not passed what the sink has yet, or more is on its way
        ctx = EntryContext(self.cluster, partition, position.index, position.term, int(self.clock() * 1000))
        events = capture_snapshot(rebuild.aside, replica.engine, ctx)
        await self._deliver([events], {partition: position}, resyncs={partition: base.index})
        self.last_data_delivered[partition] = position.index
        self._rebuilt(partition, f"{len(events)} events at index {position.index}, from index {base.index}")
        return True

    def log_short_of(self, partition: int) -> int:
        """How many entries the cluster's log of re-syncing `partition` lacks before its re-sync can go out:
        the rebuilt copy holds every entry the group committed but has not passed what the sink has (a whole
        cluster lost entries the sink had, and the partition is idle). 0 while it still catches up."""
        rebuild, replica = self.rebuilding.get(partition), self.replicas.get(partition)
        if rebuild is None or replica is None or replica.pending_snapshot is not None:
            return 0
        position = replica.engine.position.index
        if not position or replica.group.commit_index > position:
            return 0
        return max(0, self._resync_floor(partition) + 1 - position)

    def _resync_floor(self, partition: int) -> int:
        """What the sink has of re-syncing `partition`: the copy set aside, or more if a re-sync's difference
        went out before a restart. The re-sync goes out at an index past it."""
        return max(self.rebuilding[partition].aside.position.index, self.delivered_before_start.get(partition, 0))

    def _rebuilt(self, partition: int, how: str) -> None:
        rebuild = self.rebuilding.pop(partition)
        rebuild.aside.close()
        partition_heal.discard(rebuild.aside.folder)
        self.resyncs += 1
        log.info("partition %d re-synced from the cluster after its log contradicted its copy: %s", partition, how)

    async def _resync(self, replica: LearnerReplica) -> None:
        """Install the snapshot the leader sent; the sink gets its differences from the copy as `r`
        events, unless it has everything up to the snapshot already: a learner restarted with an empty
        disk (another host, KUDU-3290) gets the leader's latest snapshot, often older than what its
        sink has, and its `r` events would take the sink back to that older state."""
        snapshot = replica.pending_snapshot
        index, term = snapshot.last.index, snapshot.last.term
        delivered = self.delivered_before_start.get(replica.partition, 0)
        if index > delivered:
            async def deliver_difference(theirs: RocksEngine) -> int:
                ctx = EntryContext(self.cluster, replica.partition, index, term, int(self.clock() * 1000))
                events = capture_snapshot(replica.engine, theirs, ctx)
                await self._deliver([events], {replica.partition: snapshot.last},
                                    resyncs={replica.partition: replica.engine.position.index})
                return len(events)

            events = await self._install(replica, deliver_difference)
            log.info("partition %d re-synced from a snapshot at index %d (%d events)", replica.partition, index,
                     events)
        else:
            await self._install(replica)
            log.info("partition %d: installed a snapshot at index %d; the sink has up to %d already", replica.partition,
                     index, delivered)
        self.last_data_delivered[replica.partition] = max(self.last_data_delivered.get(replica.partition, 0), index)
        self.resyncs += 1

    @staticmethod
    async def _install(replica: LearnerReplica, before: Callable[[RocksEngine], Awaitable[int]] | None = None) -> int:
        """Install the snapshot the leader sent in the copy; `before(snapshot's database)` first, if given
        (what it returns is returned)."""
        snapshot = replica.pending_snapshot
        with tempfile.TemporaryDirectory(dir=replica.engine.folder, prefix="resync-") as tmp:
            # The file as it is now: the next snapshot the leader sends is renamed over its path while this
            # one is unpacked, and unpacking that one would label the newer state with this one's index.
            pinned = Path(tmp) / snapshot.path.name
            os.link(snapshot.path, pinned)
            checkpoint = await asyncio.to_thread(snapshot_file.extract_db, pinned, Path(tmp))
            result = 0
            if before is not None:
                theirs = RocksEngine(checkpoint.parent)  # opens <tmp>/db
                try:
                    result = await before(theirs)
                finally:
                    theirs.close()
            replica.engine.install(checkpoint)
        replica.mark_snapshot_installed(snapshot)
        return result

    async def _deliver(self, entries: list[EntryEvents], positions: dict[int, Position],
                       resyncs: dict[int, int] | None = None) -> None:
        batch = DeliveryBatch(EventRows(entries), {p: pos.index for p, pos in positions.items()},
                              {p: pos.term for p, pos in positions.items()}, resyncs or {})
        await asyncio.to_thread(_deliver_and_flush, self.sink, batch)


def _deliver_and_flush(sink: Sink, batch: DeliveryBatch) -> None:
    """One trip to a worker thread per step: each costs a hand-off and a wake-up of the loop."""
    failpoints.hit("learner-deliver-before")
    sink.deliver(batch)
    failpoints.hit("sink-flush-before")
    sink.flush()
    failpoints.hit("sink-flush-after")


async def _either(news: asyncio.Event, stop: asyncio.Event, seconds: float) -> None:
    waits = (asyncio.ensure_future(news.wait()), asyncio.ensure_future(stop.wait()))
    await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except asyncio.TimeoutError:
        pass
