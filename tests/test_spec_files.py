"""Building a cluster spec, and saving and loading it as TOML."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest
import tomllib
from hypothesis import given, settings, strategies as st

from raftkv.core.errors import ConfigError
from raftkv.core.spec import Tuning, build_spec, load_spec, parse_spec, save_spec, spec_to_toml
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
