"""The bytes of the node log (`node_log.py`): its segment and meta files and its records. No I/O.

Integers are little-endian; records are framed by `record_file` with a fixed header of kind and group:

    <seq:016d>.log := "RKVWAL\\0\\0" u32 version=1 record*
    record   := u32 length | u32 length^0xFFFFFFFF | u32 crc32(kind, group, payload) | u8 kind | u32 group | payload
    meta     := "RKVWALM\\0" u32 version=1 | u32 crc32(rest) | u64 segment | u64 offset

    kind        payload                                         what replay does to the group
    1 entries   u64 first_idx (u64 term | u32 n | command[n])*  appends; first_idx must follow its last entry
    2 truncate  u64 idx                                         drops its entries from idx on
    3 compact   u64 idx                                         drops its entries before idx
    4 clear     -                                               drops every entry
    5 state     u64 term | u64 commit | i32 n (-1: none) | voted-for[n]   sets term, commit index, vote
    6 remove    -                                               forgets the group
    7 replace   as entries                                      clear, then entries (one record: all or nothing)
    8 synced    u64 segment | u64 offset (group 0xFFFFFFFF)     the log was durable up to there when written

`length` counts the payload only. The meta file holds the durable point: the segment and offset
the last sync (as of the meta's writing) covered.
"""

from __future__ import annotations

import struct
import zlib
from enum import IntEnum
from typing import Callable, Iterable

from raftkv.raft.record_file import FILE_HEADER, LENGTH_MASK, RECORD_HEADER, check_file_header, frame, unframe

Entry = tuple[bytes, int, int]  # command, idx, term: what pysyncobj keeps in its log
Point = tuple[int, int]  # (segment seq, byte offset) in the log

FORMAT_VERSION = 1
META_VERSION = 1
NO_GROUP = 0xFFFFFFFF  # the group field of a record that belongs to none
SEGMENT_MAGIC = b"RKVWAL\0\0"
META_MAGIC = b"RKVWALM\0"
SEGMENT_HEADER = FILE_HEADER.pack(SEGMENT_MAGIC, FORMAT_VERSION)
SEGMENT_SUFFIX = ".log"


class Kind(IntEnum):
    ENTRIES = 1
    TRUNCATE = 2
    COMPACT = 3
    CLEAR = 4
    STATE = 5
    REMOVE = 6
    REPLACE = 7
    SYNCED = 8


KIND_GROUP = struct.Struct("<BI")
_U64 = struct.Struct("<Q")
_ENTRY = struct.Struct("<QI")  # term, command length
_STATE = struct.Struct("<QQi")  # term, commit index, length of voted-for (-1: none)
_POINT = struct.Struct("<QQ")
_ONE_ENTRY = struct.Struct("<BIQQI")  # kind, group, first idx, then the entry's term and command length
_ENTRIES = int(Kind.ENTRIES)
_CRC = struct.Struct("<I")
ENTRY_OVERHEAD = _ENTRY.size  # bytes an entry takes in an entries record beside its command
RECORD_OVERHEAD = RECORD_HEADER.size + KIND_GROUP.size


def segment_name(seq: int) -> str:
    return f"{seq:016d}{SEGMENT_SUFFIX}"


def segment_seq(name: str) -> int | None:
    """The sequence number of a segment file's name, None for any other name."""
    stem = name.removesuffix(SEGMENT_SUFFIX)
    return int(stem) if len(stem) == 16 and stem.isdigit() and name.endswith(SEGMENT_SUFFIX) else None


# Records


def entries_record(group: int, first_idx: int, items: Iterable[tuple[bytes, int]], kind: Kind = Kind.ENTRIES) -> bytes:
    """An entries (or replace) record of `items`, (command, term) pairs from index `first_idx` on."""
    pack = _ENTRY.pack
    parts = [_U64.pack(first_idx)]
    for command, term in items:
        parts += (pack(term, len(command)), command)
    return frame(KIND_GROUP.pack(kind, group), b"".join(parts))


def one_entry_record(group: int, command: bytes, term: int, idx: int) -> bytes:
    """`entries_record` of one entry, the common case, with fewer copies."""
    body = _ONE_ENTRY.pack(_ENTRIES, group, idx, term, len(command)) + command
    length = len(body) - KIND_GROUP.size
    return RECORD_HEADER.pack(length, length ^ LENGTH_MASK, zlib.crc32(body)) + body


