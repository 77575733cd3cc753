"""Users, roles and tokens on a cluster with TLS (docs/security.md §5), against real node processes."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import subprocess
import sys
import time

import pytest

from raftkv import Client, PermissionDenied, Tls, Unauthenticated
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
