"""A process's Prometheus samples, read from its metrics port (plain HTTP), for scripts and checks."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def samples(address: str, timeout: float = 10.0) -> list[Sample]:
    """Every sample `host:port/metrics` serves; OSError if it does not answer."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as answer:
        text = answer.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]
