"""The Kafka sink's options (the list is in kafka_sink.py's docstring), parsed and checked once."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Mapping

from confluent_kafka import KafkaException, Producer

from learners.sinks.kafka_errors import reason
from learners.sinks.options import OptionReader, limits
from raftkv.core.errors import ConfigError
from raftkv.core.spec import DEFAULT_MAX_KEY_BYTES, DEFAULT_MAX_VALUE_BYTES

POSITIONS_SUFFIX = ".raftkv-positions"
_KNOWN = {"bootstrap.servers", "topic", "tombstones", "transactional.id", "topic.partitions",
          "topic.replication.factor", "timeout.ms"}
_PRODUCER = "producer."
_RESERVED_PRODUCER = {"bootstrap.servers", "transactional.id", "enable.idempotence"}
_CONNECTION = ("security.", "ssl.", "sasl.")  # producer settings every client of the broker needs
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
_DEFAULT_LIMITS = limits("", DEFAULT_MAX_KEY_BYTES, DEFAULT_MAX_VALUE_BYTES)
_RECORD_OVERHEAD = 1024  # headers, record and batch framing, a cluster name longer than the default's ""
_LIBRDKAFKA_MESSAGE_MAX = 1_000_000  # librdkafka's default message.max.bytes; never set lower


@dataclass(frozen=True)
class KafkaOptions:
    bootstrap: str
    topic: str
    learner: str = "learner"
    tombstones: bool = True
    transactional_id: str = ""
    partitions: int = 8  # of the feed topic, when the sink creates it
    replication: int = -1  # of the topics it creates; -1: the broker's default
    timeout: float = 30.0  # seconds, for every blocking Kafka call
    producer: tuple[tuple[str, str], ...] = ()  # producer.<property> pass-through
    max_key_bytes: int = DEFAULT_MAX_KEY_BYTES  # the cluster's limits, from the learner
    max_event_bytes: int = int(_DEFAULT_LIMITS["max_event_bytes"])

    @property
    def record_bytes(self) -> int:
        """The largest record this sink can produce: the raw key, the event, the headers."""
        return max(self.max_key_bytes + self.max_event_bytes + _RECORD_OVERHEAD, _LIBRDKAFKA_MESSAGE_MAX)

    @property
    def positions_topic(self) -> str:
        return self.topic + POSITIONS_SUFFIX

    @property
    def witness_group(self) -> str:
        return f"{self.transactional_id}.positions"

    def connection(self, logger: logging.Logger) -> dict[str, object]:
        """What every client of the broker needs (the admin client and the consumers too): where, and the
        TLS and SASL settings given as producer.security.*, producer.ssl.*, producer.sasl.*."""
        return {"bootstrap.servers": self.bootstrap, "logger": logger,
                **{k: v for k, v in self.producer if k.startswith(_CONNECTION)}}

    def producer_config(self, logger: logging.Logger) -> dict[str, object]:
        return {
            "partitioner": "murmur2_random",
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "lz4",
            "message.max.bytes": self.record_bytes,
            **dict(self.producer),
            "bootstrap.servers": self.bootstrap,
            "enable.idempotence": True,
            "transactional.id": self.transactional_id,
            "logger": logger,
        }

    @classmethod
    def parse(cls, config: Mapping[str, str]) -> KafkaOptions:
        """Raise one ConfigError naming every bad option."""
        read = OptionReader(config, "kafka sink", _KNOWN, prefixes=(_PRODUCER,))
        bootstrap = read.text("bootstrap.servers", required="HOST:PORT[,HOST:PORT...] of the brokers")
        topic = read.text("topic", required="the change feed's topic")
        if topic and (not _TOPIC_NAME.match(topic) or len(topic + POSITIONS_SUFFIX) > 249):
            read.problem(f"option 'topic': {topic!r} is not a valid Kafka topic name "
                         f"(letters, digits, '.', '_', '-'; at most {249 - len(POSITIONS_SUFFIX)} characters)")
        learner = read.text("learner", "learner", required="the learner's name")
        transactional_id = read.text("transactional.id", f"raftkv-{topic}-{learner}",
                                     required="a transactional id, unique to this learner")
        replication = read.integer("topic.replication.factor", -1, -1)
        if replication == 0:
            read.problem("option 'topic.replication.factor' must be -1 (broker default) or at least 1")
        producer = read.prefixed(_PRODUCER)
        for name in sorted(_RESERVED_PRODUCER & producer.keys()):
            read.problem(f"option 'producer.{name}' is set by the sink and cannot be overridden")
        options = cls(
            bootstrap=bootstrap,
            topic=topic,
            learner=learner,
            tombstones=read.boolean("tombstones", True),
            transactional_id=transactional_id,
            partitions=read.integer("topic.partitions", 8, 1),
            replication=replication,
            timeout=read.integer("timeout.ms", 30000, 1) / 1000.0,
            producer=tuple(sorted(producer.items())),
            max_key_bytes=read.integer("max_key_bytes", DEFAULT_MAX_KEY_BYTES, 1),
            max_event_bytes=read.integer("max_event_bytes", int(_DEFAULT_LIMITS["max_event_bytes"]), 1),
        )
        problem = too_small("option 'producer.message.max.bytes'", producer.get("message.max.bytes"),
                            options.record_bytes)
        if problem:
            read.problem(problem)
        read.done()
        options._check_producer_properties()
        return options

    def _check_producer_properties(self) -> None:
        """librdkafka validates properties when a producer is built (no connection yet)."""
        try:
            Producer(self.producer_config(logging.getLogger("raftkv.learners.kafka")))
        except (KafkaException, ValueError, TypeError) as exc:
            text = reason(exc)
            match = re.search(r'property[: ]+"?([\w.]+)"?', text)
            name = f"producer.{match.group(1)}" if match else "producer.*"
            raise ConfigError([f"option {name!r}: {text}"], source="kafka sink") from None


def too_small(setting: str, value: str | None, needed: int) -> str | None:
    """Why `setting` (None: not set, no limit of its own) cannot carry a record of `needed` bytes, or None."""
    try:
        if value is None or int(value) >= needed:
            return None
    except ValueError:
        return None  # not a number: librdkafka or the broker names it
    return (f"{setting} is {value} bytes, but the cluster's largest change event (its largest key, and its "
            f"largest value before and after, in base64) needs {needed}: set it to at least {needed}")
