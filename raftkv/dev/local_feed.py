"""A change feed on this machine: a tansu broker and one Kafka learner process feeding it (dev up, chaos runs).

    feed = LocalFeed(spec, name="feed", topic="raftkv-feed").start()
    feed.bootstrap        # where to read the topic
    feed.learner.poll()   # the learner process
    feed.stop()

tansu keeps topics in memory, so every start begins the feed afresh: the
learner's folder is wiped and it streams the whole log again.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from learners.learner_process import learner_folder
from raftkv.client.sync_client import Client
from raftkv.core.errors import Unavailable
from raftkv.dev.broker import TansuBroker
from raftkv.dev.local_cluster import die_with_parent
from raftkv.core.spec import ClusterSpec
from raftkv.security.tls import client_tls


LEARNER_READY_SECONDS = 60.0


class LocalFeed:
    def __init__(self, spec: ClusterSpec, name: str, topic: str, broker_port: int | None = None,
                 sink_options: dict[str, str] | None = None, die_with_parent: bool = False):
        if spec.path is None:
            raise ValueError("the spec must come from a file (load_spec): the learner process reads it")
        self.spec = spec
        self.name = name
        self.topic = topic
        self.broker = TansuBroker(port=broker_port, log_path=self.log_path.with_name("tansu.log"),
                                  die_with_parent=die_with_parent)
        self._die_with_parent = die_with_parent  # local_cluster.die_with_parent, for the learner too
        self.sink_options = sink_options or {}
        self.learner: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    @property
    def log_path(self) -> Path:
        return learner_folder(self.spec, self.name).parent / f"{self.name}.log"

    def start(self) -> LocalFeed:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.broker.start()
        try:
            shutil.rmtree(learner_folder(self.spec, self.name), ignore_errors=True)
            with Client([n.api_address for n in self.spec.nodes], tls=client_tls(self.spec)) as kv:
                kv.register_learner(self.name, "kafka",
                                    {"bootstrap.servers": self.bootstrap, "topic": self.topic, **self.sink_options})
            with open(self.log_path, "ab") as out:
                logged = out.tell()
                self.learner = subprocess.Popen(
                    [sys.executable, "-m", "raftkv", "learner", "start", "--name", self.name,
                     "--config", str(self.spec.path)],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    preexec_fn=die_with_parent() if self._die_with_parent else None)
            self._wait_ready(logged, LEARNER_READY_SECONDS)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, logged: int, timeout: float) -> None:
        """Until the learner says it is ready: a chaos run's first power cut once came while it was still
        starting, it exited (no node answered), and the feed never began."""
        ready = f"raftkv learner {self.name} ready".encode()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as log:
                log.seek(logged)
                said = log.read()
            if ready in said:
                return
            if (code := self.learner.poll()) is not None:
                last = said.decode(errors="replace").strip().splitlines()[-1:] or ["nothing"]
                raise Unavailable(f"the learner {self.name} exited with {code} before it was ready: {last[0]}")
            time.sleep(0.05)
        raise Unavailable(f"the learner {self.name} was not ready after {timeout:.0f}s (log: {self.log_path})")

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the learner (SIGKILL after `grace` seconds), then stop the broker."""
        if self.learner is not None and self.learner.poll() is None:
            self.learner.terminate()
            try:
                self.learner.wait(grace)
            except subprocess.TimeoutExpired:
                self.learner.kill()
                self.learner.wait()
        self.broker.stop()
