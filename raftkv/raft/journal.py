"""The Raft log of one partition replica: a crash-safe drop-in for pysyncobj's FileJournal.

pysyncobj 0.3.17's FileJournal is not safe to build a store on: it writes through
mmap and never fsyncs; its compaction (`deleteEntriesTo`) clears the file and then
re-adds the kept entries, so a crash in between loses them; its records have no
checksums, so a torn or rotted record is read back as data; and its term/vote meta
file is replaced without fsync. RaftJournal fixes each of these:

- every record carries its length and a CRC; recovery on open drops a torn tail and
  refuses (CorruptData) anything else that fails a check;
- `add` is one `os.write` (it survives `kill -9`); with `fsync=True` the caller makes
  it survive power loss with `sync()`, one `fdatasync` per group commit; without, it is
  synced once a second (pysyncobj's `onOneSecondTimer`, or, once `sync_elsewhere()` was
  called, `sync_in_background()` from another thread: `journal_syncer`);
- compaction and `clear` write a new file and `os.replace` it, fsyncing both;
- term and vote are written atomically (temp file, replace) and synced, in both modes,
  before `setCurrentTerm` returns; its directory is made durable when created;
- after a failed fsync every later `sync()` fails too (fsyncgate, docs/durability.md);
- every method that writes holds the journal's lock, so the background sync never sees
  it half-changed (the event loop waits for it only while it syncs this very journal).

The directory holds `raft.log` and `meta` (and their `.tmp` twins while they are
rewritten); integers are little-endian:

    raft.log := "RKVLOG\\0\\0" u32 version record*
    record   := u32 length | u32 length^0xFFFFFFFF | u32 crc | u64 idx | u64 term | payload
                (crc = crc32 of idx, term and payload)
    meta     := "RKVMETA\\0" u32 version | u32 crc | u64 term | u64 commit | u64 synced | i32 vlen | voted
                (crc = crc32 of everything after it; vlen = -1 when no vote was cast;
                 version 1 had no `synced`)

`synced` is how many bytes of raft.log a sync had made durable when the meta was last
written (once a second, and at once after a compaction or a truncation). A power cut
may leave anything after the last sync: holes of zeros, a later write's prefix. Damage
there is such a torn tail, dropped with a warning; damage before it is corruption.

The length is stored with its complement so that a damaged length field is caught as
corruption instead of looking like a record cut short at the end of the file.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from functools import wraps
from itertools import accumulate
from pathlib import Path

from pysyncobj.journal import Journal

from raftkv import failpoints
from raftkv.core import metrics
from raftkv.core.durable import fsync_failed, fsync_file, make_dirs
from raftkv.core.errors import CorruptData, DiskFailed, StorageFull
from raftkv.raft.record_file import (
    FILE_HEADER, FULL_UNTIL_FREE_BYTES, RECORD_HEADER, BadRecord, DiskSpace, append_whole, check_file_header, frame,
    only_zeros_from, read_file, tmp_path, unframe, write_new_file,
)

Entry = tuple[bytes, int, int]

LOG_NAME = "raft.log"
META_NAME = "meta"
FORMAT_VERSION = 1
META_VERSION = 2

_LOG_MAGIC = b"RKVLOG\0\0"
_META_MAGIC = b"RKVMETA\0"

_IDX_TERM = struct.Struct("<QQ")
_CRC = struct.Struct("<I")
_META_FIELDS = struct.Struct("<QQQi")  # term, commit index, synced bytes of the log, length of voted-for (-1: None)
_META_FIELDS_V1 = struct.Struct("<QQi")
_LOG_HEADER = FILE_HEADER.pack(_LOG_MAGIC, FORMAT_VERSION)

_logger = logging.getLogger(__name__)


def _locked(method):
    @wraps(method)
    def locked(self, *args):
        with self._lock:
            return method(self, *args)
    return locked


class RaftJournal(Journal):
    """The Raft log, term, vote and commit index of one replica, kept in `directory`.

    Entries are `(command, idx, term)` tuples held in memory; positions passed to
    `deleteEntriesFrom` / `deleteEntriesTo` are list positions, as in FileJournal.
    """

    def __init__(self, directory: str | os.PathLike[str], fsync: bool):
        self._dir = Path(directory)
        self._path = self._dir / LOG_NAME
        self._meta_path = self._dir / META_NAME
        self._fsync = fsync
        self._lock = threading.RLock()
        self._synced_elsewhere = False
        self._background_error: Exception | None = None  # what the background sync ran into, for the loop
        self._closed = False
        self._dirty = False
        self._rewrites = 0  # truncations and replacements of the file: a sync that began before one counts for nothing
        self._meta_lock = threading.Lock()  # taken inside `_lock` when both are
        self._meta_seq = self._meta_stored = 0  # the meta states made and the newest one written
        self._space = DiskSpace(self._dir)
        self._failed: DiskFailed | None = None  # an fsync failed: no later one may be believed
        self._make_directory()
        for path in (self._path, self._meta_path):
            tmp_path(path).unlink(missing_ok=True)
        if not self._path.exists():
            os.close(write_new_file(self._path, _LOG_HEADER, fsync=True))
        self._term, self._commit, synced, self._voted = _read_meta(self._meta_path)
        self._load(synced)
        self._synced = self._end  # what was read is what counts as durable from here on
        self._meta_saved = True

    # Log entries

    @_locked
    def add(self, command: bytes, idx: int, term: int) -> None:
        if self._entries and idx != self._entries[-1][1] + 1:
            raise ValueError(f"journal {self._path}: entry {idx} does not follow {self._entries[-1][1]}")
        record = _encode_record(command, idx, term)
        failpoints.hit("journal-append-before")
        append_whole(self._fd, record, self._path, self._end, self._space)
        self._entries.append((command, idx, term))
        self._offsets.append(self._end)
        self._end += len(record)
        self._dirty = True
        metrics.JOURNAL_WRITES.inc()
        failpoints.hit("journal-append-after")

    def __getitem__(self, item: int | slice) -> Entry | list[Entry]:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    @_locked
    def deleteEntriesFrom(self, entryFrom: int) -> None:
        start = list_position(entryFrom, len(self._entries))
        if start == len(self._entries):
            return
        self._end = self._offsets[start]
        os.ftruncate(self._fd, self._end)
        del self._entries[start:]
        del self._offsets[start:]
        self._dirty = True
        self._rewrites += 1
        if self._synced > self._end:  # new entries will take those bytes: at once, not at the next save
            self._save_meta(fsync=True)

    @_locked
    def deleteEntriesTo(self, entryTo: int) -> None:
        start = list_position(entryTo, len(self._entries))
        if start:
            self._install(self._entries[start:])

    @_locked
    def clear(self) -> None:
        self._install([])

    # Durability

    @property
    def size_bytes(self) -> int:
        """Bytes of the log file (header included)."""
        return self._end

    def bytes_from(self, position: int) -> int:
        """Bytes of the records from list position `position` to the end."""
        return self._end - self._offsets[position] if 0 <= position < len(self._offsets) else 0

    @property
    def full(self) -> bool:
        """An add failed for want of space, and the disk has not had FULL_UNTIL_FREE_BYTES free since."""
        return self._space.full

    @property
    def dirty(self) -> bool:
        """fsync mode: whether entries were added or truncated since the last `sync()`, which must come
        before this replica says anything of them (always False without fsync)."""
        return self._fsync and self._dirty

    @_locked
    def sync(self) -> None:
        """Make every added entry and truncation durable; a no-op unless dirty.

        Raises DiskFailed if the fsync fails, and again on every later call: the kernel may
        have dropped the unsynced pages and would report the next fsync as a success."""
        if self._failed is not None:
            raise self._failed
        if self._dirty:
            try:
                failpoints.hit("journal-fsync-before")  # its injected EIO stands for the fsync's
                fsync_file(self._fd, self._path, data_only=True)
            except (DiskFailed, OSError) as error:
                self._failed = error if isinstance(error, DiskFailed) else fsync_failed(self._path, error)
                raise self._failed from None
            self._dirty = False
            self._synced = self._end
            self._meta_saved = False
            failpoints.hit("journal-fsync-after")

    def write_pending(self) -> None:
        """Nothing waits to be written: every add is written at once (the node log's `GroupLog` batches)."""

    sync_written = sync  # from any thread: the lock keeps the group's adds out until the fsync is done

    @_locked
    def flush(self) -> None:
        self._sync_and_save()

    def onOneSecondTimer(self) -> None:
        """On the replica's tick, about once a second: the default mode's sync, which bounds what a
        power cut takes to the last second or so; or, synced elsewhere, what that sync ran into."""
        if self._synced_elsewhere:
            error, self._background_error = self._background_error, None
            if error is not None:
                raise error
            return
        self._sync_and_save()

    def sync_elsewhere(self) -> None:
        """From now on another thread calls `sync_in_background` about once a second, whether or not the
        replica ticks (a resting group does not), and the event loop never waits for that fsync."""
        self._synced_elsewhere = True

    def sync_in_background(self) -> bool:
        """The once-a-second sync, from the syncer's thread. A failure is raised on the replica's next
        `onOneSecondTimer`, as if it had synced there. False once the journal is closed.

        The fdatasync (on a duplicate of the descriptor) and the meta file's write run outside the lock, as
        the node log's do: the loop's appends (a learner's every entry) waited for them, tens of ms on a busy
        machine (docs/benchmarks.md, "Against an etcd watch"). The sync counts for what was written before
        it began, unless the file was truncated or replaced meanwhile; later appends wait for the next."""
        with self._lock:
            if self._closed:
                return False
            if self._failed is not None:
                self._background_error = self._failed
                return True
            fd = os.dup(self._fd) if self._dirty else None
            end, rewrites = self._end, self._rewrites
        if fd is not None:
            try:
                failpoints.hit("journal-fsync-before")  # its injected EIO stands for the fsync's
                fsync_file(fd, self._path, data_only=True)
            except (DiskFailed, OSError) as error:
                with self._lock:
                    self._failed = error if isinstance(error, DiskFailed) else fsync_failed(self._path, error)
                    self._background_error = self._failed
                return True
            finally:
                os.close(fd)
        with self._lock:
            if self._closed:
                return False
            if fd is not None and rewrites == self._rewrites:
                self._dirty = self._dirty and self._end != end
                self._synced, self._meta_saved = max(self._synced, end), False
            meta = None if self._meta_saved else self._meta_state()
            self._meta_saved = True  # a change from here on marks it unsaved again
        if meta is not None:
            try:
                self._store_meta(meta)
            except (CorruptData, StorageFull, OSError) as error:
                with self._lock:
                    self._background_error, self._meta_saved = error, False
        return True

    @_locked
    def _sync_and_save(self) -> None:
        self.sync()
        if not self._meta_saved:
            self._save_meta()

    @_locked
    def _destroy(self) -> None:
        try:
            if self._failed is None:  # nothing more is written to a disk that failed
                self.flush()
        finally:
            with self._meta_lock:  # a meta write of the syncer's thread ends first, and none begins after
                self._closed = True
            os.close(self._fd)

    # Term, vote and commit index

    @_locked
    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:
        self._term, self._voted = term, votedForNodeId
        # Synced in both modes (elections are rare): a vote forgotten in a power cut could be cast
        # again in the same term, and two leaders of one term would split the log for good.
        self._save_meta(fsync=True)

    def getCurrentTerm(self) -> int:
        return self._term

    def getVotedForNodeId(self) -> str | None:
        return self._voted

    @_locked
    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        self._commit = raftCommitIndex
        self._meta_saved = False

    def getRaftCommitIndex(self) -> int:
        return self._commit

    # Files

    def _make_directory(self) -> None:
        make_dirs(self._dir)  # in both modes: a journal whose directory a power cut took is all lost

    def _load(self, synced: int | None) -> None:
        data = _read(self._path)
        self._entries, self._offsets, self._end = _scan(self._path, data, synced)
        if self._end < len(data):
            os.truncate(self._path, self._end)
        self._fd = os.open(self._path, os.O_RDWR | os.O_APPEND)

    def _install(self, entries: list[Entry]) -> None:
        """Atomically replace the log file with one holding exactly `entries`."""
        records = [_encode_record(*entry) for entry in entries]
        fd = write_new_file(self._path, b"".join([_LOG_HEADER, *records]), fsync=True)
        os.close(self._fd)
        self._fd = fd
        self._rewrites += 1
        *self._offsets, self._end = accumulate(map(len, records), initial=len(_LOG_HEADER))
        self._entries = entries
        self._dirty = False
        self._synced = self._end
        self._save_meta(fsync=True)  # the old `synced` measured the old file

    def _save_meta(self, fsync: bool | None = None) -> None:
        # The stored commit index must never point past the durable end of the log (in the
        # default mode it may: pysyncobj clamps it to the log's end at start-up).
        self.sync()
        self._store_meta(self._meta_state(), fsync)
        self._meta_saved = True

    def _meta_state(self) -> tuple[int, bytes]:  # under the lock: the meta file's contents now, numbered
        self._meta_seq += 1
        return self._meta_seq, _encode_meta(self._term, self._commit, self._synced, self._voted)

    def _store_meta(self, state: tuple[int, bytes], fsync: bool | None = None) -> None:
        """One writer at a time, and never a state older than the one on disk (the syncer's thread writes
        outside the lock, so the loop may have stored a newer term or vote meanwhile)."""
        seq, meta = state
        with self._meta_lock:
            if seq > self._meta_stored and not self._closed:
                os.close(write_new_file(self._meta_path, meta, fsync=self._fsync if fsync is None else fsync))
                self._meta_stored = seq


def list_position(item: int, length: int) -> int:
    """The list position `item` means in a slice `[item:]` of a list of `length`."""
    return slice(item, None).indices(length)[0]


def _encode_record(command: bytes, idx: int, term: int) -> bytes:
    return frame(_IDX_TERM.pack(idx, term), command)


def _decode_record(data: bytes, offset: int) -> tuple[Entry, int]:
    """The record at `offset` and the offset just after it."""
    end = unframe(data, offset, _IDX_TERM.size)
    body = offset + RECORD_HEADER.size
    idx, term = _IDX_TERM.unpack_from(data, body)
    return (data[body + _IDX_TERM.size : end], idx, term), end


def _scan(path: Path, data: bytes, synced: int | None = None) -> tuple[list[Entry], list[int], int]:
    """Entries, their offsets and the end of the last good record in the log file `data`.

    A damaged record followed by nothing but zeros is a write cut short by a crash
    (file systems may extend a file with zeros before its data lands); it is dropped, and
    so is damage at or after `synced`, the bytes last known durable (a power cut's torn
    tail). Any other damage raises CorruptData.
    """
    _check_file_header(path, data, _LOG_MAGIC)
    entries: list[Entry] = []
    offsets: list[int] = []
    offset = FILE_HEADER.size
    while offset < len(data):
        try:
            entry, end = _decode_record(data, offset)
        except BadRecord as bad:
            beyond_sync = synced is not None and offset >= synced
            if not beyond_sync and not only_zeros_from(data, bad.torn_if_zeros_from):
                raise _corrupt(path, offset, bad.reason) from None
            _logger.warning(
                "journal %s: dropped %d bytes of a torn write at byte %d (%s); keeping %d entries",
                path, len(data) - offset, offset, bad.reason, len(entries),
            )
            break
        if entries and entry[1] != entries[-1][1] + 1:
            raise _corrupt(path, offset, f"entry {entry[1]} follows entry {entries[-1][1]}")
        entries.append(entry)
        offsets.append(offset)
        offset = end
    return entries, offsets, offset


def _encode_meta(term: int, commit: int, synced: int, voted: str | None) -> bytes:
    voted_bytes = b"" if voted is None else voted.encode()
    fields = _META_FIELDS.pack(term, commit, synced, -1 if voted is None else len(voted_bytes)) + voted_bytes
    return FILE_HEADER.pack(_META_MAGIC, META_VERSION) + _CRC.pack(zlib.crc32(fields)) + fields


def _read_meta(path: Path) -> tuple[int, int, int | None, str | None]:
    """Term, commit index, synced bytes of the log (None: not recorded, as in version 1) and
    vote stored at `path`, or the defaults if there is no file."""
    try:
        data = _read(path)
    except FileNotFoundError:
        return 0, 1, None, None
    version = _check_file_header(path, data, _META_MAGIC, (1, META_VERSION))
    fields = _META_FIELDS if version == META_VERSION else _META_FIELDS_V1
    fields_at = FILE_HEADER.size + _CRC.size
    voted_at = fields_at + fields.size
    if len(data) < voted_at:
        raise _corrupt(path, len(data), "file cut short")
    (crc,) = _CRC.unpack_from(data, FILE_HEADER.size)
    if zlib.crc32(memoryview(data)[fields_at:]) != crc:
        raise _corrupt(path, FILE_HEADER.size, "checksum mismatch")
    if version == META_VERSION:
        term, commit, synced, voted_length = fields.unpack_from(data, fields_at)
    else:
        (term, commit, voted_length), synced = fields.unpack_from(data, fields_at), None
    if len(data) != voted_at + max(voted_length, 0):
        raise _corrupt(path, voted_at, "bad vote length")
    return term, commit, synced, None if voted_length < 0 else data[voted_at:].decode()


def _read(path: Path) -> bytes:
    return read_file(path, f"move {path.parent} away and restart the node so the partition re-syncs from its peers")


def _check_file_header(path: Path, data: bytes, magic: bytes, versions: tuple[int, ...] = (FORMAT_VERSION,)) -> int:
    """The file's format version, one of `versions`."""
    return check_file_header(data, magic, versions, lambda offset, reason: _corrupt(path, offset, reason))


def _corrupt(path: Path, offset: int, reason: str) -> CorruptData:
    return CorruptData(
        f"journal {path} is corrupt at byte {offset} ({reason}); stop the node, "
        f"move {path.parent} away and restart it so the partition re-syncs from its peers"
    )
