"""Network partitions between nodes on hosts of their own (`raftkv.dev.netns`): nftables rules in each
node's network namespace, by address.

Where every node has its own address, a rule can name a peer by it, and each side filters its own
traffic as a host's firewall would. To cut node A from node B, in A's namespace (and likewise in B's):

    output: ip daddr <B> tcp dport <B's Raft ports> drop   (what A sends to B's listeners)
    input:  ip saddr <B> tcp sport <B's Raft ports> drop   (what B's listeners send to A)

the same pair of rules `NetCut` writes by cgroup on loopback; API ports are never matched, so clients
and request forwarding still work. Each namespace holds one table; it goes with the namespace.
"""

from __future__ import annotations

import itertools
from typing import Iterable

from raftkv.chaos.netcut import nft, raft_ports
from raftkv.core.spec import ClusterSpec
from raftkv.dev.netns import Hosts

TABLE = "raftkv_chaos"


class HostCut:
    """The same interface as `NetCut` (command_for, cut, heal, close), for a cluster on `hosts`."""

    def __init__(self, spec: ClusterSpec, hosts: Hosts):
        self.spec = spec
        self.hosts = hosts
        self.command_for = hosts.node_commands(spec)  # `command` run on the node's host, its PID kept
        for node_id in spec.node_ids:
            nft(f"add table inet {TABLE}\n"
                f"add chain inet {TABLE} out {{ type filter hook output priority -10; policy accept; }}\n"
                f"add chain inet {TABLE} in {{ type filter hook input priority -10; policy accept; }}\n",
                self._in(node_id))
        self.cut_groups: tuple[tuple[str, ...], ...] = ()

    def _in(self, node_id: str) -> list[str]:
        return self.hosts.command_for(self.spec.node(node_id).host, [])

    def cut(self, groups: Iterable[Iterable[str]]) -> None:
        """Only nodes in the same group talk Raft to each other (replaces any earlier cut)."""
        groups = tuple(tuple(g) for g in groups)
        rules: dict[str, list[str]] = {n: [f"flush chain inet {TABLE} out", f"flush chain inet {TABLE} in"]
                                       for n in self.spec.node_ids}
        for group, other in itertools.permutations(groups, 2):
            for node_id in group:
                for peer in other:
                    address, ports = self.spec.node(peer).host, raft_ports(self.spec, peer)
                    rules[node_id] += [f"add rule inet {TABLE} out ip daddr {address} tcp dport {ports} drop",
                                       f"add rule inet {TABLE} in ip saddr {address} tcp sport {ports} drop"]
        for node_id, script in rules.items():
            nft("\n".join(script) + "\n", self._in(node_id))
        self.cut_groups = groups

    def heal(self) -> None:
        for node_id in self.spec.node_ids:
            nft(f"flush chain inet {TABLE} out\nflush chain inet {TABLE} in\n", self._in(node_id))
        self.cut_groups = ()

    def close(self) -> None:
        """Nothing of its own to remove: each table goes with its namespace (`Hosts.close`)."""
