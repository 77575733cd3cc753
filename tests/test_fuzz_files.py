"""Fuzzing, in process, of what raftkv reads from files, specs and backup manifests (security item 5).

Each target is one test; tests/fuzzing.py sets how many inputs it sends and tallies them.

1. TOML specs -> `load_spec`: random bytes and text, and a valid spec (with [tls], [backup], [tuning])
   mutated value by value: wrong types, zero/negative/huge numbers, NaN and infinities, empty, long and
   control-character strings, absolute and `..` paths in every path field, missing tables, unknown keys,
   duplicate nodes, non-UTF-8 bytes, tomllib's own limits. It must give a spec that validates, names no
   path a file cannot have, and survives spec_to_toml and parsing unchanged, or a one-line ConfigError;
   never another exception, and never a second of work.
2. Backup manifests -> `BackupInfo.from_manifest`: random bytes, random JSON, deep nesting, and a valid
   manifest mutated: wrong types, huge, negative, float and infinite numbers, missing keys, file names
   that climb out (`../x`, `/etc/passwd`, `p0001/x` under partition 0, NUL, backslashes). It must give a
   BackupInfo whose every file is `<partition dir>/<plain name>`, or a one-line CorruptData.
"""

from __future__ import annotations

import copy
import json
import tomllib
from datetime import datetime, timezone
from pathlib import Path

import tomli_w
from hypothesis import strategies as st

from raftkv.backup.manifest import BackupInfo, FileEntry, PartitionCopy, partition_dir
from raftkv.core.errors import ConfigError, CorruptData
from raftkv.core.spec import Tuning, ports_per_node
from raftkv.core.spec_toml import load_spec, parse_spec, spec_to_toml
from raftkv.storage.engine import Position
from tests.fuzzing import HOSTILE_NUMBERS, HOSTILE_PATHS, HOSTILE_TEXTS, containers, fuzz, is_one_line, mutated

# -- 1. TOML specs --------------------------------------------------------------------

SPEC_PATH_KEYS = {"data_dir", "ca", "node_cert", "node_key", "learner_cert", "learner_key", "client_cert",
                  "client_key"}
NUMBER_KEYS = {"partitions", "replication", "max_key_bytes", "max_value_bytes", "api_port", "metrics_port",
               "raft_port_base"}
NODE_ADDRESS_KEYS = {"host", "api_port", "metrics_port", "raft_port_base", "data_dir"}
TLS = {"ca": "certs/ca.pem", "node_cert": "certs/node-{id}.pem", "node_key": "certs/node-{id}.key",
       "learner_cert": "certs/learner.pem", "learner_key": "certs/learner.key",
       "client_cert": "certs/user-admin.pem", "client_key": "certs/user-admin.key", "metrics": False}


def spec_doc(base_port: int, partitions: int = 4) -> dict:
    """A valid spec of two nodes on 127.0.0.1 from `base_port`, with every optional table."""
    stride = ports_per_node(partitions)
    nodes = [{"id": f"n{i + 1}", "host": "127.0.0.1", "api_port": base_port + i * stride,
              "metrics_port": base_port + i * stride + 1, "raft_port_base": base_port + i * stride + 2,
              "data_dir": f"n{i + 1}"} for i in range(2)]
    return {"cluster": {"name": "fuzz", "partitions": partitions, "replication": 2, "durability": "fsync"},
            "tuning": {"heartbeat_period": 0.05, "max_batch_ops": 64},
            "backup": {"url": "file:///srv/backups", "seed": True, "storage": {"auto_mkdir": True}},
            "tls": dict(TLS), "nodes": nodes}


scalars = (st.sampled_from(HOSTILE_NUMBERS + HOSTILE_TEXTS + HOSTILE_PATHS + [True, False]) | st.integers()
           | st.floats() | st.datetimes() | st.text(max_size=20))
toml_values = scalars | st.lists(scalars, max_size=3) | st.dictionaries(st.text(max_size=8), scalars, max_size=3)


def spec_values(path: tuple) -> st.SearchStrategy:
    if path[-1] in SPEC_PATH_KEYS:
        return st.sampled_from(HOSTILE_PATHS) | toml_values
    if path[-1] in NUMBER_KEYS or path[:1] == ("tuning",):
        return st.sampled_from(HOSTILE_NUMBERS) | toml_values
    return toml_values


def _nodes_duplicated(valid: dict, copies: int) -> dict:
    doc = copy.deepcopy(valid)
    doc["nodes"] += [copy.deepcopy(doc["nodes"][0]) for _ in range(copies)]
    return doc


def _tuned(valid: dict, key: str, value) -> dict:
    """`valid` with one Tuning field (or a name that is not one) set: `mutated` reaches only those it has."""
    doc = copy.deepcopy(valid)
    doc["tuning"][key] = value
    return doc


RAW_TOMLS = [b"a = " + b"[" * 100_000, b"a = " + b"{b=" * 100_000, b"[" + b"a." * 10_000 + b"b]",
             b"[cluster]\npartitions = " + b"9" * 5000, b"[cluster]\npartitions = 1e999", b"\xef\xbb\xbf[cluster]"]


