"""Whether the node engine carried the run (`--raft-engine steady`): a run whose groups never left
the Raft library's own path would prove nothing about the engine (docs/raft-engine.md)."""

from __future__ import annotations

from raftkv.core.spec import ClusterSpec
from raftkv.dev.metrics_scrape import samples


def engine_counts(spec: ClusterSpec, timeout: float = 5.0) -> dict[str, tuple[float, float]]:
    """Each answering node's groups taken by its engine and engine frames it sent, since it last started."""
    counts = {}
    for node in spec.nodes:
        try:
            served = samples(f"{node.host}:{node.metrics_port}", timeout)
        except OSError:
            continue
        counts[node.id] = (
            sum(s.value for s in served if s.name == "raftkv_engine_handovers_total" and s.labels["kind"] != "handback"),
            sum(s.value for s in served if s.name == "raftkv_engine_frames_total" and s.labels["direction"] == "sent"))
    return counts
