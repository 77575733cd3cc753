"""Hosts of their own on one machine: a network namespace per node, each with its own address.

Every test and benchmark otherwise runs all nodes on 127.0.0.1, where a node that advertises the
wrong address, a certificate without a node's address, or a link the console builds from "localhost"
still works. Here each host is a network namespace with only its loopback and one end of a veth pair,
addressed from a private /24 made for the purpose (10.231.x.0/24, a free x); the other ends hang on a
bridge in this process's namespace, which takes the range's first address. So this process (a test,
its clients, a learner, Spark) reaches every node as a separate machine would, and the nodes reach
each other only over the bridge. A node is started in its host with `command_for`, which execs it
there and keeps its PID.

Everything is named after this process's id and removed by `close()`; a new `Hosts` first removes
what a process that died left behind. Needs root (CAP_NET_ADMIN) and iproute2.
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
from typing import Callable, Sequence

from raftkv.core.errors import ConfigError
from raftkv.core.spec import ClusterSpec

PREFIX = "10.231"  # a /16 of the private 10/8 whose /24s are taken one per Hosts
_NAMESPACE = re.compile(r"^raftkv-(\d+)-(\d+)\b")
_BRIDGE = re.compile(r"^\d+: (rkv(\d+))[:@]")


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise ConfigError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()} (network namespaces need root "
                          "and iproute2)")
    return done.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep() -> None:
    """Remove the namespaces and bridges of `Hosts` whose process is gone (killed before `close`)."""
    for line in _ip("netns", "list").splitlines():
        if (m := _NAMESPACE.match(line)) and not _alive(int(m.group(1))):
            _ip("netns", "delete", m.group(0))
    for line in _ip("-o", "link", "show", "type", "bridge").splitlines():
        if (m := _BRIDGE.match(line)) and not _alive(int(m.group(2))):
            _ip("link", "delete", m.group(1))


def _free_subnet() -> ipaddress.IPv4Network:
    taken = {ipaddress.ip_interface(word).network for word in _ip("-o", "-4", "addr", "show").split()
             if "/" in word and word[0].isdigit()}
    start = os.getpid() % 256
    for n in range(256):
        subnet = ipaddress.ip_network(f"{PREFIX}.{(start + n) % 256}.0/24")
        if not any(subnet.overlaps(t) for t in taken):
            return subnet
    raise ConfigError(f"no free /24 left in {PREFIX}.0.0/16 for test hosts")


class Hosts:
    """`count` hosts to begin with (`add` makes more); `addresses[i]` is host i's, `client_address`
    this process's on their network."""

    def __init__(self, count: int):
        sweep()
        self._pid = os.getpid()
        self.bridge = f"rkv{self._pid}"
        self._subnet = _free_subnet()
        self.client_address = str(self._subnet.network_address + 1)
        self.addresses: list[str] = []
        _ip("link", "add", self.bridge, "type", "bridge")
        try:
            _ip("addr", "add", f"{self.client_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for _ in range(count):
                self.add()
        except BaseException:
            self.close()
            raise

    def namespace(self, index: int) -> str:
        return f"raftkv-{self._pid}-{index}"

    def add(self) -> str:
        """One more host; returns its address."""
        index = len(self.addresses)
        if index > 200:
            raise ConfigError("at most 200 hosts")
        namespace, outside, inside = self.namespace(index), f"rkv{self._pid}h{index}", f"rkv{self._pid}n{index}"
        address = str(self._subnet.network_address + 10 + index)
        _ip("netns", "add", namespace)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", namespace)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", inside)
        _ip("-n", namespace, "link", "set", inside, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("-n", namespace, "route", "add", "default", "via", self.client_address)
        self.addresses.append(address)
        return address

    def command_for(self, address: str, command: Sequence[str]) -> list[str]:
        """`command` run on the host with `address` (exec'd there: the PID stays the one started)."""
        return ["ip", "netns", "exec", self.namespace(self.addresses.index(address)), *command]

    def node_commands(self, spec: ClusterSpec) -> Callable[[str, Sequence[str]], list[str]]:
        """A `LocalCluster`'s `wrap_command`: each node of `spec` started on its host."""
        return lambda node_id, command: self.command_for(spec.node(node_id).host, command)

    def close(self) -> None:
        """Remove every namespace and the bridge (a namespace's veth pair goes with it). Processes still
        running in a namespace keep it alive until they end: stop them first."""
        for index in range(len(self.addresses)):
            subprocess.run(["ip", "netns", "delete", self.namespace(index)], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, timeout=10)
        self.addresses = []

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
