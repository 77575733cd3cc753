"""Tests for raftkv.core.spec: building, saving, loading and validating the cluster spec."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest
import tomllib
from hypothesis import given, settings, strategies as st

from raftkv.core.errors import ConfigError
from raftkv.core.spec import (
    DEFAULT_MAX_KEY_BYTES,
    DEFAULT_MAX_VALUE_BYTES,
    Tuning,
    build_spec,
    load_spec,
    parse_spec,
    save_spec,
    spec_to_toml,
)

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
    assert spec.durability == "default"
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
    assert f"cluster.durability: {durability!r} is not one of default, fsync" in problems_of(doc)


@pytest.mark.parametrize("durability", ["default", "fsync"])
def test_both_durability_modes_are_accepted(durability):
    doc = valid_doc()
    doc["cluster"]["durability"] = durability
    assert parse_spec(doc, BASE).durability == durability


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


# --- build_spec -----------------------------------------------------------------


def test_build_spec_gives_each_node_a_block_of_partitions_plus_two_ports(tmp_path):
    spec = build_spec(nodes=3, partitions=4, replication=3, base_port=9000, data_dir=tmp_path)
    assert spec.node_ids == ("n1", "n2", "n3")
    assert [(n.api_port, n.metrics_port, n.raft_port_base) for n in spec.nodes] == [
        (9000, 9001, 9002), (9006, 9007, 9008), (9012, 9013, 9014),
    ]
    assert [n.data_dir for n in spec.nodes] == [tmp_path.resolve() / f"n{i}" for i in (1, 2, 3)]
    assert all(n.host == "127.0.0.1" for n in spec.nodes)
    assert spec.validate() == []


def test_build_spec_uses_the_given_hosts(tmp_path):
    spec = build_spec(nodes=2, partitions=1, replication=1, base_port=9000, data_dir=tmp_path, hosts=["a", "b"])
    assert [n.host for n in spec.nodes] == ["a", "b"]


def test_build_spec_rejects_a_host_count_that_differs_from_the_node_count(tmp_path):
    with pytest.raises(ConfigError, match="--hosts lists 1 hosts for 2 nodes"):
        build_spec(nodes=2, partitions=1, replication=1, base_port=9000, data_dir=tmp_path, hosts=["a"])


def test_build_spec_validates(tmp_path):
    with pytest.raises(ConfigError) as info:
        build_spec(nodes=2, partitions=4, replication=3, base_port=9000, data_dir=tmp_path, durability="often")
    assert info.value.source == "cluster init"
    assert any(p.startswith("cluster.replication: 3 must be between 1") for p in info.value.problems)
    assert any(p.startswith("cluster.durability: 'often'") for p in info.value.problems)


# --- save / load ------------------------------------------------------------------


def test_save_load_round_trip_keeps_data_dirs_relative_to_the_spec_file(tmp_path):
    spec = build_spec(nodes=3, partitions=4, replication=2, base_port=9000, data_dir=tmp_path / "data",
                      durability="fsync", name="prod")
    path = save_spec(spec, tmp_path / "data" / "cluster.toml")
    doc = tomllib.loads(path.read_text())
    assert [n["data_dir"] for n in doc["nodes"]] == ["n1", "n2", "n3"]
    assert "tuning" not in doc

    loaded = load_spec(path)
    assert loaded == spec
    assert loaded.path == path

    # Moving the whole folder moves the data dirs with it.
    moved = tmp_path / "moved"
    (tmp_path / "data").rename(moved)
    assert [n.data_dir for n in load_spec(moved / "cluster.toml").nodes] == [
        moved.resolve() / f"n{i}" for i in (1, 2, 3)
    ]


def test_save_writes_data_dirs_outside_the_spec_folder_as_absolute_paths(tmp_path):
    spec = build_spec(nodes=1, partitions=1, replication=1, base_port=9000, data_dir=tmp_path / "data")
    path = save_spec(spec, tmp_path / "conf" / "deep" / "cluster.toml")
    doc = tomllib.loads(path.read_text())
    assert doc["nodes"][0]["data_dir"] == str((tmp_path / "data" / "n1").resolve())
    assert load_spec(path) == spec


def test_save_load_round_trip_keeps_non_default_tuning_only(tmp_path):
    spec = build_spec(nodes=1, partitions=2, replication=1, base_port=9000, data_dir=tmp_path)
    spec = dataclasses.replace(spec, tuning=Tuning(heartbeat_period=0.05, max_batch_ops=64, request_timeout=3),
                               max_key_bytes=100, max_value_bytes=0)
    path = save_spec(spec, tmp_path / "cluster.toml")
    doc = tomllib.loads(path.read_text())
    assert doc["tuning"] == {"heartbeat_period": 0.05, "max_batch_ops": 64, "request_timeout": 3}
    loaded = load_spec(path)
    assert loaded == spec
    assert loaded.tuning == spec.tuning


@given(
    st.integers(1, 5).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(1, 32), st.integers(1, n), st.sampled_from(["default", "fsync"]))
    ),
    st.integers(1024, 60000),
)
@settings(max_examples=25, deadline=None)
def test_any_built_spec_survives_save_and_load(shape, base_port):
    nodes, partitions, replication, durability = shape
    with tempfile.TemporaryDirectory() as tmp:
        spec = build_spec(nodes=nodes, partitions=partitions, replication=replication,
                          base_port=base_port, data_dir=tmp, durability=durability)
        assert load_spec(save_spec(spec, Path(tmp) / "cluster.toml")) == spec


def test_spec_to_toml_is_parseable_back_without_a_file(tmp_path):
    spec = build_spec(nodes=2, partitions=2, replication=2, base_port=9000, data_dir=tmp_path)
    doc = tomllib.loads(spec_to_toml(spec, relative_to=tmp_path.resolve()))
    assert parse_spec(doc, tmp_path.resolve()) == spec


def test_load_spec_of_a_missing_file_says_to_run_cluster_init(tmp_path):
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_spec(path)
    assert info.value.source == str(path)
    assert "raftkv cluster init" in str(info.value)
    assert str(info.value).startswith(str(path))


def test_load_spec_that_is_not_toml_names_the_path(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text("[cluster\nname = ")
    with pytest.raises(ConfigError) as info:
        load_spec(path)
    assert info.value.source == str(path)
    assert "not valid TOML" in str(info.value)
    assert str(info.value).startswith(f"{path}: ")


def test_load_spec_of_a_directory_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_spec(tmp_path)


def test_load_spec_reports_problems_with_the_path_as_source(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text('[cluster]\nname = "x"\npartitions = 2\nreplication = 1\n')
    with pytest.raises(ConfigError) as info:
        load_spec(path)
    assert info.value.source == str(path)
    assert info.value.problems == ["missing [[nodes]] entries"]


def test_spec_equality_ignores_the_path():
    spec = parse_spec(valid_doc(), BASE)
    assert dataclasses.replace(spec, path=Path("/x.toml")) == spec


def test_specs_are_frozen():
    spec = parse_spec(valid_doc(), BASE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.partitions = 8  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.nodes[0].host = "x"  # type: ignore[misc]


def test_wire_compression_must_be_a_zlib_level():
    doc = valid_doc()
    doc["tuning"] = {"wire_compression": 12}
    assert "tuning.wire_compression: a zlib level, 0 (none) to 9" in problems_of(doc)
