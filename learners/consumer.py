"""Reading a raftkv change feed from Kafka: FeedConsumer, and `tail` for `raftkv feed tail`.

    with FeedConsumer("127.0.0.1:9092", "kv-feed") as feed:
        table = feed.materialize()             # {key: value} of everything in the feed
        for event in feed.events(timeout=5):   # then follow it
            ...

Records are read with isolation.level=read_committed, tombstones (value null)
are skipped, values are parsed into ChangeEvents, and duplicates are dropped.

Why there are duplicates: the sink redelivers a batch after a failed flush
whose outcome it could not know (the commit may have landed), and tansu (the
test broker) even shows aborted transactions to read_committed readers. A
redelivered event is the same event: (partition, index, seq) identifies it.

How they are dropped: per (raftkv partition, Kafka partition) the consumer
keeps the highest (index, seq) it has yielded and drops every event at or
below it. A raftkv partition's events are spread over Kafka partitions by key,
so there is no order across Kafka partitions (a high mark per raftkv partition
alone would drop real events); but within ONE Kafka partition they are in Raft
order: the learner delivers each partition's events in Raft order, one
transaction at a time, the idempotent producer keeps per-partition order, and
a redelivery restarts at or below the failed batch and repeats the same
events. So an event that is not above the mark of its Kafka partition was
already yielded. This is exact where a set of seen ids would be too, and takes
O(raftkv partitions x Kafka partitions) memory instead of one entry per event
forever (a set can only be pruned below such a mark anyway).
`duplicates` counts what was dropped. The marks live in memory: a consumer that
restarts from committed group offsets may see the tail of a redelivered batch
again (at-least-once across restarts); applying it again is harmless, the
events repeat the same writes in the same order.

Consumers without `group_id` assign all partitions of the topic themselves
(no group join: tansu takes session.timeout.ms/2 per join) and start at the
beginning (or the end); `events(to_end=True)` then stops once every partition
reached its end (partition EOF: tansu's watermarks cannot be trusted). With
`group_id` they subscribe, resume from the group's committed offsets
(`commit()` stores them; auto-commit is off), with session.timeout.ms 6000
(Kafka's smallest by default; librdkafka's 45000 makes a tansu join take 23 s).
librdkafka's own log goes to the `raftkv.feed.kafka` logger at DEBUG.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid
from typing import Iterator, Mapping, TextIO

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from learners.change_event import ChangeEvent
from raftkv.core.errors import Unavailable

_log = logging.getLogger("raftkv.feed.kafka")


class _LibrdkafkaLog:
    """librdkafka's own log (a wrong address: a line every few ms) goes to our logger at DEBUG; what a caller
    needs comes back as one Unavailable."""

    def log(self, level: int, message: str, *args: object, **kwargs: object) -> None:
        _log.debug(message, *args)


class FeedConsumer:
    def __init__(self, bootstrap: str, topic: str, group_id: str | None = None, from_beginning: bool = True,
                 config: Mapping[str, object] | None = None, timeout: float = 10.0):
        self.topic = topic
        self.group_id = group_id
        self.duplicates = 0   # events dropped as already yielded
        self.tombstones = 0   # tombstone records skipped
        self._marks: dict[tuple[int, int], tuple[int, int]] = {}  # (raftkv partition, kafka partition) -> (index, seq)
        self._assigned: set[int] = set()  # the Kafka partitions, without group_id
        self._consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": group_id or f"raftkv-feed-{uuid.uuid4().hex}",  # unused without group_id
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest" if from_beginning else "latest",
            "fetch.wait.max.ms": 100,
            "enable.partition.eof": True,
            "session.timeout.ms": 6000,  # tansu answers a group join after session.timeout.ms / 2
            "logger": _LibrdkafkaLog(),
            **(config or {}),
        })
        try:
            if group_id:
                self._consumer.subscribe([topic])
            else:
                metadata = self._consumer.list_topics(topic, timeout=timeout).topics.get(topic)
                if metadata is None or metadata.error is not None or not metadata.partitions:
                    raise Unavailable(f"feed topic {topic!r} not found on {bootstrap}"
                                      + (f" ({metadata.error.str()})" if metadata and metadata.error else ""))
                start = OFFSET_BEGINNING if from_beginning else OFFSET_END
                self._assigned = set(metadata.partitions)
                self._consumer.assign([TopicPartition(topic, p, start) for p in sorted(self._assigned)])
        except KafkaException as exc:
            self._consumer.close()
            raise Unavailable(f"cannot read feed {topic!r} from {bootstrap}: {exc.args[0].str()}") from None
        except BaseException:
            self._consumer.close()
            raise

    def events(self, timeout: float | None = None, to_end: bool = False,
               deadline: float | None = None) -> Iterator[ChangeEvent]:
        """Events in arrival order, each once; ends after `timeout` seconds without a record (None: never), or,
        `to_end` (without group_id), once every partition reached its end: then a timeout is Unavailable.
        Unavailable too once `deadline` (a `time.monotonic()`) passes first: records that trickle in never
        leave the feed idle."""
        if to_end and self.group_id:
            raise ValueError("to_end needs the partitions assigned: no group_id")
        idle_since = time.monotonic()
        at_end: set[int] = set()
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise Unavailable(f"feed {self.topic!r}: still reading when the deadline passed")
            msg = self._consumer.poll(0.1 if timeout is None else min(0.1, max(timeout, 0.001)))
            if msg is None:
                if timeout is not None and time.monotonic() - idle_since >= timeout:
                    if to_end:
                        raise Unavailable(f"feed {self.topic!r}: partitions {sorted(self._assigned - at_end)} did "
                                          f"not reach their end within {timeout:g}s")
                    return
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                    if to_end and at_end >= self._assigned:
                        return
                    continue
                if error.fatal():
                    raise Unavailable(f"feed {self.topic!r}: {error.str()}")
                continue  # transient (the client retries)
            idle_since = time.monotonic()
            if self.group_id:
                self._consumer.store_offsets(msg)
            if msg.value() is None:
                self.tombstones += 1
                continue
            try:
                event = ChangeEvent.from_json(msg.value())
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"feed {self.topic!r} partition {msg.partition()} offset {msg.offset()}: "
                                 f"not a ChangeEvent ({exc})") from None
            mark_key = (event.partition, msg.partition())
            mark = (event.index, event.seq)
            seen = self._marks.get(mark_key)
            if seen is not None and mark <= seen:
                self.duplicates += 1
                continue
            self._marks[mark_key] = mark
            yield event

    def materialize(self, into: dict[bytes, bytes] | None = None, until_idle: float = 1.0) -> dict[bytes, bytes]:
        """Apply events (c/u/r set the key, d deletes it) until `until_idle` seconds pass without a record."""
        table = {} if into is None else into
        for event in self.events(timeout=until_idle):
            if event.op == "d":
                table.pop(event.key, None)
            else:
                table[event.key] = event.after
        return table

    def commit(self) -> None:
        """Store the group's offsets past every record yielded or skipped so far (group_id only)."""
        if not self.group_id:
            raise ValueError("commit() needs a group_id")
        try:
            self._consumer.commit(asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:
                raise Unavailable(f"feed {self.topic!r}: commit failed: {exc.args[0].str()}") from None

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> FeedConsumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_feed(bootstrap: str, topic: str, idle: float = 3.0, within: float | None = None) -> list[ChangeEvent]:
    """Every event in the topic once (deduplicated), in arrival order, until `idle` seconds bring nothing new;
    Unavailable if that takes more than `within` seconds."""
    deadline = None if within is None else time.monotonic() + within
    with FeedConsumer(bootstrap, topic) as feed:
        return list(feed.events(timeout=idle, deadline=deadline))


def tail(bootstrap: str, topic: str, *, group_id: str | None = None, from_beginning: bool = False,
         out: TextIO | None = None, timeout: float | None = None, max_events: int | None = None,
         config: Mapping[str, object] | None = None) -> int:
    """Print events as JSON lines (the v1 envelope) until `timeout` idle seconds or `max_events`; return the count."""
    out = out or sys.stdout
    count = 0
    if max_events is not None and max_events <= 0:
        return 0
    with FeedConsumer(bootstrap, topic, group_id=group_id, from_beginning=from_beginning, config=config) as feed:
        try:
            for event in feed.events(timeout=timeout):
                out.write(json.dumps(event.to_dict(), separators=(",", ":")) + "\n")
                out.flush()
                count += 1
                if group_id and count % 100 == 0:
                    feed.commit()
                if max_events is not None and count >= max_events:
                    break
        finally:
            if group_id:
                feed.commit()
    return count
