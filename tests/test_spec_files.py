"""Building a cluster spec, and saving and loading it as TOML."""

from __future__ import annotations

import dataclasses
import re
import tempfile
from pathlib import Path

import pytest
import tomllib
from hypothesis import given, settings, strategies as st

from raftkv.core.errors import ConfigError
from raftkv.core.spec import Tuning, build_spec
from raftkv.core.spec_toml import load_spec, parse_spec, save_spec, spec_to_toml
from tests.test_spec import BASE, problems_of, valid_doc


# --- build_spec -----------------------------------------------------------------


def test_build_spec_gives_each_node_a_block_of_partitions_plus_three_ports(tmp_path):
    spec = build_spec(nodes=3, partitions=4, replication=3, base_port=9000, data_dir=tmp_path)
    assert spec.node_ids == ("n1", "n2", "n3")
    assert [(n.api_port, n.metrics_port, n.raft_port_base, n.meta_port(4)) for n in spec.nodes] == [
        (9000, 9001, 9002, 9006), (9007, 9008, 9009, 9013), (9014, 9015, 9016, 9020),
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


def test_a_nodes_raft_engine_is_saved_only_when_not_the_default_and_an_unknown_one_is_one_problem(tmp_path):
    spec = build_spec(nodes=2, partitions=2, replication=2, base_port=9000, data_dir=tmp_path)
    spec = dataclasses.replace(spec, nodes=(dataclasses.replace(spec.nodes[0], raft_engine="off"), spec.nodes[1]))
    path = save_spec(spec, tmp_path / "cluster.toml")
    assert [n.get("raft_engine") for n in tomllib.loads(path.read_text())["nodes"]] == ["off", None]
    assert spec.nodes[1].raft_engine == "auto"
    assert load_spec(path) == spec
    doc = valid_doc()
    doc["nodes"][1]["raft_engine"] = "fast"
    assert problems_of(doc) == ["nodes[1].raft_engine: 'fast' is not one of off, auto, steady"]


@given(
    st.integers(1, 5).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(1, 32), st.integers(1, n), st.sampled_from(["fsync", "lose-last-second", "default"]))
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


def load_error(path, text: str) -> ConfigError:
    """The error of loading a spec file holding `text`; it names the file as its source."""
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_spec(path)
    assert info.value.source == str(path)
    return info.value


def test_load_spec_that_is_not_toml_names_the_path(tmp_path):
    path = tmp_path / "cluster.toml"
    error = load_error(path, "[cluster\nname = ")
    assert "not valid TOML" in str(error)
    assert str(error).startswith(f"{path}: ")


def test_load_spec_of_a_directory_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_spec(tmp_path)


def test_load_spec_reports_problems_with_the_path_as_source(tmp_path):
    error = load_error(tmp_path / "cluster.toml", '[cluster]\nname = "x"\npartitions = 2\nreplication = 1\n')
    assert error.problems == ["missing [[nodes]] entries"]


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


# --- hostile spec files (found by tests/test_fuzz_files.py) -------------------------------------


@pytest.mark.parametrize("text, named", [
    (b'\xff[cluster]\nname = "x"\n', "not UTF-8 text (byte 0)"),
    (b"[cluster]\npartitions = " + b"9" * 5000 + b"\n", "not valid TOML: Exceeds the limit (4300 digits)"),
    (b"a = " + b"[" * 100_000, "not valid TOML: maximum recursion depth exceeded"),
])
def test_a_spec_file_tomllib_cannot_read_is_one_config_error_line(tmp_path, text, named):
    path = tmp_path / "cluster.toml"
    path.write_bytes(text)
    with pytest.raises(ConfigError, match=re.escape(named)) as info:
        load_spec(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("key", ["problems", "__class__", "__doc__"])
def test_a_tuning_key_that_names_a_method_or_dunder_is_unknown(key):
    doc = valid_doc()
    doc["tuning"] = {key: 1}
    assert problems_of(doc) == [f"tuning.{key}: unknown key"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 10**400])
def test_a_tuning_number_must_be_finite(value):
    doc = valid_doc()
    doc["tuning"] = {"heartbeat_period": value}
    assert problems_of(doc) == [f"tuning.heartbeat_period: expected a finite number, got {value!r}"]


def test_a_huge_partition_count_is_refused_without_checking_a_port_per_partition():
    doc = valid_doc()
    doc["cluster"]["partitions"] = 2**63 - 1
    assert problems_of(doc) == [f"cluster.partitions: {2**63 - 1} is not in 1..4096"]


@pytest.mark.parametrize("change, problem", [
    (lambda doc: doc["cluster"].update({"a\nb": 1}), "cluster: unknown keys a\\nb"),
    (lambda doc: [node.update(host="h\n", api_port=7000) for node in doc["nodes"]],
     "nodes[1].api_port: port 7000 on h\\n is also n1 api_port"),
])
def test_line_breaks_in_keys_and_hosts_are_escaped_in_the_one_line_error(change, problem):
    doc = valid_doc()
    change(doc)
    with pytest.raises(ConfigError) as info:
        parse_spec(doc, BASE, source="t.toml")
    assert "\n" not in str(info.value)
    assert problem in info.value.problems


def test_a_spec_with_text_that_is_not_utf8_is_not_saved(tmp_path):
    spec = dataclasses.replace(build_spec(nodes=1, partitions=1, replication=1, base_port=9000, data_dir=tmp_path),
                               name="caf\udce9")
    with pytest.raises(ConfigError, match=r"b'\\xe9' is not UTF-8 text"):
        save_spec(spec, tmp_path / "cluster.toml")
    assert not (tmp_path / "cluster.toml").exists()


def test_a_nul_character_in_a_name_or_path_is_refused():
    doc = valid_doc()
    doc["nodes"][0]["data_dir"] = "n\x001"
    doc["tls"] = {"ca": "ca\x00.pem", "node_cert": "n.pem", "node_key": "n.key"}
    assert problems_of(doc) == ["nodes[0].data_dir: 'n\\x001' holds a NUL character, which no name or path can",
                                "tls.ca: expected a file path, got 'ca\\x00.pem'"]
