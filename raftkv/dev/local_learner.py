"""One learner process on this machine, registered afresh (dev up's feed, chaos runs).

    changes = LocalLearner(spec, "changes", "changelog", {"path": "/tmp/changes"}, ("--api-port", "7100")).start()
    changes.process.poll()   # the learner process
    changes.stop()

Every start wipes the learner's folder, so it streams the whole log again; its output goes to
`log_path`, beside that folder.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

from learners.learner_process import learner_folder
from raftkv.client.sync_client import Client
from raftkv.core.errors import Unavailable
from raftkv.core.spec import ClusterSpec
from raftkv.dev.local_cluster import die_with_parent
from raftkv.security.tls import client_tls

READY_SECONDS = 60.0


class LocalLearner:
    def __init__(self, spec: ClusterSpec, name: str, sink: str, sink_options: Mapping[str, str],
                 args: Sequence[str] = (), die_with_parent: bool = False):
        if spec.path is None:
            raise ValueError("the spec must come from a file (load_spec): the learner process reads it")
        self.spec = spec
        self.name = name
        self.sink = sink
        self.sink_options = dict(sink_options)
        self.args = tuple(args)
        self._die_with_parent = die_with_parent  # local_cluster.die_with_parent
        self.process: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return learner_folder(self.spec, self.name).parent / f"{self.name}.log"

    def start(self) -> LocalLearner:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.rmtree(learner_folder(self.spec, self.name), ignore_errors=True)
            with Client([n.api_address for n in self.spec.nodes], tls=client_tls(self.spec)) as kv:
                kv.register_learner(self.name, self.sink, self.sink_options)
            with open(self.log_path, "ab") as out:
                logged = out.tell()
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "raftkv", "learner", "start", "--name", self.name,
                     "--config", str(self.spec.path), *self.args],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    preexec_fn=die_with_parent() if self._die_with_parent else None)
            self._wait_ready(logged, READY_SECONDS)
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
            if (code := self.process.poll()) is not None:
                last = said.decode(errors="replace").strip().splitlines()[-1:] or ["nothing"]
                raise Unavailable(f"the learner {self.name} exited with {code} before it was ready: {last[0]}")
            time.sleep(0.05)
        raise Unavailable(f"the learner {self.name} was not ready after {timeout:.0f}s (log: {self.log_path})")

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the learner (SIGKILL after `grace` seconds)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
