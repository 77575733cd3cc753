"""The part of a state machine every engine-backed group shares: where the state stands,
checkpoints for snapshots, and installing a snapshot a leader sent."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from raftkv.raft import snapshot_file
from raftkv.raft.group import Snapshot
from raftkv.storage.engine import Position, ReplicaEngine

log = logging.getLogger(__name__)


def install(engine: ReplicaEngine, snapshot: Snapshot | None) -> None:
    """Replace `engine`'s state with `snapshot`'s (None: the empty state)."""
    if snapshot is None:
        engine.install(None)
        return
    with tempfile.TemporaryDirectory(dir=engine.folder, prefix="install-") as tmp:
        engine.install(snapshot_file.extract_db(snapshot.path, Path(tmp)))


class EngineStateMachine:
    """A `StateMachine` over a `ReplicaEngine`, less `apply` (each subclass brings its own)."""

    def __init__(self, name: str, engine: ReplicaEngine):
        self.name = name  # for the log: "partition 3", "metadata"
        self.engine = engine

    @property
    def position(self) -> Position:
        return self.engine.position

    def checkpoint(self, dest: Path, last: Position) -> Position:
        """Refused while the database is past `last`: after a restart it is until the replay reaches it,
        and a snapshot holding entries past its own would be no point to roll back to after a
        whole-cluster power cut (docs/durability.md, "A snapshot whose database is ahead of its entry")."""
        if (position := self.engine.position).index > last.index:
            raise RuntimeError(f"the database is at entry {position.index}, past entry {last.index} the log "
                               "would be compacted to (the replay after a restart has not reached it)")
        return self.engine.checkpoint(dest)

    def verify(self, checkpoint: Path) -> None:
        self.engine.verify(checkpoint)

    def restore(self, snapshot: Snapshot) -> None:
        if snapshot.position.index > self.engine.position.index:
            install(self.engine, snapshot)
            log.info("%s installed a snapshot at index %d", self.name, snapshot.position.index)

    def roll_back(self, snapshot: Snapshot | None) -> None:
        install(self.engine, snapshot)

    def flush(self) -> None:
        self.engine.flush_memtable()
