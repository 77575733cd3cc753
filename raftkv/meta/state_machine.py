"""The metadata group's state machine: `ClusterMeta` in its engine (a RocksDB database), one JSON value."""

from __future__ import annotations

from typing import Callable

from raftkv.core.errors import ChangeRefused
from raftkv.meta.records import ClusterMeta, apply, decode_command, decode_meta, encode_meta
from raftkv.raft.engine_state import EngineStateMachine
from raftkv.raft.group import Entry
from raftkv.storage.engine import Position, ReplicaEngine

_KEY = b"cluster-meta"


def stored_meta(engine: ReplicaEngine) -> ClusterMeta:
    """The metadata as the engine holds it (an empty `ClusterMeta` in a new one)."""
    raw = engine.meta_get(_KEY)
    return decode_meta(raw) if raw is not None else ClusterMeta()


class MetaStateMachine(EngineStateMachine):
    """Applies metadata commands; `on_change(meta)` hears of every new state (on the group's thread).

    A refused command is a committed entry like any other: it changes nothing, and its proposer
    gets the `ChangeRefused` as the result.
    """

    def __init__(self, engine: ReplicaEngine, on_change: Callable[[ClusterMeta], None] | None = None):
        super().__init__("metadata", engine)
        self._on_change = on_change
        self.meta = stored_meta(engine)

    def apply(self, entry: Entry) -> ClusterMeta | ChangeRefused:
        if not entry.payload:  # a barrier: committing it commits everything before it
            self.engine.write((), Position(entry.index, entry.term))
            return self.meta
        try:
            meta = apply(self.meta, decode_command(entry.payload))
        except ChangeRefused as refused:
            self.engine.write((), Position(entry.index, entry.term))
            return refused
        self.engine.write((), Position(entry.index, entry.term), {_KEY: encode_meta(meta)})
        self.meta = meta
        if self._on_change is not None:
            self._on_change(meta)
        return meta

    def restore(self, snapshot) -> None:
        super().restore(snapshot)
        self._reload()

    def roll_back(self, snapshot) -> None:
        super().roll_back(snapshot)
        self._reload()

    def _reload(self) -> None:
        meta = stored_meta(self.engine)
        if meta.epoch != self.meta.epoch:
            self.meta = meta
            if self._on_change is not None:
                self._on_change(meta)
