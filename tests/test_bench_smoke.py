"""Smoke test of the benchmark harness (scripts/bench.py), raftkv side only: no etcd needed."""

from __future__ import annotations

import io
import sys
from collections import defaultdict
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench  # noqa: E402
from bench_clusters import raftkv_cluster  # noqa: E402
from bench_load import Figures  # noqa: E402

TINY = bench.Config(processes=2, in_flight=8, duration=1.0, warmup=0.2, batch=5, keys=1000, partitions=2)


def test_raftkv_scenarios_report_sane_figures(tmp_path: Path):
    with raftkv_cluster(tmp_path, TINY.partitions) as cluster:
        for name in ("seq_put", "put", "get_linearizable", "batch"):
            figures = bench.run_scenario(name, "raftkv", cluster, TINY)
            assert figures.errors == 0, f"{name}: {figures.first_error}"
            assert figures.ops > 0, name
            assert 0 < figures.p50_ms <= figures.p99_ms, name


def test_every_row_of_the_table_is_evaluated_and_printed():
    """Found when the layout change renamed `raftkv.errors` (a local Figures) to `raftkv.core.errors`:
    the measuring worked and the final table raised."""
    config = bench.Config()
    figures = Figures(ops=100, ops_per_s=50.0, p50_ms=2.0, p99_ms=4.0, errors=0, first_error="", client_cpu=0.5,
                      server_cpu=1.0, other_cpu=0.1)
    results: dict = {}
    for row in bench.rows(config):
        for (phase, name), system in ((row.raftkv, "raftkv"), (row.etcd, "etcd")):
            results.setdefault(phase, {}).setdefault(system, {})[name] = figures
    evaluated = [bench.evaluate(row, results, config) for row in bench.rows(config)]
    assert all(e["ratio"] == 1.0 and e["errors"] == {"raftkv": 0, "etcd": 0} for e in evaluated)
    Console(file=io.StringIO()).print(bench.table(evaluated, defaultdict(lambda: 1.0), config))
