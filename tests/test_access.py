"""Users, roles and tokens on a cluster with TLS (docs/security.md §5), against real node processes; and
renewed certificates taken up without a restart (§4): after `raftkv certs renew`, new handshakes on a node's
API port and its Raft hub's port present the new certificate while a client reads and writes throughout,
and a corrupt renewed file leaves the node serving the one it had, saying so in one log line and a metric."""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import secrets
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cryptography import x509

from raftkv import Client, PermissionDenied, Tls, Unauthenticated
from raftkv.core.durable import replace_file
from raftkv.meta.access import GrantPermission, Permission, PutUser, RemoveUser, UserRecord
from raftkv.security.certs import init_certs
from tests.conftest import wait_until
from tests.test_cli import assert_one_line_error


def _token_user(kv: Client, name: str, *roles: str) -> str:
    """Add `name` with `roles` and a new token; returns the token."""
    token = secrets.token_urlsafe(16)
    kv.change_topology(PutUser(UserRecord(name, roles, hashlib.sha256(token.encode()).hexdigest())), everywhere=True)
    return token


@pytest.fixture(scope="module")
def secured(make_module_cluster):
    """One cluster for the module: each test makes users of its own and writes keys of its own."""
    cluster = make_module_cluster(nodes=3, partitions=2, tls=True)
    with Client(cluster.endpoints, tls=cluster.tls, timeout=10) as admin:
        admin.change_topology(GrantPermission("reader", Permission("read", "")), everywhere=True)
        admin.change_topology(GrantPermission("app-writer", Permission("write", b"app/".hex())), everywhere=True)
        admin.put(b"app/x", b"1")
        admin.put(b"other/x", b"1")
        yield cluster, admin


def test_a_read_only_user_reads_and_cannot_write(secured, tmp_path):
    cluster, admin = secured
    token = _token_user(admin, "rita", "reader")
    with Client(cluster.endpoints, tls=cluster.tls, token=token, timeout=5) as rita:
        assert rita.get(b"app/x") == b"1"
        assert {b"app/x": b"1", b"other/x": b"1"}.items() <= dict(rita.scan()).items()
        with pytest.raises(PermissionDenied, match=r"user rita may not write key b'app/x'"):
            rita.put(b"app/x", b"2")
        with pytest.raises(PermissionDenied, match="user rita may not run change_topology"):
            rita.change_topology(RemoveUser("admin"))
        with pytest.raises(PermissionDenied, match="user rita may not run checkpoint"):  # a backup's copy
            rita.checkpoint_files(0, tmp_path / "p0", lambda listed: [f.path for f in listed])
    assert admin.get(b"app/x") == b"1" and not (tmp_path / "p0").exists()
    assert {"admin", "rita"} <= {u.name for u in admin.topology().meta.users}


def test_a_writer_of_one_prefix_cannot_touch_another(secured):
    cluster, admin = secured
    token = _token_user(admin, "walt", "app-writer")
    with Client(cluster.endpoints, tls=cluster.tls, token=token, timeout=5) as walt:
        walt.put(b"app/y", b"2")
        assert walt.get(b"app/y") == b"2"  # write includes read
        with pytest.raises(PermissionDenied, match=r"user walt may not write key b'other/x'"):
            walt.put(b"other/x", b"2")
        with pytest.raises(PermissionDenied, match=r"user walt may not read key b'other/x'"):
            walt.get(b"other/x")
        with pytest.raises(PermissionDenied, match="user walt may not read keys"):
            list(walt.scan(prefix=b"other/"))
        with pytest.raises(PermissionDenied, match="may not run transfer_leadership"):
            walt.transfer_leadership(0, "n1")
    assert admin.get(b"other/x") == b"1"


