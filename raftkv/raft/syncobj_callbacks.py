"""Proposals' callbacks that pysyncobj would lose when a write raises (a full disk).

pysyncobj takes a proposal off its queue and then appends it to the log, and takes an entry's
waiting proposals off their table and then applies the entry. When the append or the apply raises
(StorageFull: the tick is tried again once there is room), what it took is gone: no callback ever
runs, and the leader's group commit waited its whole request timeout for an answer, holding every
later write and read barrier of the partition behind it (docs/pysyncobj.md).

Each holder remembers what pysyncobj last took from it; `_Member` (syncobj_group.py) refuses or puts
back what a raising tick lost.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from pysyncobj.fast_queue import FastQueue


class Proposals(FastQueue):
    """pysyncobj's queue of proposals, `(command, callback)`. `taken`: the one its loop took last; `_Member`
    clears it when the loop ends, so a loop that raised (only the leader's append can) leaves it set."""

    def __init__(self, max_size: int):
        super().__init__(max_size)
        self.taken: tuple[bytes, Any] | None = None

    def get_nowait(self):
        self.taken = super().get_nowait()
        return self.taken


class Waiting(defaultdict):
    """pysyncobj's proposals waiting for their entry to apply, by log index; `taken`: the
    `(index, [(term, callback), ...])` its apply step took for an entry whose apply has not returned
    (`_Member` clears it when one does: the callbacks run after it)."""

    def __init__(self):
        super().__init__(list)
        self.taken: tuple[int, list] | None = None

    def pop(self, index, *default):
        self.taken = index, super().pop(index, *default)
        return self.taken[1]


def unappended(proposals: Proposals, last_command: bytes | None) -> tuple[bytes, Any] | None:
    """After the loop over queued proposals raised: the proposal it took last, unless the log's last entry
    is it, was never appended and never will be."""
    taken, proposals.taken = proposals.taken, None
    if taken is None or taken[0] is last_command:
        return None
    return taken


def keep_unapplied(waiting: Waiting, last_applied: int) -> None:
    """After an apply step raised: the entry it took the waiting proposals of was not applied, so they wait
    for its next try."""
    if waiting.taken is None:
        return
    (index, subscribers), waiting.taken = waiting.taken, None
    if index > last_applied and subscribers:  # (pysyncobj counts an entry applied after its callbacks)
        waiting[index] = subscribers + waiting.get(index, [])
