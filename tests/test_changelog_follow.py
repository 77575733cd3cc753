"""ChangeLog.Follow: the changelog pushed to readers after each synced flush."""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import sys
import threading
import time

import grpc
import pytest

from learners import changelog_service
from learners.change_event import ChangeEvent
from learners.changelog_client import ChangeLogClient
from learners.changelog_service import ChangeLogService, chunks_through
from learners.sinks.base import DeliveryBatch
from learners.sinks.changelog_sink import ChangelogSink, Flushed
from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.client.sync_client import Client
from raftkv.core.errors import InvalidRequest
from raftkv.dev.local_cluster import free_port_block
from raftkv.meta.records import ClusterMeta
from raftkv.node.gatekeeper import Gatekeeper
from raftkv.core.partitioning import partition_for_key
from tests.conftest import changelog_caught_up, wait_until
from tests.kafka_broker import VALIDATOR


def change(index: int, seq: int = 0) -> pb.Change:
    return pb.Change(index=index, seq=seq, op="c", key=b"k")


def test_chunks_through_never_claims_an_entry_it_has_only_begun(monkeypatch):
    monkeypatch.setattr(changelog_service, "CHUNK_CHANGES", 3)
    changes = [change(5, 0), change(5, 1), change(6, 0), change(6, 1), change(6, 2), change(7, 0), change(9, 0)]
    chunks = [([(c.index, c.seq) for c in chunk], through) for chunk, through in chunks_through(iter(changes), 10)]
    assert chunks == [
        ([(5, 0), (5, 1), (6, 0)], 5),   # entry 6 goes on in the next chunk
        ([(6, 1), (6, 2), (7, 0)], 7),   # the next change is entry 9: entry 7 is complete
        ([(9, 0)], 10),                  # the range's end covers entries without events too
    ]
    assert list(chunks_through(iter([]), 4)) == [([], 4)]


@pytest.fixture
def served_sink(tmp_path):
    """(sink, address): a changelog sink served by ChangeLogService over real gRPC on loopback."""
    sink = ChangelogSink()
    sink.open({"path": str(tmp_path / "log"), "retain_entries": "10"})
    sink.recover()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    port = free_port_block(1)

    async def start() -> grpc.aio.Server:
        server = grpc.aio.server()
        kv_pb2_grpc.add_ChangeLogServicer_to_server(
            ChangeLogService(sink, loop, Gatekeeper(enforce=False, meta=ClusterMeta)), server)  # no TLS: no checks
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        return server

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    yield sink, f"127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()
    sink.close()


def deliver(sink: ChangelogSink, partition: int, index: int, events: int = 1) -> None:
    batch = [ChangeEvent("c", b"k%d" % index, None, b"v", "c", partition, index, 1, seq, False, 0)
             for seq in range(events)]
    sink.deliver(DeliveryBatch(batch, {partition: index}))
    sink.flush()


def follow_into(log: ChangeLogClient, after=None) -> queue.Queue:
    chunks: queue.Queue = queue.Queue()

    def run():
        try:
            for chunk in log.follow(after):
                chunks.put(chunk)
        except Exception as exc:
            chunks.put(exc)

    threading.Thread(target=run, daemon=True).start()
    return chunks


def test_follow_sends_each_flush_and_resumes_exactly_from_through(served_sink):
    sink, address = served_sink
    deliver(sink, 0, 1)
    with ChangeLogClient(address) as log:
        chunks = follow_into(log, {0: 1, 1: 0})  # partition 1 has nothing yet
        deliver(sink, 0, 2, events=2)
        deliver(sink, 1, 3)
        got = collect(chunks, changes=3)
    assert sorted((c.partition, c.through, [(x.index, x.seq) for x in c.changes]) for c in got) == [
        (0, 2, [(2, 0), (2, 1)]),
        (1, 3, [(3, 0)]),
    ]
    with ChangeLogClient(address) as log:  # a reader that saved `through` picks up exactly after it
        deliver(sink, 0, 4)
        resumed = collect(follow_into(log, {0: 2, 1: 3}), changes=1)
    assert [(c.partition, [x.index for x in c.changes], c.through) for c in resumed] == [(0, [4], 4)]


def test_a_follower_at_the_tail_gets_each_flush_from_memory_without_reading_the_log(served_sink, monkeypatch):
    sink, address = served_sink
    deliver(sink, 0, 1)
    with ChangeLogClient(address) as log:
        chunks = follow_into(log, {0: 1, 1: 0})
        deliver(sink, 0, 2)
        collect(chunks, changes=1)  # the follower is at the tail (whether the log or memory served this)
        reads = []
        monkeypatch.setattr(sink, "changes", lambda *args: reads.append(args) or iter(()))
        monkeypatch.setattr(sink, "offsets", lambda *args: reads.append(args) or [])
        deliver(sink, 0, 3, events=2)
        deliver(sink, 1, 4)
        got = collect(chunks, changes=3)
    assert reads == []
    assert sorted((c.partition, c.through, [(x.index, x.seq) for x in c.changes]) for c in got) == [
        (0, 3, [(3, 0), (3, 1)]),
        (1, 4, [(4, 0)]),
    ]


