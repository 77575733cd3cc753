"""The feed consumer against a real tansu broker: dedup, materialize, group resume, tail."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import threading
import time
from collections import Counter

import pytest

from learners.change_event import ChangeEvent
from learners.consumer import FeedConsumer, read_feed, tail
from learners.sinks.base import DeliveryBatch
from learners.sinks.kafka_sink import KafkaSink
from raftkv.cli.feed import check_bootstrap, kafka_feed
from raftkv.client.sync_client import LearnerView
from raftkv.core.errors import ConfigError, Unavailable
from raftkv.dev.local_cluster import free_port_block
from tests.kafka_broker import FAST_CONSUMER, VALIDATOR, History, new_topic, read_raw, sink_options, tansu_fixture

broker = tansu_fixture()


def open_sink(bootstrap: str, topic: str) -> KafkaSink:
    sink = KafkaSink()
    sink.open(sink_options(bootstrap, topic))
    return sink


@pytest.fixture(scope="module")
def duplicated_feed(broker):
    """A feed holding every kind of duplicate the sink can leave, and the history it should mean."""
    topic = new_topic()
    history = History()
    sink = open_sink(broker.bootstrap, topic)
    try:
        a = history.entries(0, 4) + history.entries(1, 4)
        sink.deliver(DeliveryBatch(a, {0: 4, 1: 4}))
        sink.flush()
        # a commit whose outcome the sink did not learn: the learner delivers the same batch again
        b = history.entries(1, 3) + history.entries(0, 2)
        for _ in range(2):
            sink.deliver(DeliveryBatch(b, {0: 6, 1: 7}))
            sink.flush()
        # an aborted batch (tansu shows it), then the retry: the same entries and more
        c = history.entries(0, 3)
        sink.deliver(DeliveryBatch(c, {0: 9}))
        deadline = time.monotonic() + 10       # they reach the broker before close() aborts them
        produced = len(a) + 2 * len(b) + len(c)
        while len([r for r in read_raw(broker.bootstrap, topic, "read_uncommitted") if r.value]) < produced:
            assert time.monotonic() < deadline, "the batch to abort never reached the broker"
    finally:
        sink.close()
    sink = open_sink(broker.bootstrap, topic)
    try:
        d = history.entries(0, 2) + history.entries(1, 2)
        sink.deliver(DeliveryBatch(c + d, {0: 11, 1: 9}))
        sink.flush()
    finally:
        sink.close()
    unique = a + b + c + d
    raw = [r for r in read_raw(broker.bootstrap, topic) if r.value is not None]
    assert len(raw) == len(unique) + len(b) + len(c), "tansu no longer shows aborted records?"
    return topic, history, unique, len(b) + len(c)


def test_events_yields_each_event_once_in_per_key_order(broker, duplicated_feed):
    topic, _, unique, duplicates = duplicated_feed
    with FeedConsumer(broker.bootstrap, topic, config=FAST_CONSUMER) as feed:
        events = list(feed.events(timeout=1.0))
        assert feed.duplicates == duplicates
        assert feed.tombstones > 0
    counts = Counter(e.event_id for e in events)
    assert max(counts.values()) == 1
    assert set(counts) == {e.event_id for e in unique}
    # a raftkv partition's events come from several Kafka partitions: only per-key order holds
    for key in {e.key for e in unique}:
        assert [e.event_id for e in events if e.key == key] == [e.event_id for e in unique if e.key == key]
    by_id = {e.event_id: e for e in unique}
    assert all(by_id[e.event_id] == e for e in events)


def test_materialize_applies_the_history_once(broker, duplicated_feed):
    topic, history, _, _ = duplicated_feed
    with FeedConsumer(broker.bootstrap, topic, config=FAST_CONSUMER) as feed:
        table = feed.materialize(until_idle=1.0)
    assert table == history.table()
    assert table and all(isinstance(k, bytes) and isinstance(v, bytes) for k, v in table.items())


def test_materialize_continues_into_an_existing_table(broker):
    topic = new_topic()
    history = History()
    sink = open_sink(broker.bootstrap, topic)
    try:
        sink.deliver(DeliveryBatch(history.entries(0, 4), {0: 4}))
        sink.flush()
        with FeedConsumer(broker.bootstrap, topic, config=FAST_CONSUMER) as feed:
            table = {b"untouched": b"1"}
            assert feed.materialize(into=table, until_idle=0.5) is table
            assert table == {b"untouched": b"1", **history.table()}
            batch = history.entries(0, 4)
            for _ in range(2):                    # redelivered: the second copy is dropped
                sink.deliver(DeliveryBatch(batch, {0: 8}))
                sink.flush()
            feed.materialize(into=table, until_idle=0.5)
            assert table == {b"untouched": b"1", **history.table()}
            assert feed.duplicates == len(batch)
    finally:
        sink.close()


def take(feed: FeedConsumer, count: int, timeout: float = 15.0) -> list[ChangeEvent]:
    events = []
    for event in feed.events(timeout=timeout):
        events.append(event)
        if len(events) == count:
            break
    return events


def test_a_group_consumer_resumes_after_its_committed_offsets(broker):
    topic = new_topic()
    history = History()
    sink = open_sink(broker.bootstrap, topic)
    group = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 500, **FAST_CONSUMER}
    try:
        first = history.entries(0, 3)
        sink.deliver(DeliveryBatch(first, {0: 3}))
        sink.flush()
        with FeedConsumer(broker.bootstrap, topic, group_id=f"g-{topic}", config=group) as feed:
            seen = take(feed, len(first))   # a tansu group join takes ~session.timeout.ms/2
            feed.commit()
        assert sorted(e.event_id for e in seen) == sorted(e.event_id for e in first)
        second = history.entries(0, 2)
        sink.deliver(DeliveryBatch(second, {0: 5}))
        sink.flush()
        with FeedConsumer(broker.bootstrap, topic, group_id=f"g-{topic}", config=group) as feed:
            seen = take(feed, len(second))  # from the beginning it would start with `first`'s events
        assert sorted(e.event_id for e in seen) == sorted(e.event_id for e in second)
    finally:
        sink.close()


def test_tail_prints_valid_json_lines(broker, duplicated_feed):
    topic, _, unique, _ = duplicated_feed
    out = io.StringIO()
    count = tail(broker.bootstrap, topic, from_beginning=True, out=out, timeout=1.0, config=FAST_CONSUMER)
    lines = out.getvalue().splitlines()
    assert count == len(lines) == len(unique)
    for line in lines:
        VALIDATOR.validate(json.loads(line))
    assert {ChangeEvent.from_json(line).event_id for line in lines} == {e.event_id for e in unique}
    out = io.StringIO()
    assert tail(broker.bootstrap, topic, from_beginning=True, out=out, max_events=3, config=FAST_CONSUMER) == 3
    assert len(out.getvalue().splitlines()) == 3


def test_a_read_of_a_feed_that_never_goes_idle_ends_at_its_deadline(broker):
    """A soak's final check read the Kafka feed again for 20 minutes past its 120 s deadline: records kept
    trickling in, so the read never went idle, and the deadline was checked only between reads."""
    topic = new_topic()
    history = History()
    sink = open_sink(broker.bootstrap, topic)
    stop = threading.Event()

    def trickle() -> None:  # for 10 s at most: a read without the deadline then ends idle, and the test fails
        index, until = 0, time.monotonic() + 10
        while not stop.wait(0.3) and time.monotonic() < until:
            index += 1
            sink.deliver(DeliveryBatch(history.entries(0, 1), {0: index}))
            sink.flush()

    writer = threading.Thread(target=trickle)
    writer.start()
    try:
        started = time.monotonic()
        with pytest.raises(Unavailable, match="still reading when the deadline passed"):
            read_feed(broker.bootstrap, topic, idle=1.0, within=2.0)
        assert time.monotonic() - started < 10
    finally:
        stop.set()
        writer.join()
        sink.close()


def test_a_missing_topic_is_unavailable(broker):
    with pytest.raises(Unavailable, match="not found"):
        FeedConsumer(broker.bootstrap, new_topic("absent"), timeout=5)


# -- issue 25: a wrong address, third-party clients of the demo broker ------------------------------------------

def test_a_broker_that_does_not_answer_is_one_error_and_no_librdkafka_lines(capfd):
    closed = f"127.0.0.1:{free_port_block(1)}"
    with pytest.raises(Unavailable) as error:
        FeedConsumer(closed, "raftkv-feed", timeout=1.0)
    assert f"cannot read feed 'raftkv-feed' from {closed}" in str(error.value)
    out, err = capfd.readouterr()
    assert "rdkafka" not in out + err


@pytest.mark.parametrize("bootstrap", ["127.0.0.1", "127.0.0.1:port", "127.0.0.1:99999", "a:1,b"])
def test_a_malformed_bootstrap_is_a_config_error_naming_it(bootstrap):
    with pytest.raises(ConfigError) as error:
        check_bootstrap(bootstrap)
    assert str(error.value).startswith("--bootstrap: ")


def test_feed_tail_without_an_address_reads_the_one_kafka_learner_registered():
    def view(sink, **options):
        return LearnerView("x", sink, options, {}, {}, {})
    demo = {"feed": view("kafka", **{"bootstrap.servers": "127.0.0.1:7033", "topic": "raftkv-feed"}),
            "nightly": view("backup", url="file:///b")}
    assert kafka_feed(demo, None) == ("127.0.0.1:7033", "raftkv-feed")
    assert kafka_feed(demo, "raftkv-feed") == ("127.0.0.1:7033", "raftkv-feed")
    with pytest.raises(ConfigError, match="kafka learners registered: raftkv-feed on 127.0.0.1:7033"):
        kafka_feed(demo, "other")


def test_a_subscribing_consumer_gets_its_first_event_within_5_seconds(broker):
    """tansu answers a group join after session.timeout.ms / 2: librdkafka's default (45 s) made it 23 s."""
    topic = new_topic()
    sink = open_sink(broker.bootstrap, topic)
    try:
        sink.deliver(DeliveryBatch(History().entries(0, 1), {0: 1}))
        sink.flush()
    finally:
        sink.close()
    started = time.monotonic()
    with FeedConsumer(broker.bootstrap, topic, group_id=f"g-{topic}", config=FAST_CONSUMER) as feed:
        first = next(feed.events(timeout=10), None)
    assert first is not None and time.monotonic() - started < 5


def test_debian_kcat_cannot_read_tansu_0_6_0(broker):
    """A broker fault, no client setting gets round it (README, "Other Kafka clients"): librdkafka 2.0.2 cannot
    parse tansu 0.6.0's ApiVersion v3 reply and, since librdkafka 2.0, api.version.request=false is ignored.
    Pinned so that a tansu that fixes it is noticed."""
    kcat = shutil.which("kcat")
    assert kcat, "kcat is missing: `make system-deps` installs it"
    result = subprocess.run([kcat, "-b", broker.bootstrap, "-L", "-m", "2"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode != 0 and "ApiVersionRequest failed: Local: Read underflow" in result.stderr