class GrowingEntries:
    """An entries record of one group still taking entries (a batch's), encoded when written."""

    __slots__ = ("group", "first", "next", "items")

    def __init__(self, group: int, first: int):
        self.group, self.first, self.next = group, first, first
        self.items: list[tuple[bytes, int]] = []

    def encode(self) -> bytes:
        if len(self.items) == 1:
            return one_entry_record(self.group, *self.items[0], self.first)
        return entries_record(self.group, self.first, self.items)


def index_record(kind: Kind, group: int, idx: int) -> bytes:
    """A truncate or compact record."""
    return frame(KIND_GROUP.pack(kind, group), _U64.pack(idx))


def bare_record(kind: Kind, group: int) -> bytes:
    """A clear or remove record."""
    return frame(KIND_GROUP.pack(kind, group), b"")


def state_record(group: int, term: int, commit: int, voted: str | None) -> bytes:
    voted_bytes = b"" if voted is None else voted.encode()
    payload = _STATE.pack(term, commit, -1 if voted is None else len(voted_bytes)) + voted_bytes
    return frame(KIND_GROUP.pack(Kind.STATE, group), payload)


def synced_record(point: Point) -> bytes:
    return frame(KIND_GROUP.pack(Kind.SYNCED, NO_GROUP), _POINT.pack(*point))


SYNCED_PREFIX = RECORD_HEADER.pack(_POINT.size, _POINT.size ^ 0xFFFFFFFF, 0)[:8]  # how every synced record starts


class BadPayload(Exception):
    """A record whose checksum holds but whose payload does not parse: written wrong, not torn."""


def read_record(data: bytes, offset: int) -> tuple[int, int, int, int]:
    """(kind, group, payload start, end) of the record at `offset`; raises record_file.BadRecord."""
    end = unframe(data, offset, KIND_GROUP.size)
    kind, group = KIND_GROUP.unpack_from(data, offset + RECORD_HEADER.size)
    return kind, group, offset + RECORD_OVERHEAD, end


def legible_group(data: bytes, offset: int) -> int:
    """The group field of the (maybe damaged) record at `offset`, unchecked."""
    return KIND_GROUP.unpack_from(data, offset + RECORD_HEADER.size)[1]


def read_entries(data: bytes, start: int, end: int) -> tuple[int, list[tuple[bytes, int]]]:
    """first_idx and the (command, term) pairs of an entries or replace payload."""
    if end - start < _U64.size:
        raise BadPayload("entries record without a first index")
    (first_idx,) = _U64.unpack_from(data, start)
    items = []
    at = start + _U64.size
    unpack = _ENTRY.unpack_from
    while at < end:
        if end - at < _ENTRY.size:
            raise BadPayload("entry header cut short")
        term, length = unpack(data, at)
        at += _ENTRY.size
        if at + length > end:
            raise BadPayload("entry runs past its record")
        items.append((data[at : at + length], term))
        at += length
    return first_idx, items


def read_index(data: bytes, start: int, end: int) -> int:
    if end - start != _U64.size:
        raise BadPayload("bad index record length")
    return _U64.unpack_from(data, start)[0]


def read_state(data: bytes, start: int, end: int) -> tuple[int, int, str | None]:
    """term, commit index, voted-for of a state payload."""
    if end - start < _STATE.size:
        raise BadPayload("state record cut short")
    term, commit, voted_length = _STATE.unpack_from(data, start)
    voted_at = start + _STATE.size
    if end != voted_at + max(voted_length, 0):
        raise BadPayload("bad vote length")
    try:
        return term, commit, None if voted_length < 0 else data[voted_at:end].decode()
    except UnicodeDecodeError:
        raise BadPayload("vote is not UTF-8") from None


def read_point(data: bytes, start: int, end: int) -> Point:
    if end - start != _POINT.size:
        raise BadPayload("bad synced record length")
    return _POINT.unpack_from(data, start)


# The meta file


def encode_meta(durable: Point) -> bytes:
    fields = _POINT.pack(*durable)
    return FILE_HEADER.pack(META_MAGIC, META_VERSION) + _CRC.pack(zlib.crc32(fields)) + fields


def decode_meta(data: bytes, corrupt: Callable[[int, str], Exception]) -> Point:
    check_file_header(data, META_MAGIC, (META_VERSION,), corrupt)
    fields_at = FILE_HEADER.size + _CRC.size
    if len(data) != fields_at + _POINT.size:
        raise corrupt(min(len(data), fields_at), "bad meta length")
    (crc,) = _CRC.unpack_from(data, FILE_HEADER.size)
    if zlib.crc32(data[fields_at:]) != crc:
        raise corrupt(FILE_HEADER.size, "checksum mismatch")
    return _POINT.unpack_from(data, fields_at)

