"""The cluster spec: one frozen, validated object (`ClusterSpec`) and its parts.

`validate` names every problem by field; `spec_error` makes one ConfigError listing them
all. The spec's TOML file is read and written by `raftkv.core.spec_toml`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from raftkv.core.errors import ConfigError, one_line

# "fsync": a write is acknowledged once every replica that counted toward it synced it (the default).
# "lose-last-second": the logs sync once a second, so a power cut of every node at once may lose the
# writes acknowledged in about the last second (docs/durability.md).
FSYNC, LOSE_LAST_SECOND = "fsync", "lose-last-second"
DURABILITY_MODES = (FSYNC, LOSE_LAST_SECOND)
# Its name while it was the default (before 0.2): still read, and kept as written, so a file an older
# release wrote stays readable by it during a rolling upgrade or a downgrade.
FORMER_DURABILITY_NAMES = {"default": LOSE_LAST_SECOND}
# How settled groups replicate (docs/raft-engine.md): "auto" through the node engine once the cluster
# version says every member has it, "steady" through it at once, "off" never.
RAFT_ENGINES = ("off", "auto", "steady")
DEFAULT_MAX_KEY_BYTES = 4 * 1024
DEFAULT_MAX_VALUE_BYTES = 1024 * 1024
MAX_PARTITIONS = 4096


@dataclass(frozen=True)
class Tuning:
    """Raft and group-commit knobs; the defaults suit a LAN or loopback."""

    election_timeout_min: float = 0.4
    election_timeout_max: float = 1.4
    heartbeat_period: float = 0.1
    leader_fallback_timeout: float = 1.5  # an isolated leader steps down after this
    connection_retry_seconds: float = 0.5
    compaction_min_entries: int = 5000
    compaction_min_seconds: float = 300.0
    compaction_min_bytes: int = 16 * 1024 * 1024  # ... or once the log holds this much: it is held in memory
    learner_retention_entries: int = 50_000  # keep entries a stopped learner or a backup seed needs, up to this
    learner_retention_bytes: int = 256 * 1024 * 1024
    seed_retention_bytes: int = 32 * 1024 * 1024  # ... a backup seed needs, up to this (held in memory)
    backup_poll_seconds: float = 60.0  # how often nodes list the [backup] URL for the newest copies
    max_batch_ops: int = 4096
    max_batch_bytes: int = 2 * 1024 * 1024
    request_timeout: float = 10.0
    wire_compression: int = 0  # zlib level of Raft messages; 0 on loopback/LAN (raftkv/raft/hub_frames.py)
    rebalance_interval: float = 2.0  # how often the metadata leader plans moves and transfers; 0: never by itself
    max_moves: int = 2  # replica moves under way in the cluster at once
    max_moves_per_node: int = 1  # ... and per node, as source or target
    dead_after: float = 300.0  # a node unreachable this long is dead: its replicas are re-created elsewhere
    move_timeout: float = 300.0  # a move whose new replica makes no progress this long is rolled back
    # what one client (a user; a host without TLS) may have open on one node (raftkv/node/client_limits.py)
    max_calls_per_client: int = 2048
    max_scans_per_client: int = 64
    max_writes_per_client: int = 200_000  # write operations sent and not yet answered
    # what every RocksDB database of a node (or learner) shares: a block cache, memtables (storage/rocks_memory.py)
    rocksdb_block_cache_mb: int = 64
    rocksdb_memtables_mb: int = 64

    def problems(self) -> list[str]:
        problems = []
        if not self.heartbeat_period * 3 < self.election_timeout_min < self.election_timeout_max:
            problems.append("tuning: need 3 * heartbeat_period < election_timeout_min < election_timeout_max")
        if self.leader_fallback_timeout <= self.heartbeat_period:
            problems.append("tuning.leader_fallback_timeout: must exceed heartbeat_period")
        for name in ("compaction_min_entries", "compaction_min_bytes", "max_batch_ops", "max_batch_bytes", "learner_retention_entries",
                     "learner_retention_bytes", "seed_retention_bytes", "max_calls_per_client", "max_scans_per_client",
                     "max_writes_per_client"):
            if getattr(self, name) < 2:
                problems.append(f"tuning.{name}: must be at least 2")
        for name in ("connection_retry_seconds", "compaction_min_seconds", "request_timeout", "dead_after",
                     "backup_poll_seconds", "move_timeout", "max_moves", "max_moves_per_node"):
            if getattr(self, name) <= 0:
                problems.append(f"tuning.{name}: must be positive")
        if self.seed_retention_bytes > self.learner_retention_bytes:
            problems.append("tuning.seed_retention_bytes: must not exceed learner_retention_bytes (the log kept for "
                            "seeds counts against what a stopped learner may hold)")
        if self.rebalance_interval < 0:
            problems.append("tuning.rebalance_interval: must not be negative (0 turns rebalancing off)")
        for name in ("rocksdb_block_cache_mb", "rocksdb_memtables_mb"):
            if getattr(self, name) < 8:
                problems.append(f"tuning.{name}: at least 8")
        if not 0 <= self.wire_compression <= 9:
            problems.append("tuning.wire_compression: a zlib level, 0 (none) to 9")
        return problems


@dataclass(frozen=True)
class NodeSpec:
    id: str
    host: str
    api_port: int
    metrics_port: int
    raft_port_base: int
    data_dir: Path
    raft_engine: str = "auto"  # RAFT_ENGINES

    @property
    def api_address(self) -> str:
        return f"{self.host}:{self.api_port}"

    def raft_address(self, partition: int) -> str:
        return f"{self.host}:{self.raft_port_base + partition}"

    def meta_port(self, partitions: int) -> int:
        """The metadata group's Raft port: the one after the partitions' block."""
        return self.raft_port_base + partitions

    @property
    def meta_dir(self) -> Path:
        """Its replica of the metadata group: absent until the node first starts, and after its data is lost."""
        return self.data_dir / "meta"


@dataclass(frozen=True)
class BackupConfig:
    """Where the cluster's backups are: nodes seed new replicas from them, and the log a seeded
    replica catches up from is kept on the replicas."""

    url: str
    seed: bool = True
    storage: tuple[tuple[str, str], ...] = ()  # fsspec options as text pairs (raftkv.backup.store types them)


@dataclass(frozen=True)
class TlsSpec:
    """Where the cluster's PEM files are; the presence of [tls] turns mutual TLS on for every listener."""

    ca: Path
    node_cert: str  # a path; "{id}" in it stands for the node's id
    node_key: str
    learner_cert: Path | None = None
    learner_key: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    metrics: bool = False

    def node(self, node_id: str) -> tuple[Path, Path]:
        """The certificate and key of node `node_id`."""
        return Path(self.node_cert.replace("{id}", node_id)), Path(self.node_key.replace("{id}", node_id))


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    partitions: int
    replication: int
    nodes: tuple[NodeSpec, ...]
    durability: str = FSYNC
    max_key_bytes: int = DEFAULT_MAX_KEY_BYTES
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    tuning: Tuning = field(default_factory=Tuning)
    backup: BackupConfig | None = None
    tls: TlsSpec | None = None
    path: Path | None = field(default=None, compare=False)

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(n.id for n in self.nodes)

    def node(self, node_id: str) -> NodeSpec:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise ConfigError(
            f"node {node_id!r} is not in the spec; known nodes: {', '.join(self.node_ids)}",
            source=str(self.path or "spec"),
        )

    def validate(self) -> list[str]:
        problems = []
        if not self.name:
            problems.append("cluster.name: must not be empty")
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            problems.append(f"cluster.partitions: {self.partitions} is not in 1..{MAX_PARTITIONS}")
        if not self.nodes:
            problems.append("nodes: at least one node is required")
        if not 1 <= self.replication <= max(len(self.nodes), 1):
            problems.append(
                f"cluster.replication: {self.replication} must be between 1 and the number of nodes ({len(self.nodes)})"
            )
        if self.durability not in DURABILITY_MODES and self.durability not in FORMER_DURABILITY_NAMES:
            problems.append(f"cluster.durability: {self.durability!r} is not one of {', '.join(DURABILITY_MODES)}")
        if self.max_key_bytes < 1:
            problems.append("cluster.max_key_bytes: must be positive")
        if self.max_value_bytes < 0:
            problems.append("cluster.max_value_bytes: must not be negative")
        if 1 <= self.partitions <= MAX_PARTITIONS:  # else one Raft port a partition would be too many to check
            problems += _node_problems(self.nodes, self.partitions)
        problems += self.tuning.problems()
        return problems


