"""The learners a chaos run feeds, and the check of what each delivered.

    feeds = start_feeds(spec, ("kafka", "changelog"), cleanup)
    feed_violations(feed, final)    # the feed replays to `final`, every key's chain complete

A Kafka learner feeds a local tansu broker (read back deduplicated); a changelog learner keeps
its events in its own RocksDB, read back through its --api-port. Either must replay to the
voters' final contents with no event missing, repeated or out of order (learners/feed_check.py).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from learners.change_event import ChangeEvent
from learners.changelog_client import read_changelog
from learners.consumer import read_feed
from learners.feed_check import chain_breaks, replay
from learners.learner_process import learner_folder
from raftkv.chaos.history import Violation
from raftkv.core.errors import RaftKVError
from raftkv.core.spec import ClusterSpec
from raftkv.dev.local_cluster import free_port_block
from raftkv.dev.local_feed import LocalFeed
from raftkv.dev.local_learner import LocalLearner
from raftkv.security.tls import client_tls

LEARNERS = ("kafka", "changelog")
FEED_DEADLINE = 120.0  # for a learner's feed to catch up with the final contents


@dataclass(frozen=True)
class Feed:
    kind: str  # one of LEARNERS
    where: str  # the topic, or the changelog's address
    process: Callable[[], subprocess.Popen]
    log_path: Path
    read: Callable[[], list[ChangeEvent]]


def start_feeds(spec: ClusterSpec, kinds: Iterable[str], cleanup: ExitStack) -> list[Feed]:
    feeds = []
    for kind in kinds:
        name = f"chaos-{kind}"
        if kind == "kafka":
            kafka = LocalFeed(spec, name, name, sink_options={"timeout.ms": "5000"}).start()
            cleanup.callback(kafka.stop)
            feeds.append(Feed(kind, f"topic {kafka.topic}", lambda kafka=kafka: kafka.learner, kafka.log_path,
                              lambda kafka=kafka: read_feed(kafka.bootstrap, kafka.topic, within=FEED_DEADLINE)))
        else:
            port = free_port_block(1)
            address = f"127.0.0.1:{port}"
            events = learner_folder(spec, name).with_name(f"{name}-events")
            shutil.rmtree(events, ignore_errors=True)  # the sink's own: the learner streams the whole log again
            changes = LocalLearner(spec, name, "changelog", {"path": str(events)}, ("--api-port", str(port))).start()
            cleanup.callback(changes.stop)
            feeds.append(Feed(kind, f"changelog {address}", lambda changes=changes: changes.process,
                              changes.log_path, lambda address=address: read_changelog(address, client_tls(spec), timeout=FEED_DEADLINE)))
    return feeds


def feed_violations(feed: Feed, final: dict[bytes, bytes]) -> list[Violation]:
    """Waits up to FEED_DEADLINE for the feed to replay to `final`; then every way it does not."""
    deadline = time.monotonic() + FEED_DEADLINE
    events, unread = _read(feed)
    while replay(events) != final and time.monotonic() < deadline:
        if (code := feed.process().poll()) is not None:
            return [Violation("feed", feed.where, f"the {feed.kind} learner exited with {code}; see {feed.log_path}",
                              ())]
        time.sleep(1.0)
        events, unread = _read(feed)
    if unread is not None:
        return [Violation("feed", feed.where, f"the feed could not be read at the end of {FEED_DEADLINE:.0f}s of "
                                              f"waiting for it to catch up: {unread}", ())]
    violations = [Violation("feed", feed.where, line, ()) for line in chain_breaks(events)]
    if (table := replay(events)) != final:
        missing = len(set(final) - set(table))
        wrong = sum(1 for k in final if k in table and table[k] != final[k])
        violations.append(Violation("feed", feed.where,
                                    f"after {FEED_DEADLINE:.0f}s the feed replays to {len(table)} keys, not the "
                                    f"voters' {len(final)}: {missing} missing, {wrong} with another value", ()))
    return violations


def _read(feed: Feed) -> tuple[list[ChangeEvent], RaftKVError | None]:
    try:
        return feed.read(), None
    except RaftKVError as error:  # a changelog learner busy catching up may not answer in time: asked again
        return [], error
