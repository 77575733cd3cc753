"""The feed pump over the in-memory Raft twin and the memory sink: one process, no timing."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from learners import partition_heal
from learners.feed_pump import RETRY_STOPPED_SECONDS, FeedPump
from learners.learner_replica import LearnerReplica
from learners.sinks.memory_sink import MemorySink
from raftkv.core.commands import Delete, DeleteRange, Put, PutMany
from raftkv.core.log_codec import encode_proposal
from raftkv.core.errors import LogContradiction, Unavailable, Undeliverable
from raftkv.core.spec import Tuning
from raftkv.node.replica import PartitionReplica
from raftkv.raft import snapshot_file
from raftkv.raft.group import Outcome, Role
from raftkv.raft.memory_group import Disk, MemoryGroup
from raftkv.raft.memory_network import MemoryNetwork
from raftkv.storage.engine import KeyRange, Position
from raftkv.storage.rocks_engine import RocksEngine


class Feed:
    """One voter (n1) and one learner (l1) of partition 0, and the learner's pump into a MemorySink."""

    def __init__(self, tmp_path, partition: int = 0):
        self.tmp_path = tmp_path
        self.partition = partition
        self.net = MemoryNetwork(seed=0)
        self.disks = {name: Disk(tmp_path / name, voters=frozenset({"n1"})) for name in ("n1", "l1")}
        for disk in self.disks.values():
            disk.folder.mkdir()
        self.voter = PartitionReplica(partition, RocksEngine(tmp_path / "n1"), Tuning(), open_group=self._group("n1"))
        self.voter.group.campaign()
        assert self.voter.role == Role.LEADER
        self.sink = MemorySink()
        self.sink.open({"learner": "l1"})
        self.open_learner()

    def _group(self, name: str):
        return lambda state_machine: MemoryGroup(name, self.disks[name], state_machine, self.net)

    def open_learner(self) -> None:
        self.learner = LearnerReplica(self.partition, RocksEngine(self.tmp_path / "l1"), open_group=self._group("l1"))
        self.pump = FeedPump("test", {self.partition: self.learner}, self.sink, clock=lambda: 1.0)
        self.pump.delivered_before_start = self.sink.recover()

    def write(self, *commands) -> None:
        outcome = []
        self.voter.propose(encode_proposal(list(commands)), lambda result, o: outcome.append(o))
        self.net.tick()
        assert outcome == [Outcome.APPLIED]

    def snapshot_after(self, *commands) -> None:
        """The learner misses `commands`; the voter compacts past them and sends it a snapshot."""
        self.net.isolate("l1")
        self.write(*commands)
        self.voter.group.compact()
        self.net.heal()
        self.net.tick()

    def pump_all(self) -> None:
        self.net.tick()
        while asyncio.run(self.pump.step()):
            pass

    def close(self) -> None:
        self.learner.close()
        self.voter.close()


@pytest.fixture
def feed(tmp_path):
    feed = Feed(tmp_path)
    yield feed
    feed.close()


def ops(sink: MemorySink) -> list[tuple]:
    return [(e.op, e.key, e.before, e.after) for e in sink.events]


def test_committed_writes_reach_the_sink_as_events_and_only_then_the_copy(feed):
    feed.write(Put(b"a", b"1"))
    feed.write(Put(b"a", b"2"), Put(b"b", b"1"))
    feed.write(Delete(b"a"))
    feed.pump_all()
    assert ops(feed.sink) == [("c", b"a", None, b"1"), ("u", b"a", b"1", b"2"), ("c", b"b", None, b"1"),
                              ("d", b"a", b"2", None)]
    assert feed.sink.positions == {0: feed.voter.group.last_applied}
    assert feed.learner.engine.position.index == feed.voter.group.last_applied
    assert feed.learner.engine.get(b"b") == b"1" and feed.learner.engine.get(b"a") is None


def test_bulk_writes_reach_the_sink_row_by_row_in_one_step(feed):
    feed.write(PutMany.of([b"a", b"b", b"a"], [b"1", b"1", b"2"]))
    feed.write(Put(b"c", b"1"), DeleteRange(b"a", b"c"), PutMany.of([b"b", b"c"], [b"2", b"2"]))
    feed.pump_all()
    assert ops(feed.sink) == [("c", b"a", None, b"1"), ("c", b"b", None, b"1"), ("u", b"a", b"1", b"2"),
                              ("c", b"c", None, b"1"), ("d", b"a", b"2", None), ("d", b"b", b"1", None),
                              ("c", b"b", None, b"2"), ("u", b"c", b"1", b"2")]
    assert feed.sink.flushes == 1
    assert dict(feed.learner.engine.scan(KeyRange())[1]) == {b"b": b"2", b"c": b"2"}


