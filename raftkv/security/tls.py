"""The PEM files a process presents and trusts, turned into gRPC credentials (docs/security.md §4).

Every gRPC channel and server of raftkv is made here, so "TLS or not" is decided
in one place: `channel(address, tls)` is plaintext only when `tls` is None.
The files are read and checked when first used: a missing file, a certificate
the CA did not sign, or one that expired is one ConfigError line naming the file
and what to do, not a handshake that fails later with an OpenSSL code. Renewed
files are taken up without a restart (`tls_files`): listeners present them at
their next handshake, channels opened from then on too.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import grpc
from cryptography import x509

from raftkv.core.errors import ConfigError
from raftkv.core.spec import ClusterSpec
from raftkv.security.certs import Identity, identity_of
from raftkv.security.tls_files import Material, TlsFiles


@dataclass(frozen=True)
class Tls:
    """A CA to trust, and the certificate and key this process presents (its identity). What they hold
    is `files.current`; a node or a learner calls `refresh` once a second to take up renewed files."""

    ca: Path
    cert: Path
    key: Path
    files: TlsFiles = field(init=False, repr=False, compare=False)

    def __post_init__(self):  # paths may come as text
        for name in ("ca", "cert", "key"):
            object.__setattr__(self, name, Path(getattr(self, name)))
        object.__setattr__(self, "files", TlsFiles(self.ca, self.cert, self.key))

    def server_credentials(self) -> grpc.ServerCredentials:
        """Mutual TLS: a client without a certificate this CA signed fails the handshake. gRPC asks for
        the files before each handshake: the current ones, given again once they changed."""
        files = self.files
        served = files.current

        def renewed() -> grpc.ServerCertificateConfiguration | None:  # on a gRPC thread
            nonlocal served
            if files.current is served:
                return None
            served = files.current
            return _configuration(served)

        return grpc.dynamic_ssl_server_credentials(_configuration(served), renewed, require_client_authentication=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Of the current files: a channel keeps them for its life (`generation` says when to open anew)."""
        m = self.files.current
        return grpc.ssl_channel_credentials(root_certificates=m.ca, private_key=m.key, certificate_chain=m.cert)

    @property
    def generation(self) -> int:
        """Moves when renewed files were taken up: channels opened before present the old certificate."""
        self.files.current  # loaded first: the first load must not read as a renewal
        return self.files.generation

    def check(self) -> None:
        """Read and check the files now (at start-up), rather than at the first connection."""
        self.files.current

    def refresh(self) -> None:
        self.files.refresh()

    def server_context(self) -> ssl.SSLContext:
        """For raftkv's own listeners (the Raft hub): mutual TLS, TLS 1.2 or later, the current files."""
        return self.files.listener_context("server")

    def https_context(self) -> ssl.SSLContext:
        """For the console's HTTPS: the current files, no client certificate asked."""
        return self.files.listener_context("https")

    def client_context(self) -> ssl.SSLContext:
        """Checks the server's certificate against the CA and the host it was dialed at."""
        return self.files.context("client")


def _configuration(m: Material) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(m.key, m.cert)], root_certificates=m.ca)


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
