"""RocksDB behind the Engine interface: one database per partition replica (its files, checkpoints
and installs: `rocks_files`).

The applied Raft position is written in the same WriteBatch as the user
mutations, so state and position never disagree. Installing a snapshot
closes the database, swaps the folders and opens it again.

rocksdict flushes a column family's memtable whenever a view of it
(`get_column_family`) is dropped: a table file and a synced WAL each time,
which also made the database durable past the Raft log's synced end. So the
engine keeps one view of its metadata family while the database is open.

rocksdict 0.3.29's `Snapshot.items()`/`iter()` ignore the snapshot (they read
the live database), so scans use a plain iterator instead: a RocksDB
iterator pins a consistent view when it is created.

A full disk: once a write fails with ENOSPC, RocksDB refuses every later
write ("Writer has previous error") even after space is freed, until the
database is reopened. So a failed write marks the engine broken (reads still
work); the next write reopens the database once the disk has room again,
and raises StorageFull until then. Reopening replays RocksDB's WAL: the
failed batch was not applied, and the position says so.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from rocksdict import Checkpoint, DbClosedError, Rdict, WriteBatch

from raftkv import failpoints
from raftkv.core.command_kinds import write_mutation
from raftkv.core.commands import IngestSst, Mutation
from raftkv.core.durable import fsync_directory, fsync_tree, make_dirs
from raftkv.core.errors import CorruptData, DiskFailed, StorageFull, Unavailable
from raftkv.storage import rocks_sst
from raftkv.storage.engine import ZERO, KeyRange, Position
from raftkv.storage.rocks_files import (INGEST_PREFIX, INSTALL_READY, META_CF, POSITION, POSITION_KEY, SCRATCH_PREFIX,
                                        corrupt_database, empty_database, failed_disk, is_corruption, is_io_error,
                                        no_space, open_database, read_every_block, recover_interrupted_install)
from raftkv.storage.rocks_scan import RocksScan

log = logging.getLogger(__name__)

_META_PREFIX = b"m/"  # the state machine's metadata, beside the position key
LOCK_RELEASE_SECONDS = 2.0  # a reopen waits this long for a cut scan's step to let go of the old handle
REOPEN_MIN_FREE_BYTES = 8 << 20  # a broken engine reopens its database once the disk has this much room


class RocksEngine:
    """`on_corrupt(error)` hears of every corruption a read or write runs into (RocksDB checks a
    block when it reads it, so a damaged table file can open fine and fail later); the error is
    raised as well."""

    def __init__(self, folder: str | Path, reader_grace: float = 5.0,
                 on_corrupt: Callable[[CorruptData], None] | None = None):
        self.folder = Path(folder)
        self._reader_grace = reader_grace  # how long a close waits for scans still reading
        self._on_corrupt = on_corrupt
        make_dirs(self.folder)
        recover_interrupted_install(self.folder)
        self._lock = threading.Lock()
        self._readers = 0
        self._flushing = 0  # memtable flushes under way on worker threads (`flush_memtable`)
        self._readers_done = threading.Condition(self._lock)  # notified when either count falls
        self._scans: weakref.WeakSet[RocksScan] = weakref.WeakSet()  # open ones, to cut at a close
        self._db = open_database(self.folder / "db")
        self._meta = self._db.get_column_family(META_CF)
        self._meta_items: list[tuple[bytes, bytes]] | None = None  # read once per change (`meta_items`)
        # Every open, not only the first: a kill between RocksDB making db/ and this sync leaves a
        # db/ that exists but whose name a later power cut would still take.
        fsync_directory(self.folder)
        self._broken = False  # a write failed: the database must be reopened before the next one
        self._position = self._read_position()

    def _read_position(self) -> Position:
        try:
            raw = self._meta.get(POSITION_KEY)
        except Exception as exc:
            raise self._checked(exc) from None
        return Position(*POSITION.unpack(raw)) if raw is not None else ZERO

    def _checked(self, exc: Exception) -> Exception:
        """The error to raise for what RocksDB raised: CorruptData or DiskFailed (reported to
        on_corrupt), Unavailable once closed (a call that raced the node's stop), or itself."""
        if self._meta is None:
            return Unavailable(f"{self.folder} is closed (the node is stopping, or its database is being reopened)")
        if is_corruption(exc):
            error = corrupt_database(self.folder / "db", exc)
        elif is_io_error(exc):
            error = failed_disk(self.folder / "db", exc)
        else:
            return exc
        if self._on_corrupt is not None:
            self._on_corrupt(error)
        return error

    @property
    def position(self) -> Position:
        return self._position

    @property
    def broken(self) -> bool:
        """A write failed (a full disk): no write succeeds until the database is reopened."""
        return self._broken

    def get(self, key: bytes) -> bytes | None:
        return self._read(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return self._read(keys)

    def _read(self, keys: bytes | list[bytes]) -> bytes | None | list[bytes | None]:
        """rocksdict's get: one key's value, or a list of values for a list of keys."""
        while True:
            db = self._db
            try:
                return db.get(keys)
            except DbClosedError as exc:
                if db is self._db:  # closed for good (the node stops), not reopened under the read
                    raise self._checked(exc) from None
            except Exception as exc:
                raise self._checked(exc) from None

    def meta_get(self, key: bytes) -> bytes | None:
        try:
            return self._meta.get(_META_PREFIX + key)
        except Exception as exc:
            raise self._checked(exc) from None

    def meta_items(self) -> list[tuple[bytes, bytes]]:
        """Read from the database once per change: every status and console sample reads each replica's
        learners, and at 1,024 partitions the reads were 7% of an idle node's samples."""
        with self._lock:
            if self._meta_items is None:
                try:
                    self._meta_items = [(k[len(_META_PREFIX):], v) for k, v in self._meta.items(from_key=_META_PREFIX)
                                        if k.startswith(_META_PREFIX)]
                except Exception as exc:
                    raise self._checked(exc) from None
            return list(self._meta_items)

    def write(self, mutations: Sequence[Mutation], position: Position,
              meta: Mapping[bytes, bytes | None] | None = None) -> None:
        """A bulk-load file among `mutations` is ingested between the WriteBatches of the mutations before
        and after it; the position goes with the last (docs/bulk-ingest.md: why that is atomic enough)."""
        files = [m for m in mutations if type(m) is IngestSst]
        for m in files:
            rocks_sst.check(m, self.folder / "db")
        batches = [WriteBatch(raw_mode=True)]  # the mutations before each file, then those after the last
        for m in mutations:
            if type(m) is IngestSst:
                batches.append(WriteBatch(raw_mode=True))
            else:
                write_mutation(m, batches[-1])
        wb = batches.pop()
        with self._lock:
            if self._broken:
                self._reopen()
            for before, file in zip(batches, files):
                self._write_batch(before)
                self._ingest(file)
            meta_cf = self._db.get_column_family_handle(META_CF)
            if meta:
                self._meta_items = None
            for key, value in (meta or {}).items():
                if value is None:
                    wb.delete(_META_PREFIX + key, meta_cf)
                else:
                    wb.put(_META_PREFIX + key, value, meta_cf)
            wb.put(POSITION_KEY, POSITION.pack(position.index, position.term), meta_cf)
            del meta_cf
            try:
                self._write_batch(wb)
            finally:
                del wb  # it refers to the column family handle (`_write_batch`)
            self._position = position

    def _write_batch(self, wb: WriteBatch) -> None:
        """Lock held. StorageFull (the engine then broken) for a full disk."""
        if not len(wb):
            return
        try:
            self._db.write(wb)
        except Exception as exc:
            # The batch refers to a column family handle, which keeps the database open: none may
            # outlive this frame in the traceback the caller holds, or the database could not be closed.
            del wb
            if no_space(exc):
                self._broken = True
                raise StorageFull(f"disk full writing {self.folder}; writes resume once space is freed") from None
            raise self._checked(exc) from None

    def _ingest(self, file: IngestSst) -> None:
        """Lock held. The file written beside the database, everything before it made durable, the file
        moved in. Before the ingest nothing changed; a crash after it leaves the rows without their
        position, and the replay ingests the same file again."""
        path = self.folder / f"{INGEST_PREFIX}{file.sha256.hex()[:16]}.sst"
        try:
            path.write_bytes(file.data)
        except OSError as exc:
            path.unlink(missing_ok=True)
            if no_space(exc):
                self._broken = True  # as a failed write: the leader refuses writes and hands leadership on
                raise StorageFull(f"disk full writing a bulk-load file in {self.folder}; writes resume once "
                                  "space is freed") from None
            raise failed_disk(path, exc) from None
        try:
            self._db.flush_wal(True)
            self._db.ingest_external_file([str(path)], rocks_sst.ingest_options())
        except Exception as exc:
            path.unlink(missing_ok=True)
            if no_space(exc):
                self._broken = True
                raise StorageFull(f"disk full ingesting a bulk-load file into {self.folder}; writes resume once "
                                  "space is freed") from None
            raise self._checked(exc) from None
        failpoints.hit("ingest-after")

    def _reopen(self) -> None:
        """Reopen the database after a failed write (lock held), once the disk has room again."""
        free = shutil.disk_usage(self.folder).free
        if free < REOPEN_MIN_FREE_BYTES:
            raise StorageFull(f"disk full writing {self.folder} ({free} bytes free); writes resume once space is freed")
        self._close_and_open(lambda: None)
        log.info("reopened %s after a failed write", self.folder / "db")

    def _close_and_open(self, swap) -> None:
        """Close the database (lock held; readers get a grace period), run `swap()` on the files, open it again.

        A close that fails still releases the database (`_release`). If opening fails the engine
        stays broken, and the next write tries again.
        """
        deadline = time.monotonic() + self._reader_grace
        while self._readers and self._readers_done.wait(max(0.0, deadline - time.monotonic())):
            pass
        # past the grace (the lock is held): each scan left fails its next step rather than ending early
        self._readers -= sum(scan.cut() for scan in list(self._scans))
        self._broken = True
        self._release()
        swap()
        self._db = self._open_when_released()
        self._meta = self._db.get_column_family(META_CF)
        self._position = self._read_position()
        self._broken = False

    def _open_when_released(self) -> Rdict:
        """Open the database again. RocksDB's lock goes with the last reference to the old handle, and a
        scan cut while its thread was inside a step holds one until that step returns (found by the
        fail-point suite: a snapshot install then failed as if the disk had, and the node stopped)."""
        deadline = time.monotonic() + LOCK_RELEASE_SECONDS
        while True:
            try:
                return open_database(self.folder / "db")
            except DiskFailed as exc:
                if "lock hold by current process" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def scan(self, key_range: KeyRange, cache: bool = True) -> tuple[Position, Iterator[tuple[bytes, bytes]]]:
        with self._lock:
            position = self._position
            # pins the view of `position`
            scan = RocksScan(self._db, key_range, self._reader_done, self._checked, cache)
            self._readers += 1
            self._scans.add(scan)
        return position, scan

    def _reader_done(self) -> None:
        with self._lock:
            self._readers -= 1
            self._readers_done.notify_all()

    def scratch(self) -> Path:
        """A new folder beside the database for a checkpoint on its way out: the caller removes it, and
        the next open does if the process dies first."""
        return Path(tempfile.mkdtemp(dir=self.folder, prefix=SCRATCH_PREFIX))

    def checkpoint(self, dest: Path) -> Position:
        """A consistent copy of the database (hard links) at `dest`, and its position."""
        with self._lock:
            position = self._position
            try:
                Checkpoint(self._db).create_checkpoint(str(dest))
            except Exception as exc:  # RocksDB flushes first, which a full disk refuses
                if no_space(exc):
                    raise StorageFull(f"disk full taking a checkpoint of {self.folder}; another voter's copy "
                                      "serves meanwhile") from None
                raise self._checked(exc) from None
        return position

    def verify(self, checkpoint: Path) -> None:
        """`read_every_block` of a checkpoint of this database, before it leaves the node: damage found
        there is this database's, reported to on_corrupt as well as raised."""
        try:
            read_every_block(checkpoint, self.folder / "db")
        except CorruptData as error:
            if self._on_corrupt is not None:
                self._on_corrupt(error)
            raise

    def install(self, checkpoint_dir: Path | None) -> Position:
        """Replace the database with a checkpoint (a snapshot from the leader; None: an empty database)."""
        if checkpoint_dir is None:
            with tempfile.TemporaryDirectory(dir=self.folder, prefix="install-") as tmp:
                return self.install(empty_database(Path(tmp) / "db"))
        incoming = self.folder / "db.incoming"
        if incoming.exists():
            shutil.rmtree(incoming)
        shutil.move(str(checkpoint_dir), incoming)
        fsync_tree(incoming)  # its files were unpacked from a snapshot, never synced
        (incoming / INSTALL_READY).touch()
        fsync_directory(incoming)

        def swap() -> None:
            (self.folder / "db").rename(self.folder / "db.old")
            incoming.rename(self.folder / "db")
            fsync_directory(self.folder)
            (self.folder / "db" / INSTALL_READY).unlink()

        with self._lock:
            self._close_and_open(swap)
        shutil.rmtree(self.folder / "db.old", ignore_errors=True)
        return self._position

    def flush(self) -> None:
        """Make everything written so far durable (used before log compaction)."""
        try:
            self._db.flush_wal(True)
        except Exception as exc:
            raise self._checked(exc) from None

    def flush_memtable(self) -> None:
        """The memtable written to table files and the WAL synced, from a worker thread while writes go on:
        rocksdict releases the GIL for both, but holds it through a whole checkpoint, which flushes the
        memtable itself (docs/benchmarks.md, "What a worker thread can take off the loop"). Not under the
        lock, which writes take; a close waits for it instead (RocksDB's handle cannot close while a call
        is inside it: rocksdict raises "Already borrowed")."""
        with self._lock:  # a closed handle raises, as Unavailable (`_checked`)
            db = self._db
            self._flushing += 1
        try:
            db.flush(True)
            db.flush_wal(True)
        except Exception as exc:
            if no_space(exc):
                raise StorageFull(f"disk full flushing {self.folder}; writes resume once space is freed") from None
            raise self._checked(exc) from None
        finally:
            with self._lock:
                self._flushing -= 1
                self._readers_done.notify_all()

    def close(self) -> None:
        with self._lock:
            self._release()

    def _release(self) -> None:
        """Close the database (lock held). A close that fails (RocksDB cannot flush to a full disk, or
        refuses after an earlier write error) still releases it, and its WAL holds everything it had
        acknowledged: a node dropping a replica, or stopping, on a full disk goes on."""
        while self._flushing:  # a flush ends within a second or so: RocksDB writes one memtable
            self._readers_done.wait()
        self._meta = self._meta_items = None
        try:
            self._db.close()
        except Exception as exc:  # logged as text: the exception object keeps the database alive
            log.warning("closing %s: %s", self.folder / "db", str(exc))