def test_flushes_a_follower_missed_come_as_one_chunk_per_partition_and_a_gap_sends_it_to_the_log():
    raw = {index: change(index).SerializeToString() for index in (2, 3, 4)}
    flushes = [Flushed({0: 1}, {0: 2}, {0: [raw[2]]}), Flushed({0: 2, 1: 0}, {0: 4, 1: 3}, {0: [raw[4]], 1: [raw[3]]})]
    tail = changelog_service._Tail(None, {0: 1, 1: 0})
    chunks = tail.take(flushes)
    assert [(c.partition, c.through, [x.index for x in c.changes]) for c in chunks] == [(0, 4, [2, 4]), (1, 3, [3])]
    assert tail.sent == {0: 4, 1: 3}
    assert tail.take(flushes) == []  # everything in them was sent: nothing twice
    behind = changelog_service._Tail(None, {0: 0, 1: 0})  # partition 0's entry 1 is only in the log
    assert behind.take(flushes) is None and behind.sent == {0: 0, 1: 0}
    assert changelog_service._Tail(None, {0: 1}).take(flushes) is None  # partition 1 is new to it
    assert tail.take([None]) is None  # a flush no longer kept in memory


def test_follow_without_offsets_starts_at_what_is_delivered(served_sink):
    sink, address = served_sink
    deliver(sink, 0, 1)
    with ChangeLogClient(address) as log:
        chunks = follow_into(log)
        first, index = None, 1
        deadline = time.monotonic() + 10
        while first is None and time.monotonic() < deadline:  # when the call starts is not observable:
            index += 1                                         # deliver until the follower reports
            deliver(sink, 0, index)
            try:
                first = chunks.get(timeout=0.2)
            except queue.Empty:
                pass
    assert first is not None and 1 < first.changes[0].index <= index


def test_follow_from_trimmed_history_says_how_far_back_the_log_goes(served_sink):
    sink, address = served_sink
    for index in range(1, 31):
        deliver(sink, 0, index)
    with ChangeLogClient(address) as log:
        failure = follow_into(log, {0: 5}).get(timeout=10)
    assert isinstance(failure, InvalidRequest)
    assert "no longer retained" in str(failure)


def test_a_follower_of_a_real_learner_sees_every_write_once_in_raft_order(make_cluster, changelog_learner):
    cluster = make_cluster(nodes=3, partitions=2)
    address = changelog_learner(cluster)
    wait_until(lambda: changelog_caught_up(cluster, address), 60, "the learner to start logging")
    keys = [b"follow/%03d" % i for i in range(200)]
    with ChangeLogClient(address) as log:
        chunks = follow_into(log, {o.partition: o.latest for o in log.offsets()})
        with Client(cluster.endpoints) as client:
            for key in keys:
                client.put(key, b"v1")
            client.put(keys[0], b"v2")
        seen = collect(chunks, changes=len(keys) + 1, timeout=60)
    changes = [(c.partition, x) for c in seen for x in c.changes]
    assert sorted(x.key for _, x in changes) == sorted(keys + [keys[0]])
    for partition in {p for p, _ in changes}:
        order = [(x.index, x.seq) for p, x in changes if p == partition]
        assert order == sorted(set(order))  # in Raft order, nothing twice
        assert all(partition_for_key(x.key, 2) == partition for p, x in changes if p == partition)
    update = [x for _, x in changes if x.key == keys[0] and x.op == "u"]
    assert [(u.before, u.after) for u in update] == [(b"v1", b"v2")]

    # what an operator runs: the same feed as v1 ChangeEvent JSON lines
    tail = subprocess.run([sys.executable, "-m", "raftkv", "feed", "tail", "--changelog", address, "--from-beginning",
                           "--max-events", str(len(changes)), "--timeout", "30"],
                          capture_output=True, text=True, timeout=60)
    assert tail.returncode == 0, tail.stderr
    printed = [ChangeEvent.from_json(line) for line in tail.stdout.splitlines()]
    assert all(VALIDATOR.is_valid(json.loads(line)) for line in tail.stdout.splitlines())
    assert sorted(e.key for e in printed if e.key.startswith(b"follow/")) == sorted(keys + [keys[0]])
    assert {e.cluster for e in printed} == {cluster.spec.name}


def test_feed_tail_needs_exactly_one_feed(tmp_path):
    for args in (["--config", str(tmp_path / "none.toml")], ["--topic", "t", "--changelog", "127.0.0.1:1"]):
        result = subprocess.run([sys.executable, "-m", "raftkv", "feed", "tail", *args], capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 2
        assert "name one feed: --" in result.stderr
        assert "Traceback" not in result.stderr


def collect(chunks: queue.Queue, changes: int, timeout: float = 10) -> list[pb.ChangesChunk]:
    """Chunks from a follower until they hold `changes` changes; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    got: list[pb.ChangesChunk] = []
    while sum(len(c.changes) for c in got) < changes:
        try:
            item = chunks.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"timed out after {timeout}s with {got}") from None
        if isinstance(item, Exception):
            raise item
        got.append(item)
    return got