def test_a_failed_delivery_leaves_the_copy_behind_and_the_retry_delivers_each_event_once(feed):
    feed.write(Put(b"a", b"1"))
    feed.net.tick()
    before = feed.learner.engine.position
    feed.sink.fail_next = 1
    with pytest.raises(Unavailable):
        asyncio.run(feed.pump.step())
    assert feed.learner.engine.position == before and feed.sink.events == []
    feed.pump_all()
    assert ops(feed.sink) == [("c", b"a", None, b"1")]


def test_a_learner_that_missed_compacted_entries_resyncs_from_a_snapshot_as_r_events(feed):
    feed.write(Put(b"a", b"1"), Put(b"b", b"1"))
    feed.pump_all()
    copy_at = feed.learner.engine.position.index
    feed.learner.close()  # down while the voter moves on and compacts its log past it
    feed.write(Put(b"b", b"2"), Put(b"c", b"1"))
    feed.write(Delete(b"a"))
    feed.voter.group.compact()
    with pytest.raises(LookupError):
        feed.voter.group.committed_entries(0, 1)
    feed.open_learner()
    feed.pump_all()
    assert feed.pump.resyncs == 1
    resync = [(e.op, e.key, e.before, e.after) for e in feed.sink.events if e.snapshot]
    assert sorted(resync) == [("d", b"a", b"1", None), ("r", b"b", b"1", b"2"), ("r", b"c", None, b"1")]
    # the sink hears which entries the diff stands for: a reader of the feed can tell them from a gap
    snapshot_at = {e.index for e in feed.sink.events if e.snapshot}
    assert feed.sink.resyncs == {0: [(copy_at, *snapshot_at)]} and copy_at < min(snapshot_at)
    assert feed.learner.engine.get(b"b") == b"2" and feed.learner.engine.get(b"a") is None
    feed.write(Put(b"d", b"1"))  # and the live feed goes on after the snapshot
    feed.pump_all()
    assert ops(feed.sink)[-1] == ("c", b"d", None, b"1")


def test_a_learner_restarted_with_an_empty_disk_skips_a_snapshot_its_sink_is_past(feed):
    """KUDU-3290: the learner's host is lost and a new one starts with an empty disk. The leader's
    snapshot is older than what the sink has: its `r` events would take the sink back to that older
    state, and the entries after it up to the sink's position are not delivered again."""
    feed.write(Put(b"a", b"1"), Put(b"b", b"1"))
    feed.voter.group.compact()
    feed.write(Put(b"b", b"2"))  # after the snapshot, and delivered
    feed.pump_all()
    delivered = len(feed.sink.events)
    feed.learner.close()
    shutil.rmtree(feed.tmp_path / "l1")
    feed.disks["l1"] = Disk(feed.tmp_path / "l1", voters=frozenset({"n1"}))
    feed.disks["l1"].folder.mkdir()
    feed.open_learner()
    feed.write(Put(b"c", b"1"))
    feed.pump_all()
    assert feed.pump.resyncs == 1
    assert not [e for e in feed.sink.events if e.snapshot]  # a journal sink would append them after b=2
    assert ops(feed.sink)[delivered:] == [("c", b"c", None, b"1")]
    assert feed.learner.engine.get(b"b") == b"2" and feed.learner.engine.get(b"a") == b"1"


class SinkWithAHook(MemorySink):
    """Runs `during_resync()` once, inside the first delivery of a re-sync's difference."""

    during_resync = None

    def deliver(self, batch):
        if batch.resyncs and self.during_resync is not None:
            hook, self.during_resync = self.during_resync, None
            hook()
        super().deliver(batch)


def test_a_newer_snapshot_that_arrives_while_one_is_installed_is_installed_next(feed):
    """The leader compacted again and sent a newer snapshot while the pump delivered the difference of the
    one it had stashed: the group's log now begins at the newer one. Forgetting it left the copy at the
    older one's index, and every step failed on entries "compacted away" for good, stalling the whole feed
    (the soak of seed 1880499202, 2026-11-28)."""
    feed.sink = SinkWithAHook()
    feed.sink.open({"learner": "l1"})
    feed.pump.sink = feed.sink
    feed.write(Put(b"a", b"1"))
    feed.pump_all()
    feed.snapshot_after(Put(b"b", b"1"))
    first = feed.learner.pending_snapshot
    assert first is not None
    feed.sink.during_resync = lambda: feed.snapshot_after(Put(b"c", b"1"))
    feed.pump_all()
    assert feed.learner.pending_snapshot is None and feed.sink.during_resync is None
    feed.write(Put(b"d", b"1"))
    feed.pump_all()
    assert feed.learner.engine.position == feed.voter.engine.position
    assert dict(feed.learner.engine.scan(KeyRange())[1]) == {b"a": b"1", b"b": b"1", b"c": b"1", b"d": b"1"}
    assert ops(feed.sink)[-1] == ("c", b"d", None, b"1")


