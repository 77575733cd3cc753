"""raftkv certs init: what it writes, and real mutual-TLS handshakes (gRPC, loopback) with it."""

from __future__ import annotations

import stat
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from raftkv.core.errors import ConfigError
from raftkv.core.spec import build_spec
from raftkv.security.certs import Identity, identity_of, init_certs, list_certs, renew_certs
from tests.test_cli import assert_one_line_error, run


@pytest.fixture
def spec(tmp_path):
    return build_spec(nodes=2, partitions=1, replication=2, base_port=20000, data_dir=tmp_path / "data",
                      hosts=["127.0.0.1", "db2.example"])


def cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_a_ca_signs_one_certificate_per_node_user_and_the_learners(tmp_path, spec):
    out = tmp_path / "certs"
    written = init_certs(out, spec, ["alice"], days=30)
    assert [(w.path.name, w.created) for w in written] == [
        ("ca.pem", True), ("node-n1.pem", True), ("node-n2.pem", True), ("user-alice.pem", True),
        ("learner.pem", True)]
    ca = cert(out / "ca.pem")
    for w in written[1:]:
        cert(w.path).verify_directly_issued_by(ca)
        assert stat.S_IMODE(w.path.with_suffix(".key").stat().st_mode) == 0o600
    assert identity_of(cert(out / "node-n2.pem")) == Identity("n2", "node")
    assert identity_of(cert(out / "user-alice.pem")) == Identity("alice", "user")
    assert identity_of(cert(out / "learner.pem")) == Identity("learner", "learner")
    sans = cert(out / "node-n2.pem").extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["db2.example"]


def test_a_second_run_keeps_every_file_and_adds_what_is_missing(tmp_path, spec):
    out = tmp_path / "certs"
    init_certs(out, spec, ["alice"], days=30)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    written = init_certs(out, spec, ["alice", "bob"], days=30)
    assert {w.path.name for w in written if w.created} == {"user-bob.pem"}
    assert all((out / name).read_bytes() == data for name, data in before.items())
    cert(out / "user-bob.pem").verify_directly_issued_by(cert(out / "ca.pem"))


def test_bad_names_and_a_lost_ca_key_are_one_line(tmp_path, spec):
    with pytest.raises(ConfigError, match="cannot be a user name"):
        init_certs(tmp_path / "a", spec, ["../etc"], days=30)
    init_certs(tmp_path / "b", None, [], days=30)
    (tmp_path / "b" / "ca.key").unlink()
    assert_one_line_error(run("certs", "init", "--out", str(tmp_path / "b"), "--user", "carol"), "ca.key is missing")


def _serve(out: Path, seen: list):
    def echo(request, context):
        seen.append(context.auth_context().get("x509_common_name"))
        return request

    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "t.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)})])
    credentials = grpc.ssl_server_credentials(
        [((out / "node-n1.key").read_bytes(), (out / "node-n1.pem").read_bytes())],
        root_certificates=(out / "ca.pem").read_bytes(), require_client_auth=True)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, f"127.0.0.1:{port}"


def _call(channel: grpc.Channel) -> bytes:
    return channel.unary_unary("/t.Echo/Echo")(b"ping", timeout=5)


def test_a_node_certificate_serves_mutual_tls_to_this_clusters_clients_only(tmp_path, spec):
    out, other = tmp_path / "certs", tmp_path / "other"
    init_certs(out, spec, ["alice"], days=30)
    init_certs(other, spec, ["alice"], days=30)  # another CA: same names, not this cluster
    seen: list = []
    server, address = _serve(out, seen)
    try:
        def client(certs: Path, user: str = "alice") -> grpc.Channel:
            return grpc.secure_channel(address, grpc.ssl_channel_credentials(
                (out / "ca.pem").read_bytes(), (certs / f"user-{user}.key").read_bytes(),
                (certs / f"user-{user}.pem").read_bytes()))

        with client(out) as channel:
            assert _call(channel) == b"ping"
        assert seen == [[b"alice"]]  # the server knows who called from the handshake alone
        for refused in (client(other), grpc.insecure_channel(address),
                        grpc.secure_channel(address, grpc.ssl_channel_credentials((out / "ca.pem").read_bytes()))):
            with refused, pytest.raises(grpc.RpcError) as failure:
                _call(refused)
            assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
        assert seen == [[b"alice"]]  # no refused connection reached the service
    finally:
        server.stop(None)


def test_renew_issues_expiring_certificates_again_for_their_keys_and_they_still_handshake(tmp_path, spec):
    out = tmp_path / "certs"
    init_certs(out, spec, ["alice"], days=30)
    init_certs(out, spec, ["bob"], days=800)  # bob's is not due
    keys = {p.name: p.read_bytes() for p in out.glob("*.key")}
    old = cert(out / "node-n2.pem")

    held = renew_certs(out, days=400, within_days=60)
    assert {h.path.name: h.renewed for h in held} == {
        "learner.pem": True, "node-n1.pem": True, "node-n2.pem": True, "user-alice.pem": True, "user-bob.pem": False}
    assert {p.name: p.read_bytes() for p in out.glob("*.key")} == keys  # the same keys: each .pem replaced alone
    new = cert(out / "node-n2.pem")
    new.verify_directly_issued_by(cert(out / "ca.pem"))
    assert new.subject == old.subject and list(new.extensions) == list(old.extensions)
    assert new.public_key() == old.public_key()
    assert (new.not_valid_after_utc - new.not_valid_before_utc).days == 400
    assert [h.path.name for h in list_certs(out)] == sorted(h.path.name for h in held)

    seen: list = []
    server, address = _serve(out, seen)  # the renewed node certificate serves, the renewed user's is accepted
    try:
        with grpc.secure_channel(address, grpc.ssl_channel_credentials(
                (out / "ca.pem").read_bytes(), (out / "user-alice.key").read_bytes(),
                (out / "user-alice.pem").read_bytes())) as channel:
            assert _call(channel) == b"ping"
        assert seen == [[b"alice"]]
    finally:
        server.stop(None)


def test_renew_without_the_ca_key_and_list_of_a_folder_without_a_ca_are_one_line(tmp_path, spec):
    out = tmp_path / "certs"
    init_certs(out, spec, [], days=30)
    (out / "ca.key").unlink()
    assert_one_line_error(run("certs", "renew", "--out", str(out)), "ca.key is missing")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(run("certs", "list", "--out", str(tmp_path / "empty")), "ca.pem is missing")
