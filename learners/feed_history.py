"""A change feed's history, read back for a point-in-time restore: what it covers, and its events.

    --feed changelog://HOST:PORT          a learner running the changelog sink (its --api-port)
    --feed kafka://HOST:PORT[,...]/TOPIC  the topic a Kafka learner writes (kafka_history.py)

What a feed covers (`restore_plan.Coverage`) comes from what it records about itself: the changelog's
retained range and re-syncs (`Offsets`), the Kafka sink's positions record. The events are the ones its
readers already serve (`ChangeLogClient.read`, `FeedConsumer`).
"""

from __future__ import annotations

from typing import Iterator, Mapping, Protocol

from learners.change_event import ChangeEvent
from learners.changelog_client import ChangeLogClient, event_of
from learners.restore_plan import Coverage, Resync
from raftkv.core.errors import ConfigError
from raftkv.security.tls import Tls

SCHEMES = ("changelog", "kafka")


class FeedHistory(Protocol):
    cluster: str  # the name of the cluster whose log the feed follows

    def coverage(self) -> dict[int, Coverage]: ...

    def events(self, partition: int, after: int, until: int) -> Iterator[ChangeEvent]:
        """The partition's events with after < index <= until, in (index, seq) order."""

    def close(self) -> None: ...


class ChangelogHistory:
    """A changelog learner's retained log, over its ChangeLog service."""

    def __init__(self, address: str, tls: Tls | None = None, token: str | None = None):
        self._log = ChangeLogClient(address, tls=tls, token=token)
        try:
            self.cluster = self._log.cluster()
        except BaseException:
            self._log.close()
            raise

    def coverage(self) -> dict[int, Coverage]:
        return {o.partition: Coverage(o.earliest, o.latest, tuple(Resync(r.base, r.index) for r in o.resyncs))
                for o in self._log.offsets()}

    def events(self, partition: int, after: int, until: int) -> Iterator[ChangeEvent]:
        for chunk in self._log.read(partition, after, until):
            for change in chunk.changes:
                yield event_of(change, partition, self.cluster)

    def close(self) -> None:
        self._log.close()


def open_feed(url: str, options: Mapping[str, str], tls: Tls | None = None, token: str | None = None) -> FeedHistory:
    """The feed at `url`; `options` are the Kafka sink's (learner=NAME, transactional.id, producer.ssl.*...)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES or not rest:
        raise ConfigError(f"expected changelog://HOST:PORT or kafka://HOST:PORT/TOPIC, got {url!r}", source="--feed")
    if scheme == "changelog":
        if options:
            raise ConfigError(f"a changelog feed takes no options, got {', '.join(sorted(options))}",
                              source="--feed-option")
        return ChangelogHistory(rest, tls, token)
    bootstrap, _, topic = rest.partition("/")
    if not bootstrap or not topic:
        raise ConfigError(f"expected kafka://HOST:PORT[,HOST:PORT...]/TOPIC, got {url!r}", source="--feed")
    from learners.kafka_history import KafkaHistory  # only a Kafka feed needs the Kafka client

    return KafkaHistory(bootstrap, topic, options)