def test_on_the_stream_a_denied_write_fails_alone_and_the_reads_beside_it_are_answered(secured):
    """The client's requests go on one ExecuteStream per node (docs/raft-engine.md, "Step 6"): a write the
    caller may not make is refused op by op there as on unary Execute, and the stream goes on."""
    cluster, admin = secured
    token = _token_user(admin, "sid", "reader")
    with Client(cluster.endpoints, tls=cluster.tls, token=token, timeout=5) as sid:
        with ThreadPoolExecutor(4) as pool:
            writes = [pool.submit(sid.put, b"app/x", b"%d" % i) for i in range(4)]
            reads = [pool.submit(sid.get, b"app/x") for _ in range(8)]
        assert [r.result() for r in reads] == [b"1"] * 8
        for write in writes:
            with pytest.raises(PermissionDenied, match=r"user sid may not write key b'app/x'"):
                write.result()
        streams = [t._stream for t in sid._async._core._channels._transports.values()]
        assert streams and all(s is not None and not s.broken for s in streams)
        assert sid.get(b"app/x") == b"1"
    assert admin.get(b"app/x") == b"1"


def test_a_user_certificate_gets_the_roles_of_its_common_name(secured):
    cluster, admin = secured
    certs = cluster.spec.tls.ca.parent
    init_certs(certs, None, ["carol"], days=30)
    carol = Tls(certs / "ca.pem", certs / "user-carol.pem", certs / "user-carol.key")
    with Client(cluster.endpoints, tls=carol, timeout=5) as kv:
        with pytest.raises(PermissionDenied, match=r"user carol may not read key b'app/x'"):
            kv.get(b"app/x")  # no roles yet
        admin.change_topology(PutUser(UserRecord("carol", ("reader",))), everywhere=True)
        assert wait_until(lambda: _reads(kv, b"app/x"), 5, "carol's role to arrive") == b"1"


def _reads(kv: Client, key: bytes) -> bytes | None:
    try:
        return kv.get(key)
    except PermissionDenied:
        return None


def test_a_removed_users_token_stops_working_within_a_second_on_every_node(secured):
    cluster, admin = secured
    token = _token_user(admin, "remy", "reader")
    clients = {n.id: Client([n.api_address], tls=cluster.tls, token=token, timeout=2) for n in cluster.spec.nodes}
    try:
        for kv in clients.values():
            assert kv.get(b"app/x") == b"1"
        admin.change_topology(RemoveUser("remy"))
        removed = time.monotonic()
        for node_id, kv in clients.items():
            def refused() -> bool:
                try:
                    kv.get(b"app/x")
                except Unauthenticated:
                    return True
                return False
            wait_until(refused, 5, f"{node_id} to refuse the token")
            assert time.monotonic() - removed < 1.0, f"{node_id} took {time.monotonic() - removed:.2f}s"
    finally:
        for kv in clients.values():
            kv.close()


def test_the_cli_manages_users_and_roles_and_a_denied_write_is_one_line(secured):
    cluster, admin = secured
    config = ["--config", str(cluster.spec_path)]

    def raftkv(*args, env=None):
        return subprocess.run([sys.executable, "-m", "raftkv", *args], capture_output=True, text=True, timeout=60,
                              env=env)

    assert raftkv("role", "grant", "auditor", "--access", "read", "--prefix", "app/", *config).returncode == 0
    added = raftkv("user", "add", "audrey", "--role", "auditor", "--token", *config)
    assert added.returncode == 0, added.stderr
    token = re.search(r"token \(shown once.*\): (\S+)", added.stdout).group(1)
    listed = raftkv("user", "list", "--json", *config)
    assert {"name": "audrey", "roles": ["auditor"], "token": True} in json.loads(listed.stdout)
    assert raftkv("--token", token, "get", "app/x", *config).stdout.strip() == "1"
    assert_one_line_error(raftkv("--token", token, "put", "app/x", "2", *config),
                          "permission denied: user audrey may not write key b'app/x'")
    assert_one_line_error(raftkv("--token", "not-a-token", "get", "app/x", *config), "the token is no user's")
    assert raftkv("role", "revoke", "auditor", "--prefix", "app/", *config).returncode == 0
    assert_one_line_error(raftkv("--token", token, "get", "app/x", *config), "may not read key b'app/x'")
    assert admin.get(b"app/x") == b"1"


