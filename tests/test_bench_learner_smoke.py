"""Smoke test of the learner benchmark (scripts/bench_learner.py), raftkv side only: no etcd needed."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench_learner  # noqa: E402

RATE = 300
TINY = bench_learner.Config(keys=3000, partitions=2, chunk=50, load_in_flight=16, rates=str(RATE), duration=1.0,
                            warmup=0.3, timeout=30.0, writer_rate=200)  # two writer processes


def test_raftkv_catch_up_and_feed_lag_report_sane_figures(tmp_path: Path):
    catch_up, lags = bench_learner.measure_raftkv(TINY, tmp_path, Console(quiet=True))

    assert catch_up.load_s > 0
    assert catch_up.target_index >= TINY.partitions  # at least the load and the registration in each
    assert 0 < catch_up.serving_s <= catch_up.caught_up_s < TINY.timeout  # nan (never caught up) fails too
    assert catch_up.keys_on_learner == TINY.keys  # every loaded key reached the changelog, once
    assert catch_up.cores.servers > 0 and catch_up.cores.learner > 0

    [lag] = lags
    assert lag.rate == RATE and lag.writers == 2
    assert lag.errors == 0, lag.first_error
    assert lag.skipped == 0
    assert lag.missing == 0  # every acknowledged write of the window was read from the feed
    assert 0.9 * RATE <= lag.achieved <= 1.1 * RATE
    assert lag.events >= 0.9 * RATE * TINY.duration
    assert 0 < lag.p50_ms <= lag.p99_ms <= lag.max_ms < 5000  # positive: seen after it was sent
    assert 0 < lag.put_p50_ms <= lag.put_p99_ms

    printed = Console(file=io.StringIO(), width=160)  # the figures make the report's table, etcd skipped
    printed.print(bench_learner.table(catch_up, None, lags, TINY, "n/a"))
    assert "feed lag" in printed.file.getvalue()
