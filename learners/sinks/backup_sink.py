"""The backup sink: a RocksDB copy per partition, exported as consistent backups.

Delivered events are materialized into `<work_dir>/p<NNNN>/db` (a
RocksEngine), written in one atomic batch per partition together with the
Raft position they reach, so the copy's position IS the sink's durable
position (`recover`). Every `interval_seconds`, and on `export_now()`, each
partition is checkpointed (exactly the state at its recorded position) and
the checkpoints are exported to `url` with `raftkv.backup.store`, which
uploads only the files no stored backup holds yet, writes the manifest last
and applies retention (`keep`). An export's checkpoints sit in
`<work_dir>/export-<backup id>`: one left by a crash names the backup that
will never finish, which the next export abandons (docs/backup.md).

Options (all text, as a learner passes them):

    url               where backups go: file:///path, s3://bucket/prefix, any fsspec URL (required)
    work_dir          the local copy; default ./raftkv-backup-work/<learner>
    learner           the learner's name, for the default work_dir (default: backup)
    interval_seconds  seconds between exports; 0: only export_now() (default 300)
    keep              complete backups kept (default 7)
    storage.<key>     fsspec storage options, e.g. storage.endpoint_url=http://127.0.0.1:9000
"""

from __future__ import annotations

import logging
import shutil
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping

from raftkv.backup.manifest import BackupInfo, backup_id_for, partition_dir, time_of
from raftkv.backup.store import BackupStore, parse_storage_options
from learners.change_event import ChangeEvent
from learners.sinks.base import DeliveryBatch
from learners.sinks.options import OptionReader
from raftkv.core.commands import Delete, Mutation, Put
from raftkv.storage.engine import ZERO, Position
from raftkv.core.errors import ConfigError, InvalidRequest, RaftKVError
from raftkv.storage.rocks_engine import RocksEngine

log = logging.getLogger(__name__)

_STORAGE_PREFIX = "storage."
_CLUSTER_FILE = "cluster"
_EXPORT_PREFIX = "export-"


@dataclass(frozen=True)
class BackupOptions:
    url: str
    work_dir: Path
    interval_seconds: float = 300.0
    keep: int = 7
    storage_options: dict = field(default_factory=dict)
    cluster_id: str = ""  # the learner passes it; nodes seed new replicas only from their cluster's backups

    @classmethod
    def parse(cls, config: Mapping[str, str]) -> BackupOptions:
        """Validate every option; one ConfigError names each problem by option."""
        read = OptionReader(config, "backup sink", {"url", "work_dir", "interval_seconds", "keep"},
                            prefixes=(_STORAGE_PREFIX,))
        url = read.text("url", required="file:///path or s3://bucket/prefix")
        interval = read.number("interval_seconds", 300.0, 0)
        keep = read.integer("keep", 7, 1)
        work_dir = read.text("work_dir") or f"./raftkv-backup-work/{read.text('learner') or 'backup'}"
        cluster_id = read.text("cluster_id")
        read.done()
        storage = parse_storage_options(read.prefixed(_STORAGE_PREFIX).items())
        return cls(url, Path(work_dir), interval, keep, storage, cluster_id)


@dataclass
class _Pending:
    """What one partition's next flush writes: mutations in Raft order and the position they reach."""

    position: Position
    mutations: list[Mutation] = field(default_factory=list)


