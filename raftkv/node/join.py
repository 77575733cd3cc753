"""A node joining a running cluster (`raftkv node start --join`, docs/elasticity.md §2).

The new node asks any member for the topology and the cluster's constants, registers
itself (`AddNode`: state `joining` until it serves), and keeps what it was told in its
data dir, so a restart needs neither `--join` nor a spec. A node of the spec that lost its
data is given `--join` to learn the current members (`current_topology`):

    <data_dir>/cluster.toml   the cluster's spec, with this node added
    <data_dir>/joined.json    the topology the join was answered with (until its own copy of
                              the metadata has one)
"""

from __future__ import annotations

import logging
import time
import tomllib
from dataclasses import replace
from pathlib import Path

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.api.rpc_errors import never_sent
from raftkv.core.durable import replace_file
from raftkv.core.errors import ChangeRefused, ConfigError, Unauthenticated, Unavailable
from raftkv.core.spec import ClusterSpec, NodeSpec
from raftkv.core.spec_toml import load_spec, parse_spec, save_spec
from raftkv.meta.bootstrap import node_record
from raftkv.meta.records import AddNode, ClusterMeta, NodeState, decode_meta, encode_command, encode_meta
from raftkv.meta.wire import topology_of
from raftkv.security.tls import Tls, open_blocking_channel, refusal

SPEC_FILE = "cluster.toml"
JOINED_FILE = "joined.json"
LEADER_WAIT_SECONDS = 30.0  # a seed that answers it cannot register anyone right now (an election) is asked again
RETRY_PAUSE_SECONDS = 0.5

log = logging.getLogger(__name__)


def joined_before(data_dir: Path) -> tuple[ClusterSpec, ClusterMeta] | None:
    """The spec and initial topology of a node that joined with this data dir, if one did."""
    spec_path, joined = data_dir / SPEC_FILE, data_dir / JOINED_FILE
    if not (spec_path.exists() and joined.exists()):
        return None
    return load_spec(spec_path), decode_meta(joined.read_bytes())


def join(seed: str, node_id: str, host: str, base_port: int, data_dir: Path,
         tls: Tls | None = None) -> tuple[ClusterSpec, ClusterMeta]:
    """Register this node through `seed` (any member's API address); returns its spec and the topology.
    `tls`: this node's certificate (--cacert/--cert/--key); without it, a cluster with TLS is joined with
    the files its spec names (the same paths on this host)."""
    with open_blocking_channel(seed, tls) as channel:
        admin = kv_pb2_grpc.AdminStub(channel)
        topology = _call(seed, tls, lambda: admin.Topology(pb.TopologyRequest(), timeout=10.0))
        doc = tomllib.loads(topology.spec_toml)
        cluster = parse_spec(doc, base_dir=data_dir, source=f"the cluster's spec from {seed}")
        if tls is not None and cluster.tls is not None:
            cluster = replace(cluster, tls=replace(cluster.tls, ca=tls.ca, node_cert=str(tls.cert),
                                                   node_key=str(tls.key)))
        me = NodeSpec(node_id, host, base_port, base_port + 1, base_port + 2, data_dir.resolve())
        if any(n.id == node_id for n in topology.meta.nodes):
            known = topology.meta.node(node_id)
            if (known.host, known.api_port) != (host, base_port):
                raise ChangeRefused(f"node {node_id} is already in the cluster (at {known.api_address}); pick another id")
        spec = replace(cluster, nodes=tuple(n for n in cluster.nodes if n.id != node_id) + (me,), path=None)
        record = node_record(spec, me)
        command = pb.ChangeTopologyRequest(command=encode_command(AddNode(record)))
        meta = _call(seed, tls, lambda: admin.ChangeTopology(command, timeout=15.0), LEADER_WAIT_SECONDS).meta
    data_dir.mkdir(parents=True, exist_ok=True)
    save_spec(spec, data_dir / SPEC_FILE)
    replace_file(data_dir / JOINED_FILE, encode_meta(meta))
    return load_spec(data_dir / SPEC_FILE), meta


def current_topology(seed: str, node_id: str, tls: Tls | None) -> ClusterMeta:
    """The topology as `seed` (a live member's API address) knows it, for node `node_id` of the spec that
    lost its data: when every node the spec names has left since, its own copy (the spec's, epoch 0)
    names no member that is left, and it would hear none of them (docs/chaos.md, the first soak hour)."""
    with open_blocking_channel(seed, tls) as channel:
        admin = kv_pb2_grpc.AdminStub(channel)
        meta = _call(seed, tls, lambda: admin.Topology(pb.TopologyRequest(), timeout=10.0)).meta
    if not meta.has_node(node_id) or meta.node(node_id).state == NodeState.REMOVED:
        raise ChangeRefused(f"node {node_id} is no member of the cluster at {seed} (removed?); to bring it back, "
                            "start it with an empty --data-dir, --base-port and --join")
    return meta


def _call(seed: str, tls: Tls | None, call, wait: float = 0.0):
    """`call()`'s topology. UNAVAILABLE from the seed itself (its metadata group has no leader right now: an
    election, or a cluster restarting) is asked again for up to `wait` seconds; a seed that cannot be
    reached fails at once, since nothing may be running there (a chaos run's wiped node gave up on an
    election in a second, and stopped)."""
    deadline, warned = time.monotonic() + wait, False
    while True:
        try:
            return topology_of(call())
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
                raise ChangeRefused(exc.details()) from None
            if why := refusal(exc.details() or "", tls):
                raise Unauthenticated(f"cannot join through {seed}: {why}") from None
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise ConfigError(f"joining through {seed} failed: {exc.code().name} {exc.details()}",
                                  source="--join") from None
            if never_sent(exc) or not wait:
                raise Unavailable(f"cannot join through {seed}: {exc.details()}; is a node of the cluster running "
                                  "there?") from None
            if time.monotonic() >= deadline:
                raise Unavailable(f"cannot join through {seed}: {exc.details()} (asked for {wait:.0f}s)") from None
            if not warned:
                log.warning("%s cannot register this node right now (%s); asking again for up to %.0fs", seed,
                            exc.details(), wait)
                warned = True
            time.sleep(RETRY_PAUSE_SECONDS)
