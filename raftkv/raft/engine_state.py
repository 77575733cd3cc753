"""The part of a state machine every RocksDB-backed group shares: where the state stands,
checkpoints for snapshots, and installing a snapshot a leader sent."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from raftkv.raft import snapshot_file
from raftkv.raft.group import Snapshot
from raftkv.storage.engine import Position
from raftkv.storage.rocks_engine import RocksEngine

log = logging.getLogger(__name__)


class EngineStateMachine:
    """A `StateMachine` over a `RocksEngine`, less `apply` (each subclass brings its own)."""

    def __init__(self, name: str, engine: RocksEngine, folder: Path):
        self.name = name  # for the log: "partition 3", "metadata"
        self.engine = engine
        self._folder = folder

    @property
    def position(self) -> Position:
        return self.engine.position

    def checkpoint(self, dest: Path, last: Position) -> Position:
        return self.engine.checkpoint(dest)

    def restore(self, snapshot: Snapshot) -> None:
        if snapshot.position.index > self.engine.position.index:
            with tempfile.TemporaryDirectory(dir=self._folder, prefix="install-") as tmp:
                self.engine.install(snapshot_file.extract_db(snapshot.path, Path(tmp)))
            log.info("%s installed a snapshot at index %d", self.name, snapshot.position.index)

    def flush(self) -> None:
        self.engine.flush()
