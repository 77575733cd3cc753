"""Whether the node engine carried the run (`--raft-engine steady`): a run whose groups never left
the Raft library's own path would prove nothing about the engine (docs/raft-engine.md)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from raftkv.core.spec import ClusterSpec


def engine_counts(spec: ClusterSpec, timeout: float = 5.0) -> dict[str, tuple[float, float]]:
    """Each answering node's groups taken by its engine and engine frames it sent, since it last started."""
    counts = {}
    for node in spec.nodes:
        try:
            with urllib.request.urlopen(f"http://{node.host}:{node.metrics_port}/metrics", timeout=timeout) as r:
                text = r.read().decode()
        except OSError:
            continue
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
        counts[node.id] = (
            sum(s.value for s in samples if s.name == "raftkv_engine_handovers_total" and s.labels["kind"] != "handback"),
            sum(s.value for s in samples if s.name == "raftkv_engine_frames_total" and s.labels["direction"] == "sent"))
    return counts
