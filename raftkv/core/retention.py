"""When a voter compacts its Raft log. Pure.

A Raft group always compacts up to its last applied entry, and a learner needs
every entry after its delivered index. A learner that is connected and keeps
up has already received those entries into its own journal, so compacting
behind it is harmless, even though its reported progress always lags a
little (it reports once a second). Reported progress cannot tell such a
learner from one that just died, but the leader can: it sees which readonly
replicas are connected and how far each has received (`learners_streaming`
counts those that hold everything up to the last applied entry).

So compaction waits while more learners are behind than are streaming, and
only until the journal passes the retention bound. Past that a stopped
learner re-syncs through a snapshot, which it reports as op="r" events:
never a silent gap. Followers see no readonly replicas (only the leader
sends to them), so they hold the log for any learner that is behind.
A move's target that is being copied or catching up counts as one more
learner behind (`PartitionReplica.maybe_compact`): it starts from a voter's
checkpoint and needs the entries after it.

A compaction also keeps the entries after the newest backup's copy of the
partition (`kept_for_seeds`), up to `learner_retention_entries` and
`seed_retention_bytes` (the log is held in memory, on every replica of every
partition): a new replica seeded from that copy then catches up from the log
instead of a snapshot (docs/elasticity.md §5).
"""

from __future__ import annotations

from typing import Iterable

from raftkv.core.spec import Tuning


def compaction_wanted(*, entries: int, size_bytes: int, seconds_since_last: float, tuning: Tuning) -> bool:
    """Whether the log is long, big or old enough to compact, learners aside: the check a replica makes
    first, once a second, before it reads its learners' progress. The bytes matter as much as the
    entries: the log is held in memory, and 5,000 entries of large `put_many`s were half a gigabyte."""
    return (entries > tuning.compaction_min_entries or size_bytes > tuning.compaction_min_bytes
            or (seconds_since_last > tuning.compaction_min_seconds and entries > 2))


def compaction_due(
    *,
    entries: int,
    size_bytes: int,
    seconds_since_last: float,
    applied: int,
    learner_progress: Iterable[int],
    learners_streaming: int,
    tuning: Tuning,
) -> bool:
    if not compaction_wanted(entries=entries, size_bytes=size_bytes, seconds_since_last=seconds_since_last,
                             tuning=tuning):
        return False
    behind = sum(1 for p in learner_progress if p < applied - 1)
    if behind <= learners_streaming:
        return True
    return entries > tuning.learner_retention_entries or size_bytes > tuning.learner_retention_bytes


def kept_for_seeds(*, backup_index: int, in_log: bool, applied: int, bytes_after: int, tuning: Tuning) -> int:
    """The first entry a compaction keeps for replicas seeded from the backup copy at `backup_index`,
    or 0 (compact as usual): no copy, the log no longer holds its entry (`in_log`), or the entries
    after it pass the bounds (a busy partition then seeds from a voter's checkpoint instead)."""
    if not (in_log and 0 < backup_index < applied):
        return 0
    if applied - backup_index > tuning.learner_retention_entries or bytes_after > tuning.seed_retention_bytes:
        return 0
    return backup_index
