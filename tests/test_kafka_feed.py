"""The Kafka change feed end to end: nodes, a Kafka learner process, a real tansu broker."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time

import pytest

from learners.consumer import read_feed
from learners.feed_check import chain_breaks, replay
from raftkv import Client
from tests.conftest import random_write, wait_until
from tests.kafka_broker import TansuBroker, new_topic

broker = pytest.fixture(scope="module")(lambda: (yield from _broker()))


def _broker():
    with TansuBroker() as b:
        yield b


def test_kafka_feed_is_exactly_once_through_learner_kills_and_a_broker_outage(make_cluster, broker, tmp_path):
    cluster = make_cluster(nodes=3, partitions=4)
    topic = new_topic()
    config = ["--config", str(cluster.spec_path)]
    subprocess.run([sys.executable, "-m", "raftkv", "learner", "add", "--name", "feed", "--sink", "kafka",
                    "--sink-option", f"bootstrap.servers={broker.bootstrap}", "--sink-option", f"topic={topic}",
                    "--sink-option", "timeout.ms=5000", *config], check=True, capture_output=True, timeout=60)
    log = open(tmp_path / "learner.log", "ab")

    def start_learner() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "raftkv", "learner", "start", "--name", "feed", *config],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    learner = start_learner()
    done = [0]
    stop = threading.Event()

    def writer(seed: int, count: int) -> None:
        rng = random.Random(seed)
        with Client(cluster.endpoints) as kv:
            for _ in range(count):
                random_write(kv, rng, keys=2000, deletes=0.15)
                done[0] += 1
                if stop.is_set():
                    return

    writers = [threading.Thread(target=writer, args=(seed, 3000)) for seed in range(4)]
    try:
        for t in writers:
            t.start()
        for threshold in (2500, 5500):  # kill -9 the learner twice while writes go on
            wait_until(lambda: done[0] >= threshold, 120, f"{threshold} operations")
            learner.kill()
            learner.wait()
            learner = start_learner()
        wait_until(lambda: done[0] >= 8000, 120, "8000 operations")
        broker.pause()  # tansu keeps topics in memory only, so the outage is a SIGSTOP, not a restart
        time.sleep(7)  # the outage itself, past the sink's 5 s timeout: the learner must ride it out
        broker.resume()
        for t in writers:
            t.join(300)
        assert done[0] == 12000
        with Client(cluster.endpoints) as kv:
            final = dict(kv.scan())
        wait_until(lambda: replay(read_feed(broker.bootstrap, topic)) == final, 120,
                   "the feed to replay to the voters' final contents", interval=1.0)
        events = read_feed(broker.bootstrap, topic)
        assert len({e.event_id for e in events}) == len(events)
        assert not chain_breaks(events)
    finally:
        stop.set()
        for t in writers:
            t.join(60)
        learner.kill()
        learner.wait()
