"""A Kafka change feed's history for a point-in-time restore (feed_history.py): the topic, read whole.

What it covers comes from the Kafka sink's positions record (kafka_positions.py): each partition's
delivered index and re-syncs, committed in the same transaction as the events. That is the upper end.
The lower end needs the topic whole: the learner's first events are the start of the log or a
re-sync, so with every record still there the feed covers each partition from index 0. Retention
that deleted records (a partition whose log no longer starts at offset 0) or compaction (which keeps
only each key's last record) would leave gaps the positions cannot show, so either is refused.

The topic is read once, to the end of every partition (after the positions record, so every event
it counts is there), deduplicated by `FeedConsumer`, and kept in memory, sorted per partition: a
partition's events are spread over the topic's partitions by key.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Iterator, Mapping

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from learners.change_event import ChangeEvent
from learners.consumer import FeedConsumer
from learners.restore_plan import Coverage, Resync
from learners.sinks import kafka_positions
from learners.sinks.kafka_errors import StepFailed, reason
from learners.sinks.kafka_options import KafkaOptions
from raftkv.core.errors import ConfigError, InvalidRequest, Unavailable

log = logging.getLogger("raftkv.learners.kafka")


class KafkaHistory:
    def __init__(self, bootstrap: str, topic: str, options: Mapping[str, str]):
        self.options = o = KafkaOptions.parse({"bootstrap.servers": bootstrap, "topic": topic, **options})
        where = f"feed {topic!r} on {bootstrap}"
        try:
            delivered, resyncs = self._positions()
            self._check_whole()
        except (KafkaException, StepFailed) as exc:
            raise Unavailable(f"{where}: {reason(exc)}") from None
        if not delivered:
            raise ConfigError(f"{where}: no positions of learner {o.learner!r} in {o.positions_topic!r}; name the "
                              "learner that writes the topic (--feed-option learner=NAME)", source="--feed")
        self._coverage = {p: Coverage(0, index, tuple(Resync(b, i) for b, i in resyncs.get(p, ())))
                          for p, index in delivered.items()}
        by_partition: dict[int, list[ChangeEvent]] = defaultdict(list)
        with FeedConsumer(bootstrap, topic, config=dict(o.connection(log)), timeout=o.timeout) as feed:
            for event in feed.events(timeout=o.timeout, to_end=True):
                by_partition[event.partition].append(event)
        self._events = {p: sorted(events, key=lambda e: (e.index, e.seq)) for p, events in by_partition.items()}
        clusters = {e.cluster for events in self._events.values() for e in events[:1]}
        if len(clusters) > 1:
            raise InvalidRequest(f"{where} holds events of several clusters ({', '.join(sorted(clusters))})")
        self.cluster = clusters.pop() if clusters else ""

    def _positions(self) -> tuple[dict[int, int], kafka_positions.Resyncs]:
        o = self.options
        witness = Consumer({**o.connection(log), "group.id": o.witness_group, "enable.auto.commit": False})
        try:
            return kafka_positions.read(o, witness)
        finally:
            witness.close()

    def _check_whole(self) -> None:
        """Refuse a topic whose retention deleted records or that is compacted: gaps no position shows."""
        o = self.options
        admin = AdminClient(o.connection(log))
        resource = ConfigResource(ConfigResource.Type.TOPIC, o.topic)
        configs = admin.describe_configs([resource], request_timeout=o.timeout)[resource].result(o.timeout)
        policy = configs.get("cleanup.policy")
        if policy is not None and "compact" in (policy.value or ""):
            raise InvalidRequest(f"feed {o.topic!r} is compacted (cleanup.policy={policy.value}): it keeps only the "
                                 "last change of each key, so it cannot replay a range of the log")
        reader = Consumer({**o.connection(log), "group.id": f"{o.witness_group}.history"})  # assign() only
        try:
            partitions = reader.list_topics(o.topic, timeout=o.timeout).topics[o.topic].partitions
            for k in sorted(partitions):
                start, _ = reader.get_watermark_offsets(TopicPartition(o.topic, k), timeout=o.timeout, cached=False)
                if start > 0:
                    raise InvalidRequest(
                        f"feed {o.topic!r}: partition {k} starts at offset {start}, retention deleted the records "
                        "before it; a point-in-time restore needs the topic whole (or a changelog learner, whose "
                        "retained range is exact)")
        finally:
            reader.close()

    def coverage(self) -> dict[int, Coverage]:
        return dict(self._coverage)

    def events(self, partition: int, after: int, until: int) -> Iterator[ChangeEvent]:
        return (e for e in self._events.get(partition, ()) if after < e.index <= until)

    def close(self) -> None:
        """Nothing stays open: the topic was read when the history was made."""
