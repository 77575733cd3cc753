"""Which lost writes a power cut explains, in lose-last-second durability mode. Pure.

In that mode each replica syncs its Raft log once a second, so a power cut of every
node may take the writes acknowledged in about the last second before it (docs/durability.md).
The set workload names exactly which acknowledged adds were lost; each must have been
acknowledged at most LOSS_BOUND_SECONDS before a cut began (or while its nodes were being
killed). A lost add that no cut explains is a violation like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from raftkv.chaos.history import Op

LOSS_BOUND_SECONDS = 1.5  # the sync interval, and the tick that runs it late under load


@dataclass(frozen=True)
class Cut:
    start: float  # time.monotonic() when the nodes began to be killed
    end: float  # when they were started again


@dataclass(frozen=True)
class PowerCutLosses:
    explained: tuple[Op, ...]  # lost adds acknowledged within the bound before a cut
    unexplained: tuple[Op, ...]
    worst_seconds: float  # the longest time from such an add's acknowledgement to its cut

    def summary(self) -> str:
        return (f"{len(self.explained)} acknowledged adds lost to power cuts, each acknowledged at most "
                f"{self.worst_seconds:.2f}s before its cut (bound {LOSS_BOUND_SECONDS:.1f}s)")


def explain_losses(lost: Iterable[Op], cuts: Sequence[Cut], bound: float = LOSS_BOUND_SECONDS) -> PowerCutLosses:
    explained, unexplained, worst = [], [], 0.0
    for op in lost:
        acknowledged = op.complete / 1e9
        before = [cut.start - acknowledged for cut in cuts if cut.start - bound <= acknowledged <= cut.end]
        if before:
            explained.append(op)
            worst = max(worst, max(0.0, min(before)))
        else:
            unexplained.append(op)
    return PowerCutLosses(tuple(explained), tuple(unexplained), worst)