def test_a_snapshot_renamed_over_while_the_pump_unpacks_it_is_delivered_as_it_was(feed, monkeypatch):
    """The next snapshot the leader sends is renamed over the stashed one's file while the pump unpacks
    that one on a worker: read by its path, the newer state went out labelled with the older index."""
    feed.write(Put(b"a", b"1"))
    feed.pump_all()
    feed.snapshot_after(Put(b"b", b"1"))
    first = feed.learner.pending_snapshot.last.index
    unpack = snapshot_file.extract_db

    def a_newer_one_arrives_first(filename, dest):
        monkeypatch.setattr(snapshot_file, "extract_db", unpack)
        feed.snapshot_after(Put(b"c", b"1"))
        return unpack(filename, dest)

    monkeypatch.setattr(snapshot_file, "extract_db", a_newer_one_arrives_first)
    feed.pump_all()
    resyncs = sorted((e.index, e.key, e.after) for e in feed.sink.events if e.snapshot)
    assert resyncs == [(first, b"b", b"1"), (feed.voter.engine.position.index, b"c", b"1")]
    assert feed.learner.engine.position == feed.voter.engine.position


def test_a_copy_its_log_no_longer_reaches_is_reported_once_for_a_resync_instead_of_failing_every_step(feed, monkeypatch):
    """However the copy fell behind the log's first entry, the pump does not fail every step on it (which
    stalled every partition's feed): it skips the partition and asks for its re-sync once (the learner heals
    it as a contradiction, learners/learner_process.py)."""
    def forget_the_newer(replica, snapshot):  # what the fix above prevents
        replica.engine.write([], snapshot.last)
        replica.state_machine.pending_snapshot = None

    monkeypatch.setattr(LearnerReplica, "mark_snapshot_installed", forget_the_newer)
    gaps = []
    feed.pump._on_gap = gaps.append
    feed.sink = feed.pump.sink = SinkWithAHook()
    feed.sink.open({"learner": "l1"})
    feed.write(Put(b"a", b"1"))
    feed.pump_all()
    feed.net.isolate("l1")
    feed.write(Put(b"b", b"1"))
    feed.voter.group.compact()
    feed.net.heal()
    feed.net.tick()

    def newer() -> None:
        feed.net.isolate("l1")
        feed.write(Put(b"c", b"1"))
        feed.voter.group.compact()
        feed.net.heal()
        feed.net.tick()

    feed.sink.during_resync = newer
    feed.pump_all()
    feed.write(Put(b"d", b"1"))
    feed.pump_all()
    assert [(type(g), g.partition) for g in gaps] == [(LogContradiction, 0)]
    assert "its log begins after its copy's entry" in str(gaps[0])


class RefusingSink(MemorySink):
    """Refuses every event of one key for good, as Kafka refuses a record over its size limit."""

    refused = b"too-big"

    def deliver(self, batch):
        for event in batch.events:
            if event.key == self.refused:
                self._pending = []
                raise Undeliverable(event.partition, event.index, "Broker: Message size too large")
        super().deliver(batch)


def test_an_undeliverable_event_stops_its_partition_once_and_the_others_keep_flowing(tmp_path, caplog):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    a, b = Feed(tmp_path / "a", partition=0), Feed(tmp_path / "b", partition=1)
    sink = RefusingSink()
    sink.open({"learner": "l1"})
    now = [1.0]
    pump = FeedPump("test", {0: a.learner, 1: b.learner}, sink, clock=lambda: now[0])
    a.write(Put(b"too-big", b"x"))
    a.write(Put(b"after", b"1"))
    b.write(Put(b"b1", b"1"))

    async def run_until(condition) -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(pump.run(stop, idle_wait=0.001))
        deadline = asyncio.get_running_loop().time() + 10
        while not condition():
            assert asyncio.get_running_loop().time() < deadline, "the pump never got there"
            a.net.tick()
            b.net.tick()
            await asyncio.sleep(0.001)
        stop.set()
        await task

    async def scenario() -> None:
        await run_until(lambda: 0 in pump.stopped and sink.positions.get(1) == b.learner.engine.position.index > 0)
        b.write(Put(b"b2", b"2"))   # partition 1 goes on after partition 0 stopped
        await run_until(lambda: b"b2" in {e.key for e in sink.events})
        now[0] += RETRY_STOPPED_SECONDS  # tried again: refused again, and the next try waits twice as long
        failures = pump.failures
        await run_until(lambda: pump.failures > failures)
        now[0] += RETRY_STOPPED_SECONDS
        assert 0 in pump.stopped and a.learner not in pump._fed()
        sink.refused = None  # the limit raised: the next try delivers, and partition 0 flows again
        now[0] += RETRY_STOPPED_SECONDS
        await run_until(lambda: 0 not in pump.stopped and pump.lag()[0] == 0)

    caplog.set_level("ERROR", logger="learners.feed_pump")
    try:
        asyncio.run(scenario())
    finally:
        a.close()
        b.close()
    assert [(e.partition, e.key) for e in sink.events] == [(0, b"too-big"), (0, b"after"), (1, b"b1"), (1, b"b2")]
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 1  # when it stopped, not at each try


