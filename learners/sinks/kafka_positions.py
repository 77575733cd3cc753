"""Where the Kafka sink keeps how far each partition was delivered, and how it reads it back.

In the same transaction as the events, each flush writes one positions record
to partition 0 of the compacted topic `<topic>.raftkv-positions` (key: the
learner's name; value: {"v": 1, "learner": ..., "positions": {"<partition>":
index, ...}, "resyncs": {"<partition>": [[base, index], ...]}} for EVERY
partition the learner delivered), and commits the offset just past it for the
consumer group `<transactional.id>.positions`: the commit witness. `resyncs`
lists every re-sync from a snapshot the feed holds, oldest first: entries
base+1..index are one diff at index, not one by one (a reader of the topic
needs it to know which ranges it can replay entry by entry; records written
before it existed have none). `read` takes the witness W, then the last record with the
learner's key below offset W (read_committed). Why the witness, and why the
result may be lower than the truth but never higher: kafka_sink.py.
"""

from __future__ import annotations

import json
import logging
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from learners.sinks.kafka_errors import StepFailed
from learners.sinks.kafka_options import KafkaOptions

log = logging.getLogger("raftkv.learners.kafka")


Resyncs = dict[int, list[tuple[int, int]]]  # partition -> [(base, index), ...], oldest first


def record(learner: str, positions: dict[int, int], resyncs: Resyncs | None = None) -> bytes:
    return json.dumps({"v": 1, "learner": learner, "positions": {str(p): i for p, i in sorted(positions.items())},
                       "resyncs": {str(p): [list(r) for r in ranges] for p, ranges in sorted((resyncs or {}).items())}},
                      separators=(",", ":")).encode()


def parse_record(value: bytes, learner: str) -> tuple[dict[int, int], Resyncs]:
    try:
        doc = json.loads(value)
        positions = {int(p): int(i) for p, i in doc["positions"].items()}
        resyncs = {int(p): [(int(base), int(index)) for base, index in ranges]
                   for p, ranges in doc.get("resyncs", {}).items()}
        return positions, resyncs
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StepFailed(f"unreadable positions record for learner {learner!r}: {exc}") from None


def witness(options: KafkaOptions, offset: int) -> list[TopicPartition]:
    """What a flush commits, in its transaction, for the record it wrote at `offset`."""
    return [TopicPartition(options.positions_topic, 0, offset + 1)]


def read(options: KafkaOptions, witness_consumer: Consumer) -> tuple[dict[int, int], Resyncs]:
    """The positions and re-syncs of the last committed flush (empty if none ever committed)."""
    committed = witness_consumer.committed([TopicPartition(options.positions_topic, 0)], timeout=options.timeout)
    end = committed[0].offset if committed else -1
    if end is None or end <= 0:
        return {}, {}  # no transaction of this transactional.id ever committed
    found = _last_record_before(options, end)
    return ({}, {}) if found is None else parse_record(found, options.learner)


def _last_record_before(options: KafkaOptions, end: int) -> bytes | None:
    """End detection never uses watermarks (tansu reports them wrong): it stops at offset end-1,
    at a partition EOF, or fails after the timeout."""
    reader = Consumer({
        **options.connection(log),
        "group.id": f"{options.witness_group}.reader",  # never joined nor committed: assign() only
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 50,
    })
    key = options.learner.encode()
    found: bytes | None = None
    deadline = time.monotonic() + options.timeout
    try:
        reader.assign([TopicPartition(options.positions_topic, 0, -2)])  # OFFSET_BEGINNING
        while True:
            if time.monotonic() > deadline:
                raise StepFailed(f"positions record at offset {end - 1} not reached within {options.timeout:g}s")
            msg = reader.poll(0.1)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    log.warning("kafka sink: %s ends before the committed positions record (offset %d); "
                                "recovering conservatively", options.positions_topic, end - 1)
                    break  # readable end (last stable offset): what we have is committed
                if msg.error().fatal() or not msg.error().retriable():
                    raise KafkaException(msg.error())
                continue
            if msg.offset() >= end:
                break
            if msg.key() == key and msg.value() is not None:
                found = msg.value()
            if msg.offset() == end - 1:
                break
    finally:
        reader.close()
    return found
