"""Tests for raftkv.core.spec and spec_toml: building, saving, loading and validating the cluster spec."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from raftkv.core.errors import ConfigError
from raftkv.core.spec import DEFAULT_MAX_KEY_BYTES, DEFAULT_MAX_VALUE_BYTES, BackupConfig, Tuning
from raftkv.core.spec_toml import parse_spec, spec_to_toml

BASE = Path("/srv/raftkv")


def valid_doc() -> dict:
    """A minimal valid spec document: two nodes, four partitions."""
    return {
        "cluster": {"name": "test", "partitions": 4, "replication": 2},
        "nodes": [
            {"id": "n1", "host": "127.0.0.1", "api_port": 7000, "metrics_port": 7001,
             "raft_port_base": 7002, "data_dir": "n1"},
            {"id": "n2", "host": "127.0.0.1", "api_port": 7010, "metrics_port": 7011,
             "raft_port_base": 7012, "data_dir": "/abs/n2"},
        ],
    }


def problems_of(doc: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_spec(doc, BASE, source="t.toml")
    assert str(info.value).startswith("t.toml: ")
    return info.value.problems


# --- parse_spec: the happy path ------------------------------------------------


def test_parse_applies_defaults_and_resolves_relative_data_dirs():
    spec = parse_spec(valid_doc(), BASE)
    assert spec.name == "test"
    assert (spec.partitions, spec.replication) == (4, 2)
    assert spec.durability == "fsync"  # durable by default since 0.2
    assert (spec.max_key_bytes, spec.max_value_bytes) == (DEFAULT_MAX_KEY_BYTES, DEFAULT_MAX_VALUE_BYTES)
    assert spec.tuning == Tuning()
    assert spec.node_ids == ("n1", "n2")
    assert spec.nodes[0].data_dir == BASE / "n1"
    assert spec.nodes[1].data_dir == Path("/abs/n2")


def test_node_addresses():
    node = parse_spec(valid_doc(), BASE).node("n2")
    assert node.api_address == "127.0.0.1:7010"
    assert node.raft_address(0) == "127.0.0.1:7012"
    assert node.raft_address(3) == "127.0.0.1:7015"


def test_node_with_an_unknown_id_lists_the_known_ids():
    spec = parse_spec(valid_doc(), BASE)
    with pytest.raises(ConfigError) as info:
        spec.node("n7")
    assert "'n7'" in str(info.value)
    assert "known nodes: n1, n2" in str(info.value)


def test_parse_accepts_tuning_and_converts_ints_for_float_fields():
    doc = valid_doc()
    doc["tuning"] = {"request_timeout": 20, "max_batch_ops": 16, "heartbeat_period": 0.05}
    tuning = parse_spec(doc, BASE).tuning
    assert tuning.request_timeout == 20.0 and isinstance(tuning.request_timeout, float)
    assert tuning.max_batch_ops == 16
    assert tuning.heartbeat_period == 0.05
    assert tuning.election_timeout_min == Tuning().election_timeout_min


# --- parse_spec: errors name their fields --------------------------------------


@pytest.mark.parametrize("cluster", [None, "test", 3, ["a"]])
def test_missing_or_malformed_cluster_table_is_reported(cluster):
    doc = valid_doc()
    if cluster is None:
        del doc["cluster"]
    else:
        doc["cluster"] = cluster
    assert problems_of(doc) == ["missing [cluster] table"]


@pytest.mark.parametrize("nodes", [None, {"id": "n1"}, "n1"])
def test_missing_nodes_list_is_reported(nodes):
    doc = valid_doc()
    if nodes is None:
        del doc["nodes"]
    else:
        doc["nodes"] = nodes
    assert problems_of(doc) == ["missing [[nodes]] entries"]


@pytest.mark.parametrize(
    "table, key, value, problem",
    [
        ("cluster", "partitions", "4", "cluster.partitions: expected int, got '4'"),
        ("cluster", "partitions", 4.0, "cluster.partitions: expected int, got 4.0"),
        ("cluster", "replication", True, "cluster.replication: expected int, got True"),
        ("cluster", "name", 7, "cluster.name: expected str, got 7"),
        ("cluster", "durability", 1, "cluster.durability: expected str, got 1"),
        ("cluster", "max_key_bytes", "big", "cluster.max_key_bytes: expected int, got 'big'"),
        ("node", "api_port", "7000", "nodes[0].api_port: expected int, got '7000'"),
        ("node", "id", 1, "nodes[0].id: expected str, got 1"),
        ("node", "data_dir", ["n1"], "nodes[0].data_dir: expected str, got ['n1']"),
        ("node", "raft_port_base", False, "nodes[0].raft_port_base: expected int, got False"),
    ],
)
def test_wrong_types_are_named_by_field(table, key, value, problem):
    doc = valid_doc()
    (doc["cluster"] if table == "cluster" else doc["nodes"][0])[key] = value
    assert problem in problems_of(doc)


@pytest.mark.parametrize(
    "table, key, problem",
    [
        ("cluster", "name", "cluster.name: missing"),
        ("cluster", "partitions", "cluster.partitions: missing"),
        ("cluster", "replication", "cluster.replication: missing"),
        ("node", "host", "nodes[0].host: missing"),
        ("node", "metrics_port", "nodes[0].metrics_port: missing"),
    ],
)
def test_missing_required_fields_are_named(table, key, problem):
    doc = valid_doc()
    del (doc["cluster"] if table == "cluster" else doc["nodes"][0])[key]
    assert problem in problems_of(doc)


def test_unknown_keys_are_named_by_table():
    doc = valid_doc()
    doc["cluster"]["partitons"] = 8
    doc["nodes"][1]["port"] = 1
    doc["nodes"][1]["zone"] = "a"
    doc["tuning"] = {"heartbeat": 0.1}
    problems = problems_of(doc)
    assert "cluster: unknown keys partitons" in problems
    assert "nodes[1]: unknown keys port, zone" in problems
    assert "tuning.heartbeat: unknown key" in problems


def test_a_backup_table_is_parsed_and_written_back():
    doc = valid_doc()
    doc["backup"] = {"url": "s3://bucket/raftkv", "storage": {"endpoint_url": "http://127.0.0.1:9000", "anon": True}}
    spec = parse_spec(doc, BASE)
    assert spec.backup == BackupConfig("s3://bucket/raftkv", True,
                                       (("endpoint_url", "http://127.0.0.1:9000"), ("anon", "true")))
    assert parse_spec(tomllib.loads(spec_to_toml(spec)), BASE).backup == spec.backup
    assert parse_spec(valid_doc(), BASE).backup is None


def test_a_bad_backup_table_is_named_by_key():
    doc = valid_doc()
    doc["backup"] = {"url": "", "seed": "yes", "storage": {"retries": [1]}, "bucket": "b"}
    problems = problems_of(doc)
    assert any(p.startswith("backup.url: expected a URL") for p in problems)
    assert "backup.seed: expected true or false, got 'yes'" in problems
    assert any(p.startswith("backup.storage: expected a table of fsspec options") for p in problems)
    assert "backup: unknown keys bucket" in problems


def test_a_tls_table_resolves_its_paths_and_is_written_back_relative():
    doc = valid_doc()
    doc["tls"] = {"ca": "certs/ca.pem", "node_cert": "certs/node-{id}.pem", "node_key": "/etc/raftkv/node.key",
                  "client_cert": "certs/user-admin.pem", "client_key": "certs/user-admin.key"}
    spec = parse_spec(doc, BASE)
    assert spec.tls.ca == BASE / "certs/ca.pem"
    assert spec.tls.node("n2") == (BASE / "certs/node-n2.pem", Path("/etc/raftkv/node.key"))
    assert spec.tls.learner_cert is None and spec.tls.metrics is False
    written = tomllib.loads(spec_to_toml(spec, relative_to=BASE))["tls"]
    assert written == {**doc["tls"], "metrics": False}
    assert parse_spec(tomllib.loads(spec_to_toml(spec)), Path("/elsewhere")).tls == spec.tls
    assert parse_spec(valid_doc(), BASE).tls is None


def test_a_bad_tls_table_is_named_by_key():
    doc = valid_doc()
    doc["tls"] = {"node_cert": "", "node_key": 3, "client_cert": "c.pem", "metrics": "yes", "crl": "x"}
    problems = problems_of(doc)
    assert "tls.ca: missing (the file of the cluster CA)" in problems
    assert "tls.node_cert: expected a file path, got ''" in problems
    assert "tls.node_key: expected a file path, got 3" in problems
    assert "tls: client_cert and client_key go together" in problems
    assert "tls.metrics: expected true or false, got 'yes'" in problems
    assert "tls: unknown keys crl" in problems


def test_every_problem_is_reported_at_once():
    doc = valid_doc()
    doc["cluster"]["partitions"] = "x"
    doc["nodes"][0]["api_port"] = "y"
    doc["nodes"].append("not a table")
    problems = problems_of(doc)
    assert "cluster.partitions: expected int, got 'x'" in problems
    assert "nodes[0].api_port: expected int, got 'y'" in problems
    assert "nodes[2]: expected a table" in problems


def test_duplicate_node_ids_are_reported():
    doc = valid_doc()
    doc["nodes"][1]["id"] = "n1"
    assert "nodes[1].id: duplicate node id 'n1'" in problems_of(doc)


def test_empty_node_id_and_empty_name_are_reported():
    doc = valid_doc()
    doc["nodes"][0]["id"] = ""
    doc["cluster"]["name"] = ""
    problems = problems_of(doc)
    assert "nodes[0].id: must not be empty" in problems
    assert "cluster.name: must not be empty" in problems


def test_port_clash_between_api_and_metrics_ports_is_reported():
    doc = valid_doc()
    doc["nodes"][1]["metrics_port"] = 7000
    problems = problems_of(doc)
    assert any(p.startswith("nodes[1].metrics_port: port 7000 on 127.0.0.1 is also n1 api_port") for p in problems)


def test_port_clash_with_a_partitions_raft_port_is_reported():
    doc = valid_doc()
    doc["nodes"][1]["api_port"] = 7005  # n1's raft port of partition 3
    problems = problems_of(doc)
    assert "nodes[1].api_port: port 7005 on 127.0.0.1 is also n1 raft port of partition 3" in problems


def test_same_ports_on_different_hosts_do_not_clash():
    doc = valid_doc()
    doc["nodes"][1].update(host="10.0.0.2", api_port=7000, metrics_port=7001, raft_port_base=7002)
    assert parse_spec(doc, BASE).node("n2").api_address == "10.0.0.2:7000"


def test_ports_out_of_range_are_reported():
    doc = valid_doc()
    doc["nodes"][0]["api_port"] = 0
    doc["nodes"][1]["raft_port_base"] = 65533
    problems = problems_of(doc)
    assert "nodes[0].api_port: 0 is not a valid port" in problems
    assert "nodes[1].raft port of partition 3: 65536 is not a valid port" in problems


@pytest.mark.parametrize("replication", [0, 3, -1])
def test_replication_must_be_between_one_and_the_node_count(replication):
    doc = valid_doc()
    doc["cluster"]["replication"] = replication
    assert f"cluster.replication: {replication} must be between 1 and the number of nodes (2)" in problems_of(doc)


@pytest.mark.parametrize("partitions", [0, 4097, -3])
def test_partitions_must_be_in_range(partitions):
    doc = valid_doc()
    doc["cluster"]["partitions"] = partitions
    for node in doc["nodes"]:
        node["raft_port_base"] = 20000 if node["id"] == "n1" else 30000
    assert f"cluster.partitions: {partitions} is not in 1..4096" in problems_of(doc)


def test_an_empty_node_list_is_reported():
    doc = valid_doc()
    doc["nodes"] = []
    doc["cluster"]["replication"] = 1
    assert "nodes: at least one node is required" in problems_of(doc)


@pytest.mark.parametrize("durability", ["sometimes", "FSYNC", ""])
def test_bad_durability_is_reported(durability):
    doc = valid_doc()
    doc["cluster"]["durability"] = durability
    assert f"cluster.durability: {durability!r} is not one of fsync, lose-last-second" in problems_of(doc)


@pytest.mark.parametrize("durability", ["fsync", "lose-last-second", "default"])
def test_both_durability_modes_and_the_former_name_are_accepted_and_kept_as_written(durability):
    """"default" is lose-last-second's name from before 0.2: a file an older release wrote stays readable
    by it, so a node of this release never rewrites the name (a rolling upgrade, a downgrade)."""
    doc = valid_doc()
    doc["cluster"]["durability"] = durability
    spec = parse_spec(doc, BASE)
    assert spec.durability == durability
    assert f'durability = "{durability}"' in spec_to_toml(spec)


def test_size_limits_are_validated():
    doc = valid_doc()
    doc["cluster"].update(max_key_bytes=0, max_value_bytes=-1)
    problems = problems_of(doc)
    assert "cluster.max_key_bytes: must be positive" in problems
    assert "cluster.max_value_bytes: must not be negative" in problems


@pytest.mark.parametrize(
    "tuning, problem",
    [
        ("fast", "tuning: expected a table"),
        ({"heartbeat_period": "0.1"}, "tuning.heartbeat_period: expected float, got '0.1'"),
        ({"heartbeat_period": True}, "tuning.heartbeat_period: expected float, got True"),
        ({"max_batch_ops": 10.5}, "tuning.max_batch_ops: expected int, got 10.5"),
        ({"max_batch_ops": 1}, "tuning.max_batch_ops: must be at least 2"),
        ({"compaction_min_entries": 0}, "tuning.compaction_min_entries: must be at least 2"),
        ({"request_timeout": 0}, "tuning.request_timeout: must be positive"),
        ({"connection_retry_seconds": -1.0}, "tuning.connection_retry_seconds: must be positive"),
        ({"election_timeout_min": 0.25}, "tuning: need 3 * heartbeat_period < election_timeout_min < election_timeout_max"),
        ({"election_timeout_max": 0.4}, "tuning: need 3 * heartbeat_period < election_timeout_min < election_timeout_max"),
        ({"leader_fallback_timeout": 0.1}, "tuning.leader_fallback_timeout: must exceed heartbeat_period"),
    ],
)
def test_bad_tuning_is_reported(tuning, problem):
    doc = valid_doc()
    doc["tuning"] = tuning
    assert problem in problems_of(doc)


def test_default_tuning_is_valid():
    assert Tuning().problems() == []
