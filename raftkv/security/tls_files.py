"""The PEM files of a `Tls` as they are now, and a renewed file taken up without a restart (docs/security.md §4).

`TlsFiles.current` is the files read and checked: a missing file, a certificate its CA did not sign or
that expired, a key that is not its certificate's is one ConfigError line naming the file. A process
that serves (a node, a learner) calls `refresh` from a timer it has anyway, once a second: a stat of the
three files. When one changed (`raftkv certs renew` replaces each .pem atomically) they are read and
checked again; if they pass they become `current`, and every handshake from then on presents them
(`listener_context` swaps each listener's handshakes to them; tls.py does gRPC's). If not, the old
ones stay, with one log line naming the file, and `raftkv_tls_files_refused` is 1 until they pass.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from raftkv.core import metrics
from raftkv.core.errors import ConfigError

log = logging.getLogger(__name__)

_REMEDY = "make them with `raftkv certs init`, or name your own PEM files in the spec's [tls] table"
_READS = 3  # a file replaced while it was read is read again; a folder rewritten without end fails

Stamp = tuple[tuple[int, int, int] | None, ...]  # per file: (inode, mtime in ns, size); None: cannot stat


@dataclass(frozen=True, eq=False)
class Material:
    """One reading of the files, checked, and the contexts made of it when first asked for."""

    stamp: Stamp
    ca: bytes
    cert: bytes
    key: bytes
    serial: int
    expires: datetime.datetime

    @functools.cached_property
    def server(self) -> ssl.SSLContext:
        """Mutual TLS, for raftkv's own listeners (the Raft hub)."""
        return self._context(ssl.PROTOCOL_TLS_SERVER)

    @functools.cached_property
    def client(self) -> ssl.SSLContext:
        """Checks the server's certificate against the CA and the host it was dialed at."""
        return self._context(ssl.PROTOCOL_TLS_CLIENT)

    @functools.cached_property
    def https(self) -> ssl.SSLContext:
        """The console's: asks no client certificate."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        _load_chain(context, self.cert, self.key)
        return context

    def _context(self, protocol: int) -> ssl.SSLContext:
        context = ssl.SSLContext(protocol)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=self.ca.decode())
        _load_chain(context, self.cert, self.key)
        return context



class TlsFiles:
    def __init__(self, ca: Path, cert: Path, key: Path):
        self._paths = (ca, cert, key)
        self._current: Material | None = None
        self._refused: Stamp | None = None  # the files as they were when last refused
        self._used: set[str] = set()  # the contexts asked for: made as soon as renewed files are read
        self.generation = 0  # how many times the files were taken up

    def __getstate__(self) -> tuple[Path, Path, Path]:  # a Tls travels in the Spark connector's options
        return self._paths

    def __setstate__(self, paths: tuple[Path, Path, Path]) -> None:
        self.__init__(*paths)

    @property
    def current(self) -> Material:
        if self._current is None:
            self._current = read(*self._paths)
            self.generation += 1
        return self._current

    def context(self, kind: str) -> ssl.SSLContext:
        """The current files' "server", "client" or "https" context."""
        self._used.add(kind)
        return getattr(self.current, kind)

    def refresh(self) -> None:
        """Take up the files if they changed and pass the checks; else keep the current ones, and say so
        once (per change). Also sets the certificate's metrics."""
        stamp = _stamp(self._paths)
        if stamp == self.current.stamp:
            self._refused = None  # a bad file moved away again, the one in use back in its place
        elif stamp != self._refused:
            try:
                material = read(*self._paths)
                for kind in self._used:  # here, where a failure is a refusal, not in a handshake
                    getattr(material, kind)
            except (ConfigError, ssl.SSLError) as exc:
                self._refused = stamp
                problem = "; ".join(exc.problems) if isinstance(exc, ConfigError) else f"OpenSSL: {exc}"
                log.error("TLS files refused, still serving with the certificate that expires on %s: %s; fix or "
                          "restore the file (it is read again when it changes)", f"{self._current.expires:%Y-%m-%d}",
                          problem)
            else:
                self._current, self._refused = material, None
                self.generation += 1
                log.info("TLS: took up %s (serial %x, expires %s); new connections present it", self._paths[1],
                         material.serial, f"{material.expires:%Y-%m-%d}")
        metrics.TLS_CERT_EXPIRES.set(self._current.expires.timestamp())
        metrics.TLS_FILES_REFUSED.set(self._refused is not None)

    def listener_context(self, kind: str) -> ssl.SSLContext:
        """The `server` or `https` context for a listener that lives as long as the process: each of its
        handshakes moves to the current files' context, in the SNI callback (OpenSSL calls it for every
        client hello, with a server name or without)."""
        front = self.context(kind)

        def current_files(ssl_object, _server_name: str | None, context: ssl.SSLContext) -> None:
            newest = getattr(self._current, kind)
            if newest is not context:
                ssl_object.context = newest

        front.sni_callback = current_files
        return front


def read(ca_path: Path, cert_path: Path, key_path: Path) -> Material:
    """The files, checked. Stat'ed before and after: if one was replaced while they were read, they are
    read again (the bytes of one moment, and the stamp of those bytes)."""
    for _ in range(_READS):
        before = _stamp((ca_path, cert_path, key_path))
        ca, cert, key = (_read(p) for p in (ca_path, cert_path, key_path))
        if _stamp((ca_path, cert_path, key_path)) == before:
            checked = check_certificate(cert, ca, cert_path, ca_path)
            check_key(key, cert, key_path, cert_path)
            return Material(before, ca, cert, key, checked.serial_number, checked.not_valid_after_utc)
    raise ConfigError(f"{cert_path.parent} kept changing while it was read; try again once it is written",
                      source="tls")


def _load_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads a certificate and key from a file only: these bytes, the ones checked, through a file in
    memory (no second read of files that may have changed since, no copy of the key on a disk)."""
    fd = os.memfd_create("raftkv-tls", os.MFD_CLOEXEC)
    try:
        with open(fd, "wb", closefd=False) as f:
            f.write(cert + b"\n" + key)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def _stamp(paths: tuple[Path, ...]) -> Stamp:
    def one(path: Path) -> tuple[int, int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size
    return tuple(one(p) for p in paths)


def check_certificate(cert_pem: bytes, ca_pem: bytes, cert_path: Path, ca_path: Path) -> x509.Certificate:
    """`cert_pem`, if it is valid now and one of the CAs in `ca_pem` issued it (while the CA changes, the
    CA file holds the old and the new one: docs/operations.md)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        cas = x509.load_pem_x509_certificates(ca_pem)
    except ValueError:
        raise ConfigError(f"{cert_path} or {ca_path} is not a PEM certificate; {_REMEDY}", source="tls") from None
    now = datetime.datetime.now(datetime.timezone.utc)
    if cert.not_valid_after_utc < now:
        raise ConfigError(f"{cert_path} expired on {cert.not_valid_after_utc:%Y-%m-%d}; issue a new one "
                          "(`raftkv certs init` makes what is missing)", source="tls")
    if not any(_issued(cert, ca) for ca in cas):
        raise ConfigError(f"{cert_path} was not issued by the CA in {ca_path}; use the certificates of one "
                          "cluster together", source="tls")
    return cert


def _issued(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


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