def spec_texts(valid: dict, frozen=lambda path: False) -> st.SearchStrategy[bytes]:
    """A spec file's bytes: random, or `valid` mutated, perhaps with bytes that are not UTF-8 spliced in."""
    numbers = st.sampled_from(HOSTILE_NUMBERS)
    documents = st.one_of(
        mutated(valid, spec_values, frozen),
        mutated(valid, lambda path: numbers, lambda path: path[-1] not in NUMBER_KEYS or frozen(path)),
        st.builds(_nodes_duplicated, st.just(valid), st.integers(1, 3)),
        st.builds(_tuned, st.just(valid), st.sampled_from(sorted(vars(Tuning())) + ["problems", "__doc__"]), numbers))
    tomls = documents.map(lambda doc: tomli_w.dumps(doc).encode())
    spliced = st.tuples(tomls, st.integers(0, 10_000), st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\r", b"["])).map(
        lambda t: t[0][:t[1]] + t[2] + t[0][t[1]:])
    return st.one_of(tomls, tomls, spliced, st.binary(max_size=200), st.text(max_size=200).map(str.encode))


def spec_paths(spec) -> list[Path]:
    tls = [v for k, v in vars(spec.tls).items() if k != "metrics" and v is not None] if spec.tls else []
    return [n.data_dir for n in spec.nodes] + tls


def check_spec_file(path: Path) -> str:
    try:
        spec = load_spec(path)
    except ConfigError as error:
        assert is_one_line(error), str(error)
        return "ConfigError"
    assert spec.validate() == []
    assert all("\x00" not in str(p) for p in spec_paths(spec)), "a path no file can have"
    base = path.parent.resolve()
    assert parse_spec(tomllib.loads(spec_to_toml(spec, relative_to=base)), base) == spec
    return "a spec"


def test_hostile_specs_load_or_fail_with_one_line(tmp_path):
    path = tmp_path / "cluster.toml"

    def check(data: bytes) -> str:
        path.write_bytes(data)
        return check_spec_file(path)

    fuzz("TOML specs -> load_spec", 2000, spec_texts(spec_doc(7000)), check, always=RAW_TOMLS)


# -- 2. backup manifests --------------------------------------------------------------

BACKUP_ID = "20260102T030405.123456Z"
TRAVERSALS = ["../x", "/etc/passwd", "p0000/../../x", "p0001/x", "", ".", "p0000", "p0000/", "p0000/.",
              "p0000/..", "p0000//x", "./p0000/x", "p0000\\..\\x", "p0000/..\\x", "p0000/a\x00b", "P0000/x",
              "p0000/x/y", "p0000/" + "x" * 5000, "p-001/x", "p00000/x", " p0000/x"]


def manifest_doc() -> dict:
    files = (FileEntry("p0000/000009.sst", 100, "ab" * 32), FileEntry("p0000/CURRENT", 16, "cd" * 32))
    copies = (PartitionCopy(0, Position(10, 2), files),
              PartitionCopy(1, Position(0, 0), (FileEntry("p0001/MANIFEST-000005", 9, "ef" * 32),)))
    info = BackupInfo(BACKUP_ID, "fuzz", datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc), copies, "cid")
    return json.loads(info.to_manifest())


json_scalars = (st.none() | st.booleans() | st.integers(-10**300, 10**300) | st.floats()
                | st.sampled_from(HOSTILE_NUMBERS + HOSTILE_TEXTS + TRAVERSALS) | st.text(max_size=20))
json_values = st.recursive(json_scalars, containers, max_leaves=20)


def manifest_values(path: tuple) -> st.SearchStrategy:
    return st.sampled_from(TRAVERSALS) | json_values if path[-1] == "path" else json_values


def manifest_bytes() -> st.SearchStrategy[bytes]:
    documents = mutated(manifest_doc(), manifest_values) | json_values
    texts = documents.map(lambda doc: json.dumps(doc).encode())
    overflowing = texts.map(lambda text: text.replace(b": 100,", b": 1e999,").replace(b": 10,", b": -1e999,"))
    return st.one_of(texts, texts, overflowing, st.binary(max_size=300))


JSON_ATTACKS = [b"[" * 100_000, b'{"a":' * 100_000, b"[" * 100_000 + b"]" * 100_000, b"[]", b"7", b'"x"', b"null"]


def plain_file_of(path: str, partition: int) -> bool:
    folder, _, name = path.partition("/")
    return (folder == partition_dir(partition) and name not in ("", ".", "..")
            and not any(c in name for c in "/\\\x00"))


def check_manifest(data: bytes) -> str:
    try:
        info = BackupInfo.from_manifest(data, "fuzz/manifest.json")
    except CorruptData as error:
        assert is_one_line(error), str(error)
        return "CorruptData"
    for c in info.copies:
        assert type(c.partition) is int and c.partition >= 0, c.partition
        assert all(type(n) is int and n >= 0 for n in (c.position.index, c.position.term)), c.position
        for f in c.files:
            assert plain_file_of(f.path, c.partition), (c.partition, f.path)
            assert type(f.size) is int and f.size >= 0 and isinstance(f.sha256, str), f
    return "a BackupInfo"


def test_hostile_manifests_parse_to_files_inside_their_partition_or_fail_with_one_line():
    fuzz("backup manifests -> BackupInfo.from_manifest", 2000, manifest_bytes(), check_manifest, always=JSON_ATTACKS)
