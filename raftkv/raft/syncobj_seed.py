"""A replica seeded from a checkpoint taken elsewhere: a backup, or another replica's files.

The checkpoint becomes the replica's database where it lies, with no copy: `seed` turns a staging
folder holding it (`<staging>/db`) into the replica's folder, beside a snapshot file that holds
only the position and the log's base (`snapshot_file.write_head`). The replica starts as if it
had just installed that snapshot from the leader: its state is the checkpoint's, its log ends at
the checkpoint's entry (and the one before, both copied from a member's log), and the leader sends
it only the entries after that one. If the leader's log no longer holds them (it compacted past
the checkpoint), the leader sends its own snapshot instead: a stale seed costs the saving, never
correctness.

The snapshot file names a checkpoint of the seed too (`snapshot-seed/db`: the table files hard-linked,
the few others copied), as a compaction's does. The live database moves on from the seed, and a
power cut in lose-last-second mode may leave it durable past the log's synced end (any memtable
flush does it, and the first compaction's checkpoint): the replica then rolls back to that
checkpoint and applies its log again (`StateRepair.after_load`). A seed of 0.2 named none, and a
node stopped on it for good ("not where its seed left it", a soak hour; docs/chaos.md).

A crash leaves the old state or the new one (docs/elasticity.md, "One copy"): everything is
written and synced in the staging folder, which one rename makes the replica's folder. A staging
folder found at start-up is deleted (`HostedReplicas.start`): the replica's folder is then still
empty, and the copy starts again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

from raftkv import failpoints
from raftkv.raft import snapshot_file
from raftkv.core.durable import fsync_directory, fsync_tree
from raftkv.raft.syncobj_snapshots import SNAPSHOT_FILE
from raftkv.raft.syncobj_patches import LogEntry
from raftkv.storage.engine import Position
from raftkv.storage.rocks_files import link_checkpoint

DATABASE = "db"  # in a staging folder, and in a replica's folder (`RocksEngine`)
SEED_CHECKPOINT = snapshot_file.KEPT_PREFIX + "seed"  # beside it: what the replica rolls back to


def base_problem(position: Position, base: Sequence[LogEntry]) -> str | None:
    """Why `base` cannot start the log of a replica seeded at `position`; None if it can."""
    if len(base) != 2:
        return "a seed's base must be two log entries (the checkpoint came without them)"
    prev, last = base
    if prev[1] != last[1] - 1 or last[1] < position.index:
        return f"a seed's base must be two consecutive entries at or after {position.index}, not {prev[1]} and {last[1]}"
    return None


def seed(staging: Path, folder: Path, partition: int, position: Position, base: tuple[LogEntry, LogEntry],
         members: Iterable[str]) -> None:
    """Make `folder` (absent or empty) a replica of `partition` whose database is the checkpoint in
    `staging/db`, moved there, never copied: the state after entry `position` (what the checkpoint's
    database records), and so after entry `base[1]` too. `staging` is gone afterwards; it must be on
    `folder`'s file system, beside it.

    `base` is two consecutive entries of the group's log, as a member's log holds them, the last
    at or after `position` with nothing between that changes the state. pysyncobj keeps them as
    the log's first two entries, and a leader sends entries from its log whenever a follower's
    next index is past the first: made-up entries there would reach a follower that stopped just
    before them, in place of the real ones, if this replica ever leads.
    """
    problem = base_problem(position, base)
    if problem is not None:
        raise ValueError(problem)
    prev, last = base
    if folder.exists() and any(folder.iterdir()):
        raise FileExistsError(f"{folder} is not empty: a replica is seeded into an empty folder only")
    link_checkpoint(staging / DATABASE, staging / SEED_CHECKPOINT / DATABASE)
    meta = snapshot_file.Meta(partition=partition, position=position, last_entry=last, prev_entry=prev,
                              cluster=sorted(members), in_place=True, checkpoint=SEED_CHECKPOINT)
    snapshot_file.write_head(staging / SNAPSHOT_FILE, meta)
    fsync_tree(staging)  # the files were streamed or downloaded, never synced
    failpoints.hit("seed-rename-before")
    os.replace(staging, folder)  # over an empty folder too: one rename, so a crash leaves all or nothing
    failpoints.hit("seed-rename-after")
    fsync_directory(folder.parent)