def _node_problems(nodes: tuple[NodeSpec, ...], partitions: int) -> list[str]:
    problems = []
    seen_ids: set[str] = set()
    used: dict[tuple[str, int], str] = {}
    for i, n in enumerate(nodes):
        where = f"nodes[{i}]"
        if not n.id:
            problems.append(f"{where}.id: must not be empty")
        elif n.id in seen_ids:
            problems.append(f"{where}.id: duplicate node id {n.id!r}")
        seen_ids.add(n.id)
        if n.raft_engine not in RAFT_ENGINES:
            problems.append(f"{where}.raft_engine: {n.raft_engine!r} is not one of {', '.join(RAFT_ENGINES)}")
        ports = [("api_port", n.api_port), ("metrics_port", n.metrics_port)]
        ports += [(f"raft port of partition {p}", n.raft_port_base + p) for p in range(partitions)]
        ports.append(("metadata raft port (raft_port_base + partitions)", n.meta_port(partitions)))
        for name, port in ports:
            if not 1 <= port <= 65535:
                problems.append(f"{where}.{name}: {port} is not a valid port")
                continue
            other = used.get((n.host, port))
            if other:
                problems.append(f"{where}.{name}: port {port} on {n.host} is also {other}")
            used[(n.host, port)] = f"{n.id} {name}"
    return problems


def ports_per_node(partitions: int) -> int:
    """API, metrics, one Raft port per partition and the metadata group's."""
    return partitions + 3


def build_spec(
    *,
    nodes: int,
    partitions: int,
    replication: int,
    base_port: int,
    data_dir: str | Path,
    hosts: list[str] | None = None,
    name: str = "raftkv",
    durability: str = FSYNC,
) -> ClusterSpec:
    """A spec for `nodes` nodes; each node takes a block of partitions + 3 ports."""
    if hosts and len(hosts) != nodes:
        raise ConfigError(f"--hosts lists {len(hosts)} hosts for {nodes} nodes")
    stride = ports_per_node(partitions)
    node_specs = tuple(
        NodeSpec(
            id=f"n{i + 1}",
            host=hosts[i] if hosts else "127.0.0.1",
            api_port=base_port + i * stride,
            metrics_port=base_port + i * stride + 1,
            raft_port_base=base_port + i * stride + 2,
            data_dir=Path(data_dir).resolve() / f"n{i + 1}",
        )
        for i in range(nodes)
    )
    spec = ClusterSpec(
        name=name, partitions=partitions, replication=replication, nodes=node_specs, durability=durability
    )
    problems = spec.validate()
    if problems:
        raise spec_error(problems, "cluster init")
    return spec


def spec_error(problems: list[str], source: str) -> ConfigError:
    """One ConfigError listing every problem `validate` (or the TOML parser) found."""
    return ConfigError([one_line(p) for p in problems], source=source)