class _Traffic:
    """A client writing and reading its own keys throughout, recording any error."""

    def __init__(self, cluster):
        self._cluster = cluster
        self._stop = threading.Event()
        self.done = 0
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Traffic:
        self._thread.start()
        wait_until(lambda: self.done > 0 or self.errors, 10, "the client's first write")
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            with Client(self._cluster.endpoints, tls=self._cluster.tls, timeout=5) as kv:
                while not self._stop.is_set():
                    key, value = f"reload/{self.done % 50}".encode(), str(self.done).encode()
                    kv.put(key, value)
                    assert kv.get(key) == value
                    self.done += 1
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            self.errors.append(exc)


def _presented(port: int, user: Tls) -> int:
    """The serial of the certificate a new mutual-TLS handshake on `port` is answered with."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(user.ca)
    context.load_cert_chain(user.cert, user.key)
    context.set_alpn_protocols(["h2"])  # gRPC's port asks for it; the hub's ignores it
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


def _gauge(cluster, node_id: str, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.spec.node(node_id).metrics_port}/metrics", timeout=5) as r:
        return float(re.search(rf"^{name} (\S+)$", r.read().decode(), re.MULTILINE).group(1))


def test_renewed_certificates_are_presented_without_a_restart(secured):
    cluster, _ = secured
    certs, n1 = cluster.spec.tls.ca.parent, cluster.spec.node("n1")
    ports = {"api": n1.api_port, "raft hub": n1.raft_port_base}
    before = {name: _presented(port, cluster.tls) for name, port in ports.items()}
    assert set(before.values()) == {_serial_of(certs / "node-n1.pem")}
    with _Traffic(cluster) as traffic:
        subprocess.run([sys.executable, "-m", "raftkv", "certs", "renew", "--out", str(certs), "--within", "100000",
                        "--days", "400"], check=True, capture_output=True, timeout=60)
        renewed = _serial_of(certs / "node-n1.pem")
        for name, port in ports.items():
            wait_until(lambda: _presented(port, cluster.tls) == renewed, 10, f"n1's {name} port to present the renewal")
        for node in cluster.spec.nodes:
            wait_until(lambda: _presented(node.api_port, cluster.tls) == _serial_of(certs / f"node-{node.id}.pem"), 10,
                       f"{node.id} to present its renewal")
        expires = x509.load_pem_x509_certificate((certs / "node-n1.pem").read_bytes()).not_valid_after_utc
        assert _gauge(cluster, "n1", "raftkv_tls_certificate_expiry_timestamp_seconds") == expires.timestamp()
        assert expires - datetime.datetime.now(datetime.timezone.utc) < datetime.timedelta(days=401)
        done = traffic.done
        wait_until(lambda: traffic.done > done + 10 or traffic.errors, 10, "the client to go on")
    assert not traffic.errors and traffic.done > done


def test_a_corrupt_renewed_file_is_refused_and_the_node_keeps_serving(secured):
    cluster, _ = secured
    certs, n1 = cluster.spec.tls.ca.parent, cluster.spec.node("n1")
    cert = certs / "node-n1.pem"
    good, serial = cert.read_bytes(), _serial_of(cert)
    refusals = len(re.findall("TLS files refused", cluster.log_path("n1").read_text()))
    with _Traffic(cluster) as traffic:
        replace_file(cert, b"-----BEGIN CERTIFICATE-----\ntruncated")
        try:
            wait_until(lambda: _gauge(cluster, "n1", "raftkv_tls_files_refused") == 1, 10, "n1 to refuse the file")
            assert _presented(n1.api_port, cluster.tls) == serial == _presented(n1.raft_port_base, cluster.tls)
            lines = [line for line in cluster.log_path("n1").read_text().splitlines() if "TLS files refused" in line]
            assert len(lines) == refusals + 1 and str(cert) in lines[-1], lines
            done = traffic.done
            wait_until(lambda: traffic.done > done + 10 or traffic.errors, 10, "the client to go on")
        finally:
            replace_file(cert, good)
        wait_until(lambda: _gauge(cluster, "n1", "raftkv_tls_files_refused") == 0, 10, "n1 to take the file up again")
    assert not traffic.errors and traffic.done > done
    assert len(re.findall("TLS files refused", cluster.log_path("n1").read_text())) == refusals + 1  # not one a second


def _serial_of(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number
