"""The Kafka change-feed sink: an idempotent, transactional producer (docs/learners.md, DESIGN §7).

Options (`raftkv learner add ... --sink kafka --option k=v`; parsed in kafka_options.py):

    bootstrap.servers        required
    topic                    required; the change feed
    tombstones               true|false (default true): a tombstone follows every `d` event
    transactional.id         default raftkv-<topic>-<learner>
    learner                  the learner's name (the learner process passes it; default "learner")
    topic.partitions         partitions of the feed when this sink creates it (default 8)
    topic.replication.factor when this sink creates topics (default -1: the broker's default)
    timeout.ms               bound on every blocking Kafka call (default 30000)
    producer.<property>      passed through to the producer (librdkafka names); producer.security.*,
                             producer.ssl.* and producer.sasl.* reach the sink's admin client and
                             consumers too (a TLS or SASL broker)

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
   {"v": 1, "learner": ..., "positions": {"<partition>": index, ...}, "resyncs": ...} with the
   positions of EVERY partition this learner has delivered, and every re-sync from a
   snapshot it delivered (both cumulative; kafka_positions.py);
3. commits, in the same transaction, the offset just past that record for the
   consumer group `<transactional.id>.positions` (send_offsets_to_transaction):
   the commit witness;
4. commits the transaction.

So the events, the positions record and the witness become visible together
(the record and its reading: kafka_positions.py).

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

import dataclasses
import logging
import time
from typing import Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from learners.sinks import kafka_positions
from learners.sinks.base import DeliveryBatch
from learners.sinks.kafka_errors import StepFailed, reason
from learners.sinks.kafka_options import KafkaOptions, too_small
from raftkv.core.errors import ConfigError, Unavailable, Undeliverable

log = logging.getLogger("raftkv.learners.kafka")

EVENT_ID_HEADER = "raftkv-event-id"
OP_HEADER = "raftkv-op"
_ABORT_TIMEOUT = 2.0  # a healthy broker aborts in milliseconds; past this the producer is dropped instead
_CHECK_TIMEOUT = 5.0  # `learner add` waits no longer for the broker
# What Kafka answers for ONE record it will never take, however often it is sent
_REFUSED = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_RECORD}


class KafkaSink:
    """Sink protocol (learners/sinks/base.py) over a transactional Kafka producer."""

    def __init__(self) -> None:
        self.options: KafkaOptions | None = None
        self._producer: Producer | None = None
        self._witness: Consumer | None = None
        self._in_txn = False
        self._pending: dict[int, int] = {}            # positions delivered in the open transaction
        self._pending_resyncs: kafka_positions.Resyncs = {}  # re-syncs delivered in it
        self._positions: dict[int, int] | None = None  # last committed (None: not read yet)
        self._resyncs: kafka_positions.Resyncs = {}    # last committed
        self._errors: list[str] = []                   # delivery-report errors of the open transaction
        self._refused: tuple[int, int, KafkaError] | None = None  # (partition, index, error): an event refused
        self._last_offset: int | None = None           # offset of the positions record just produced

    # -- Sink protocol ---------------------------------------------------------------------------

    def open(self, config: Mapping[str, str]) -> None:
        self.options = o = KafkaOptions.parse(config)
        self._witness = Consumer({**o.connection(log), "group.id": o.witness_group, "enable.auto.commit": False})
        try:
            self._ensure_topics(AdminClient(o.connection(log)), create=True)
            self._ensure_producer()
        except StepFailed as exc:
            self.close()
            raise Unavailable(f"kafka sink: cannot open {o.topic!r} on {o.bootstrap}: {exc}") from None
        except ConfigError:
            self.close()
            raise

    def check(self, config: Mapping[str, str]) -> None:
        """What `learner add` asks: the options, and an existing topic's record size limit. Unavailable if the
        broker does not answer within a few seconds."""
        o = KafkaOptions.parse(config)
        admin = AdminClient({**o.connection(log), "log_level": 0})
        checker = KafkaSink()
        checker.options = dataclasses.replace(o, timeout=min(o.timeout, _CHECK_TIMEOUT))
        try:
            checker._ensure_topics(admin, create=False)
        except StepFailed as exc:
            raise Unavailable(f"kafka sink: cannot check {o.topic!r} on {o.bootstrap}: {exc}") from None

    def recover(self) -> dict[int, int]:
        o = self.options
        try:
            self._positions, self._resyncs = kafka_positions.read(o, self._witness)
        except (KafkaException, StepFailed) as exc:
            raise Unavailable(f"kafka sink: cannot read positions from {o.positions_topic!r} on "
                              f"{o.bootstrap}: {reason(exc)}") from None
        return dict(self._positions)

    def deliver(self, batch: DeliveryBatch) -> None:
        try:
            self._ensure_producer()
            if not self._in_txn:
                self._producer.begin_transaction()
                self._in_txn = True
                self._errors, self._refused = [], None
            for event in batch.events:
                headers = [(EVENT_ID_HEADER, f"{event.partition}/{event.index}/{event.seq}".encode()),
                           (OP_HEADER, event.op.encode())]
                try:
                    self._produce(event.key, event.to_json(), headers)
                except KafkaException as exc:
                    if exc.args[0].code() not in _REFUSED:
                        raise
                    self._refuse(event.partition, event.index, exc)
                if event.op == "d" and self.options.tombstones:
                    self._produce(event.key, None, headers)
            self._pending.update(batch.positions)
            for partition, base in batch.resyncs.items():
                self._pending_resyncs.setdefault(partition, []).append((base, batch.positions[partition]))
            self._producer.poll(0)
        except (KafkaException, BufferError, StepFailed) as exc:
            self._fail("deliver", exc)

    def flush(self) -> None:
        if not self._in_txn:
            return
        o = self.options
        try:
            if self._positions is None:  # the record must hold every partition's position: read them first
                self._positions, self._resyncs = kafka_positions.read(o, self._witness)
            self._wait_acked("events")
            positions = {**self._positions, **self._pending}
            resyncs = {p: self._resyncs.get(p, []) + self._pending_resyncs.get(p, [])
                       for p in self._resyncs.keys() | self._pending_resyncs.keys()}
            self._last_offset = None
            self._producer.produce(o.positions_topic, key=o.learner.encode(),
                                   value=kafka_positions.record(o.learner, positions, resyncs), partition=0,
                                   on_delivery=self._on_positions_delivery)
            self._wait_acked("positions record")
            if self._last_offset is None:
                raise StepFailed("no offset reported for the positions record")
            self._producer.send_offsets_to_transaction(kafka_positions.witness(o, self._last_offset),
                                                       self._witness.consumer_group_metadata(), o.timeout)
            self._producer.commit_transaction(o.timeout)
        except (KafkaException, StepFailed) as exc:
            self._fail("flush", exc)
        self._in_txn = False
        self._positions, self._resyncs = positions, resyncs
        self._pending, self._pending_resyncs = {}, {}

    def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            if self._in_txn:
                try:
                    producer.abort_transaction(min(self.options.timeout, _ABORT_TIMEOUT))
                except KafkaException as exc:
                    log.warning("kafka sink: abort on close failed (%s); the broker aborts it on the "
                                "next init_transactions or after transaction.timeout.ms", reason(exc))
                    producer.purge()
            del producer  # rd_kafka_destroy; nothing is flushed
        self._in_txn = False
        self._pending, self._pending_resyncs = {}, {}
        if self._witness is not None:
            self._witness.close()
            self._witness = None

    # -- Kafka plumbing ----------------------------------------------------------------------------

    def _ensure_topics(self, admin: AdminClient, create: bool) -> None:
        """Create the topics (the feed's sized for the largest record), or check the feed's limit."""
        o = self.options
        try:
            existing = admin.list_topics(timeout=o.timeout).topics
        except KafkaException as exc:
            raise StepFailed(f"metadata request failed: {reason(exc)}") from None
        if o.topic in existing:
            self._check_topic_limit(admin)
        if not create:
            return
        wanted = []
        if o.topic not in existing:
            wanted.append(NewTopic(o.topic, o.partitions, o.replication,
                                   config={"max.message.bytes": str(o.record_bytes)}))
        if o.positions_topic not in existing:
            wanted.append(NewTopic(o.positions_topic, 1, o.replication, config={"cleanup.policy": "compact"}))
        if not wanted:
            return
        for name, future in admin.create_topics(wanted, request_timeout=o.timeout).items():
            try:
                future.result(o.timeout)
                log.info("kafka sink: created topic %s", name)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise StepFailed(f"cannot create topic {name!r}: {reason(exc)}") from None

    def _check_topic_limit(self, admin: AdminClient) -> None:
        o = self.options
        future = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, o.topic)],
                                        request_timeout=o.timeout)
        try:
            entries = next(iter(future.values())).result(o.timeout)
        except KafkaException as exc:
            raise StepFailed(f"cannot read the configuration of topic {o.topic!r}: {reason(exc)}") from None
        entry = entries.get("max.message.bytes")
        problem = too_small(f"topic {o.topic!r}: max.message.bytes", None if entry is None else entry.value,
                            o.record_bytes)
        if problem:
            raise ConfigError(problem, source="kafka sink")

    def _ensure_producer(self) -> None:
        if self._producer is not None:
            return
        producer = Producer(self.options.producer_config(log))
        try:
            # fences any earlier producer with this transactional.id and ends its open transaction
            producer.init_transactions(self.options.timeout)
        except KafkaException as exc:
            producer.purge()
            raise StepFailed(f"init_transactions failed: {reason(exc)}") from None
        self._producer = producer
        self._in_txn = False

    def _produce(self, key: bytes, value: bytes | None, headers: list) -> None:
        deadline = time.monotonic() + self.options.timeout
        while True:
            try:
                self._producer.produce(self.options.topic, key=key, value=value, headers=headers,
                                       on_delivery=self._on_delivery)
                return
            except BufferError:  # the local queue is full: serve delivery reports until there is room
                if time.monotonic() > deadline:
                    raise StepFailed(f"producer queue still full after {self.options.timeout:g}s") from None
                self._producer.poll(0.05)

    def _on_delivery(self, err, msg) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}: {err.str()}")
            if err.code() in _REFUSED and self._refused is None:
                event_id = dict(msg.headers() or []).get(EVENT_ID_HEADER, b"")
                partition, index, _ = (event_id.decode().split("/") + ["", "", ""])[:3]
                if partition.isdigit() and index.isdigit():
                    self._refused = (int(partition), int(index), err)

    def _on_positions_delivery(self, err, msg) -> None:
        self._on_delivery(err, msg)
        if err is None:
            self._last_offset = msg.offset()

    def _wait_acked(self, what: str) -> None:
        remaining = self._producer.flush(self.options.timeout)
        if remaining:
            raise StepFailed(f"{remaining} record(s) ({what}) not acknowledged within {self.options.timeout:g}s")
        if self._refused is not None:
            partition, index, err = self._refused
            self._refuse(partition, index, KafkaException(err))
        if self._errors:
            raise StepFailed(f"{len(self._errors)} record(s) failed ({what}): {self._errors[0]}")

    def _refuse(self, partition: int, index: int, exc: KafkaException):
        """The broker (or librdkafka) will never take this event: end the transaction and name its partition."""
        self._end_transaction(exc)
        o = self.options
        raise Undeliverable(partition, index, f"{reason(exc)} (kafka sink, topic {o.topic!r} on {o.bootstrap}; "
                                              f"records up to {o.record_bytes} bytes)") from None

    def _fail(self, stage: str, exc: BaseException):
        """Abort the open transaction (or drop the producer) and raise Unavailable."""
        outcome = self._end_transaction(exc)
        raise Unavailable(f"kafka sink: {stage} to {self.options.topic!r} on {self.options.bootstrap} failed "
                          f"({reason(exc)}); {outcome}; deliver again") from None

    def _end_transaction(self, exc: BaseException) -> str:
        """Abort the open transaction (or drop the producer), forget the pending batch; say which."""
        producer = self._producer
        outcome = "no transaction was open"
        if producer is not None and self._in_txn:
            try:
                producer.abort_transaction(min(self.options.timeout, _ABORT_TIMEOUT))
                outcome = "transaction aborted"
            except KafkaException as abort_exc:
                log.warning("kafka sink: abort failed (%s); dropping the producer", reason(abort_exc))
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
        self._pending, self._pending_resyncs = {}, {}
        self._errors, self._refused = [], None
        return outcome
