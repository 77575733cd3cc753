"""The PEM files a process presents and trusts, turned into gRPC credentials (docs/security.md §4).

Every gRPC channel and server of raftkv is made here, so "TLS or not" is decided
in one place: `channel(address, tls)` is plaintext only when `tls` is None.
The files are read and checked when first used: a missing file, a certificate
the CA did not sign, or one that expired is one ConfigError line naming the file
and what to do, not a handshake that fails later with an OpenSSL code.
"""

from __future__ import annotations

import datetime
import functools
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from raftkv.core.errors import ConfigError
from raftkv.core.spec import ClusterSpec
from raftkv.security.certs import Identity, identity_of

_REMEDY = "make them with `raftkv certs init`, or name your own PEM files in the spec's [tls] table"


@dataclass(frozen=True)
class Tls:
    """A CA to trust, and the certificate and key this process presents (its identity)."""

    ca: Path
    cert: Path
    key: Path

    def __post_init__(self):  # paths may come as text
        for name in ("ca", "cert", "key"):
            object.__setattr__(self, name, Path(getattr(self, name)))

    @functools.cached_property
    def _pems(self) -> tuple[bytes, bytes, bytes]:
        ca, cert, key = (_read(p) for p in (self.ca, self.cert, self.key))
        check_certificate(cert, ca, self.cert, self.ca)
        check_key(key, cert, self.key, self.cert)
        return ca, cert, key

    def server_credentials(self) -> grpc.ServerCredentials:
        """Mutual TLS: a client without a certificate this CA signed fails the handshake."""
        ca, cert, key = self._pems
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        ca, cert, key = self._pems
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)

    def check(self) -> None:
        """Read and check the files now (at start-up), rather than at the first connection."""
        self._pems

    def server_context(self) -> ssl.SSLContext:
        """For raftkv's own listeners (the Raft hub): mutual TLS, TLS 1.2 or later."""
        return self._context(ssl.PROTOCOL_TLS_SERVER)

    def client_context(self) -> ssl.SSLContext:
        """Checks the server's certificate against the CA and the host it was dialed at."""
        return self._context(ssl.PROTOCOL_TLS_CLIENT)

    def _context(self, protocol: int) -> ssl.SSLContext:
        ca, _, _ = self._pems
        context = ssl.SSLContext(protocol)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=ca.decode())
        context.load_cert_chain(self.cert, self.key)
        return context


def peer_identity(ssl_object: ssl.SSLObject) -> Identity:
    """Who the other side of a mutual-TLS connection is, from its certificate (the CA checked it)."""
    return identity_of(x509.load_der_x509_certificate(ssl_object.getpeercert(binary_form=True)))


def node_tls(spec: ClusterSpec, node_id: str) -> Tls | None:
    """What node `node_id` serves with and presents to the others; None: the cluster runs plaintext."""
    if spec.tls is None:
        return None
    return Tls(spec.tls.ca, *spec.tls.node(node_id))


def learner_tls(spec: ClusterSpec) -> Tls | None:
    if spec.tls is None:
        return None
    if spec.tls.learner_cert is None:
        raise ConfigError("the cluster runs TLS but its spec names no learner_cert and learner_key; "
                          "`raftkv certs init` makes learner.pem", source="tls")
    return Tls(spec.tls.ca, spec.tls.learner_cert, spec.tls.learner_key)


def client_tls(spec: ClusterSpec | None, cacert: str | None = None, cert: str | None = None,
               key: str | None = None) -> Tls | None:
    """A client's TLS: the files given (the CLI's --cacert/--cert/--key), else the spec's client_cert."""
    if cacert or cert or key:
        if not (cacert or spec and spec.tls) or not (cert and key):
            raise ConfigError("give --cert and --key together, and --cacert unless the spec names the CA",
                              source="tls")
        return Tls(Path(cacert) if cacert else spec.tls.ca, Path(cert), Path(key))
    if spec is None or spec.tls is None:
        return None
    if spec.tls.client_cert is None:
        raise ConfigError("the cluster runs TLS: give --cert and --key of a user certificate, or name one as "
                          "client_cert and client_key in the spec's [tls] table", source="tls")
    return Tls(spec.tls.ca, spec.tls.client_cert, spec.tls.client_key)


