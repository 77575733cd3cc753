"""Hosts of their own (network namespaces, raftkv.dev.netns) and the chaos cut between them
(raftkv.chaos.hostcut), with real sockets: what each promises, in about a second."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from raftkv.chaos.hostcut import HostCut
from raftkv.core.spec import build_spec
from raftkv.dev.netns import Hosts

# a listener on each port given, answering each connection with the port it came in on
_SERVE = """
import selectors, socket, sys
sel = selectors.DefaultSelector()
for port in sys.argv[2:]:
    s = socket.create_server((sys.argv[1], int(port)))
    sel.register(s, selectors.EVENT_READ)
print("up", flush=True)
while True:
    for key, _ in sel.select():
        c, _ = key.fileobj.accept()
        c.sendall(str(key.fileobj.getsockname()[1]).encode())
        c.close()
"""
_DIAL = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=0.5) as c:
        print(c.recv(16).decode())
except OSError as exc:
    print(type(exc).__name__)
"""


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_a_partition_between_hosts_drops_raft_ports_by_address_and_spares_the_api(tmp_path: Path):
    with Hosts(3) as hosts:
        spec = build_spec(nodes=3, partitions=2, replication=3, base_port=20000, data_dir=tmp_path,
                          hosts=hosts.addresses)
        n1, n2, n3 = spec.nodes
        servers = [subprocess.Popen(hosts.command_for(n.host, [sys.executable, "-c", _SERVE, n.host, str(n.api_port),
                                                               str(n.raft_port_base)]),
                                    stdout=subprocess.PIPE, text=True) for n in spec.nodes]
        try:
            assert all(s.stdout.readline().strip() == "up" for s in servers)

            def dial(source, target, port: int) -> str:
                return subprocess.run(hosts.command_for(source.host, [sys.executable, "-c", _DIAL, target.host,
                                                                      str(port)]),
                                      capture_output=True, text=True, timeout=30).stdout.strip()

            cut = HostCut(spec, hosts)
            assert dial(n1, n2, n2.raft_port_base) == str(n2.raft_port_base)  # hosts reach each other
            cut.cut([("n1",), ("n2", "n3")])
            assert dial(n1, n2, n2.raft_port_base) == "TimeoutError"  # dropped, not refused
            assert dial(n2, n1, n1.raft_port_base) == "TimeoutError"
            assert dial(n2, n3, n3.raft_port_base) == str(n3.raft_port_base)  # within a side
            assert dial(n1, n2, n2.api_port) == str(n2.api_port)  # the API is never cut
            cut.heal()
            assert dial(n1, n2, n2.raft_port_base) == str(n2.raft_port_base)
        finally:
            for s in servers:
                s.kill()
                s.wait()
    assert f"raftkv-{os.getpid()}-" not in _namespaces()


def test_what_a_killed_process_left_behind_is_removed_by_the_next(tmp_path: Path):
    """Hosts made by a process killed before it could close them: the next Hosts sweeps them away."""
    script = "import os, sys; from raftkv.dev.netns import Hosts; h = Hosts(1); print(os.getpid(), flush=True); os._exit(0)"
    pid = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parent.parent).stdout.strip()
    assert f"raftkv-{pid}-0" in _namespaces()
    with Hosts(1):
        assert f"raftkv-{pid}-" not in _namespaces()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"rkv{pid}" not in links
