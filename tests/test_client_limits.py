"""Per-client limits on a node (raftkv/node/client_limits.py, docs/security.md §6)."""

from __future__ import annotations

import grpc
import pytest

from raftkv import Client, ResourceExhausted, Tls
from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.core.partitioning import partition_for_key
from raftkv.meta.access import GrantPermission, Permission, PutUser, UserRecord
from raftkv.node.client_limits import ClientLimits, ClientLoad, client_of
from raftkv.security.certs import init_certs
from raftkv.security.permissions import Identity
from raftkv.security.tls import open_blocking_channel
from tests.conftest import wait_until


def test_a_client_is_its_user_or_without_tls_its_host_and_nodes_and_learners_are_not_limited():
    peer = "ipv4:10.0.0.7:51234"
    assert client_of(Identity("alice"), peer, forwarded=False) == "user alice"
    assert client_of(Identity("alice"), peer, forwarded=True) == "user alice"  # a user cannot opt out
    assert client_of(Identity("n2", "node"), peer, forwarded=True) is None
    assert client_of(Identity("changes", "learner"), peer, forwarded=False) is None
    anyone = Identity("", "node")  # what the gatekeeper says without TLS
    assert client_of(anyone, peer, forwarded=False) == "host 10.0.0.7"
    assert client_of(anyone, "ipv6:[::1]:6000", forwarded=False) == "host [::1]"
    assert client_of(anyone, peer, forwarded=True) is None


def test_calls_scans_and_writes_are_counted_per_client_and_given_back():
    load = ClientLoad(ClientLimits(calls=3, scans=2, writes=10), "n1")
    load.open("user a", scan=True)
    load.open("user a", scan=True)
    with pytest.raises(ResourceExhausted, match=r"user a has 2 scans open on node n1 \(tuning.max_scans_per_client\)"):
        load.open("user a", scan=True)
    load.open("user a")
    with pytest.raises(ResourceExhausted, match="user a has 3 calls open"):
        load.open("user a")
    load.open("user b", scan=True)  # another client is not held back by a's calls
    load.close("user a", scan=True)
    load.open("user a", scan=True)
    assert load.take_writes("user a", 7) == 7
    assert load.take_writes("user a", 7) == 3
    assert load.take_writes("user b", 10) == 10
    load.return_writes("user a", 7)
    assert load.take_writes("user a", 100) == 7
    assert load.take_writes(None, 10**9) == 10**9  # not limited
    load.open(None, scan=True)
    assert "writes in flight on node n1 (tuning.max_writes_per_client)" in str(load.refusal("user a"))


@pytest.fixture
def limited(make_cluster):
    """A TLS cluster whose clients may each have 2 scans and 5 writes open per node; users ann and bob.

    The tests call partition 0's leader directly, so the rebalancer does not transfer leaders here."""
    cluster = make_cluster(nodes=3, partitions=2, tls=True, max_scans_per_client=2, max_writes_per_client=5,
                           rebalance_interval=0)
    certs = cluster.spec.tls.ca.parent
    init_certs(certs, None, ["ann", "bob"], days=30)
    with Client(cluster.endpoints, tls=cluster.tls, timeout=10) as admin:
        admin.change_topology(GrantPermission("writer", Permission("write", "")), everywhere=True)
        for name in ("ann", "bob"):
            admin.change_topology(PutUser(UserRecord(name, ("writer",))), everywhere=True)
        yield cluster, {name: Tls(certs / "ca.pem", certs / f"user-{name}.pem", certs / f"user-{name}.key")
                        for name in ("ann", "bob")}, admin


def test_writes_over_a_clients_limit_are_refused_one_by_one_and_not_applied(limited):
    cluster, users, admin = limited
    keys = [f"k{i}".encode() for i in range(40) if partition_for_key(f"k{i}".encode(), 2) == 0][:8]
    leader = _leader_of(admin, 0)
    with open_blocking_channel(cluster.spec.node(leader).api_address, users["ann"]) as channel:
        results = kv_pb2_grpc.KVStub(channel).Execute(pb.ExecuteRequest(
            ops=[pb.Op(partition=0, put=pb.Put(key=k, value=b"v")) for k in keys]), timeout=10).results
    assert [r.code for r in results] == [pb.OK] * 5 + [pb.RESOURCE_EXHAUSTED] * 3
    assert "user ann has 5 writes in flight on node" in results[5].message
    assert [admin.get(k) for k in keys] == [b"v"] * 5 + [None] * 3


# The held scans are cancelled while the node writes to them: grpc logs the failed write with a
# traceback of its own (grpc/grpc#32551), outside the servicer's code.
@pytest.mark.expected_log(r"ExecuteBatchError raised in core by servicer method \[/raftkv\.v1\.KV/Scan\]")
def test_a_client_at_its_scan_limit_is_refused_and_another_client_is_not(limited):
    cluster, users, admin = limited
    big = b"x" * 500_000
    keys = [f"big{i}".encode() for i in range(200) if partition_for_key(f"big{i}".encode(), 2) == 0][:40]
    for key in keys:  # 20 MB: a scan that is not read blocks on flow control, open, on the node
        admin.put(key, big)
    address = cluster.spec.node(_leader_of(admin, 0)).api_address
    with open_blocking_channel(address, users["ann"]) as ann, open_blocking_channel(address, users["bob"]) as bob:
        held = [kv_pb2_grpc.KVStub(ann).Scan(pb.ScanRequest(partition=0), timeout=30) for _ in range(2)]
        for scan in held:
            next(scan)  # under way
        with pytest.raises(grpc.RpcError) as refused:
            next(kv_pb2_grpc.KVStub(ann).Scan(pb.ScanRequest(partition=0), timeout=10))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "user ann has 2 scans open" in refused.value.details()
        assert sum(1 for _ in kv_pb2_grpc.KVStub(bob).Scan(pb.ScanRequest(partition=0), timeout=30)) > 1
        with Client(cluster.endpoints, tls=users["ann"], timeout=10) as client:
            with pytest.raises(ResourceExhausted, match="user ann has 2 scans open"):
                list(client.scan(prefix=b"big"))  # partition 0's leader is the node ann holds two scans on
        for scan in held:
            scan.cancel()
    with Client(cluster.endpoints, tls=users["ann"], timeout=10) as client:  # given back when cancelled
        assert wait_until(lambda: len(list(client.scan(prefix=b"big"))), 10, "ann's scans to close") == len(keys)


def _leader_of(admin: Client, partition: int) -> str:
    return next(p.leader for s in admin.status() for p in s.partitions if p.partition == partition and p.leader)