def refusal(details: str, tls: Tls | None) -> str | None:
    """What a failed connection's gRPC details mean, when the TLS set-up is what failed; else None."""
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return (f"this client does not trust the node's certificate (not issued by the CA in "
                f"{tls.ca if tls else '?'}, or expired); use the cluster's CA")
    if "WRONG_VERSION_NUMBER" in details:
        return "the node does not speak TLS: connect without TLS settings, or start the cluster with [tls]"
    if "handshake failed" in details.lower():
        return f"the TLS handshake failed ({details.rsplit(': ', 1)[-1]})"
    if "failed to connect" in details and details.endswith("Socket closed"):
        if tls is None:
            return ("the node closed the connection at once: it requires TLS; give the cluster's CA and a client "
                    "certificate (--cacert/--cert/--key, the spec's [tls] table, or tls= in code)")
        return (f"the node refused the certificate {tls.cert}: it was not issued by the cluster's CA, has "
                "expired, or is not a client certificate")
    return None


def check_certificate(cert_pem: bytes, ca_pem: bytes, cert_path: Path, ca_path: Path) -> None:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        ca = x509.load_pem_x509_certificate(ca_pem)
    except ValueError:
        raise ConfigError(f"{cert_path} or {ca_path} is not a PEM certificate; {_REMEDY}", source="tls") from None
    now = datetime.datetime.now(datetime.timezone.utc)
    if cert.not_valid_after_utc < now:
        raise ConfigError(f"{cert_path} expired on {cert.not_valid_after_utc:%Y-%m-%d}; issue a new one "
                          "(`raftkv certs init` makes what is missing)", source="tls")
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise ConfigError(f"{cert_path} was not issued by the CA in {ca_path}; use the certificates of one "
                          "cluster together", source="tls") from None


def check_key(key_pem: bytes, cert_pem: bytes, key_path: Path, cert_path: Path) -> None:
    """The key is the private half of the certificate's public key (gRPC's core would only log that the
    handshake failed, and the client would say no node answered)."""
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise ConfigError(f"{key_path} is not an unencrypted PEM private key; {_REMEDY}", source="tls") from None
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*spki) != x509.load_pem_x509_certificate(cert_pem).public_key().public_bytes(*spki):
        raise ConfigError(f"{key_path} is not the key of {cert_path}: give the key file that was made with "
                          "that certificate", source="tls")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}; {_REMEDY}", source="tls") from None


# A channel that cannot connect fails every call at once until its next attempt, and gRPC spaces the
# attempts out to 2 minutes: a peer or a client would shun a node for that long after it came back.
# (Not grpc.min_reconnect_backoff_ms: it is also the least time a connection attempt gets.)
RECONNECT_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000))


def open_channel(address: str, tls: Tls | None, options: Sequence[tuple[str, object]] = (),
                 token: str | None = None) -> grpc.aio.Channel:
    """An asyncio channel to `address`: mutual TLS with `tls`, plaintext without. `token`: a user's bearer
    token, sent with every call (over TLS only: it is a password)."""
    options = [*RECONNECT_OPTIONS, *options]
    if tls is None:
        _no_token_without_tls(token)
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, _credentials(tls, token), options=options)


def open_blocking_channel(address: str, tls: Tls | None, options: Sequence[tuple[str, object]] = (),
                          token: str | None = None) -> grpc.Channel:
    """The same, for code that is not on an event loop."""
    options = [*RECONNECT_OPTIONS, *options]
    if tls is None:
        _no_token_without_tls(token)
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, _credentials(tls, token), options=options)


def _credentials(tls: Tls, token: str | None) -> grpc.ChannelCredentials:
    credentials = tls.channel_credentials()
    if token:
        credentials = grpc.composite_channel_credentials(credentials, grpc.access_token_call_credentials(token))
    return credentials


def _no_token_without_tls(token: str | None) -> None:
    if token:
        raise ConfigError("a token is sent over TLS only; give the cluster's TLS settings too", source="tls")


def listen(server: grpc.Server | grpc.aio.Server, address: str, tls: Tls | None) -> None:
    if tls is None:
        server.add_insecure_port(address)
    else:
        server.add_secure_port(address, tls.server_credentials())
