"""When a voter compacts its Raft log. Pure.

pysyncobj always compacts up to its last applied entry, and a learner needs
every entry after its delivered index. A learner that is connected and keeps
up receives entries as they are appended, so compacting behind it is
harmless, but its reported progress always lags a little: it reports once a
second. So compaction waits only for learners that fell more than
`compaction_min_entries` behind (stopped, or slow), and only until the
journal passes the retention bound. Past that the learner re-syncs through a
snapshot, which it reports as op="r" events: never a silent gap.
"""

from __future__ import annotations

from typing import Iterable

from raftkv.spec import Tuning


def compaction_due(
    *,
    entries: int,
    size_bytes: int,
    seconds_since_last: float,
    applied: int,
    learner_progress: Iterable[int],
    tuning: Tuning,
) -> bool:
    wanted = entries > tuning.compaction_min_entries or (
        seconds_since_last > tuning.compaction_min_seconds and entries > 2
    )
    if not wanted:
        return False
    lagging = [p for p in learner_progress if p < applied - tuning.compaction_min_entries]
    if not lagging:
        return True
    return entries > tuning.learner_retention_entries or size_bytes > tuning.learner_retention_bytes
