"""A cluster's certificates: its CA, one certificate per node, and client certificates for users
and learner processes (docs/security.md §3).

The role a certificate grants is its subject's organizational unit (`raftkv-node`,
`raftkv-learner`, `raftkv-user`), so a node can tell it from the TLS session alone;
the name is the common name (node id, user name, `learner`). Keys are EC P-256,
written 0600 and never overwritten: running `init` again adds what is missing, and
`renew` re-issues certificates for the keys they have (docs/operations.md).
"""

from __future__ import annotations

import datetime
import ipaddress
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from raftkv.core.durable import replace_file
from raftkv.core.errors import ConfigError
from raftkv.core.spec import ClusterSpec, TlsSpec

ROLES = ("node", "learner", "user")
CA_DAYS = 3650
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # a file name and a CN alike
_BACKDATE = datetime.timedelta(minutes=5)  # clocks of a cluster's hosts differ a little


@dataclass(frozen=True)
class Identity:
    name: str
    role: str


@dataclass(frozen=True)
class Written:
    path: Path  # the certificate; its key is beside it
    created: bool  # False: it was there already and is kept


@dataclass(frozen=True)
class Held:
    """A certificate of the folder, as `list_certs` and `renew_certs` see it."""

    path: Path
    identity: Identity
    expires: datetime.datetime
    renewed: bool = False

    def days_left(self, now: datetime.datetime) -> float:
        return (self.expires - now).total_seconds() / 86400


def identity_of(cert: x509.Certificate) -> Identity:
    """Who a certificate this cluster's CA issued names, and in which role."""
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    units = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    role = units[0].value.removeprefix("raftkv-") if units else ""
    if not names or role not in ROLES:
        raise ConfigError(f"certificate {cert.subject.rfc4514_string()} names no raftkv role", source="tls")
    return Identity(str(names[0].value), role)


def init_certs(out: Path, spec: ClusterSpec | None, users: Iterable[str], days: int,
               nodes: Iterable[tuple[str, str]] = ()) -> list[Written]:
    """The CA (made if absent), a certificate per node of `spec` and per (id, host) of `nodes` (a node
    that will join), per user, and the learners' one."""
    users, nodes = list(users), [(n.id, n.host) for n in (spec.nodes if spec else ())] + list(nodes)
    for name in users:
        if not _NAME.match(name):
            raise ConfigError(f"{name!r} cannot be a user name: letters, digits, '.', '_' and '-' only, "
                              "up to 64", source="--user")
    for node_id, _ in nodes:
        if not _NAME.match(node_id):
            raise ConfigError(f"{node_id!r} cannot be a node id: letters, digits, '.', '_' and '-' only", source="--node")
    out.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key, written = _ca(out)
    wanted = [(f"node-{node_id}", node_id, "node", [host]) for node_id, host in nodes]
    wanted += [(f"user-{name}", name, "user", []) for name in users]
    # A learner serves its API (follower reads, the changelog) too; it runs beside a node or on this host.
    learner_hosts = sorted({n.host for n in spec.nodes} if spec else set()) or ["127.0.0.1"]
    wanted.append(("learner", "learner", "learner", learner_hosts))
    for stem, name, role, hosts in wanted:
        written.append(_leaf(out, stem, name, role, hosts, days, ca_cert, ca_key))
    return written


def list_certs(out: Path) -> list[Held]:
    """The CA's leaf certificates in `out`, by file name."""
    ca_cert = _load_cert(out / "ca.pem")
    held = []
    for path in sorted(out.glob("*.pem")):
        if path.name == "ca.pem":
            continue
        cert = _load_cert(path)
        if cert.issuer == ca_cert.subject:
            held.append(Held(path, identity_of(cert), cert.not_valid_after_utc))
    return held


def renew_certs(out: Path, days: int, within_days: float, now: datetime.datetime | None = None) -> list[Held]:
    """Every leaf certificate in `out` that expires within `within_days`, issued again for `days` by the
    folder's CA: the same subject, names and uses, and the same key, so each file is replaced on its own
    (atomically) and a node keeps serving with either. The rest are listed as they are."""
    ca_cert, ca_key, _ = _ca(out, create=False)
    now = now or datetime.datetime.now(datetime.timezone.utc)
    held = []
    for entry in list_certs(out):
        if entry.days_left(now) > within_days:
            held.append(entry)
            continue
        old = _load_cert(entry.path)
        builder = (x509.CertificateBuilder().subject_name(old.subject).issuer_name(ca_cert.subject)
                   .public_key(old.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - _BACKDATE).not_valid_after(now + datetime.timedelta(days=days)))
        for extension in old.extensions:
            builder = builder.add_extension(extension.value, extension.critical)
        cert = builder.sign(ca_key, hashes.SHA256())
        replace_file(entry.path, cert.public_bytes(serialization.Encoding.PEM))
        held.append(Held(entry.path, entry.identity, cert.not_valid_after_utc, renewed=True))
    return held


def _load_cert(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except FileNotFoundError:
        raise ConfigError(f"{path} is missing: give the folder `raftkv certs init` wrote", source="--out") from None
    except ValueError:
        raise ConfigError(f"{path} is not a PEM certificate", source="--out") from None


CERTS_DIR = "certs"
ADMIN_USER = "admin"


def with_certificates(spec: ClusterSpec, folder: Path, days: int = 825) -> ClusterSpec:
    """`spec` with mutual TLS on: certificates made in `folder`/certs (the CA, one per node, the learners'
    and an `admin` user's for the CLI), and a [tls] table naming them."""
    out = folder / CERTS_DIR
    init_certs(out, spec, [ADMIN_USER], days)
    return replace(spec, tls=TlsSpec(
        ca=out / "ca.pem", node_cert=str(out / "node-{id}.pem"), node_key=str(out / "node-{id}.key"),
        learner_cert=out / "learner.pem", learner_key=out / "learner.key",
        client_cert=out / f"user-{ADMIN_USER}.pem", client_key=out / f"user-{ADMIN_USER}.key"))


def _ca(out: Path, create: bool = True) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, list[Written]]:
    cert_path, key_path = out / "ca.pem", out / "ca.key"
    if cert_path.exists() or not create:
        if not key_path.exists():
            raise ConfigError(f"{key_path} is missing: certificates cannot be issued without the CA's key; "
                              "bring it back, or use another --out for a new CA", source="--out")
        cert = _load_cert(cert_path)
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        return cert, key, [Written(cert_path, False)]
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "raftkv cluster CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE).not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    _write(key_path, key, cert_path, cert)
    return cert, key, [Written(cert_path, True)]


def _leaf(out: Path, stem: str, name: str, role: str, hosts: list[str], days: int,
          ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey) -> Written:
    cert_path, key_path = out / f"{stem}.pem", out / f"{stem}.key"
    if cert_path.exists():
        return Written(cert_path, False)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if hosts else [])
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, f"raftkv-{role}"),
                                        x509.NameAttribute(NameOID.COMMON_NAME, name)]))
               .issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - _BACKDATE).not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=True, key_cert_sign=False,
                                            crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False))
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName([_general_name(h) for h in hosts]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write(key_path, key, cert_path, cert)
    return Written(cert_path, True)


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write(key_path: Path, key: ec.EllipticCurvePrivateKey, cert_path: Path, cert: x509.Certificate) -> None:
    """The key first (0600 from its creation), then the certificate that makes the pair count as present."""
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    replace_file(key_path, pem, mode=0o600)
    replace_file(cert_path, cert.public_bytes(serialization.Encoding.PEM))
