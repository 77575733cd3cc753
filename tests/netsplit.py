"""Cut a replica off from its peers on loopback, with nftables.

pysyncobj opens each connection from the node with the greater address to
the one with the smaller, and on loopback every connection's source address
is 127.0.0.1; so the only thing a rule can tell apart is the listening Raft
port. The replica with the smallest address only ever accepts connections:
dropping every packet to or from its Raft port isolates it completely, while
clients still reach its API. Rules live in a table of their own, deleted on
exit.
"""

from __future__ import annotations

import itertools
import os
import subprocess

from raftkv.core.spec import ClusterSpec

_counter = itertools.count()


def _nft(script: str) -> None:
    subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True, capture_output=True)


def smallest_address_node(spec: ClusterSpec, partition: int, replicas: tuple[str, ...]) -> str:
    return min(replicas, key=lambda n: spec.node(n).raft_address(partition))


class NetSplit:
    def __init__(self, spec: ClusterSpec):
        self.spec = spec
        self.table = f"raftkv_test_{os.getpid()}_{next(_counter)}"
        _nft(f"add table inet {self.table}\n"
             f"add chain inet {self.table} filter {{ type filter hook input priority -10; policy accept; }}\n")

    def isolate(self, node_id: str, partition: int, replicas: tuple[str, ...]) -> None:
        """Drop all Raft traffic of `node_id`'s replica of `partition` (it must have the smallest address)."""
        if smallest_address_node(self.spec, partition, replicas) != node_id:
            raise ValueError(f"{node_id} does not have the smallest Raft address of partition {partition}")
        port = self.spec.node(node_id).raft_port_base + partition
        _nft(f"add rule inet {self.table} filter tcp dport {port} drop\n"
             f"add rule inet {self.table} filter tcp sport {port} drop\n")

    def heal(self) -> None:
        _nft(f"flush chain inet {self.table} filter\n")

    def close(self) -> None:
        subprocess.run(["nft", "delete", "table", "inet", self.table], capture_output=True)

    def __enter__(self) -> NetSplit:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
