"""Tests for raftkv.core.partitioning: key -> partition and partition -> replicas."""

from __future__ import annotations

import math
import zlib
from collections import Counter

import pytest
from hypothesis import given, strategies as st

from raftkv.core.partitioning import partition_for_key, partitions_hosted_by, replicas_for

# Standard CRC-32 (IEEE 802.3, zlib / java.util.zip.CRC32 / Spark's crc32) check values.
KNOWN_CRC32 = {
    b"": 0x00000000,
    b"a": 0xE8B7BE43,
    b"123456789": 0xCBF43926,
    b"The quick brown fox jumps over the lazy dog": 0x414FA339,
}


@pytest.mark.parametrize("key, crc", KNOWN_CRC32.items())
@pytest.mark.parametrize("partitions", [1, 3, 8, 1000, 4096])
def test_partition_is_the_standard_crc32_of_the_key_mod_partitions(key, crc, partitions):
    assert partition_for_key(key, partitions) == crc % partitions


@pytest.mark.parametrize(
    "key, partitions, partition",
    [
        (b"123456789", 8, 6),
        (b"123456789", 1000, 262),
        (b"a", 8, 3),
        (b"a", 7, 3904355907 % 7),
        (b"", 16, 0),
        (b"The quick brown fox jumps over the lazy dog", 10, 1095738169 % 10),
    ],
)
def test_pinned_partitions_never_change(key, partitions, partition):
    # Clients, Spark writers and nodes must keep agreeing across versions.
    assert partition_for_key(key, partitions) == partition


@given(st.binary(max_size=64), st.integers(1, 4096))
def test_partition_matches_zlib_crc32_and_is_in_range(key, partitions):
    p = partition_for_key(key, partitions)
    assert p == zlib.crc32(key) % partitions
    assert 0 <= p < partitions
    assert partition_for_key(key, partitions) == p


node_lists = st.integers(1, 9).map(lambda n: [f"n{i + 1}" for i in range(n)])


@given(node_lists.flatmap(lambda nodes: st.tuples(st.just(nodes), st.integers(1, len(nodes)), st.integers(0, 200))))
def test_replicas_are_rf_distinct_nodes_starting_at_partition_mod_n(case):
    nodes, rf, partition = case
    replicas = replicas_for(partition, nodes, rf)
    assert len(replicas) == rf
    assert len(set(replicas)) == rf
    assert set(replicas) <= set(nodes)
    assert replicas[0] == nodes[partition % len(nodes)]
    assert replicas_for(partition, list(nodes), rf) == replicas
    assert replicas_for(partition, tuple(nodes), rf) == replicas


def test_replicas_are_consecutive_nodes_wrapping_around():
    nodes = ["n1", "n2", "n3", "n4"]
    assert replicas_for(0, nodes, 3) == ("n1", "n2", "n3")
    assert replicas_for(2, nodes, 3) == ("n3", "n4", "n1")
    assert replicas_for(3, nodes, 3) == ("n4", "n1", "n2")
    assert replicas_for(5, nodes, 2) == ("n2", "n3")
    assert replicas_for(7, nodes, 1) == ("n4",)


def test_replication_above_the_node_count_is_capped():
    assert replicas_for(1, ["n1", "n2"], 3) == ("n2", "n1")


@given(node_lists.flatmap(lambda nodes: st.tuples(st.just(nodes), st.integers(1, len(nodes)), st.integers(1, 64))))
def test_each_node_hosts_about_p_times_rf_over_n_partitions(case):
    nodes, rf, partitions = case
    counts = Counter(n for p in range(partitions) for n in replicas_for(p, nodes, rf))
    n = len(nodes)
    assert sum(counts.values()) == partitions * rf
    for node in nodes:
        assert math.floor(partitions / n) * rf <= counts[node] <= math.ceil(partitions / n) * rf
    if partitions % n == 0:
        assert all(counts[node] == partitions * rf // n for node in nodes)


@given(node_lists.flatmap(lambda nodes: st.tuples(st.just(nodes), st.integers(1, len(nodes)), st.integers(1, 64))))
def test_partitions_hosted_by_is_consistent_with_replicas_for(case):
    nodes, rf, partitions = case
    for node in nodes:
        hosted = partitions_hosted_by(node, nodes, partitions, rf)
        assert hosted == sorted(hosted)
        assert hosted == [p for p in range(partitions) if node in replicas_for(p, nodes, rf)]
    every = sorted(p for node in nodes for p in partitions_hosted_by(node, nodes, partitions, rf))
    assert every == sorted(p for p in range(partitions) for _ in range(rf))


def test_an_unknown_node_hosts_nothing():
    assert partitions_hosted_by("n9", ["n1", "n2", "n3"], 8, 3) == []


def test_full_replication_puts_every_partition_on_every_node():
    nodes = ["n1", "n2", "n3"]
    for node in nodes:
        assert partitions_hosted_by(node, nodes, 5, 3) == [0, 1, 2, 3, 4]
