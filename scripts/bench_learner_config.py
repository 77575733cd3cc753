"""bench_learner.py's settings and the targets it reports against."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    keys: int = 100_000
    partitions: int = 8
    chunk: int = 100  # keys per put_many / per etcd txn (etcd's default --max-txn-ops is 128)
    load_in_flight: int = 64
    rates: str = "1000,5000"  # writes/s of the change-feed lag runs
    duration: float = 10.0  # measured seconds per rate
    warmup: float = 2.0  # seconds per rate before the measured window
    poll: float = 0.020  # catch-up polling period (s)
    timeout: float = 300.0  # a learner not caught up after this many seconds is reported as such
    raft_engine: str = "auto"  # the nodes' setting (docs/raft-engine.md): a node's default
    writer_rate: int = 2000  # writes/s per paced writer process in the lag runs (both systems alike)

    @property
    def rate_list(self) -> tuple[int, ...]:
        return tuple(int(r) for r in self.rates.split(","))


QUICK = Config(keys=20_000, duration=2.0, warmup=0.5)
LEARNER = "catchup"
ETCD_LEARNER = "learner"
ETCD_CLIENT = ("etcd3aio 0.3.0 (load, paced puts, watch); plain gRPC stubs from etcd3aio's generated code "
               "(MemberAdd, Status)")
LAG_TARGET_MS, LAG_TARGET_RATE = 100.0, 5000
LAG_ETCD_TARGET = 1.0  # raftkv's feed lag p99 / an etcd watch's at the same rate, at most
CATCH_UP_TARGET = 1.0  # raftkv/etcd, at most
REQUEST_TIMEOUT = 10.0
MAX_PENDING = 5000  # the paced writer skips a send when this many puts are outstanding
FAST_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 20), ("grpc.min_reconnect_backoff_ms", 20),
                  ("grpc.max_reconnect_backoff_ms", 100)]
