"""A replica seeded from a checkpoint taken elsewhere: a backup, or another replica's files.

`seed` writes the checkpoint into the replica's folder as the snapshot file pysyncobj
loads at start-up, so the replica starts as if it had just installed that snapshot
from the leader: its state is the checkpoint's, its log ends at the checkpoint's
entry, and the leader sends it only the entries after that one. If the leader's log
no longer holds them (it compacted past the checkpoint), the leader sends its own
snapshot instead: a stale seed costs the saving, never correctness.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from raftkv.raft import snapshot_file
from raftkv.raft.journal import fsync_directory
from raftkv.raft.syncobj_group import SNAPSHOT_FILE
from raftkv.storage.engine import Position

_NO_OP = bytes([1])  # pysyncobj's _COMMAND_TYPE.NO_OP entry: applying it does nothing


def seed(folder: Path, partition: int, checkpoint: Path, position: Position, members: Iterable[str]) -> None:
    """Make `folder` a replica of `partition` whose state is `checkpoint`, the state after entry `position`.

    `position.term` must be the term of entry `position.index` in the group's log: the leader's
    first append is checked against it. pysyncobj's log base also holds the entry before, whose
    term a checkpoint does not record; it gets the same term. Only a leader of that term appends
    entries of it, so a member whose entry there has that term holds the same entry, and any
    other member answers "mismatch", which makes a leader send its snapshot.
    """
    if folder.exists() and any(folder.iterdir()):
        raise FileExistsError(f"{folder} is not empty: a replica is seeded into an empty folder only")
    folder.mkdir(parents=True, exist_ok=True)
    meta = snapshot_file.Meta(
        partition=partition,
        position=position,
        last_entry=(_NO_OP, position.index, position.term),
        prev_entry=(_NO_OP, position.index - 1, position.term),
        cluster=sorted(members),
    )
    partial = folder / f"{SNAPSHOT_FILE}.seed"  # a crash mid-write leaves no damaged snapshot to refuse
    snapshot_file.write(partial, checkpoint, meta, fsync=True)
    os.replace(partial, folder / SNAPSHOT_FILE)
    fsync_directory(folder)
