"""A learner's partition whose Raft log contradicts its copy re-syncs in place; the others flow on.

The contradiction (`LogContradiction`) means the log was rewound and refilled
with other entries: a power cut of the whole cluster in lose-last-second mode
lost entries this learner had already delivered. A node stops on it; a learner
need not, because its copy is still exactly what its sink has (the pump writes
it only after the sink flushed), and so it is the base a re-sync diffs from:

1. the partition's folder (copy, log, snapshots) is set aside as
   `pNNNN.contradicted`, and the replica starts over in a fresh `pNNNN`, as a
   learner joining the group would;
2. the pump rebuilds the copy from what the leader sends (a snapshot,
   entries) and delivers none of it, until the copy is past what the sink has
   and holds every entry the group committed;
3. then it delivers the difference between the copy set aside and the rebuilt
   one as one re-sync (`r` and `d` events at the rebuilt copy's index, whose
   `resyncs` base is the index of the copy set aside), and drops the folder set
   aside.

A learner stopped meanwhile resumes at step 2: the folder set aside says so.
One stopped after the delivery and before the drop finds its sink at the
rebuilt copy's index, past the copy set aside, and only drops it. Follower reads
of the partition meanwhile see the rebuilt copy, a state the cluster had.
"""

from __future__ import annotations

import shutil
from pathlib import Path

ASIDE_SUFFIX = ".contradicted"
_REMOVING_SUFFIX = ".removing"


def aside_of(folder: Path) -> Path:
    return folder.with_name(folder.name + ASIDE_SUFFIX)


def set_aside(folder: Path) -> Path:
    """Move the partition's closed `folder` aside, or, when one is aside already (its log contradicted
    the copy again while it was rebuilt), drop it: the sink still has what the first one holds."""
    aside = aside_of(folder)
    if aside.exists():
        discard(folder)
    else:
        folder.rename(aside)
    return aside


def discard(folder: Path) -> None:
    """Remove `folder`; renamed first, so a crash part-way never leaves a half-removed database where
    one is looked for (`remove_leftovers` ends the removal)."""
    removing = folder.with_name(folder.name + _REMOVING_SUFFIX)
    folder.rename(removing)
    shutil.rmtree(removing)


def remove_leftovers(folder: Path) -> None:
    """At start: the removals a crash cut short."""
    for removing in folder.glob("*" + _REMOVING_SUFFIX):
        shutil.rmtree(removing)
