"""`TlsFiles.refresh`: a renewed certificate taken up, a bad renewed file refused with one log line
(docs/security.md §4). The same against a real cluster: tests/test_access.py."""

from __future__ import annotations

import asyncio
import logging
import os
import re
from pathlib import Path

from cryptography import x509
from prometheus_client import REGISTRY

from raftkv.core.durable import replace_file
from raftkv.security.certs import init_certs, renew_certs
from raftkv.security.tls import Tls


def _node_tls(out: Path, node_id: str = "n1") -> Tls:
    return Tls(out / "ca.pem", out / f"node-{node_id}.pem", out / f"node-{node_id}.key")


def _serial(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def test_refresh_takes_up_a_renewed_certificate_and_refuses_a_bad_one_once(tmp_path, caplog):
    out, other = tmp_path / "certs", tmp_path / "other"
    init_certs(out, None, [], 30, [("n1", "127.0.0.1")])
    init_certs(other, None, [], 30, [("n1", "127.0.0.1")])
    tls = _node_tls(out)
    tls.refresh()
    first = tls.files.current
    assert (first.serial, tls.generation) == (_serial(out / "node-n1.pem"), 1)

    renew_certs(out, days=60, within_days=1000)
    tls.refresh()
    assert (tls.files.current.serial, tls.generation) == (_serial(out / "node-n1.pem"), 2) != (first.serial, 1)
    renewed = tls.files.current

    good = (out / "node-n1.pem").read_bytes()
    bad = {"garbage": (out / "node-n1.pem", b"not a certificate"),
           "another CA's": (out / "node-n1.pem", (other / "node-n1.pem").read_bytes()),
           "another key": (out / "node-n1.key", (other / "node-n1.key").read_bytes())}
    expected = {"garbage": "node-n1.pem or .* is not a PEM certificate",
                "another CA's": "node-n1.pem was not issued by the CA",
                "another key": "node-n1.key is not the key of .*node-n1.pem"}
    for what, (path, data) in bad.items():
        kept = path.read_bytes()
        replace_file(path, data)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="raftkv.security.tls_files"):
            for _ in range(3):
                tls.refresh()
        assert tls.files.current is renewed, what
        assert len(caplog.records) == 1 and re.search(expected[what], caplog.text), (what, caplog.text)
        assert "still serving with the certificate that expires on" in caplog.text
        replace_file(path, kept)
        tls.refresh()
        assert tls.files.current.serial == renewed.serial and tls.files.current is not renewed, what
        renewed = tls.files.current
    assert (out / "node-n1.pem").read_bytes() == good

    aside = out / "node-n1.pem.bak"  # the file in use moved aside, a bad one written, the first moved back
    os.replace(out / "node-n1.pem", aside)
    (out / "node-n1.pem").write_bytes(b"not a certificate")
    tls.refresh()
    assert REGISTRY.get_sample_value("raftkv_tls_files_refused") == 1
    os.replace(aside, out / "node-n1.pem")
    tls.refresh()
    assert REGISTRY.get_sample_value("raftkv_tls_files_refused") == 0 and tls.files.current is renewed


def test_while_the_ca_changes_either_cas_certificates_pass_and_are_taken_up(tmp_path):
    """docs/operations.md's CA change: every host's ca.pem holds the old and the new CA, then the new
    certificates come; each step is taken up by `refresh`, and old and new shake hands both ways."""
    old, new = tmp_path / "old", tmp_path / "new"
    init_certs(old, None, ["ann"], 30, [("n1", "127.0.0.1")])
    init_certs(new, None, [], 30, [("n1", "127.0.0.1")])
    node, ann = _node_tls(old), Tls(old / "ca.pem", old / "user-ann.pem", old / "user-ann.key")
    node.check()
    replace_file(old / "ca.pem", (old / "ca.pem").read_bytes() + (new / "ca.pem").read_bytes())
    for name in ("node-n1.key", "node-n1.pem"):
        replace_file(old / name, (new / name).read_bytes())
    node.refresh()
    assert (node.files.current.serial, node.generation) == (_serial(new / "node-n1.pem"), 2)
    assert asyncio.run(_handshake(node, ann)) == (_serial(new / "node-n1.pem"), _serial(old / "user-ann.pem"))


async def _handshake(server: Tls, client: Tls) -> tuple[int, int]:
    """(the serial the server presented, the one the client presented), over a real mutual-TLS connection."""
    seen = asyncio.get_running_loop().create_future()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.set_result(x509.load_der_x509_certificate(writer.get_extra_info("ssl_object").getpeercert(True)))
        writer.close()

    listening = await asyncio.start_server(accept, "127.0.0.1", 0, ssl=server.server_context())
    port = listening.sockets[0].getsockname()[1]
    async with listening:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client.client_context(),
                                                  server_hostname="127.0.0.1")
        presented = x509.load_der_x509_certificate(writer.get_extra_info("ssl_object").getpeercert(True))
        writer.write(b"x")  # TLS 1.3: the server checks the client's certificate once it reads
        received = await asyncio.wait_for(seen, 5)
        writer.close()
    return presented.serial_number, received.serial_number
