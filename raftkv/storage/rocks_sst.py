"""RocksDB table files of a bulk load (docs/bulk-ingest.md): built from a PutMany's rows on the
leader, and read back into rows where an ingest must be seen row by row (a learner's change feed,
`MemoryEngine`).

rocksdict has a table file writer but no reader: the rows are read by ingesting a copy of the file
into a scratch database and iterating it. Both work in /dev/shm where there is one: creating
a database on a disk syncs several files, which made a read of 2,000 rows take 140-240 ms on a busy
disk here against 17-35 ms in memory.
"""

from __future__ import annotations

import hashlib
import operator
import os
import shutil
import tempfile
from itertools import islice
from pathlib import Path

from rocksdict import DBCompressionType, IngestExternalFileOptions, Options, Rdict, SstFileWriter

from raftkv.core.commands import IngestSst, PutMany
from raftkv.core.errors import CorruptData


SCRATCH = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None  # None: the system's temporary folder


def table_options() -> Options:
    """The options a bulk-load file is written with: raw bytes like the partition databases, and not
    compressed (compression in the leader's thread cost five times the rest of the build; RocksDB
    compresses the rows when it compacts them)."""
    options = Options(raw_mode=True)
    options.set_compression_type(DBCompressionType.none())
    return options


def _scratch(folder: Path | None, what: str) -> tempfile.TemporaryDirectory:
    """A folder of this process's for one file; first the folders of processes that died (kill -9)
    while in theirs are deleted: in /dev/shm each held its file in memory until the next boot."""
    for left in Path(folder or tempfile.gettempdir()).glob(f"sst-{what}-*-*"):
        pid = left.name.split("-")[2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(left, ignore_errors=True)
    return tempfile.TemporaryDirectory(dir=folder, prefix=f"sst-{what}-{os.getpid()}-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def build(c: PutMany, folder: Path | None = SCRATCH) -> IngestSst:
    """`c`'s rows as one sorted table file; a repeated key keeps its last value, as `c`'s puts in
    order would leave it. `folder`: where the file is written on its way (memory where it can be: not
    the data disk, which may be full, and a leader killed meanwhile leaves nothing there).
    Rows already in key order (a Spark partition's often are) skip the sort: a third of the cost."""
    keys, values = c.split()
    if not all(map(operator.lt, keys, islice(keys, 1, None))):
        rows = dict(zip(keys, values))
        keys = sorted(rows)
        values = [rows[key] for key in keys]
    with _scratch(folder, "build") as tmp:
        path = Path(tmp) / "bulk.sst"
        writer = SstFileWriter(options=table_options())
        writer.open(str(path))
        for key, value in zip(keys, values):
            writer[key] = value
        writer.finish()
        data = path.read_bytes()
    return IngestSst(data, hashlib.sha256(data).digest(), len(keys))


def check(c: IngestSst, where: Path | str) -> None:
    """CorruptData, before anything is written, when the file does not match its SHA-256 (damaged since
    the leader built it): the replica at `where` re-syncs from its peers."""
    if hashlib.sha256(c.data).digest() != c.sha256:
        raise CorruptData(f"{where}: a bulk-load file of {c.rows} rows in the Raft log does not match its "
                          "SHA-256, so nothing of it was applied; stop the node, move that folder away and "
                          "restart it so the partition re-syncs from its peers")


def ingest_options() -> IngestExternalFileOptions:
    """The file is moved into the database (a rename), not copied."""
    options = IngestExternalFileOptions()
    options.set_move_files(True)
    return options


def rows(c: IngestSst, folder: Path | None = SCRATCH) -> PutMany:
    """The rows of `c`'s file, in key order, as a PutMany. `folder`: where the scratch database goes."""
    with _scratch(folder, "read") as tmp:
        path = Path(tmp) / "bulk.sst"
        path.write_bytes(c.data)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        scratch = Rdict(str(Path(tmp) / "db"), options)
        try:
            scratch.ingest_external_file([str(path)], ingest_options())
            keys, values = list(scratch.keys()), list(scratch.values())
        finally:
            scratch.close()
    return PutMany.of(keys, values)
