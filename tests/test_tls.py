"""Mutual TLS on the node and learner APIs (docs/security.md §4), against real node processes.

Every certificate a stranger could bring is refused at the handshake, on every gRPC port, with one
line at our client, and the refused connection changes nothing. The server's refusal is shown with
raw gRPC channels as well: our client checks its own files first, and an attacker would not.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from learners.changelog_client import ChangeLogClient
from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.client.sync_client import Client
from raftkv.core.errors import ConfigError, Unauthenticated
from raftkv.core.release import VERSION
from raftkv.core.spec_toml import save_spec
from raftkv.security.certs import init_certs
from raftkv.dev.local_cluster import free_port_block
from raftkv.security.tls import Tls, open_channel
from tests.conftest import changelog_caught_up, wait_until
from tests.test_cli import assert_one_line_error

KEY = b"tls/probe"


def _issue(folder: Path, name: str, *, issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
           days: tuple[int, int] = (-1, 30)) -> tuple[Path, Path]:
    """A client certificate valid from now+days[0] to now+days[1], signed by `issuer` (None: itself)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "raftkv-user"),
                         x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_cert, issuer_key = issuer if issuer else (None, key)
    cert = (x509.CertificateBuilder().subject_name(subject)
            .issuer_name(issuer_cert.subject if issuer_cert else subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now + datetime.timedelta(days=days[0]))
            .not_valid_after(now + datetime.timedelta(days=days[1]))
            .sign(issuer_key, hashes.SHA256()))
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
def strangers(tmp_path):
    """name -> (cert, key) of client certificates the cluster must refuse, and another cluster's CA."""
    folder = tmp_path / "strangers"
    init_certs(folder / "other", None, ["eve"], days=30)
    folder.mkdir(exist_ok=True)
    return folder


def _cluster_ca(cluster) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    tls = cluster.spec.tls
    key = serialization.load_pem_private_key(tls.ca.with_suffix(".key").read_bytes(), password=None)
    return x509.load_pem_x509_certificate(tls.ca.read_bytes()), key


def _bad_certificates(cluster, folder: Path) -> dict[str, tuple[Path, Path]]:
    return {
        "self-signed": _issue(folder, "self-signed", issuer=None),
        "another CA's": (folder / "other" / "user-eve.pem", folder / "other" / "user-eve.key"),
        "expired": _issue(folder, "expired", issuer=_cluster_ca(cluster), days=(-30, -1)),
    }


def _raw_status(address: str, ca: Path, cert_and_key: tuple[Path, Path] | None) -> grpc.StatusCode | None:
    """Ask `address` for its status over a channel made without any of raftkv's checks."""
    if cert_and_key is None:
        channel = grpc.insecure_channel(address)
    else:
        creds = grpc.ssl_channel_credentials(ca.read_bytes(), cert_and_key[1].read_bytes(),
                                             cert_and_key[0].read_bytes())
        channel = grpc.secure_channel(address, creds)
    with channel:
        try:
            kv_pb2_grpc.KVStub(channel).Status(pb.StatusRequest(), timeout=5)
        except grpc.RpcError as exc:
            return exc.code()
        return None


