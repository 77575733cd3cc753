"""After healing: every replica of a partition holds the same contents at the same applied index.

Each replica is scanned on its own node (a follower scan is served locally
and never forwarded) and reports the applied index its view was taken at.
Writes may still trickle in (a learner's progress reports), so the scans are
repeated until every replica of the partition answers at one index.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.core.spec import ClusterSpec
from raftkv.security.tls import Tls, client_tls, open_blocking_channel


@dataclass(frozen=True)
class ReplicaView:
    node_id: str
    applied_index: int
    contents: dict[bytes, bytes]


def scan_replica(address: str, partition: int, timeout: float = 10.0,
                 tls: Tls | None = None) -> tuple[int, dict[bytes, bytes]]:
    """The partition's applied index and contents as this one node holds them (`tls`: the cluster's
    client TLS, a user that may read everything)."""
    contents: dict[bytes, bytes] = {}
    index = -1
    with open_blocking_channel(address, tls) as channel:
        request = pb.ScanRequest(partition=partition, consistency=pb.FOLLOWER)
        for chunk in kv_pb2_grpc.KVStub(channel).Scan(request, timeout=timeout):
            index = chunk.applied_index
            contents.update((kv.key, kv.value) for kv in chunk.items)
    return index, contents


def scan_any(spec: ClusterSpec, partition: int, replicas: tuple[str, ...]) -> dict[bytes, bytes] | None:
    """The partition's contents from the first of `replicas` that answers (None: none did)."""
    for node_id in replicas:
        try:
            return scan_replica(spec.node(node_id).api_address, partition, tls=client_tls(spec))[1]
        except grpc.RpcError:
            continue  # stopped (on damage, say), which the replica check reports
    return None


def replica_differences(spec: ClusterSpec, placement: tuple[tuple[str, ...], ...],
                        each_round: Callable[[], None], timeout: float = 60.0,
                        placed: Callable[[], tuple[tuple[str, ...], ...]] | None = None) -> list[str]:
    """One line per partition whose replicas (`placement`: each partition's voters) differ, or never
    reached one applied index before `timeout`. `each_round()` runs before every look: a scan may
    read a damaged block a node started on and stop that node, which the runner then restarts.
    `placed()`, when given, is read again at every look: the metadata leader's rebalancing may still
    move a replica (and the node it left deletes its copy) while the check runs."""
    deadline = time.monotonic() + timeout
    problems = []
    for p in range(spec.partitions):
        views = _views_at_one_index(spec, p, lambda p=p: (placed() if placed else placement)[p], each_round,
                                    deadline)
        if isinstance(views, str):
            problems.append(f"partition {p}: the replicas did not reach one applied index within {timeout:.0f}s "
                            f"(last seen: {views})")
            continue
        first, *others = views
        for view in others:
            if view.contents != first.contents:
                problems.append(f"partition {p} at index {first.applied_index}: "
                                f"{_difference(first, view)}")
    return problems


def _views_at_one_index(spec: ClusterSpec, partition: int, voters: Callable[[], tuple[str, ...]],
                        each_round: Callable[[], None], deadline: float) -> list[ReplicaView] | str:
    """The replicas' views once they answer at one applied index; else, at the deadline, what each
    said last."""
    last: dict[str, str] = {}  # each replica of the last look: what it answered
    tls = client_tls(spec)
    while True:  # one look at least, though an earlier partition spent the deadline
        each_round()
        replicas = voters()
        views = []
        for n in replicas:
            if n not in spec.node_ids:  # a node that left (replaced, say) whose replica was never moved
                last[n] = f"{n}: no longer a member of the cluster"
                continue
            try:
                views.append(ReplicaView(n, *scan_replica(spec.node(n).api_address, partition, tls=tls)))
                last[n] = f"{n} at {views[-1].applied_index}"
            except grpc.RpcError as e:
                last[n] = f"{n}: {e.code().name} {e.details()}"
        if len(views) == len(replicas) and len({v.applied_index for v in views}) == 1:
            return views
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2 if len(views) < len(replicas) else 0.1)
    return ", ".join(last[n] + _raft_state(spec, n, partition, tls) for n in replicas)


def _raft_state(spec: ClusterSpec, node_id: str, partition: int, tls: Tls | None) -> str:
    """How the node's replica of `partition` stands in its Raft group, for the report of one that did not
    converge: " (follower of n3 in term 5, log to 690, commit 614)", or "" if the node does not say."""
    if node_id not in spec.node_ids:
        return ""
    try:
        with open_blocking_channel(spec.node(node_id).api_address, tls) as channel:
            reply = kv_pb2_grpc.KVStub(channel).Status(pb.StatusRequest(), timeout=2.0)
    except grpc.RpcError:
        return ""
    status = next((s for s in reply.hosted if s.partition == partition), None)
    if status is None:
        return " (hosts no replica of it)"
    role = f"follower of {status.leader or 'no leader'}" if status.role == "follower" else status.role
    return f" ({role} in term {status.term}, log to {status.last_log_index}, commit {status.commit_index})"


def _difference(a: ReplicaView, b: ReplicaView) -> str:
    only_a = sorted(set(a.contents) - set(b.contents))
    only_b = sorted(set(b.contents) - set(a.contents))
    changed = sorted(k for k in set(a.contents) & set(b.contents) if a.contents[k] != b.contents[k])
    parts = [f"{len(only_a)} keys only on {a.node_id} (e.g. {only_a[:3]})" if only_a else "",
             f"{len(only_b)} keys only on {b.node_id} (e.g. {only_b[:3]})" if only_b else "",
             f"{len(changed)} keys differ (e.g. {changed[:3]})" if changed else ""]
    return f"{a.node_id} and {b.node_id}: " + "; ".join(p for p in parts if p)
