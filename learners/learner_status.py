"""The partitions a running learner stopped feeding, and why: a small file in its folder.

Progress travels through the partitions' Raft logs; a stopped partition is
local news (the sink refused one of its events for good, learners/feed_pump.py),
so the learner process writes it here and `raftkv learner list`, run with the
same spec on the learner's host, reads it. A learner clears it at start.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

FILE_NAME = "stopped.json"


def write(folder: Path, stopped: dict[int, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (FILE_NAME + ".tmp")
    tmp.write_text(json.dumps({str(p): why for p, why in sorted(stopped.items())}))
    os.replace(tmp, folder / FILE_NAME)


def read(folder: Path) -> dict[int, str]:
    """Partition -> why it stopped; {} when nothing stopped or no learner ran here."""
    try:
        return {int(p): why for p, why in json.loads((folder / FILE_NAME).read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}
