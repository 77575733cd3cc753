"""Smoke test of the replica-move benchmark (scripts/bench_move.py), raftkv side only: no etcd needed."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench_move  # noqa: E402
from bench_learner_config import Config  # noqa: E402

RATE = 300


def test_a_move_under_paced_writes_reports_sane_figures(tmp_path: Path):
    moved = bench_move.raftkv_move(tmp_path, Config(keys=3000, chunk=50, load_in_flight=16, timeout=30.0), RATE,
                                   before=1.0, console=Console(quiet=True))
    assert moved.system == "raftkv" and moved.keys == 3000 and moved.load_s > 0
    assert moved.size_mb > 0.3  # 3,000 values of 100 bytes, at least
    assert 0 < moved.move_s < 60 and moved.mb_s > 0
    assert moved.errors == 0
    assert moved.writes >= 0.8 * RATE * (1.0 + moved.move_s)
    assert 0 < moved.p99_before_ms < 5000 and 0 < moved.p99_during_ms < 5000
