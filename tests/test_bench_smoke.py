"""Smoke test of the benchmark harness (scripts/bench.py), raftkv side only: no etcd needed."""

from __future__ import annotations

import io
import sys
from collections import defaultdict
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench  # noqa: E402
import bench_steps  # noqa: E402
from bench_clusters import raftkv_cluster  # noqa: E402
from bench_load import Figures, fill  # noqa: E402

from tests.conftest import wait_until  # noqa: E402

TINY = bench.Config(processes=2, in_flight=8, duration=1.0, warmup=0.2, batch=5, keys=1000, partitions=2)
FIGURES = Figures(ops=100, ops_per_s=50.0, p50_ms=2.0, p99_ms=4.0, errors=0, first_error="", client_cpu=0.5,
                  server_cpu=1.0, other_cpu=0.1)


def test_raftkv_scenarios_report_sane_figures(tmp_path: Path):
    """The counters in the proportions pysyncobj's own replication implies (the node engine's frames carry
    many entries each: bench_steps.py measures both)."""
    with raftkv_cluster(tmp_path, TINY.partitions, raft_engine="off") as cluster:
        before = bench_steps.scrape(cluster.metrics)
        _assert_sane(cluster, "raftkv", ("seq_put", "put", "get_linearizable", "batch"))
        # A follower applies the last entries once a heartbeat tells it their commit (CI: 3 of 17,565
        # applies were still to come when the counters were read at once).
        steps = wait_until(lambda: _applied_on_every_replica(bench_steps.scrape(cluster.metrics) - before), 10,
                           "every replica to apply every entry")
    entries = steps[bench_steps.ENTRIES]  # bench_steps.py's counters moved, in the proportions Raft implies
    assert steps[bench_steps.PUTS] > entries > 0
    # A loop turn writes every group's records of the node in one write, and a leader appends at most one
    # entry of its group a turn (one batch in flight): at least one write per entry per partition.
    assert steps["raftkv_journal_writes_total"] >= entries / TINY.partitions
    assert steps["raftkv_apply_seconds_count"] >= 3 * entries
    assert steps["raftkv_raft_messages_total"] >= 4 * entries  # an append and its answer to each follower
    assert steps["raftkv_raft_ticks_total"] > 0 and 0 < steps["raftkv_raft_socket_writes_total"] <= steps[
        "raftkv_raft_messages_total"]


def _applied_on_every_replica(steps):
    return steps if steps["raftkv_apply_seconds_count"] >= 3 * steps[bench_steps.ENTRIES] else None


def test_raftkv_with_tls_reports_sane_figures(tmp_path: Path):
    """As --tls drives it: mutual TLS, the clients being the user admin of a cluster that checks permissions."""
    with raftkv_cluster(tmp_path, TINY.partitions, tls=True) as cluster:
        assert cluster.tls is not None
        fill("raftkv", cluster.endpoints, TINY.keys, cluster.tls)
        _assert_sane(cluster, "raftkv", bench.TLS_SCENARIOS)


def _assert_sane(cluster, system: str, names) -> None:
    for name in names:
        figures = bench.run_scenario(name, system, cluster, TINY)
        assert figures.errors == 0, f"{name}: {figures.first_error}"
        assert figures.ops > 0, name
        assert 0 < figures.p50_ms <= figures.p99_ms, name


def test_every_row_of_the_table_is_evaluated_and_printed():
    """Found when the layout change renamed `raftkv.errors` (a local Figures) to `raftkv.core.errors`:
    the measuring worked and the final table raised."""
    config = bench.Config()
    results: dict = {}
    for row in bench.rows(config):
        for (phase, name), system in ((row.raftkv, "raftkv"), (row.etcd, "etcd")):
            results.setdefault(phase, {}).setdefault(system, {})[name] = FIGURES
    evaluated = [bench.evaluate(row, results, config) for row in bench.rows(config)]
    assert all(e["ratio"] == 1.0 and e["errors"] == {"raftkv": 0, "etcd": 0} for e in evaluated)
    Console(file=io.StringIO()).print(bench.table(evaluated, defaultdict(lambda: 1.0), config))


def test_every_row_of_the_tls_table_is_evaluated_and_printed():
    config = bench.Config()
    results = {phase: {system: dict.fromkeys(bench.TLS_SCENARIOS, FIGURES) for system in ("raftkv", "etcd")}
               for phase in bench.TLS_PHASES}
    evaluated = [bench.tls_cost(row, results, config) for row in bench.tls_rows(config)]
    assert [e["label"] for e in evaluated] == [
        "sequential put p50 (ms)", "sequential put p99 (ms)", "concurrent put ops/s", "concurrent put p99 (ms)",
        "linearizable get ops/s", "linearizable get p99 (ms)"]
    assert all(e["tls_ratio"] == {"raftkv": 1.0, "etcd": 1.0} and e["met"] for e in evaluated)
    Console(file=io.StringIO()).print(bench.tls_table(evaluated, config))
