"""The one registry of command kinds: how each is encoded, checked, routed and written.

Each kind of command (raftkv/core/commands.py) registers a `Kind` under the
one-byte tag it has in the log (raftkv/core/log_codec.py frames a proposal
around them). Everything that treats commands alike looks its kind up here
instead of testing types, and the gRPC conversions (raftkv/api/convert.py)
are keyed by the same tag. Mutations (the commands that change keys) also
say how to write themselves to a `Writer`: an engine's write batch, or an
overlay of pending writes.
"""

from __future__ import annotations

import json
import re
import struct
from array import array
from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol

from raftkv.core.commands import (
    Batch, Cas, Command, Delete, DeleteRange, LearnerCommand, LearnerProgress, Limits, Mutation, Put, PutMany,
    RegisterLearner, RemoveLearner,
)
from raftkv.core.errors import InvalidRequest

_U32 = struct.Struct("<I")
_U32x2 = struct.Struct("<II")
_U32x3 = struct.Struct("<III")
_U32x4 = struct.Struct("<IIII")
_CAS_HEAD = struct.Struct("<BIII")
_PROGRESS_HEAD = struct.Struct("<IQ")


class DecodeError(ValueError):
    """The bytes are not a proposal this version understands."""


class Writer(Protocol):
    """Where mutations go: a RocksDB WriteBatch has exactly these."""

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...

    def delete_range(self, start: bytes, end: bytes) -> None: ...


@dataclass(frozen=True)
class Kind:
    """Everything that differs between kinds of command, under its log tag."""

    tag: int
    type: type
    encode: Callable[[Any], tuple[bytes, ...]]  # the fields after the tag
    decode: Callable[[bytes, int], tuple[Any, int]]  # from just after the tag: (command, next position)
    check: Callable[[Any, Limits], None]  # raise InvalidRequest naming the problem
    routing_keys: Callable[[Any], list[bytes]]  # the keys that decide its partition
    write: Callable[[Any, Writer], None] | None = None  # mutations only: write it
    in_batch: bool = False  # may appear inside a Batch

    tag_byte: bytes = b""  # set when registered


KINDS: dict[int, Kind] = {}
_BY_TYPE: dict[type, Kind] = {}


def kind_of(command: Command) -> Kind:
    try:
        return _BY_TYPE[type(command)]
    except KeyError:
        raise TypeError(f"not a command: {command!r}") from None


def tag_of(command_type: type) -> int:
    return _BY_TYPE[command_type].tag


def encode_command(command: Command) -> bytes:
    """The command as it appears in a proposal: its tag and its fields."""
    kind = kind_of(command)
    return b"".join((kind.tag_byte, *kind.encode(command)))


def check_command(command: Command, limits: Limits) -> None:
    """Raise InvalidRequest naming what is wrong with `command`."""
    kind_of(command).check(command, limits)


def routing_keys(command: Command) -> list[bytes]:
    """The keys that decide a command's partition.

    A DeleteRange applies within whichever partition it is sent to, so it
    routes by nothing; a Batch routes by its put and delete keys, and its
    ranges apply within that partition.
    """
    return kind_of(command).routing_keys(command)


def write_mutation(m: Mutation, writer: Writer) -> None:
    kind_of(m).write(m, writer)


def _register(kind: Kind) -> None:
    KINDS[kind.tag] = _BY_TYPE[kind.type] = replace(kind, tag_byte=bytes((kind.tag,)))


def _none(command: Any) -> list[bytes]:
    return []


def _check_key(k: bytes, limits: Limits, what: str = "key") -> None:
    if not k:
        raise InvalidRequest(f"{what} must not be empty")
    if len(k) > limits.max_key_bytes:
        raise InvalidRequest(f"{what} is {len(k)} bytes; the limit is {limits.max_key_bytes} (cluster.max_key_bytes)")


def _check_value(v: bytes | None, limits: Limits) -> None:
    if v is not None and len(v) > limits.max_value_bytes:
        raise InvalidRequest(
            f"value is {len(v)} bytes; the limit is {limits.max_value_bytes} (cluster.max_value_bytes)")


def _fields(buf: bytes, pos: int, head: struct.Struct) -> tuple[list[bytes], int]:
    """Length-prefixed byte strings: the lengths in `head`, then the strings back to back."""
    lengths = head.unpack_from(buf, pos)
    pos += head.size
    out = []
    for length in lengths:
        out.append(buf[pos:pos + length])
        pos += length
    return out, pos


