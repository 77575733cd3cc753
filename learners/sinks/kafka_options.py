"""The Kafka sink's options (the list is in kafka_sink.py's docstring), parsed and checked once."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Mapping

from confluent_kafka import KafkaException, Producer

from learners.sinks.kafka_errors import reason
from learners.sinks.options import OptionReader
from raftkv.core.errors import ConfigError

POSITIONS_SUFFIX = ".raftkv-positions"
_KNOWN = {"bootstrap.servers", "topic", "tombstones", "transactional.id", "topic.partitions",
          "topic.replication.factor", "timeout.ms"}
_PRODUCER = "producer."
_RESERVED_PRODUCER = {"bootstrap.servers", "transactional.id", "enable.idempotence"}
_CONNECTION = ("security.", "ssl.", "sasl.")  # producer settings every client of the broker needs
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


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
        )
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
