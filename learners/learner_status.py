"""The partitions a running learner feeds no events from, and why: a small file in its folder.

Progress travels through the partitions' Raft logs; a partition not flowing is
local news, so the learner process writes it here and `raftkv learner list`,
run with the same spec on the learner's host, reads it. A partition is either
stopped (the sink refused one of its events for good; it is tried again later,
learners/feed_pump.py) or re-syncing (its log contradicted its copy,
learners/partition_heal.py). A learner clears the file at start.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

FILE_NAME = "stopped.json"
STATES = ("stopped", "resyncing")


def write(folder: Path, stopped: dict[int, str], resyncing: dict[int, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (FILE_NAME + ".tmp")
    tmp.write_text(json.dumps({state: {str(p): why for p, why in sorted(partitions.items())}
                               for state, partitions in zip(STATES, (stopped, resyncing))}))
    os.replace(tmp, folder / FILE_NAME)


def read(folder: Path) -> dict[int, tuple[str, str]]:
    """Partition -> (its state, "stopped" or "resyncing", and why); {} when every partition flows or no
    learner ran here."""
    try:
        doc = json.loads((folder / FILE_NAME).read_text())
        return {int(p): (state, str(why)) for state in STATES for p, why in doc.get(state, {}).items()}
    except (OSError, ValueError, AttributeError):
        return {}
