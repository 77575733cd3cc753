"""Smoke test of the replica-move benchmark (scripts/bench_move.py), raftkv side only: no etcd needed."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
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
    assert set(moved.slow) == {"before", "during", "at_leader_checkpoints", "leader_checkpoints"}
    assert len(moved.samples["writes"]) == moved.writes
    assert moved.samples["move_started"] < moved.samples["move_ended"]


def test_the_leaders_checkpoints_are_read_from_rocksdbs_log_in_local_time(tmp_path: Path):
    log = tmp_path / "LOG"
    log.write_text("2026/11/29-05:58:33.853580 140554405202816 [utilities/checkpoint/checkpoint_impl.cc:112] Started "
                   "the snapshot process -- creating snapshot in directory /x/\n"
                   "2026/11/29-05:58:33.860448 1405 [db/flush_job.cc:1094] [default] [JOB 17] Flush lasted 6012 µs\n")
    expected = time.mktime((2026, 11, 29, 5, 58, 33, 0, 0, -1)) + 0.85358
    assert bench_move._checkpoint_times(log) == [pytest.approx(expected)]
    slow = bench_move._slow_writes([10.0, 10.5, 11.0, 12.0], [30.0, 2.0, 40.0, 90.0], [10.95], warm=9.0,
                                   started=11.5, ended=13.0)
    assert slow == {"before": 2, "during": 1, "at_leader_checkpoints": 1, "leader_checkpoints": 1}
