"""retention: when a voter may compact its log (compaction_due), and what it keeps for seeds (kept_for_seeds)."""

from __future__ import annotations

from raftkv.core.retention import compaction_due, kept_for_seeds
from raftkv.core.spec import Tuning

TUNING = Tuning(compaction_min_entries=100, learner_retention_entries=1000, learner_retention_bytes=10**9,
                seed_retention_bytes=10**6)


def due(entries=150, applied=500, progress=(), streaming=0, size_bytes=0, seconds=0.0) -> bool:
    return compaction_due(entries=entries, size_bytes=size_bytes, seconds_since_last=seconds, applied=applied,
                          learner_progress=progress, learners_streaming=streaming, tuning=TUNING)


def test_compacts_when_the_log_is_long_enough_big_enough_or_old_enough():
    assert due(entries=101) and not due(entries=100)
    assert due(entries=3, size_bytes=TUNING.compaction_min_bytes + 1) and not due(entries=3, size_bytes=10**6)
    assert due(entries=3, seconds=TUNING.compaction_min_seconds + 1) and not due(entries=2, seconds=10**6)


def test_a_learner_that_has_everything_does_not_hold_compaction():
    assert due(progress=[499]) and due(progress=[500])


def test_a_learner_behind_holds_compaction_unless_the_leader_sees_it_streaming():
    assert not due(progress=[480])  # 20 behind, not connected: it needs 481..499
    assert due(progress=[480], streaming=1)  # connected and caught up: it has them already
    assert not due(progress=[480, 10], streaming=1)  # one of the two is really behind


def test_past_the_retention_bound_compaction_goes_ahead_anyway():
    assert due(entries=1001, progress=[10])
    assert due(entries=150, progress=[10], size_bytes=10**9 + 1)


def kept(backup_index=300, in_log=True, applied=500, bytes_after=0) -> int:
    return kept_for_seeds(backup_index=backup_index, in_log=in_log, applied=applied, bytes_after=bytes_after,
                          tuning=TUNING)


def test_a_compaction_keeps_the_log_after_the_newest_backup_copy():
    assert kept() == 300


def test_nothing_is_kept_without_a_copy_in_the_log_or_past_the_retention_bounds():
    assert kept(backup_index=0) == 0
    assert kept(in_log=False) == 0  # compacted past it already: a seed needs a snapshot anyway
    assert kept(backup_index=500) == 0 and kept(backup_index=499) == 499  # nothing after it to keep
    assert kept(applied=300 + TUNING.learner_retention_entries + 1) == 0
    assert kept(bytes_after=TUNING.seed_retention_bytes + 1) == 0
