"""The cluster spec: one frozen, validated object built from a TOML file.

    [cluster]
    name = "raftkv"
    partitions = 8           # fixed for the life of the cluster
    replication = 3
    durability = "default"   # or "fsync"
    max_key_bytes = 4096
    max_value_bytes = 1048576

    [[nodes]]
    id = "n1"
    host = "127.0.0.1"
    api_port = 7000
    metrics_port = 7001
    raft_port_base = 7002    # partition p's Raft port is raft_port_base + p
    data_dir = "n1"          # relative paths are relative to the spec file

    [tuning]                 # optional; every key has a default (see Tuning)
    compaction_min_entries = 5000

    [backup]                 # optional: where this cluster's backups live (docs/backup.md)
    url = "s3://bucket/raftkv"
    seed = true              # a new replica starts from the newest backup (docs/elasticity.md §4)
    [backup.storage]         # fsspec storage options
    endpoint_url = "http://127.0.0.1:9000"

    [tls]                    # optional (`cluster init` and `dev up` write it): mutual TLS, docs/security.md
    ca = "certs/ca.pem"
    node_cert = "certs/node-{id}.pem"    # {id}: the node's id (or one path, the same on every host)
    node_key = "certs/node-{id}.key"
    learner_cert = "certs/learner.pem"   # optional: what learner processes present
    learner_key = "certs/learner.key"
    client_cert = "certs/user-admin.pem" # optional: what the CLI presents unless given --cert/--key
    client_key = "certs/user-admin.key"
    metrics = false          # serve /metrics over HTTPS with the node's certificate

`validate` names every problem by field; `load_spec` raises one ConfigError
listing them all.
"""

from __future__ import annotations

import os
import sys
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import tomli_w

from raftkv.core.errors import ConfigError, one_line

