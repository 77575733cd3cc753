"""A real S3 endpoint for tests: moto's standalone server as a subprocess on loopback.

    with s3_server(bucket="backups") as endpoint:   # http://127.0.0.1:<port>
        ...

Only the PID started here is ever signalled. Callers set fake AWS
credentials in their own environment (the server accepts any).
"""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import boto3

from raftkv.dev.local_cluster import free_port_block
from tests.conftest import wait_until


def _answers(endpoint: str) -> bool:
    try:
        urllib.request.urlopen(endpoint + "/", timeout=1).close()
    except urllib.error.HTTPError:
        pass  # any HTTP reply means the server is up; a refused connection raises and is retried
    return True


@contextmanager
def s3_server(bucket: str, log_path: Path, port: int | None = None) -> Iterator[str]:
    """Run moto on `port` (default: a free one) with `bucket` created; yield its endpoint URL."""
    port = port or free_port_block(1)
    endpoint = f"http://127.0.0.1:{port}"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: proc.poll() is None and _answers(endpoint), 30,
                   f"moto S3 server on {endpoint} (log: {log_path})")
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
