"""Smoke test of the benchmark harness (scripts/bench.py), raftkv side only: no etcd needed."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench  # noqa: E402
from bench_clusters import raftkv_cluster  # noqa: E402

TINY = bench.Config(processes=2, in_flight=8, duration=1.0, warmup=0.2, batch=5, keys=1000, partitions=2)


def test_raftkv_scenarios_report_sane_figures(tmp_path: Path):
    with raftkv_cluster(tmp_path, TINY.partitions) as cluster:
        for name in ("seq_put", "put", "get_linearizable", "batch"):
            figures = bench.run_scenario(name, "raftkv", cluster, TINY)
            assert figures.errors == 0, f"{name}: {figures.first_error}"
            assert figures.ops > 0, name
            assert 0 < figures.p50_ms <= figures.p99_ms, name
