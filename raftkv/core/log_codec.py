"""A Raft entry's payload: one *proposal*, the commands one group commit gathered for a partition.

Versioned and compact (no pickle): a version byte, then each command as its
one-byte tag and length-prefixed byte strings (raftkv/core/commands.py has
each kind's fields).

    entry   := VERSION command*
    Put     := 0x01 u32 klen u32 vlen key value
    Delete  := 0x02 u32 klen key
    Range   := 0x03 u32 slen u32 elen start end        (delete [start, end))
    Cas     := 0x04 u8 flags u32 klen u32 elen u32 nlen key expected new
               flags bit0: expected present (else "key must be absent")
               flags bit1: new present (else "delete on success")
    Batch   := 0x05 u32 count (Put | Delete | Range)*  (applied atomically)
    RegisterLearner := 0x06 u32 nlen u32 slen u32 olen name sink options-json
    RemoveLearner   := 0x07 u32 nlen name
    LearnerProgress := 0x08 u32 nlen u64 index name
    PutMany := 0x09 u32 klen u32 kolen u32 vlen u32 volen keys key-offsets values value-offsets
    IngestSst := 0x0a u32 rows sha256[32] u32 len file  (a sorted table file, docs/bulk-ingest.md)

An empty proposal (just the version byte) is a read barrier. A command is
encoded once, when the node accepts it (`encode_command`); a proposal joins
the encoded commands.
"""

from __future__ import annotations

import struct
from typing import Iterable

from raftkv.core.command_kinds import KINDS, DecodeError, encode_command
from raftkv.core.commands import Command

VERSION = 1
_HEAD = bytes((VERSION,))


def join_proposal(encoded: Iterable[bytes]) -> bytes:
    """A proposal of commands already encoded with `encode_command`."""
    return b"".join((_HEAD, *encoded))


def encode_proposal(commands: Iterable[Command]) -> bytes:
    return join_proposal(map(encode_command, commands))


def decode_proposal(buf: bytes) -> list[Command]:
    if not buf or buf[0] != VERSION:
        raise DecodeError(f"unsupported proposal version {buf[:1]!r}")
    commands: list[Command] = []
    pos, end = 1, len(buf)
    try:
        while pos < end:
            kind = KINDS.get(buf[pos])
            if kind is None:
                raise DecodeError(f"unknown command tag {buf[pos]}")
            command, pos = kind.decode(buf, pos + 1)
            commands.append(command)
    except DecodeError:
        raise
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:  # ValueError: bad options JSON
        raise DecodeError(f"truncated or malformed proposal at byte {pos}") from exc
    if pos > end:  # a length field pointed past the end: slices do not raise
        raise DecodeError(f"truncated proposal: a field runs to byte {pos} of {end}")
    return commands