# -- Put 0x01, Delete 0x02, DeleteRange 0x03 ------------------------------------

def _check_put(c: Put, limits: Limits) -> None:
    _check_key(c.key, limits)
    _check_value(c.value, limits)


def _decode_put(buf: bytes, pos: int) -> tuple[Put, int]:
    (key, value), pos = _fields(buf, pos, _U32x2)
    return Put(key, value), pos


def _decode_delete(buf: bytes, pos: int) -> tuple[Delete, int]:
    (key,), pos = _fields(buf, pos, _U32)
    return Delete(key), pos


def _check_range(c: DeleteRange, limits: Limits) -> None:
    _check_key(c.start, limits, "range start")
    _check_key(c.end, limits, "range end")
    if c.start >= c.end:
        raise InvalidRequest("range start must be below range end")


def _decode_range(buf: bytes, pos: int) -> tuple[DeleteRange, int]:
    (start, end), pos = _fields(buf, pos, _U32x2)
    return DeleteRange(start, end), pos


def _write_range(c: DeleteRange, w: Writer) -> None:
    if c.start < c.end:  # RocksDB fails the whole database on end < start
        w.delete_range(c.start, c.end)


_register(Kind(1, Put, lambda c: (_U32x2.pack(len(c.key), len(c.value)), c.key, c.value), _decode_put, _check_put,
               lambda c: [c.key], lambda c, w: w.put(c.key, c.value), in_batch=True))
_register(Kind(2, Delete, lambda c: (_U32.pack(len(c.key)), c.key), _decode_delete,
               lambda c, limits: _check_key(c.key, limits), lambda c: [c.key], lambda c, w: w.delete(c.key),
               in_batch=True))
_register(Kind(3, DeleteRange, lambda c: (_U32x2.pack(len(c.start), len(c.end)), c.start, c.end), _decode_range,
               _check_range, _none, _write_range, in_batch=True))


# -- Cas 0x04: flags bit0 expected present (else "must be absent"), bit1 new present (else delete) ----

def _encode_cas(c: Cas) -> tuple[bytes, ...]:
    flags = (c.expected is not None) | ((c.new is not None) << 1)
    expected, new = c.expected or b"", c.new or b""
    return _CAS_HEAD.pack(flags, len(c.key), len(expected), len(new)), c.key, expected, new


def _decode_cas(buf: bytes, pos: int) -> tuple[Cas, int]:
    flags, _, elen, nlen = _CAS_HEAD.unpack_from(buf, pos)
    if flags & ~3 or (not flags & 1 and elen) or (not flags & 2 and nlen):
        raise DecodeError(f"malformed cas at byte {pos - 1}")
    (key, expected, new), pos = _fields(buf, pos + 1, _U32x3)
    return Cas(key, expected if flags & 1 else None, new if flags & 2 else None), pos


def _check_cas(c: Cas, limits: Limits) -> None:
    _check_key(c.key, limits)
    _check_value(c.expected, limits)
    _check_value(c.new, limits)


_register(Kind(4, Cas, _encode_cas, _decode_cas, _check_cas, lambda c: [c.key]))


# -- Batch 0x05: u32 count, then Put | Delete | DeleteRange, applied atomically --------------------

def _encode_batch(c: Batch) -> tuple[bytes, ...]:
    if not all(kind_of(op).in_batch for op in c.ops):
        raise ValueError("a batch holds only put, delete and delete_range")
    return (_U32.pack(len(c.ops)), *map(encode_command, c.ops))


def _decode_batch(buf: bytes, pos: int) -> tuple[Batch, int]:
    (count,) = _U32.unpack_from(buf, pos)
    pos += 4
    ops = []
    for _ in range(count):
        kind = KINDS.get(buf[pos])
        if kind is None or not kind.in_batch:
            raise DecodeError(f"tag {buf[pos]} is not allowed inside a batch")
        op, pos = kind.decode(buf, pos + 1)
        ops.append(op)
    return Batch(tuple(ops)), pos


def _check_batch(c: Batch, limits: Limits) -> None:
    if not c.ops:
        raise InvalidRequest("a batch needs at least one operation")
    for op in c.ops:
        if not kind_of(op).in_batch:
            raise InvalidRequest("a batch holds only put, delete and delete_range")
        check_command(op, limits)


_register(Kind(5, Batch, _encode_batch, _decode_batch, _check_batch,
               lambda c: [k for op in c.ops for k in routing_keys(op)]))


# -- PutMany 0x09: u32 klen u32 kolen u32 vlen u32 volen keys key-offsets values value-offsets -----

