"""The Kafka change-feed sink: an idempotent, transactional producer (docs/learners.md, DESIGN §7).

Options (`raftkv learner add ... --sink kafka --option k=v`):

    bootstrap.servers        required
    topic                    required; the change feed
    tombstones               true|false (default true): a tombstone follows every `d` event
    transactional.id         default raftkv-<topic>-<learner>
    learner                  the learner's name (the learner process passes it; default "learner")
    topic.partitions         partitions of the feed when this sink creates it (default 8)
    topic.replication.factor when this sink creates topics (default -1: the broker's default)
    timeout.ms               bound on every blocking Kafka call (default 30000)
    producer.<property>      passed through to the producer (librdkafka names)

Records. Key = the user key; value = `ChangeEvent.to_json()`; headers
`raftkv-event-id` = "<partition>/<index>/<seq>" and `raftkv-op`. The
producer's partitioner hashes the key (murmur2_random, what Java clients use,
unless producer.partitioner says otherwise), so one key always lands on one
Kafka partition and per-key order holds; cross-key order does not. After a
`d` event comes a tombstone (same key, value null) so compaction can drop the
key.

One transaction per flush. `deliver` begins a transaction if none is open and
produces the events; `flush` then

1. waits until every event is acknowledged by the broker;
2. writes one positions record to partition 0 of the compacted companion topic
   `<topic>.raftkv-positions`: key = learner name, value =
   {"v": 1, "learner": ..., "positions": {"<partition>": index, ...}} with the
   positions of EVERY partition this learner has delivered (cumulative);
3. commits, in the same transaction, the offset just past that record for the
   consumer group `<transactional.id>.positions` (send_offsets_to_transaction):
   the commit witness;
4. commits the transaction.

So the events, the positions record and the witness become visible together.

`recover()` reads the witness W (the group's committed offset; none: nothing
was ever committed, return {}), then reads the positions topic from the
beginning with isolation.level=read_committed and enable.partition.eof, taking
the last record with this learner's key below offset W. End detection never
uses watermarks (tansu reports them wrong): it stops at the record at offset
W-1 (the one the witness names), or at a partition EOF, or fails after
timeout.ms. Why the witness: tansu shows ABORTED records to read_committed
consumers, so "the last positions record I can read" could come from an aborted
transaction, while its transactional offset commits do follow the outcome
(verified in tests/kafka_broker.py). With the witness, recover() never returns a
position that was not committed, on Kafka or tansu. It may return a LOWER one
(e.g. a read_committed reader stopped at another learner's open transaction
before W-1): that is always safe, the learner redelivers from its copy's
position and consumers deduplicate by event id; a position too high would be a
gap.

Failures. Any Kafka error in deliver/flush aborts the transaction and raises
raftkv.core.errors.Unavailable (one line); the pending batch is forgotten, so the
learner may call deliver again with the same events. If the abort itself cannot
complete (broker unreachable, or a commit is still in flight), the producer is
dropped and the next deliver builds a new one: its init_transactions fences the
old one and the broker aborts (or, for a commit already sent, completes) the
old transaction. An unknown commit outcome can therefore produce the same
events twice; consumers deduplicate (learners/consumer.py).
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from learners.sinks.base import DeliveryBatch
from raftkv.core.errors import ConfigError, Unavailable

log = logging.getLogger("raftkv.learners.kafka")

POSITIONS_SUFFIX = ".raftkv-positions"
EVENT_ID_HEADER = "raftkv-event-id"
OP_HEADER = "raftkv-op"
_OPTIONS = {"bootstrap.servers", "topic", "tombstones", "transactional.id", "learner", "topic.partitions",
            "topic.replication.factor", "timeout.ms"}
_RESERVED_PRODUCER = {"bootstrap.servers", "transactional.id", "enable.idempotence"}
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}
_ABORT_TIMEOUT = 2.0  # a healthy broker aborts in milliseconds; past this the producer is dropped instead


class _Failed(Exception):
    """A step of deliver/flush failed; message is the one-line reason."""


class KafkaSink:
    """Sink protocol (learners/sinks/base.py) over a transactional Kafka producer."""

    def __init__(self) -> None:
        self.bootstrap = ""
        self.topic = ""
        self.positions_topic = ""
        self.learner = "learner"
        self.transactional_id = ""
        self.witness_group = ""
        self.tombstones = True
        self.timeout = 30.0
        self._partitions = 8
        self._replication = -1
        self._producer_config: dict[str, object] = {}
        self._producer: Producer | None = None
        self._witness: Consumer | None = None
        self._in_txn = False
        self._pending: dict[int, int] = {}            # positions delivered in the open transaction
        self._positions: dict[int, int] | None = None  # last committed (None: not read yet)
        self._errors: list[str] = []                   # delivery-report errors of the open transaction
        self._last_offset: int | None = None           # offset of the positions record just produced

    # -- Sink protocol ---------------------------------------------------------------------------

    def open(self, config: Mapping[str, str]) -> None:
        self._configure(config)
        self._witness = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.witness_group,
                                  "enable.auto.commit": False, "logger": log})
        try:
            self._ensure_topics()
            self._ensure_producer()
        except _Failed as exc:
            self.close()
            raise Unavailable(f"kafka sink: cannot open {self.topic!r} on {self.bootstrap}: {exc}") from None

    def recover(self) -> dict[int, int]:
        try:
            self._positions = self._read_positions()
        except (KafkaException, _Failed) as exc:
            raise Unavailable(f"kafka sink: cannot read positions from {self.positions_topic!r} on "
                              f"{self.bootstrap}: {_reason(exc)}") from None
        return dict(self._positions)

    def deliver(self, batch: DeliveryBatch) -> None:
        try:
            self._ensure_producer()
            if not self._in_txn:
                self._producer.begin_transaction()
                self._in_txn = True
                self._errors = []
            for event in batch.events:
                headers = [(EVENT_ID_HEADER, f"{event.partition}/{event.index}/{event.seq}".encode()),
                           (OP_HEADER, event.op.encode())]
                self._produce(self.topic, event.key, event.to_json(), headers)
                if event.op == "d" and self.tombstones:
                    self._produce(self.topic, event.key, None, headers)
            self._pending.update(batch.positions)
            self._producer.poll(0)
        except (KafkaException, BufferError, _Failed) as exc:
            self._fail("deliver", exc)

    def flush(self) -> None:
        if not self._in_txn:
            return
        try:
            if self._positions is None:  # the record must hold every partition's position: read them first
                self._positions = self._read_positions()
            self._wait_acked("events")
            positions = {**self._positions, **self._pending}
            value = json.dumps({"v": 1, "learner": self.learner,
                                "positions": {str(p): i for p, i in sorted(positions.items())}},
                               separators=(",", ":")).encode()
            self._last_offset = None
            self._producer.produce(self.positions_topic, key=self.learner.encode(), value=value, partition=0,
                                   on_delivery=self._on_positions_delivery)
            self._wait_acked("positions record")
            if self._last_offset is None:
                raise _Failed("no offset reported for the positions record")
            witness = [TopicPartition(self.positions_topic, 0, self._last_offset + 1)]
            self._producer.send_offsets_to_transaction(witness, self._witness.consumer_group_metadata(),
                                                       self.timeout)
            self._producer.commit_transaction(self.timeout)
        except (KafkaException, _Failed) as exc:
            self._fail("flush", exc)
        self._in_txn = False
        self._positions = positions
        self._pending = {}

    def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            if self._in_txn:
                try:
                    producer.abort_transaction(min(self.timeout, _ABORT_TIMEOUT))
                except KafkaException as exc:
                    log.warning("kafka sink: abort on close failed (%s); the broker aborts it on the "
                                "next init_transactions or after transaction.timeout.ms", _reason(exc))
                    producer.purge()
            del producer  # rd_kafka_destroy; nothing is flushed
        self._in_txn = False
        self._pending = {}
        if self._witness is not None:
            self._witness.close()
            self._witness = None

    # -- configuration -----------------------------------------------------------------------------

    def _configure(self, config: Mapping[str, str]) -> None:
        problems: list[str] = []
        for name in ("bootstrap.servers", "topic"):
            if not str(config.get(name, "")).strip():
                problems.append(f"option {name!r} is required")
        unknown = sorted(k for k in config if k not in _OPTIONS and not k.startswith("producer."))
        for name in unknown:
            problems.append(f"unknown option {name!r} (known: {', '.join(sorted(_OPTIONS))}, producer.*)")
        self.bootstrap = str(config.get("bootstrap.servers", "")).strip()
        self.topic = str(config.get("topic", "")).strip()
        self.positions_topic = self.topic + POSITIONS_SUFFIX
        if self.topic and (not _TOPIC_NAME.match(self.topic) or len(self.positions_topic) > 249):
            problems.append(f"option 'topic': {self.topic!r} is not a valid Kafka topic name "
                            f"(letters, digits, '.', '_', '-'; at most {249 - len(POSITIONS_SUFFIX)} characters)")
        tombstones = str(config.get("tombstones", "true")).strip().lower()
        if tombstones not in _TRUE | _FALSE:
            problems.append(f"option 'tombstones': expected true or false, got {config['tombstones']!r}")
        self.tombstones = tombstones not in _FALSE
        self.learner = str(config.get("learner", "learner")).strip()
        if not self.learner:
            problems.append("option 'learner' must not be empty")
        self.transactional_id = str(config.get("transactional.id", f"raftkv-{self.topic}-{self.learner}")).strip()
        if not self.transactional_id:
            problems.append("option 'transactional.id' must not be empty")
        self.witness_group = f"{self.transactional_id}.positions"
        self._partitions = _int_option(config, "topic.partitions", 8, 1, problems)
        self._replication = _int_option(config, "topic.replication.factor", -1, -1, problems)
        if self._replication == 0:
            problems.append("option 'topic.replication.factor' must be -1 (broker default) or at least 1")
        self.timeout = _int_option(config, "timeout.ms", 30000, 1, problems) / 1000.0
        passthrough = {k[len("producer."):]: v for k, v in config.items() if k.startswith("producer.")}
        for name in sorted(_RESERVED_PRODUCER & passthrough.keys()):
            problems.append(f"option 'producer.{name}' is set by the sink and cannot be overridden")
        if problems:
            raise ConfigError(problems, source="kafka sink")
        self._producer_config = {
            "partitioner": "murmur2_random",
            "acks": "all",
            "linger.ms": 5,
            **passthrough,
            "bootstrap.servers": self.bootstrap,
            "enable.idempotence": True,
            "transactional.id": self.transactional_id,
            "logger": log,
        }
        try:  # librdkafka validates properties at construction (no connection yet)
            Producer(self._producer_config)
        except (KafkaException, ValueError, TypeError) as exc:
            text = _reason(exc)
            match = re.search(r'property[: ]+"?([\w.]+)"?', text)
            name = f"producer.{match.group(1)}" if match else "producer.*"
            raise ConfigError([f"option {name!r}: {text}"], source="kafka sink") from None

    # -- Kafka plumbing ----------------------------------------------------------------------------

    def _ensure_topics(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": log})
        try:
            existing = admin.list_topics(timeout=self.timeout).topics
        except KafkaException as exc:
            raise _Failed(f"metadata request failed: {_reason(exc)}") from None
        wanted = []
        if self.topic not in existing:
            wanted.append(NewTopic(self.topic, self._partitions, self._replication))
        if self.positions_topic not in existing:
            wanted.append(NewTopic(self.positions_topic, 1, self._replication,
                                   config={"cleanup.policy": "compact"}))
        if not wanted:
            return
        for name, future in admin.create_topics(wanted, request_timeout=self.timeout).items():
            try:
                future.result(self.timeout)
                log.info("kafka sink: created topic %s", name)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise _Failed(f"cannot create topic {name!r}: {_reason(exc)}") from None

    def _ensure_producer(self) -> None:
        if self._producer is not None:
            return
        producer = Producer(self._producer_config)
        try:
            # fences any earlier producer with this transactional.id and ends its open transaction
            producer.init_transactions(self.timeout)
        except KafkaException as exc:
            producer.purge()
            raise _Failed(f"init_transactions failed: {_reason(exc)}") from None
        self._producer = producer
        self._in_txn = False

    def _produce(self, topic: str, key: bytes, value: bytes | None, headers: list) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self._producer.produce(topic, key=key, value=value, headers=headers, on_delivery=self._on_delivery)
                return
            except BufferError:  # the local queue is full: serve delivery reports until there is room
                if time.monotonic() > deadline:
                    raise _Failed(f"producer queue still full after {self.timeout:g}s") from None
                self._producer.poll(0.05)

    def _on_delivery(self, err, msg) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}: {err.str()}")

    def _on_positions_delivery(self, err, msg) -> None:
        self._on_delivery(err, msg)
        if err is None:
            self._last_offset = msg.offset()

    def _wait_acked(self, what: str) -> None:
        remaining = self._producer.flush(self.timeout)
        if remaining:
            raise _Failed(f"{remaining} record(s) ({what}) not acknowledged within {self.timeout:g}s")
        if self._errors:
            raise _Failed(f"{len(self._errors)} record(s) failed ({what}): {self._errors[0]}")

    def _read_positions(self) -> dict[int, int]:
        committed = self._witness.committed([TopicPartition(self.positions_topic, 0)], timeout=self.timeout)
        witness = committed[0].offset if committed else -1
        if witness is None or witness <= 0:
            return {}  # no transaction of this transactional.id ever committed
        reader = Consumer({
            "bootstrap.servers": self.bootstrap,
            "group.id": f"{self.witness_group}.reader",  # never joined nor committed: assign() only
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 50,
            "logger": log,
        })
        key = self.learner.encode()
        found: bytes | None = None
        deadline = time.monotonic() + self.timeout
        try:
            reader.assign([TopicPartition(self.positions_topic, 0, -2)])  # OFFSET_BEGINNING
            while True:
                if time.monotonic() > deadline:
                    raise _Failed(f"positions record at offset {witness - 1} not reached within {self.timeout:g}s")
                msg = reader.poll(0.1)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        log.warning("kafka sink: %s ends before the committed positions record (offset %d); "
                                    "recovering conservatively", self.positions_topic, witness - 1)
                        break  # readable end (last stable offset): what we have is committed
                    if msg.error().fatal() or not msg.error().retriable():
                        raise KafkaException(msg.error())
                    continue
                if msg.offset() >= witness:
                    break
                if msg.key() == key and msg.value() is not None:
                    found = msg.value()
                if msg.offset() == witness - 1:
                    break
        finally:
            reader.close()
        if found is None:
            return {}
        try:
            doc = json.loads(found)
            return {int(p): int(i) for p, i in doc["positions"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise _Failed(f"unreadable positions record for learner {self.learner!r}: {exc}") from None

    def _fail(self, stage: str, exc: BaseException):
        """Abort the open transaction (or drop the producer) and raise Unavailable."""
        reason = _reason(exc)
        producer = self._producer
        outcome = "no transaction was open"
        if producer is not None and self._in_txn:
            try:
                producer.abort_transaction(min(self.timeout, _ABORT_TIMEOUT))
                outcome = "transaction aborted"
            except KafkaException as abort_exc:
                log.warning("kafka sink: abort failed (%s); dropping the producer", _reason(abort_exc))
                producer.purge()
                self._producer = None
                outcome = "transaction abandoned: the next producer's init_transactions ends it"
        elif producer is not None:
            self._producer = None  # begin_transaction failed: start over with a new producer
        fatal = isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError) \
            and exc.args[0].fatal()
        if fatal:
            self._producer = None  # a fatal producer error (e.g. fenced) needs a new producer
        self._in_txn = False
        self._pending = {}
        self._errors = []
        raise Unavailable(f"kafka sink: {stage} to {self.topic!r} on {self.bootstrap} failed ({reason}); "
                          f"{outcome}; deliver again") from None


def _int_option(config: Mapping[str, str], name: str, default: int, minimum: int, problems: list[str]) -> int:
    raw = config.get(name)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        problems.append(f"option {name!r}: expected an integer, got {raw!r}")
        return default
    if value < minimum:
        problems.append(f"option {name!r}: must be at least {minimum}, got {value}")
        return default
    return value


def _reason(exc: BaseException) -> str:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        text = exc.args[0].str()
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())