DURABILITY_MODES = ("default", "fsync")
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

    def problems(self) -> list[str]:
        problems = []
        if not self.heartbeat_period * 3 < self.election_timeout_min < self.election_timeout_max:
            problems.append("tuning: need 3 * heartbeat_period < election_timeout_min < election_timeout_max")
        if self.leader_fallback_timeout <= self.heartbeat_period:
            problems.append("tuning.leader_fallback_timeout: must exceed heartbeat_period")
        for name in ("compaction_min_entries", "max_batch_ops", "max_batch_bytes", "learner_retention_entries",
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

    @property
    def api_address(self) -> str:
        return f"{self.host}:{self.api_port}"

    def raft_address(self, partition: int) -> str:
        return f"{self.host}:{self.raft_port_base + partition}"

    def meta_port(self, partitions: int) -> int:
        """The metadata group's Raft port: the one after the partitions' block."""
        return self.raft_port_base + partitions


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
    durability: str = "default"
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
        if self.durability not in DURABILITY_MODES:
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
    durability: str = "default",
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
        raise _problems(problems, "cluster init")
    return spec


def spec_to_toml(spec: ClusterSpec, relative_to: Path | None = None) -> str:
    """TOML text; data dirs under `relative_to` are written relative to it."""

    def data_dir(n: NodeSpec) -> str:
        if relative_to is not None and n.data_dir.is_relative_to(relative_to):
            return str(n.data_dir.relative_to(relative_to))
        return str(n.data_dir)

    doc = {
        "cluster": {
            "name": spec.name,
            "partitions": spec.partitions,
            "replication": spec.replication,
            "durability": spec.durability,
            "max_key_bytes": spec.max_key_bytes,
            "max_value_bytes": spec.max_value_bytes,
        },
        **({"tuning": tuning_doc} if (tuning_doc := _non_default_tuning(spec.tuning)) else {}),
        **({"backup": _backup_doc(spec.backup)} if spec.backup else {}),
        **({"tls": _tls_doc(spec.tls, relative_to)} if spec.tls else {}),
        "nodes": [
            {
                "id": n.id,
                "host": n.host,
                "api_port": n.api_port,
                "metrics_port": n.metrics_port,
                "raft_port_base": n.raft_port_base,
                "data_dir": data_dir(n),
            }
            for n in spec.nodes
        ],
    }
    return tomli_w.dumps(doc)


def _non_default_tuning(tuning: Tuning) -> dict:
    default = Tuning()
    return {k: v for k, v in vars(tuning).items() if v != getattr(default, k)}


def _backup_doc(backup: BackupConfig) -> dict:
    return {"url": backup.url, "seed": backup.seed, **({"storage": dict(backup.storage)} if backup.storage else {})}


def _tls_doc(tls: TlsSpec, relative_to: Path | None) -> dict:
    def text(path: Path | str) -> str:
        path = Path(path)
        return str(path.relative_to(relative_to)) if relative_to is not None and path.is_relative_to(relative_to) \
            else str(path)

    doc = {k: text(v) for k, v in vars(tls).items() if k != "metrics" and v is not None}
    return {**doc, "metrics": tls.metrics}


def save_spec(spec: ClusterSpec, path: str | Path) -> Path:
    """Write the spec; relative data dirs stay relative to the spec file's folder."""
    path = Path(path)
    text = spec_to_toml(spec, relative_to=path.parent.resolve())
    try:
        data = text.encode()
    except UnicodeEncodeError as exc:  # a name, host or path from command-line bytes that are not UTF-8
        raise ConfigError(f"{os.fsencode(text[exc.start:exc.end])!r} is not UTF-8 text, which is all a TOML spec "
                          "can hold; give names, hosts and paths in UTF-8", source=one_line(str(path))) from None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


_NODE_FIELDS = {"id": str, "host": str, "api_port": int, "metrics_port": int, "raft_port_base": int, "data_dir": str}


def parse_spec(doc: dict, base_dir: Path, source: str = "spec") -> ClusterSpec:
    problems: list[str] = []
    cluster = doc.get("cluster")
    if not isinstance(cluster, dict):
        raise ConfigError("missing [cluster] table", source=source)
    nodes_doc = doc.get("nodes")
    if not isinstance(nodes_doc, list):
        raise ConfigError("missing [[nodes]] entries", source=source)

    def typed(table: dict, key: str, kind: type, where: str, default=None):
        value = table.get(key, default)
        if value is None:
            problems.append(f"{where}.{key}: missing")
        elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            problems.append(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
            return None
        elif kind is str and "\0" in value:
            problems.append(f"{where}.{key}: {value!r} holds a NUL character, which no name or path can")
            return None
        return value

    nodes = []
    for i, table in enumerate(nodes_doc):
        if not isinstance(table, dict):
            problems.append(f"nodes[{i}]: expected a table")
            continue
        values = {k: typed(table, k, kind, f"nodes[{i}]") for k, kind in _NODE_FIELDS.items()}
        unknown = set(table) - set(_NODE_FIELDS)
        if unknown:
            problems.append(f"nodes[{i}]: unknown keys {', '.join(sorted(unknown))}")
        if None not in values.values():
            data_dir = Path(values["data_dir"])
            values["data_dir"] = data_dir if data_dir.is_absolute() else base_dir / data_dir
            nodes.append(NodeSpec(**values))

    spec_values = {
        "name": typed(cluster, "name", str, "cluster"),
        "partitions": typed(cluster, "partitions", int, "cluster"),
        "replication": typed(cluster, "replication", int, "cluster"),
        "durability": typed(cluster, "durability", str, "cluster", "default"),
        "max_key_bytes": typed(cluster, "max_key_bytes", int, "cluster", DEFAULT_MAX_KEY_BYTES),
        "max_value_bytes": typed(cluster, "max_value_bytes", int, "cluster", DEFAULT_MAX_VALUE_BYTES),
    }
    unknown = set(cluster) - set(spec_values)
    if unknown:
        problems.append(f"cluster: unknown keys {', '.join(sorted(unknown))}")
    spec_values["tuning"] = _parse_tuning(doc.get("tuning", {}), problems)
    spec_values["backup"] = _parse_backup(doc["backup"], problems) if "backup" in doc else None
    spec_values["tls"] = _parse_tls(doc["tls"], base_dir, problems) if "tls" in doc else None
    if problems:
        raise _problems(problems, source)
    spec = ClusterSpec(nodes=tuple(nodes), **spec_values)
    problems = spec.validate()
    if problems:
        raise _problems(problems, source)
    return spec


_TUNING_KINDS = {f.name: type(f.default) for f in fields(Tuning)}


def _parse_tuning(table: object, problems: list[str]) -> Tuning:
    if not isinstance(table, dict):
        problems.append("tuning: expected a table")
        return Tuning()
    values = {}
    for key, value in table.items():
        kind = _TUNING_KINDS.get(key)
        if kind is None:
            problems.append(f"tuning.{key}: unknown key")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            problems.append(f"tuning.{key}: expected {kind.__name__}, got {value!r}")
        elif kind is float and not abs(value) <= sys.float_info.max:  # NaN, infinities, integers past any float
            problems.append(f"tuning.{key}: expected a finite number, got {value!r}")
        else:
            values[key] = kind(value)
    return Tuning(**values)


def _parse_backup(table: object, problems: list[str]) -> BackupConfig | None:
    if not isinstance(table, dict):
        problems.append("backup: expected a table")
        return None
    url, seed, storage = table.get("url"), table.get("seed", True), table.get("storage", {})
    before = len(problems)
    if not isinstance(url, str) or not url:
        problems.append(f"backup.url: expected a URL such as s3://bucket/prefix or file:///path, got {url!r}")
    if not isinstance(seed, bool):
        problems.append(f"backup.seed: expected true or false, got {seed!r}")
    if not isinstance(storage, dict) or not all(isinstance(v, (str, int, bool)) for v in storage.values()):
        problems.append("backup.storage: expected a table of fsspec options (text, integer or boolean values)")
    if unknown := set(table) - {"url", "seed", "storage"}:
        problems.append(f"backup: unknown keys {', '.join(sorted(unknown))}")
    if len(problems) > before:
        return None
    pairs = tuple((k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in storage.items())
    return BackupConfig(url, seed, pairs)


_TLS_PAIRS = (("learner_cert", "learner_key"), ("client_cert", "client_key"))


def _parse_tls(table: object, base_dir: Path, problems: list[str]) -> TlsSpec | None:
    if not isinstance(table, dict):
        problems.append("tls: expected a table")
        return None
    before = len(problems)
    known = {"ca", "node_cert", "node_key", "metrics"} | {k for pair in _TLS_PAIRS for k in pair}
    if unknown := set(table) - known:
        problems.append(f"tls: unknown keys {', '.join(sorted(unknown))}")
    paths = {}
    for key in known - {"metrics"}:
        value = table.get(key)
        if value is None:
            if key in ("ca", "node_cert", "node_key"):
                problems.append(f"tls.{key}: missing (the file of {'the cluster CA' if key == 'ca' else 'each node'})")
        elif not isinstance(value, str) or not value or "\0" in value:
            problems.append(f"tls.{key}: expected a file path, got {value!r}")
        else:
            paths[key] = str(base_dir / value)  # an absolute value stays as it is
    for cert, key in _TLS_PAIRS:
        if (cert in table) != (key in table):
            problems.append(f"tls: {cert} and {key} go together")
    metrics = table.get("metrics", False)
    if not isinstance(metrics, bool):
        problems.append(f"tls.metrics: expected true or false, got {metrics!r}")
    if len(problems) > before:
        return None
    return TlsSpec(**{k: v if k.startswith("node_") else Path(v) for k, v in paths.items()}, metrics=metrics)


def load_spec(path: str | Path) -> ClusterSpec:
    path = Path(path)
    source = one_line(str(path))
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError("file not found; create one with `raftkv cluster init`", source=source) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", source=source) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start}); a spec is a TOML file", source=source) from None
    try:
        doc = tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # tomllib lets through int()'s digit limit and deep nesting
        raise ConfigError(f"not valid TOML: {exc}", source=source) from None
    spec = parse_spec(doc, base_dir=path.resolve().parent, source=source)
    return replace(spec, path=path)


def _problems(problems: list[str], source: str) -> ConfigError:
    return ConfigError([one_line(p) for p in problems], source=source)
