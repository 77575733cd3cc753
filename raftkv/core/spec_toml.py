"""The cluster spec's TOML file: parsing it into a `ClusterSpec` (every problem named by field) and
writing one back.

    [cluster]
    name = "raftkv"
    partitions = 8           # fixed for the life of the cluster
    replication = 3
    durability = "fsync"     # or "lose-last-second" (docs/durability.md)
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

`load_spec` and `parse_spec` raise one ConfigError listing every problem.
"""

from __future__ import annotations

import os
import sys
import tomllib
from dataclasses import fields, replace
from pathlib import Path

import tomli_w

from raftkv.core.durable import make_dirs, replace_file
from raftkv.core.errors import ConfigError, one_line
from raftkv.core.spec import (DEFAULT_MAX_KEY_BYTES, DEFAULT_MAX_VALUE_BYTES, FSYNC, BackupConfig, ClusterSpec,
                              NodeSpec, TlsSpec, Tuning, spec_error)


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
                **({"raft_engine": n.raft_engine} if n.raft_engine != NodeSpec.raft_engine else {}),
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
    make_dirs(path.parent)
    replace_file(path, data)
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
        values["raft_engine"] = typed(table, "raft_engine", str, f"nodes[{i}]", NodeSpec.raft_engine)
        unknown = set(table) - set(_NODE_FIELDS) - {"raft_engine"}
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
        "durability": typed(cluster, "durability", str, "cluster", FSYNC),
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
        raise spec_error(problems, source)
    spec = ClusterSpec(nodes=tuple(nodes), **spec_values)
    problems = spec.validate()
    if problems:
        raise spec_error(problems, source)
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
