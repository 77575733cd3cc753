"""A change feed on this machine: a tansu broker and one Kafka learner process feeding it (dev up, chaos runs).

    feed = LocalFeed(spec, name="feed", topic="raftkv-feed").start()
    feed.bootstrap        # where to read the topic
    feed.learner.poll()   # the learner process
    feed.stop()

tansu keeps topics in memory, so every start begins the feed afresh: the
learner's folder is wiped and it streams the whole log again.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from raftkv.core.spec import ClusterSpec
from raftkv.dev.broker import TansuBroker
from raftkv.dev.local_learner import LocalLearner


class LocalFeed:
    def __init__(self, spec: ClusterSpec, name: str, topic: str, broker_port: int | None = None,
                 sink_options: dict[str, str] | None = None, die_with_parent: bool = False):
        self.topic = topic
        self._learner = LocalLearner(spec, name, "kafka", {"topic": topic, **(sink_options or {})},
                                     die_with_parent=die_with_parent)
        self.broker = TansuBroker(port=broker_port, log_path=self.log_path.with_name("tansu.log"),
                                  die_with_parent=die_with_parent)

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    @property
    def log_path(self) -> Path:
        return self._learner.log_path

    @property
    def learner(self) -> subprocess.Popen | None:
        return self._learner.process

    def start(self) -> LocalFeed:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.broker.start()
        self._learner.sink_options.setdefault("bootstrap.servers", self.bootstrap)
        try:
            self._learner.start()
        except BaseException:
            self.broker.stop()
            raise
        return self

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the learner (SIGKILL after `grace` seconds), then stop the broker."""
        self._learner.stop(grace)
        self.broker.stop()