def _raw_put(address: str, ca: Path, cert_and_key: tuple[Path, Path] | None) -> None:
    channel = grpc.insecure_channel(address) if cert_and_key is None else grpc.secure_channel(
        address, grpc.ssl_channel_credentials(ca.read_bytes(), cert_and_key[1].read_bytes(),
                                              cert_and_key[0].read_bytes()))
    with channel:
        with pytest.raises(grpc.RpcError) as refused:
            kv_pb2_grpc.KVStub(channel).Execute(pb.ExecuteRequest(ops=[pb.Op(
                partition=0, put=pb.Put(key=KEY, value=b"forged"))]), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_only_certificates_of_the_cluster_ca_get_through_the_node_api(make_cluster, strangers):
    cluster = make_cluster(nodes=1, partitions=1, replication=1, tls=True)
    ca, address = cluster.spec.tls.ca, cluster.endpoints[0]
    with Client(cluster.endpoints, tls=cluster.tls, timeout=5) as kv:
        kv.put(KEY, b"good")
        assert kv.get(KEY) == b"good"

    assert _raw_status(address, ca, None) == grpc.StatusCode.UNAVAILABLE
    for name, files in _bad_certificates(cluster, strangers).items():
        assert _raw_status(address, ca, files) == grpc.StatusCode.UNAVAILABLE, name
        _raw_put(address, ca, files)
    _raw_put(address, ca, None)

    with pytest.raises(Unauthenticated, match="requires TLS"), Client(cluster.endpoints, timeout=5) as kv:
        kv.get(KEY)
    other = strangers / "other"
    with pytest.raises(Unauthenticated, match="does not trust the node's certificate"), \
            Client(cluster.endpoints, timeout=5, tls=Tls(other / "ca.pem", other / "user-eve.pem",
                                                         other / "user-eve.key")) as kv:
        kv.get(KEY)
    expired = _issue(strangers, "expired-too", issuer=_cluster_ca(cluster), days=(-30, -1))
    with pytest.raises(ConfigError, match="expired-too.pem expired on"):
        Client(cluster.endpoints, tls=Tls(ca, *expired))
    with Client(cluster.endpoints, tls=cluster.tls, timeout=5) as kv:
        assert kv.get(KEY) == b"good"  # no refused connection wrote anything


def test_the_cli_finds_the_certificates_in_the_spec_or_is_told_in_one_line(make_cluster, strangers):
    cluster = make_cluster(nodes=1, partitions=1, replication=1, tls=True)
    config = ["--config", str(cluster.spec_path)]

    def raftkv(*args):
        return subprocess.run([sys.executable, "-m", "raftkv", *args], capture_output=True, text=True, timeout=60)

    assert raftkv("put", "k", "v", *config).returncode == 0
    assert raftkv("get", "k", *config).stdout.strip() == "v"
    assert_one_line_error(raftkv("get", "k", "--endpoints", cluster.endpoints[0]), "requires TLS")
    other = strangers / "other"
    assert_one_line_error(raftkv("--cacert", str(other / "ca.pem"), "--cert", str(other / "user-eve.pem"),
                                 "--key", str(other / "user-eve.key"), "get", "k", *config),
                          "does not trust the node's certificate")
    assert_one_line_error(raftkv("--cert", str(other / "user-eve.pem"), "get", "k", *config),
                          "give --cert and --key together")
    admin = cluster.spec.tls.client_cert  # with another user's key: gRPC's core only logged a failed handshake
    assert_one_line_error(raftkv("--cert", str(admin), "--key", str(other / "user-eve.key"), "get", "k", *config),
                          f"{other / 'user-eve.key'} is not the key of {admin}")


def test_a_node_with_an_expired_certificate_does_not_start(make_cluster, strangers):
    cluster = make_cluster(nodes=1, partitions=1, replication=1, tls=True, start=False)
    cert, key = cluster.spec.tls.node("n1")
    expired = _issue(strangers, "expired-node", issuer=_cluster_ca(cluster), days=(-30, -1))
    cert.write_bytes(expired[0].read_bytes())
    key.write_bytes(expired[1].read_bytes())
    node = subprocess.run([sys.executable, "-m", "raftkv", "node", "start", "--config", str(cluster.spec_path),
                           "--node", "n1"], capture_output=True, text=True, timeout=60)
    assert_one_line_error(node, "node-n1.pem expired on")


def test_the_learner_api_serves_the_cluster_ca_only(make_cluster, changelog_learner, strangers, tmp_path):
    cluster = make_cluster(nodes=1, partitions=1, replication=1, tls=True)
    address = changelog_learner(cluster)
    with Client(cluster.endpoints, tls=cluster.tls, timeout=5) as kv:
        kv.put(KEY, b"fed")
    wait_until(lambda: changelog_caught_up(cluster, address), 60, "the changelog learner to catch up")
    # with its learner certificate, which may report its release and no other metadata change
    wait_until(lambda: f"reported release {VERSION}" in (tmp_path / "learner.log").read_text(), 30,
               "the learner to report its release")
    with ChangeLogClient(address, timeout=5, tls=cluster.tls) as log:
        assert sum(o.latest for o in log.offsets()) > 0
    ca = cluster.spec.tls.ca
    assert _raw_status(address, ca, None) == grpc.StatusCode.UNAVAILABLE
    for name, files in _bad_certificates(cluster, strangers).items():
        assert _raw_status(address, ca, files) == grpc.StatusCode.UNAVAILABLE, name
    with pytest.raises(Unauthenticated, match="requires TLS"), ChangeLogClient(address, timeout=5) as log:
        log.offsets()


def test_metrics_are_served_over_https_when_the_spec_asks(make_cluster):
    cluster = make_cluster(nodes=1, partitions=1, replication=1, tls=True, start=False)
    save_spec(dataclasses.replace(cluster.spec, tls=dataclasses.replace(cluster.spec.tls, metrics=True)),
              cluster.spec_path)
    cluster.start_all()
    cluster.wait_ready(timeout=60)
    node = cluster.spec.nodes[0]
    url = f"https://{node.host}:{node.metrics_port}/metrics"
    context = ssl.create_default_context(cafile=str(cluster.spec.tls.ca))
    with urllib.request.urlopen(url, context=context, timeout=10) as reply:
        assert b"raftkv_is_leader" in reply.read()
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(url.replace("https", "http"), timeout=10).read()


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plaintext"])
def test_pysyncobj_admin_commands_sent_to_a_raft_port_do_nothing(make_cluster, tls):
    """pysyncobj answers `add`, `remove` and `transfer` from anyone on its port; the Raft hub carries no
    such thing, with TLS or without: membership and leadership stay as they were."""
    cluster = make_cluster(nodes=3, partitions=1, replication=3, tls=tls)
    spec = cluster.spec
    with Client(cluster.endpoints, tls=cluster.tls, timeout=10) as kv:
        before = (kv.topology().meta.placement, _leaders(kv))
        follower = next(n for n in spec.node_ids if n != before[1][0])
        for command in (["-status"], ["-remove", spec.node(follower).raft_address(0)],
                        ["-transfer", spec.node(follower).raft_address(0)],
                        ["-add", "127.0.0.1:1"]):
            for node in spec.nodes:
                admin = subprocess.run([sys.executable, "-m", "pysyncobj.syncobj_admin", "-conn",
                                        node.raft_address(0), *command], capture_output=True, text=True, timeout=60)
                assert "SUCCESS" not in admin.stdout and "leader" not in admin.stdout, admin.stdout
        kv.put(b"after-admin", b"1")
        assert (kv.topology().meta.placement, _leaders(kv)) == before


def _leaders(kv) -> dict[int, str]:
    return {ps.partition: s.node_id for s in kv.status() for ps in s.partitions if ps.role == "leader"}


def test_a_channel_reaches_its_server_within_a_second_of_it_coming_back():
    """gRPC's default reconnect backoff grows to 120 s, and a channel in backoff fails every call at once:
    a node's channel to a peer that was down for a minute kept failing its forwards for another minute.
    (Found as a forward failing just after start-up: the start-up probe of the peers had met a node not
    yet listening.)"""
    port = free_port_block(1)
    address = f"127.0.0.1:{port}"

    async def scenario() -> float:
        async with open_channel(address, None) as channel:
            status = channel.unary_unary("/raftkv.v1.KV/Status")
            deadline = asyncio.get_running_loop().time() + 6
            while asyncio.get_running_loop().time() < deadline:  # down: backoff grows over the attempts
                with pytest.raises(grpc.aio.AioRpcError):
                    await status(b"", timeout=1)
                await asyncio.sleep(0.1)
            server = grpc.aio.server()
            server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("raftkv.v1.KV", {
                "Status": grpc.unary_unary_rpc_method_handler(lambda request, context: b"")})])
            server.add_insecure_port(address)
            await server.start()
            back = asyncio.get_running_loop().time()
            try:
                while True:
                    try:
                        await status(b"", timeout=1)
                        return asyncio.get_running_loop().time() - back
                    except grpc.aio.AioRpcError:
                        await asyncio.sleep(0.05)
            finally:
                await server.stop(None)

    assert asyncio.run(asyncio.wait_for(scenario(), 30)) < 1.5