def test_a_partition_whose_log_contradicted_its_copy_is_rebuilt_silently_then_delivered_as_one_resync(feed):
    """learners/partition_heal.py. The copy set aside holds what the cluster lost (`lost`, at an index
    past the cluster's): the re-sync waits until the cluster's log passes it, then turns the sink's
    state into the cluster's, `d lost` included, in one batch."""
    feed.write(Put(b"a", b"1"), Put(b"b", b"1"), Put(b"c", b"1"))
    feed.pump_all()
    copy = feed.learner.engine
    lost_at = Position(copy.position.index + 3, copy.position.term)
    copy.write([Put(b"lost", b"1")], lost_at)
    feed.sink.positions[0] = lost_at.index  # the sink had it too, before the cluster lost it
    feed.write(Put(b"b", b"2"))
    feed.write(Delete(b"c"))
    feed.voter.group.compact()  # the rebuild starts from a snapshot
    delivered = len(feed.sink.events)

    aside = _start_over(feed)
    feed.pump_all()
    assert len(feed.sink.events) == delivered and 0 in feed.pump.rebuilding  # its log is not past `lost` yet
    assert feed.learner.engine.get(b"b") == b"2"  # rebuilt meanwhile: follower reads see a state the cluster had

    short = feed.pump.log_short_of(0)  # the learner reports progress this many times (an idle partition)
    assert short > 0
    for i in range(short - 1):
        feed.write(Put(b"d", b"%d" % i))
    feed.pump_all()
    assert 0 in feed.pump.rebuilding and feed.pump.log_short_of(0) == 1
    feed.write(Put(b"d", b"2"))
    feed.pump_all()
    assert 0 not in feed.pump.rebuilding and not aside.exists() and feed.pump.resyncs == 1
    assert feed.pump.log_short_of(0) == 0
    resync = [(e.op, e.key, e.before, e.after) for e in feed.sink.events[delivered:]]
    assert sorted(resync) == [("d", b"c", b"1", None), ("d", b"lost", b"1", None), ("r", b"b", b"1", b"2"),
                              ("r", b"d", None, b"2")]
    assert feed.sink.resyncs == {0: [(lost_at.index, feed.learner.engine.position.index)]}
    feed.write(Put(b"e", b"1"))  # the live feed goes on
    feed.pump_all()
    assert ops(feed.sink)[-1] == ("c", b"e", None, b"1")


def test_a_resync_whose_difference_was_delivered_before_a_restart_only_drops_the_copy_set_aside(feed):
    feed.write(Put(b"a", b"1"))
    feed.pump_all()
    aside = _start_over(feed)
    feed.write(Put(b"a", b"2"))
    feed.pump_all()
    assert not aside.exists()
    delivered = list(feed.sink.events)

    feed.learner.close()  # as if it stopped after the delivery and before the drop
    aside.mkdir()
    feed.open_learner()
    feed.pump.rebuild(0, RocksEngine(aside), "a re-sync the learner's stop cut short")
    feed.pump_all()
    assert feed.sink.events == delivered and not aside.exists() and feed.pump.resyncs == 1


def _start_over(feed) -> Path:
    """What the learner process does when the partition's log contradicts its copy."""
    folder = feed.learner.engine.folder
    feed.learner.close()
    aside = partition_heal.set_aside(folder)
    feed.disks["l1"] = Disk(folder, voters=frozenset({"n1"}))
    folder.mkdir()
    feed.open_learner()
    feed.pump.rebuild(0, RocksEngine(aside), "the Raft log contradicts the database")
    return aside
