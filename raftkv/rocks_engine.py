"""RocksDB behind the Engine interface: one database per partition replica.

Directory layout under the partition's folder:

    db/            the live database (rocksdict, raw bytes)
    db.incoming/   a snapshot being installed (complete once INSTALL_READY exists)
    db.old/        the database being replaced

The applied Raft position lives in the column family `raftkv` and is written
in the same WriteBatch as the user mutations, so state and position never
disagree. Installing a snapshot is two renames; `open` finishes or rolls back
an install that a crash interrupted.

rocksdict 0.3.29's `Snapshot.items()`/`iter()` ignore the snapshot (they read
the live database), so scans use a plain iterator instead: a RocksDB
iterator pins a consistent view when it is created.
"""

from __future__ import annotations

import logging
import shutil
import struct
import threading
import time
import weakref
from itertools import islice
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from rocksdict import Checkpoint, DbClosedError, Options, Rdict, ReadOptions, WriteBatch

from raftkv.commands import Delete, DeleteRange, Mutation, Put, PutMany
from raftkv.engine import ZERO, KeyRange, Position
from raftkv.errors import CorruptData, StorageFull

log = logging.getLogger(__name__)

_META_CF = "raftkv"
_POSITION_KEY = b"position"
_META_PREFIX = b"m/"  # the state machine's metadata, beside the position key
_POSITION = struct.Struct("<QQ")
INSTALL_READY = "INSTALL_READY"


def _options() -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    return opts


def _open(path: Path) -> Rdict:
    try:
        return Rdict(str(path), _options(), column_families={_META_CF: Options(raw_mode=True)})
    except Exception as exc:  # rocksdict raises a bare Exception for corruption
        text = str(exc)
        if "Corruption" in text or "checksum" in text.lower():
            raise CorruptData(
                f"database {path} is corrupt ({text.splitlines()[0]}); stop the node, move {path.parent} away "
                "and restart it so the partition re-syncs from its peers"
            ) from None
        raise


def recover_interrupted_install(folder: Path) -> None:
    db, incoming, old = folder / "db", folder / "db.incoming", folder / "db.old"
    if not db.exists():
        if (incoming / INSTALL_READY).exists():
            incoming.rename(db)
        elif old.exists():
            old.rename(db)
    for leftover in (incoming, old):
        if leftover.exists():
            shutil.rmtree(leftover)


class RocksEngine:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        recover_interrupted_install(self.folder)
        self._lock = threading.Lock()
        self._readers = 0
        self._readers_done = threading.Condition(self._lock)
        self._db = _open(self.folder / "db")
        self._position = self._read_position()

    def _read_position(self) -> Position:
        raw = self._db.get_column_family(_META_CF).get(_POSITION_KEY)
        return Position(*_POSITION.unpack(raw)) if raw is not None else ZERO

    @property
    def position(self) -> Position:
        return self._position

    def get(self, key: bytes) -> bytes | None:
        while True:
            db = self._db
            try:
                return db.get(key)
            except DbClosedError:
                if db is self._db:
                    raise

    def meta_get(self, key: bytes) -> bytes | None:
        return self._db.get_column_family(_META_CF).get(_META_PREFIX + key)

    def meta_items(self) -> list[tuple[bytes, bytes]]:
        meta = self._db.get_column_family(_META_CF)
        return [(k[len(_META_PREFIX):], v) for k, v in meta.items(from_key=_META_PREFIX)
                if k.startswith(_META_PREFIX)]

    def write(self, mutations: Sequence[Mutation], position: Position,
              meta: Mapping[bytes, bytes | None] | None = None) -> None:
        wb = WriteBatch(raw_mode=True)
        for m in mutations:
            if isinstance(m, Put):
                wb.put(m.key, m.value)
            elif isinstance(m, Delete):
                wb.delete(m.key)
            elif isinstance(m, PutMany):
                for key, value in m.pairs():
                    wb.put(key, value)
            elif isinstance(m, DeleteRange) and m.start < m.end:  # RocksDB fails the whole DB on end < start
                wb.delete_range(m.start, m.end)
        with self._lock:
            meta_cf = self._db.get_column_family_handle(_META_CF)
            for key, value in (meta or {}).items():
                if value is None:
                    wb.delete(_META_PREFIX + key, meta_cf)
                else:
                    wb.put(_META_PREFIX + key, value, meta_cf)
            wb.put(_POSITION_KEY, _POSITION.pack(position.index, position.term), meta_cf)
            try:
                self._db.write(wb)
            except Exception as exc:
                if "No space left" in str(exc) or "ENOSPC" in str(exc):
                    raise StorageFull(f"disk full writing {self.folder}; free space and restart the node") from None
                raise
            self._position = position

    def scan(self, key_range: KeyRange) -> tuple[Position, Iterator[tuple[bytes, bytes]]]:
        with self._lock:
            position = self._position
            self._readers += 1
            scan = _Scan(self._db, key_range, self._reader_done)  # pins the view of `position`
        return position, scan

    def _reader_done(self) -> None:
        with self._lock:
            self._readers -= 1
            self._readers_done.notify_all()

    def checkpoint(self, dest: Path) -> Position:
        """A consistent copy of the database (hard links) at `dest`, and its position."""
        with self._lock:
            position = self._position
            Checkpoint(self._db).create_checkpoint(str(dest))
        return position

    def install(self, checkpoint_dir: Path, reader_grace: float = 5.0) -> Position:
        """Replace the database with a checkpoint (a snapshot from the leader)."""
        incoming = self.folder / "db.incoming"
        if incoming.exists():
            shutil.rmtree(incoming)
        shutil.move(str(checkpoint_dir), incoming)
        (incoming / INSTALL_READY).touch()
        with self._lock:
            deadline = time.monotonic() + reader_grace
            while self._readers and self._readers_done.wait(max(0.0, deadline - time.monotonic())):
                pass
            self._db.close()
            (self.folder / "db").rename(self.folder / "db.old")
            incoming.rename(self.folder / "db")
            (self.folder / "db" / INSTALL_READY).unlink()
            self._db = _open(self.folder / "db")
            self._position = self._read_position()
        shutil.rmtree(self.folder / "db.old", ignore_errors=True)
        return self._position

    def flush(self) -> None:
        """Make everything written so far durable (used before log compaction)."""
        self._db.flush_wal(True)

    def close(self) -> None:
        with self._lock:
            self._db.close()


class _Scan:
    """A scan's iterator; releases its reader slot when exhausted, closed or collected.

    rocksdict's `items()` steps the RocksDB iterator in Rust, about ten times
    faster than calling valid/key/value/next from Python for each item.
    """

    def __init__(self, db: Rdict, key_range: KeyRange, release):
        read_options = ReadOptions()
        if key_range.end is not None:
            read_options.set_iterate_upper_bound(key_range.end)
        items = db.items(from_key=key_range.start or None, read_opt=read_options)
        self._it = islice(items, key_range.limit) if key_range.limit else items
        self._release = weakref.finalize(self, release)

    def __iter__(self) -> _Scan:
        return self

    def __next__(self) -> tuple[bytes, bytes]:
        if self._it is None:
            raise StopIteration
        try:
            return next(self._it)
        except StopIteration:
            self.close()
            raise

    def close(self) -> None:
        self._it = None
        self._release()