def _decode_put_many(buf: bytes, pos: int) -> tuple[PutMany, int]:
    _, key_offsets_len, _, value_offsets_len = _U32x4.unpack_from(buf, pos)
    if key_offsets_len != value_offsets_len or key_offsets_len < 8 or key_offsets_len % 4:
        raise DecodeError(f"malformed put_many at byte {pos - 1}")
    fields, pos = _fields(buf, pos, _U32x4)
    return PutMany(*fields), pos


def _check_put_many(c: PutMany, limits: Limits) -> None:
    columns = []
    for what, data, offsets in (("key", c.keys, c.key_offsets), ("value", c.values, c.value_offsets)):
        bounds = array("i")
        if len(offsets) % bounds.itemsize:
            raise InvalidRequest(f"put_many {what} offsets are not whole int32s")
        bounds.frombytes(offsets)
        if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != len(data):
            raise InvalidRequest(f"put_many {what} offsets must run from 0 to the data's length, with one row or more")
        lengths = [b - a for a, b in zip(bounds, bounds[1:])]
        if min(lengths) < 0:
            raise InvalidRequest(f"put_many {what} offsets must not decrease")
        columns.append(lengths)
    key_lengths, value_lengths = columns
    if len(key_lengths) != len(value_lengths):
        raise InvalidRequest(f"put_many has {len(key_lengths)} keys but {len(value_lengths)} values")
    if min(key_lengths) == 0:
        raise InvalidRequest("key must not be empty")
    if max(key_lengths) > limits.max_key_bytes:
        raise InvalidRequest(
            f"key is {max(key_lengths)} bytes; the limit is {limits.max_key_bytes} (cluster.max_key_bytes)")
    if max(value_lengths) > limits.max_value_bytes:
        raise InvalidRequest(
            f"value is {max(value_lengths)} bytes; the limit is {limits.max_value_bytes} (cluster.max_value_bytes)")


def _write_put_many(c: PutMany, w: Writer) -> None:
    for key, value in c.pairs():
        w.put(key, value)


def _encode_put_many(c: PutMany) -> tuple[bytes, ...]:
    fields = (c.keys, c.key_offsets, c.values, c.value_offsets)
    return (_U32x4.pack(*map(len, fields)), *fields)


_register(Kind(9, PutMany, _encode_put_many, _decode_put_many, _check_put_many, lambda c: c.split()[0],
               _write_put_many))


# -- learner commands: RegisterLearner 0x06 (options as JSON), RemoveLearner 0x07, LearnerProgress 0x08

LEARNER_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _check_learner(c: LearnerCommand, limits: Limits) -> None:
    if not LEARNER_NAME.fullmatch(c.name):
        raise InvalidRequest(f"learner name {c.name!r}: use 1-64 letters, digits, '-', '_' or '.'")
    if type(c) is RegisterLearner and not c.sink:
        raise InvalidRequest("a learner needs a sink")


def _encode_register(c: RegisterLearner) -> tuple[bytes, ...]:
    name, sink = c.name.encode(), c.sink.encode()
    options = json.dumps(dict(c.options), sort_keys=True).encode()
    return _U32x3.pack(len(name), len(sink), len(options)), name, sink, options


def _decode_register(buf: bytes, pos: int) -> tuple[RegisterLearner, int]:
    (name, sink, options), pos = _fields(buf, pos, _U32x3)
    return RegisterLearner(name.decode(), sink.decode(), tuple(sorted(json.loads(options).items()))), pos


def _decode_remove(buf: bytes, pos: int) -> tuple[RemoveLearner, int]:
    (name,), pos = _fields(buf, pos, _U32)
    return RemoveLearner(name.decode()), pos


def _decode_progress(buf: bytes, pos: int) -> tuple[LearnerProgress, int]:
    nlen, index = _PROGRESS_HEAD.unpack_from(buf, pos)
    pos += _PROGRESS_HEAD.size
    return LearnerProgress(buf[pos:pos + nlen].decode(), index), pos + nlen


_register(Kind(6, RegisterLearner, _encode_register, _decode_register, _check_learner, _none))
_register(Kind(7, RemoveLearner, lambda c: (_U32.pack(len(c.name.encode())), c.name.encode()), _decode_remove,
               _check_learner, _none))
_register(Kind(8, LearnerProgress, lambda c: (_PROGRESS_HEAD.pack(len(c.name.encode()), c.index), c.name.encode()),
               _decode_progress, _check_learner, _none))
