"""Checksummed record files, as the Raft logs keep them: framing, file headers, and writes that last.

Shared by the journal of one replica (`journal.py`) and the node's shared log (`node_log.py`).
A record is framed as

    u32 length | u32 length ^ 0xFFFFFFFF | u32 crc32(fixed + payload) | fixed | payload

where `fixed` is a header of fixed size that each log defines (`length` counts only the payload).
The length is stored with its complement so that a damaged length field is caught as corruption
instead of looking like a record cut short at the end of the file. A file opens with 8 bytes of
magic and a u32 format version; integers are little-endian.
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
import zlib
from pathlib import Path
from typing import Callable

from raftkv.core.durable import fsync_directory, fsync_file
from raftkv.core.errors import DiskFailed, StorageFull

FULL_UNTIL_FREE_BYTES = 8 << 20
FILE_HEADER = struct.Struct("<8sI")  # magic, format version
RECORD_HEADER = struct.Struct("<III")  # length, length ^ LENGTH_MASK, crc
LENGTH_MASK = 0xFFFFFFFF
TMP_SUFFIX = ".tmp"


def frame(fixed: bytes, payload: bytes) -> bytes:
    """One record: `fixed` and `payload` behind their length and checksum."""
    length = len(payload)
    crc = zlib.crc32(payload, zlib.crc32(fixed))
    return RECORD_HEADER.pack(length, length ^ LENGTH_MASK, crc) + fixed + payload


class BadRecord(Exception):
    """A record failed a check; it is a torn write if only zeros follow `torn_if_zeros_from`."""

    def __init__(self, reason: str, torn_if_zeros_from: int):
        super().__init__(reason)
        self.reason = reason
        self.torn_if_zeros_from = torn_if_zeros_from


def unframe(data: bytes, offset: int, fixed_size: int) -> int:
    """Check the record at `offset` (its fixed header starts RECORD_HEADER.size later); return its end."""
    size = len(data)
    body = offset + RECORD_HEADER.size
    if body + fixed_size > size:
        raise BadRecord("incomplete record header", size)
    length, length_check, crc = RECORD_HEADER.unpack_from(data, offset)
    if length ^ length_check != LENGTH_MASK:
        raise BadRecord("bad record length", offset)
    end = body + fixed_size + length
    if end > size:
        raise BadRecord("incomplete record", size)
    if zlib.crc32(memoryview(data)[body:end]) != crc:
        raise BadRecord("checksum mismatch", end)
    return end


def legible_end(data: bytes, offset: int, fixed_size: int) -> int | None:
    """Where the record at `offset` ends (maybe past the data) if its headers are there and its length
    field is sound; its checksum unchecked."""
    body = offset + RECORD_HEADER.size
    if body + fixed_size > len(data):
        return None
    length, length_check, _ = RECORD_HEADER.unpack_from(data, offset)
    return body + fixed_size + length if length ^ length_check == LENGTH_MASK else None


def only_zeros_from(data: bytes, offset: int) -> bool:
    return data.count(0, offset) == len(data) - offset


def check_file_header(data: bytes, magic: bytes, versions: tuple[int, ...],
                      corrupt: Callable[[int, str], Exception]) -> int:
    """The file's format version, one of `versions`; else `corrupt(offset, reason)` is raised."""
    if len(data) < FILE_HEADER.size:
        raise corrupt(len(data), "file header cut short")
    found_magic, version = FILE_HEADER.unpack_from(data)
    if found_magic != magic:
        raise corrupt(0, "not a raftkv journal file")
    if version not in versions:
        raise corrupt(len(magic), f"unsupported format version {version}")
    return version


def read_file(path: Path, remedy: str) -> bytes:
    """The file's bytes; a failed read (not a missing file) is DiskFailed, whose message ends with `remedy`."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as error:
        raise DiskFailed(f"reading {path} failed ({error.strerror}); check the disk (dmesg), then {remedy}") from error


def write_all(fd: int, data: bytes, path: Path) -> None:
    try:
        written = os.write(fd, data)
        while written < len(data):  # a regular file only takes part of a write as the disk fills up
            written += os.write(fd, data[written:])
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise StorageFull(f"disk full while writing {path}; free space on that disk") from error
        raise


class DiskSpace:
    """Whether appends to a log in `folder` fail for want of space: from a failed one until one succeeds
    or the disk has FULL_UNTIL_FREE_BYTES free. A leader asks before proposing (and steps aside)."""

    def __init__(self, folder: Path):
        self._folder = folder
        self._full = False

    def mark(self, full: bool) -> None:
        self._full = full

    @property
    def full(self) -> bool:
        if self._full and shutil.disk_usage(self._folder).free >= FULL_UNTIL_FREE_BYTES:
            self._full = False
        return self._full


def append_whole(fd: int, data: bytes, path: Path, end: int, space: DiskSpace) -> None:
    """Append `data` to the file of `fd`, which ends at `end`. If that fails, what was written of it is
    cut back off (a partial record would make the log unreadable) and the error raised."""
    try:
        write_all(fd, data, path)
    except BaseException as error:
        os.ftruncate(fd, end)
        space.mark(isinstance(error, StorageFull))
        raise
    space.mark(False)


def tmp_path(path: Path) -> Path:
    return path.with_name(path.name + TMP_SUFFIX)


def write_new_file(path: Path, data: bytes, fsync: bool) -> int:
    """Atomically replace `path` with a file holding `data`; return an appending fd on it.

    The new file's data is synced even without `fsync`, which only leaves out the directory's:
    a later sync of the directory makes the rename durable, and a rename durable before its
    file's data leaves an empty file after a power cut."""
    tmp = tmp_path(path)
    fd = os.open(tmp, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data, tmp)
        fsync_file(fd, tmp)
        os.replace(tmp, path)
        if fsync:
            fsync_directory(path.parent)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return fd
