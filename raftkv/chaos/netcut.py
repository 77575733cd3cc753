"""Network partitions between node processes on loopback: one cgroup v2 per node, nftables rules by cgroup.

On loopback every connection's source address is 127.0.0.1, and a node's
connections to the others' Raft hubs leave from ports no rule can name in
advance, so rules on ports alone cannot tell whose a packet is. Instead each node
process runs in a cgroup of its own (`command_for` starts it there, before it
opens a socket: a socket's cgroup is fixed when it is created, and accepted
sockets take their listener's), and the rules match sockets by cgroup.

To cut node A from node B, at each side X of the pair (other side Y):

    output: socket cgroupv2 <X> tcp dport <Y's Raft ports> drop   (what X sends to Y's listeners)
    input:  socket cgroupv2 <X> tcp sport <Y's Raft ports> drop   (what Y's listeners send to X)

Together these cover both connections, whichever side opened them. API
ports are never matched, so clients and request forwarding still work.

Everything lives in one nftables table and one cgroup folder named with
this process's id; `close()` deletes both.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from pathlib import Path
from typing import Iterable, Sequence

from raftkv.core.errors import ConfigError
from raftkv.core.spec import ClusterSpec, NodeSpec

CGROUP_ROOT = Path("/sys/fs/cgroup")  # nft resolves cgroup paths relative to this folder

_probes = itertools.count()


def cgroup2_mount() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted, if it is (unified or hybrid layout)."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def nft(script: str, prefix: Sequence[str] = ()) -> None:
    """Apply an nft script (`prefix`: what runs nft, e.g. in a node's network namespace)."""
    result = subprocess.run([*prefix, "nft", "-f", "-"], input=script, text=True, capture_output=True)
    if result.returncode != 0:
        raise ConfigError(f"nft refused the rules: {result.stderr.strip() or result.returncode}", source="netcut")


def unavailable_reason() -> str:
    """'' when cgroup v2 and nftables can cut node processes apart here, else why not."""
    if os.geteuid() != 0:
        return "needs root (cgroups and nftables)"
    mount = cgroup2_mount()
    if mount is None:
        return "no cgroup v2 hierarchy is mounted"
    if not mount.is_relative_to(CGROUP_ROOT):
        return f"cgroup v2 is mounted at {mount}, outside {CGROUP_ROOT} where nft looks for it"
    try:
        with NetCut.probe():
            pass
    except FileNotFoundError:
        return "the nft command is missing (install Debian's nftables package)"
    except (OSError, ConfigError) as exc:
        return str(exc)
    return ""


class NetCut:
    """Cgroups for a cluster's node processes, and the nftables rules that cut them apart."""

    def __init__(self, spec: ClusterSpec, name: str | None = None):
        mount = cgroup2_mount()
        if mount is None or not mount.is_relative_to(CGROUP_ROOT):
            raise ConfigError("no usable cgroup v2 hierarchy under /sys/fs/cgroup", source="netcut")
        self.spec = spec
        self.name = name or f"raftkv_chaos_{os.getpid()}"
        self.folder = mount / self.name
        self.table = self.name
        self._level = len(self.folder.relative_to(mount).parts) + 1  # a node's cgroup is one level below
        self.folder.mkdir()
        try:
            for node_id in spec.node_ids:
                self.cgroup(node_id).mkdir()
            nft(f"add table inet {self.table}\n"
                f"add chain inet {self.table} out {{ type filter hook output priority -10; policy accept; }}\n"
                f"add chain inet {self.table} in {{ type filter hook input priority -10; policy accept; }}\n")
        except BaseException:
            self._remove_cgroups()
            raise
        self.cut_groups: tuple[tuple[str, ...], ...] = ()

    @classmethod
    def probe(cls) -> NetCut:
        """A throw-away NetCut with one rule, to learn whether this machine supports them."""
        probe_spec = ClusterSpec(name="probe", partitions=1, replication=1,
                                 nodes=(NodeSpec("a", "127.0.0.1", 1, 2, 3, Path()),
                                        NodeSpec("b", "127.0.0.1", 4, 5, 6, Path())))
        cut = cls(probe_spec, name=f"raftkv_probe_{os.getpid()}_{next(_probes)}")
        try:
            cut.cut([("a",), ("b",)])
        except BaseException:
            cut.close()
            raise
        return cut

    def cgroup(self, node_id: str) -> Path:
        return self.folder / node_id

    def command_for(self, node_id: str, command: Sequence[str]) -> list[str]:
        """`command` run inside the node's cgroup (it joins the cgroup, then execs: the PID stays)."""
        procs = self.cgroup(node_id) / "cgroup.procs"
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs), *command]

    def cut(self, groups: Iterable[Iterable[str]]) -> None:
        """Only nodes in the same group talk Raft to each other (replaces any earlier cut)."""
        groups = tuple(tuple(g) for g in groups)
        rules = [f"flush chain inet {self.table} out", f"flush chain inet {self.table} in"]
        for group, other in itertools.permutations(groups, 2):
            for node_id in group:
                match = f'socket cgroupv2 level {self._level} "{self._nft_path(node_id)}"'
                for peer in other:
                    ports = raft_ports(self.spec, peer)
                    rules.append(f"add rule inet {self.table} out {match} tcp dport {ports} drop")
                    rules.append(f"add rule inet {self.table} in {match} tcp sport {ports} drop")
        nft("\n".join(rules) + "\n")
        self.cut_groups = groups

    def heal(self) -> None:
        nft(f"flush chain inet {self.table} out\nflush chain inet {self.table} in\n")
        self.cut_groups = ()

    def close(self) -> None:
        """Delete the table, then the cgroups (their processes must have exited by now)."""
        subprocess.run(["nft", "delete", "table", "inet", self.table], capture_output=True)
        self._remove_cgroups()

    def _remove_cgroups(self) -> None:
        for node_id in self.spec.node_ids:
            try:
                self.cgroup(node_id).rmdir()
            except FileNotFoundError:
                pass
        self.folder.rmdir()

    def _nft_path(self, node_id: str) -> str:
        return str(self.cgroup(node_id).relative_to(CGROUP_ROOT))

    def __enter__(self) -> NetCut:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def raft_ports(spec: ClusterSpec, node_id: str) -> str:
    """Every partition's Raft port of a node and the metadata group's, which follows them (an nft range)."""
    node = spec.node(node_id)
    return f"{node.raft_port_base}-{node.meta_port(spec.partitions)}"
