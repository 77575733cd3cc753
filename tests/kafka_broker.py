"""A tansu broker (Kafka protocol, memory storage) on a free loopback port, for the change-feed tests.

    with TansuBroker() as broker:          # or: broker = tansu_fixture()  in a test module
        broker.bootstrap                   # "127.0.0.1:<port>"
        broker.pause(); broker.resume()    # SIGSTOP / SIGCONT: the data survives, clients time out
        broker.stop(); broker.start()      # SIGTERM(+SIGKILL) and a new process ON THE SAME PORT;
                                           # memory storage: every topic and record is gone

Also the change-feed tests' shared helpers: History (deterministic c/u/d event
histories per raftkv partition), read_raw (every record to each partition's
EOF, no dedup), validate (against learners/schema/change_event.v1.json).

The broker itself is raftkv.dev.broker.TansuBroker; its docstring lists what
tansu 0.6.0 does differently from Kafka.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

import jsonschema
import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from learners.change_event import SCHEMA_PATH, ChangeEvent
from raftkv.dev.broker import TansuBroker



def tansu_fixture(scope: str = "module"):
    """A pytest fixture yielding a started TansuBroker, stopped at the end of `scope`.

    In a test module:  broker = tansu_fixture()
    """

    @pytest.fixture(scope=scope)
    def _broker(tmp_path_factory):
        log_path = tmp_path_factory.mktemp("tansu") / "tansu.log"
        broker = TansuBroker(log_path=log_path)
        broker.start()
        try:
            yield broker
        finally:
            broker.stop()

    return _broker


# -- helpers of the change-feed tests: event histories and a raw reader ---------------------------

VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
FAST_CONSUMER = {"fetch.wait.max.ms": 10}  # tansu waits the full fetch.wait.max.ms


def new_topic(prefix: str = "feed") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def sink_options(bootstrap: str, topic: str, **extra: str) -> dict[str, str]:
    return {"bootstrap.servers": bootstrap, "topic": topic, "learner": "l1", "topic.partitions": "4",
            "timeout.ms": "5000", **extra}


class History:
    """A deterministic write history per raftkv partition: c, then u, and every third write a d."""

    def __init__(self, cluster: str = "test", keys_per_partition: int = 5):
        self.cluster = cluster
        self.keys = keys_per_partition
        self.state: dict[int, dict[bytes, bytes]] = {}
        self.next_index: dict[int, int] = {}
        self.writes = 0

    def entries(self, partition: int, count: int, per_entry: int = 3) -> list[ChangeEvent]:
        """`count` Raft entries of `partition`, each a group commit of `per_entry` writes."""
        state = self.state.setdefault(partition, {})
        events = []
        for _ in range(count):
            index = self.next_index.get(partition, 1)
            self.next_index[partition] = index + 1
            for seq in range(per_entry):
                key = f"p{partition}/k{(index * per_entry + seq) % self.keys}".encode()
                before = state.get(key)
                self.writes += 1
                if before is None:
                    op, after = "c", f"{key.decode()}@{index}.{seq}".encode()
                elif self.writes % 3 == 0:
                    op, after = "d", None
                else:
                    op, after = "u", f"{key.decode()}@{index}.{seq}".encode()
                if after is None:
                    state.pop(key)
                else:
                    state[key] = after
                events.append(ChangeEvent(op, key, before, after, self.cluster, partition, index, 1, seq,
                                          False, 1_700_000_000_000 + index))
        return events

    def table(self) -> dict[bytes, bytes]:
        return {k: v for state in self.state.values() for k, v in state.items()}


@dataclass
class Record:
    partition: int
    offset: int
    key: bytes
    value: bytes | None
    headers: dict[str, bytes]


def read_raw(bootstrap: str, topic: str, isolation: str = "read_committed", timeout: float = 20.0) -> list[Record]:
    """Every record of `topic` from the beginning to each partition's end (partition EOF), in offset order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{uuid.uuid4().hex}",
                         "isolation.level": isolation, "enable.partition.eof": True,
                         "enable.auto.commit": False, **FAST_CONSUMER})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, -2) for p in partitions])
        records, at_end = [], set()
        deadline = time.monotonic() + timeout
        while len(at_end) < len(partitions):
            assert time.monotonic() < deadline, f"{topic}: only partitions {sorted(at_end)} reached their end"
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                at_end.add(msg.partition())
                continue
            records.append(Record(msg.partition(), msg.offset(), msg.key(), msg.value(),
                                  {k: v for k, v in (msg.headers() or [])}))
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def validate(value: bytes) -> ChangeEvent:
    doc = json.loads(value)
    VALIDATOR.validate(doc)
    return ChangeEvent.from_dict(doc)