class BackupSink:
    def __init__(self) -> None:
        self._engines: dict[int, RocksEngine] = {}
        self._pending: dict[int, _Pending] = {}
        self._cluster = ""
        self._lock = threading.Lock()  # engines and their writes vs. an export's checkpoints
        self._export_lock = threading.Lock()  # one export at a time
        self._last_exported: dict[int, Position] = {}
        self._stopping = threading.Event()
        self._exporter: threading.Thread | None = None
        self._abandoned: list[str] = []  # backups whose export a crash interrupted; the next export abandons them

    # -- Sink protocol ------------------------------------------------------

    def open(self, config: Mapping[str, str]) -> None:
        self.options = BackupOptions.parse(config)
        self._store = BackupStore(self.options.url, self.options.storage_options, source="backup sink url")
        self._work = self.options.work_dir
        self._work.mkdir(parents=True, exist_ok=True)
        for leftover in self._work.glob(_EXPORT_PREFIX + "*"):  # checkpoints of an export a crash interrupted
            if time_of(backup_id := leftover.name.removeprefix(_EXPORT_PREFIX)) is not None:
                self._abandoned.append(backup_id)
            shutil.rmtree(leftover)
        cluster_file = self._work / _CLUSTER_FILE
        self._cluster = cluster_file.read_text() if cluster_file.exists() else ""
        for folder in sorted(self._work.glob("p[0-9][0-9][0-9][0-9]")):
            self._engines[int(folder.name[1:])] = RocksEngine(folder)
        if self.options.interval_seconds > 0:
            self._exporter = threading.Thread(target=self._export_periodically, name="backup-export", daemon=True)
            self._exporter.start()

    def recover(self) -> dict[int, int]:
        return {p: engine.position.index for p, engine in self._engines.items()}

    def deliver(self, batch: DeliveryBatch) -> None:
        for event in batch.events:
            self._check_cluster(event.cluster)
            pending = self._pending_for(event.partition)
            if event.index <= self._durable(event.partition).index:
                continue  # redelivered after a crash between our flush and the learner's copy
            pending.mutations.append(_mutation(event))
            pending.position = Position(event.index, event.term)
        for p, index in batch.positions.items():
            pending = self._pending_for(p)
            if index > pending.position.index:  # an entry without events: a no-op, a read barrier
                pending.position = Position(index, batch.terms.get(p, pending.position.term))

    def flush(self) -> None:
        """Write each partition's events with its position in one atomic batch, then sync."""
        with self._lock:
            self._save_cluster()
            for p, pending in sorted(self._pending.items()):
                if pending.position == self._durable(p) and not pending.mutations:
                    continue
                engine = self._engine(p)
                engine.write(pending.mutations, pending.position)
                engine.flush()
            self._pending.clear()

    def close(self) -> None:
        self._stopping.set()
        if self._exporter is not None:
            self._exporter.join()
        with self._lock:
            for engine in self._engines.values():
                engine.close()
            self._engines.clear()

    # -- exports --------------------------------------------------------------

    def export_now(self) -> BackupInfo:
        """Checkpoint every partition, upload, apply retention; Unavailable if the storage fails.

        The copy is never touched: a failed export leaves nothing to undo here, and what it left in
        the storage the next export abandons.
        """
        with self._export_lock:
            if not self._engines:
                raise InvalidRequest("nothing to back up yet: no partition has been delivered")
            while self._abandoned:  # its marker gone, this export's prune collects what only it uploaded
                self._store.abandon(self._abandoned[0])
                self._abandoned.pop(0)
            created = datetime.now(timezone.utc)
            backup_id = backup_id_for(created)
            work = self._work / f"{_EXPORT_PREFIX}{backup_id}"  # names the backup, should this process die
            work.mkdir()
            try:
                checkpoints = self._checkpoint_all(work)
                uploaded: list[int] = []
                try:
                    info = self._store.export(self._cluster, checkpoints, created, self.options.cluster_id,
                                              sent=uploaded.append)
                except RaftKVError:
                    self._abandoned.append(backup_id)
                    raise
                self._store.prune(self.options.keep)
            finally:
                shutil.rmtree(work)
            log.info("exported backup %s (%d bytes, %d of them uploaded) to %s", info.id, info.total_bytes,
                     sum(uploaded), self.options.url)
            self._last_exported = info.positions
            return info

    def _export_periodically(self) -> None:
        """Export every interval, unless nothing was flushed since the last export."""
        while not self._stopping.wait(self.options.interval_seconds):
            positions = self._positions()
            if not positions or positions == self._last_exported:
                continue
            try:
                self.export_now()
            except RaftKVError as exc:
                log.warning("backup export failed, retrying in %ss: %s", self.options.interval_seconds, exc)

    def _checkpoint_all(self, work: Path) -> dict[int, tuple[Path, Position]]:
        """A checkpoint per partition, each exactly the state at its position (hard links: milliseconds)."""
        with self._lock:
            checkpoints = {}
            for p, engine in sorted(self._engines.items()):
                engine.flush()
                folder = work / partition_dir(p)
                checkpoints[p] = (folder, engine.checkpoint(folder))
            return checkpoints

    # -- helpers ----------------------------------------------------------------

    def _positions(self) -> dict[int, Position]:
        with self._lock:
            return {p: engine.position for p, engine in self._engines.items()}

    def _durable(self, partition: int) -> Position:
        engine = self._engines.get(partition)
        return engine.position if engine is not None else ZERO

    def _pending_for(self, partition: int) -> _Pending:
        if partition not in self._pending:
            self._pending[partition] = _Pending(self._durable(partition))
        return self._pending[partition]

    def _engine(self, partition: int) -> RocksEngine:
        if partition not in self._engines:
            self._engines[partition] = RocksEngine(self._work / partition_dir(partition))
        return self._engines[partition]

    def _check_cluster(self, cluster: str) -> None:
        """One work dir holds one cluster's copy: mixing two would corrupt both."""
        if not self._cluster:
            self._cluster = cluster
        elif cluster != self._cluster:
            raise ConfigError(
                f"{self._work} holds a copy of cluster {self._cluster!r} but events come from {cluster!r}; "
                "give each cluster its own work_dir",
                source="backup sink work_dir",
            )

    def _save_cluster(self) -> None:
        """Remember the cluster's name for the manifests of exports made before any new event."""
        path = self._work / _CLUSTER_FILE
        if self._cluster and not path.exists():
            staged = path.with_suffix(".tmp")
            staged.write_text(self._cluster)
            staged.replace(path)


def _mutation(event: ChangeEvent) -> Mutation:
    """c, u and r (snapshot or not) put the after-image; d deletes."""
    if event.op == "d":
        return Delete(event.key)
    if event.after is None:
        raise ValueError(f"event {event.event_id} op {event.op!r} has no after-image")
    return Put(event.key, event.after)
