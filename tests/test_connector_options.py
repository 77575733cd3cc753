"""spark_connector.options and key_filters: pure, no Spark session."""

from __future__ import annotations

import pytest
from pyspark.sql.datasource import (
    CaseInsensitiveDict, EqualTo, GreaterThan, GreaterThanOrEqual, In, IsNotNull, LessThan, LessThanOrEqual,
    StringStartsWith,
)

from raftkv.core.errors import ConfigError
from raftkv.core.partitioning import partition_for_key
from raftkv.core.spec import build_spec
from raftkv.core.spec_toml import save_spec
from raftkv.security.certs import with_certificates
from raftkv.security.tls import Tls
from spark_connector.key_filters import KeyScope, push_filters
from spark_connector.options import parse_options


def options(**given) -> CaseInsensitiveDict:
    return CaseInsensitiveDict(given)


def test_option_names_are_case_insensitive_and_values_are_checked():
    opts = parse_options(options(ENDPOINTS="a:1,b:2", Key_Format="STRING", maxrowspertrigger="10"))
    assert opts.endpoints == ("a:1", "b:2")
    assert opts.key_format == "string" and opts.value_format == "binary"
    assert opts.max_rows_per_trigger == 10


@pytest.mark.parametrize("given, message", [
    ({}, "option endpoints is missing"),
    ({"value_format": "json"}, "option value_format is 'json'; use one of binary, string"),
    ({"consistency": "learner"}, "option learner is needed with consistency=learner"),
    ({"partitions": "1,x"}, "option partitions must be comma-separated partition numbers"),
    ({"prefix": "a", "start": "b"}, "option prefix cannot be combined with start or end"),
    ({"maxRowsPerTrigger": "-1"}, "option maxRowsPerTrigger must be at least 0"),
    ({"startingOffsets": "soon"}, "option startingOffsets is 'soon'; use earliest, latest or JSON"),
])
def test_a_bad_option_is_named_with_what_to_do(given, message):
    base = {} if not given else {"endpoints": "a:1"}
    with pytest.raises(ConfigError, match=message):
        parse_options(options(**base, **given))


def test_endpoints_can_come_from_a_cluster_spec(tmp_path):
    spec = build_spec(nodes=2, partitions=2, replication=2, base_port=7000, data_dir=tmp_path)
    path = save_spec(spec, tmp_path / "cluster.toml")
    assert parse_options(options(config=str(path))).endpoints == ("127.0.0.1:7000", "127.0.0.1:7005")


def test_tls_files_come_from_options_or_from_the_specs_client_certificate(tmp_path):
    opts = parse_options(options(endpoints="a:1", **{"tls.ca": "/c/ca.pem", "tls.cert": "/c/u.pem", "tls.key": "/c/u.key"}))
    assert opts.tls == Tls("/c/ca.pem", "/c/u.pem", "/c/u.key")
    assert parse_options(options(endpoints="a:1")).tls is None
    spec = with_certificates(build_spec(nodes=1, partitions=1, replication=1, base_port=7000, data_dir=tmp_path),
                             tmp_path)
    path = save_spec(spec, tmp_path / "cluster.toml")
    assert parse_options(options(config=str(path))).tls == Tls(tmp_path / "certs/ca.pem",
                                                               tmp_path / "certs/user-admin.pem",
                                                               tmp_path / "certs/user-admin.key")
    with pytest.raises(ConfigError, match="option tls.cert and tls.key go together"):
        parse_options(options(endpoints="a:1", **{"tls.cert": "/c/u.pem"}))


def test_prefix_and_range_options_bound_the_keys():
    assert (parse_options(options(endpoints="a:1", prefix="ab")).start, parse_options(
        options(endpoints="a:1", prefix="ab")).end) == (b"ab", b"ac")
    opts = parse_options(options(endpoints="a:1", start="b", end="d"))
    assert (opts.start, opts.end) == (b"b", b"d")


def test_range_filters_narrow_the_scan_exactly():
    scope, rest = push_filters(KeyScope(), [GreaterThan(("key",), "b"), LessThanOrEqual(("key",), "d"),
                                            IsNotNull(("key",)), EqualTo(("value",), "x")], "string")
    assert (scope.start, scope.end) == (b"b\x00", b"d\x00")
    assert rest == [EqualTo(("value",), "x")]
    scope, _ = push_filters(KeyScope(), [GreaterThanOrEqual(("key",), "b"), LessThan(("key",), "c"),
                                         StringStartsWith(("key",), "bz")], "string")
    assert (scope.start, scope.end) == (b"bz", b"b{")


def test_equality_and_in_pick_keys_and_prune_partitions():
    scope, rest = push_filters(KeyScope(), [In(("key",), ("k1", "k2", "k3")), EqualTo(("key",), "k2")], "string")
    assert rest == [] and scope.keys == frozenset({b"k2"})
    assert scope.partitions_to_read(8) == [partition_for_key(b"k2", 8)]
    out_of_range, _ = push_filters(KeyScope(start=b"x"), [EqualTo(("key",), "k2")], "string")
    assert out_of_range.partitions_to_read(8) == []


def test_partition_filters_prune_and_empty_ranges_read_nothing():
    scope, rest = push_filters(KeyScope(), [In(("partition",), (1, 3, 9))], "binary")
    assert rest == [] and scope.partitions_to_read(4) == [1, 3]
    empty, _ = push_filters(KeyScope(), [GreaterThan(("key",), b"m"), LessThan(("key",), b"c")], "binary")
    assert empty.partitions_to_read(4) == []


def test_a_literal_of_the_wrong_type_is_left_to_spark():
    scope, rest = push_filters(KeyScope(), [EqualTo(("key",), "text")], "binary")
    assert scope == KeyScope() and rest == [EqualTo(("key",), "text")]


def test_starting_offsets_are_parsed_once_into_partition_indexes():
    parsed = parse_options(options(changelog="127.0.0.1:1", startingOffsets='{"0": 120, "3": 7}'))
    assert parsed.starting_offsets == {0: 120, 3: 7}
    assert parse_options(options(changelog="127.0.0.1:1", startingOffsets="LATEST")).starting_offsets == "latest"
