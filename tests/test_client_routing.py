"""The client's routing table, over plain Status replies."""

from __future__ import annotations

from raftkv.api import kv_pb2 as pb
from raftkv.client.routing import RoutingTable

NODES = [pb.NodeInfo(id=f"n{i}", api_address=f"127.0.0.1:700{i}") for i in (1, 2, 3)]


def reply(node: str, *hosted: pb.PartitionStatus) -> pb.StatusResponse:
    return pb.StatusResponse(node_id=node, partitions=2, nodes=NODES, hosted=hosted)


def status(partition: int, leader: str, term: int) -> pb.PartitionStatus:
    return pb.PartitionStatus(partition=partition, leader=leader, term=term, replicas=["n1", "n2", "n3"])


def test_a_table_knows_only_its_endpoints_until_a_node_answers():
    table = RoutingTable(["127.0.0.1:7002"])
    assert table.partitions == 0 and table.target(0, 1) == "127.0.0.1:7002"
    assert table.known_addresses() == ["127.0.0.1:7002"]


def test_the_leader_reported_with_the_highest_term_wins():
    table = RoutingTable(["127.0.0.1:7001"])
    table.learn([reply("n1", status(0, "n1", 3)), reply("n2", status(0, "n2", 4)), reply("n3", status(0, "n1", 3))])
    assert table.partitions == 2 and table.leaders == {0: "n2"}
    assert table.target(0, attempt=1) == "127.0.0.1:7002"
    assert table.known_addresses() == ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]


def test_a_hint_is_news_only_when_it_names_another_node():
    table = RoutingTable(["127.0.0.1:7001"])
    table.learn([reply("n1", status(0, "n1", 1))])
    assert not table.hinted(0, "n1") and not table.hinted(0, None)
    assert table.hinted(0, "n3") and table.target(0, 1) == "127.0.0.1:7003"


def test_without_a_leader_attempts_go_round_the_replicas():
    table = RoutingTable(["127.0.0.1:7001"])
    table.learn([reply("n1", status(0, "", 1))])
    table.forget_leader(0)
    assert [table.target(0, attempt) for attempt in (1, 2, 3, 4)] == [
        "127.0.0.1:7002", "127.0.0.1:7003", "127.0.0.1:7001", "127.0.0.1:7002"]


def test_a_follower_read_first_tries_the_first_endpoint_then_the_leader():
    table = RoutingTable(["127.0.0.1:7003"])
    table.learn([reply("n3", status(1, "n1", 2))])
    assert table.target(1, 1, follower_read=True) == "127.0.0.1:7003"
    assert table.target(1, 2, follower_read=True) == "127.0.0.1:7001"
