"""A replica's RocksDB database as files: opening one and naming what is wrong with it, checkpoints
(read whole, linked, their position read), and an install a crash cut short.

Directory layout under the partition's folder:

    db/            the live database (rocksdict, raw bytes)
    db.incoming/   a snapshot being installed (complete once INSTALL_READY exists)
    db.old/        the database being replaced

The applied Raft position lives in the column family `raftkv`. Installing a snapshot is two renames;
`recover_interrupted_install` finishes or rolls back one that a crash interrupted.
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
from pathlib import Path

from rocksdict import AccessType, Options, Rdict

from raftkv.core.durable import fsync_directory
from raftkv.core.errors import CorruptData, DiskFailed, StorageFull
from raftkv.storage import rocks_memory
from raftkv.storage.engine import ZERO, Position

META_CF = "raftkv"
POSITION_KEY = b"position"
POSITION = struct.Struct("<QQ")
INSTALL_READY = "INSTALL_READY"


def no_space(exc: BaseException) -> bool:
    return "No space left" in str(exc) or "ENOSPC" in str(exc) or getattr(exc, "errno", None) == errno.ENOSPC


def _options() -> Options:
    opts = rocks_memory.options()
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    # RocksDB deletes a write-ahead log file only once every family with data in it has flushed. The
    # position's family is tiny and, flushed alone, flushed only when the logs reached four times the
    # write buffers: a replica kept everything it was written since it opened (119 MB of log beside
    # 105 MB of tables at 1,000,000 keys), replayed it at each open, and a move's checkpoint flushed
    # it all. Flushing the families together lets each flush free the logs before it.
    opts.set_atomic_flush(True)
    return opts


def open_database(path: Path) -> Rdict:
    try:
        return Rdict(str(path), _options(), column_families={META_CF: rocks_memory.options()})
    except Exception as exc:  # rocksdict raises a bare Exception for corruption
        if no_space(exc):
            raise StorageFull(f"disk full opening {path}; free space on that disk") from None
        if is_corruption(exc):
            raise corrupt_database(path, exc) from None
        if is_io_error(exc):
            raise failed_disk(path, exc) from None
        raise


def is_corruption(exc: BaseException) -> bool:
    text = str(exc)
    return "Corruption" in text or "checksum" in text.lower()


def is_io_error(exc: BaseException) -> bool:
    return str(exc).startswith("IO error") and not no_space(exc)


def corrupt_database(path: Path, exc: BaseException) -> CorruptData:
    return CorruptData(
        f"database {path} is corrupt ({str(exc).splitlines()[0]}); stop the node, move {path.parent} away "
        "and restart it so the partition re-syncs from its peers"
    )


def failed_disk(path: Path, exc: BaseException) -> DiskFailed:
    return DiskFailed(
        f"database {path}: the disk failed ({str(exc).splitlines()[0]}), so nothing on it can be trusted; "
        f"check the disk (dmesg), then move {path.parent} away and restart the node so the partition "
        "re-syncs from its peers"
    )


def _read_only(db: Path) -> Rdict:
    """The database (a checkpoint) at `db`, opened read-only: nothing in it is written. CorruptData, naming
    RocksDB's complaint, when it does not open (a file missing or damaged)."""
    try:
        return Rdict(str(db), Options(raw_mode=True), column_families={META_CF: Options(raw_mode=True)},
                     access_type=AccessType.read_only())
    except Exception as exc:  # rocksdict raises a bare Exception
        raise CorruptData(f"RocksDB cannot open it: {str(exc).splitlines()[0]}") from None


def checkpoint_position(db: Path) -> Position:
    """The position of the database (a checkpoint) at `db`; CorruptData as `_read_only`."""
    rdict = _read_only(db)
    try:
        meta = rdict.get_column_family(META_CF)
        raw = meta.get(POSITION_KEY)
        del meta  # a column family view keeps the database open
    except Exception as exc:
        raise CorruptData(f"RocksDB cannot read it: {str(exc).splitlines()[0]}") from None
    finally:
        rdict.close()
    return Position(*POSITION.unpack(raw)) if raw is not None else ZERO


def read_every_block(checkpoint: Path, database: Path) -> None:
    """Read every block of the table files of `checkpoint`, a checkpoint of `database`, so that RocksDB
    checks each one's checksum. It checks a block only when it reads it, and a checkpoint hard-links the
    database's table files, damage and all: a leader shipped a block damaged on its disk, never read there,
    to two learners, which installed it and stopped (docs/chaos.md). CorruptData (or DiskFailed), naming
    `database` and RocksDB's complaint, for a file that does not read back whole.

    RocksDB's repairer does the reading, on a scratch folder of links to the table files: it reads each
    through in C++ with the GIL released and sets aside any it cannot, logging why. About 0.1 s a million
    keys, where stepping every row through rocksdict took 0.3-0.5 s and held the GIL between rows. The
    write-ahead log is not read: a checkpoint flushes the memtables first, so it holds at most the few
    writes that came during the checkpoint."""
    scratch = checkpoint.with_name(f"{checkpoint.name}.read")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        for table in checkpoint.glob("*.sst"):
            os.link(table, scratch / table.name)
        try:
            Rdict.repair(str(scratch), Options(raw_mode=True))
        except Exception as exc:  # rocksdict raises a bare Exception
            if no_space(exc):
                raise StorageFull(f"disk full checking a checkpoint of {database}; free space on that disk") from None
            raise failed_disk(database, exc) from None
        set_aside = sorted(p.name for p in (scratch / "lost").glob("*.sst"))
        why = [line.split(": ignoring ", 1)[1] for line in (scratch / "LOG").read_text(errors="replace").splitlines()
               if ": ignoring " in line]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if set_aside or why:
        complaint = (why[0] if why else f"table file {set_aside[0]} does not read back whole").replace(
            str(scratch), str(database))
        error = Exception(complaint)
        raise failed_disk(database, error) if is_io_error(error) else corrupt_database(database, error)


def link_checkpoint(src: Path, dest: Path) -> None:
    """A copy at `dest` of the checkpoint at `src`, for a database to open while `src` is kept: its table
    files hard-linked (RocksDB never changes one), the rest copied (MANIFEST, CURRENT, OPTIONS, a WAL:
    the database that opens them may write them)."""
    dest.mkdir(parents=True)
    for path in src.iterdir():
        if path.suffix in (".sst", ".blob"):
            os.link(path, dest / path.name)
        else:
            shutil.copyfile(path, dest / path.name)


def empty_database(path: Path) -> Path:
    """Create an empty database at `path` (to install in place of one) and return `path`."""
    open_database(path).close()
    return path


SCRATCH_PREFIX = "copy-"  # a checkpoint on its way out of this replica (`RocksEngine.scratch`)
INGEST_PREFIX = "ingest-"  # a bulk-load file on its way into the database (`RocksEngine._ingest`)


def recover_interrupted_install(folder: Path) -> None:
    """An install cut short finished or undone, and the scratch folders of checkpoints that were being
    sent and the bulk-load files that were being ingested when the process died deleted (nothing else
    removes them)."""
    for scratch in folder.glob(SCRATCH_PREFIX + "*"):
        shutil.rmtree(scratch, ignore_errors=True)
    for file in folder.glob(INGEST_PREFIX + "*.sst"):
        file.unlink()
    db, incoming, old = folder / "db", folder / "db.incoming", folder / "db.old"
    if not db.exists():
        if (incoming / INSTALL_READY).exists():
            incoming.rename(db)
        elif old.exists():
            old.rename(db)
        fsync_directory(folder)
    for leftover in (incoming, old):
        if leftover.exists():
            shutil.rmtree(leftover)
