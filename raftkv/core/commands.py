"""Write commands and their log encoding.

A Raft entry holds one *proposal*: the commands that one group commit gathered
for a partition. The encoding is versioned and compact (no pickle): a version
byte, then each command as a one-byte tag and length-prefixed byte strings.

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

An empty proposal (just the version byte) is a read barrier.
"""

from __future__ import annotations

import json
import re
import struct
from array import array
from dataclasses import dataclass
from itertools import accumulate
from typing import Iterator, Sequence, Union

from raftkv.core.errors import InvalidRequest

VERSION = 1

_TAG_PUT, _TAG_DELETE, _TAG_RANGE, _TAG_CAS, _TAG_BATCH = 1, 2, 3, 4, 5
_TAG_REGISTER, _TAG_REMOVE, _TAG_PROGRESS, _TAG_PUT_MANY = 6, 7, 8, 9
_U32x4 = struct.Struct("<IIII")
_U32x3 = struct.Struct("<III")
_PROGRESS_HEAD = struct.Struct("<IQ")
_U32 = struct.Struct("<I")
_U32x2 = struct.Struct("<II")
_CAS_HEAD = struct.Struct("<BIII")


@dataclass(frozen=True, slots=True)
class Put:
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class Delete:
    key: bytes


@dataclass(frozen=True, slots=True)
class DeleteRange:
    """Delete every key in [start, end)."""

    start: bytes
    end: bytes


@dataclass(frozen=True, slots=True)
class Cas:
    """Set `key` to `new` (or delete it when `new` is None) if its value is `expected`.

    `expected=None` means the key must be absent.
    """

    key: bytes
    expected: bytes | None
    new: bytes | None


@dataclass(frozen=True, slots=True)
class PutMany:
    """Puts of one partition applied atomically, in Arrow's binary layout: what bulk loaders send.

    Keys and values are concatenated; each offsets field holds count + 1
    int32 little-endian positions into them. Nothing is built per row until
    the rows are written, which makes a bulk load several times cheaper than
    a Batch of Puts (docs/spark.md).
    """

    keys: bytes
    key_offsets: bytes
    values: bytes
    value_offsets: bytes

    @classmethod
    def of(cls, keys: Sequence[bytes], values: Sequence[bytes]) -> PutMany:
        return cls(b"".join(keys), _offsets(keys), b"".join(values), _offsets(values))

    def split(self) -> tuple[list[bytes], list[bytes]]:
        return _slices(self.keys, self.key_offsets), _slices(self.values, self.value_offsets)

    def pairs(self) -> Iterator[tuple[bytes, bytes]]:
        return zip(*self.split())


def single_mutations(mutations: Sequence[Mutation]) -> Iterator[Put | Delete | DeleteRange]:
    """The mutations with each PutMany spelled out as its Puts, for code that looks at every key."""
    for m in mutations:
        if isinstance(m, PutMany):
            yield from (Put(key, value) for key, value in m.pairs())
        else:
            yield m


def _offsets(items: Sequence[bytes]) -> bytes:
    return array("i", accumulate(map(len, items), initial=0)).tobytes()


def _slices(data: bytes, offsets: bytes) -> list[bytes]:
    bounds = array("i")
    bounds.frombytes(offsets)
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


Mutation = Union[Put, Delete, DeleteRange, PutMany]


@dataclass(frozen=True, slots=True)
class Batch:
    """Mutations of one partition applied atomically."""

    ops: tuple[Put | Delete | DeleteRange, ...]


@dataclass(frozen=True, slots=True)
class RegisterLearner:
    """Make `name` a learner of this partition, feeding `sink` configured by `options`."""

    name: str
    sink: str
    options: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class RemoveLearner:
    name: str


@dataclass(frozen=True, slots=True)
class LearnerProgress:
    """Learner `name` has durably delivered this partition's entries up to `index`."""

    name: str
    index: int


LearnerCommand = Union[RegisterLearner, RemoveLearner, LearnerProgress]
Command = Union[Put, Delete, DeleteRange, Cas, Batch, PutMany, RegisterLearner, RemoveLearner, LearnerProgress]


@dataclass(frozen=True, slots=True)
class CasResult:
    succeeded: bool
    current: bytes | None  # the value after the command


def routing_keys(command: Command) -> list[bytes]:
    """The keys that decide a command's partition.

    A DeleteRange applies within whichever partition it is sent to, so it
    routes by nothing; a Batch routes by its put and delete keys, and its
    ranges apply within that partition.
    """
    if isinstance(command, Batch):
        return [k for op in command.ops for k in routing_keys(op)]
    if isinstance(command, PutMany):
        return command.split()[0]
    if isinstance(command, (DeleteRange, RegisterLearner, RemoveLearner, LearnerProgress)):
        return []
    return [command.key]


def command_size(command: Command) -> int:
    """Encoded size in bytes, for batching limits."""
    if isinstance(command, Put):
        return 9 + len(command.key) + len(command.value)
    if isinstance(command, Delete):
        return 5 + len(command.key)
    if isinstance(command, DeleteRange):
        return 9 + len(command.start) + len(command.end)
    if isinstance(command, Cas):
        return 14 + len(command.key) + len(command.expected or b"") + len(command.new or b"")
    if isinstance(command, Batch):
        return 5 + sum(command_size(op) for op in command.ops)
    if isinstance(command, PutMany):
        return 17 + len(command.keys) + len(command.key_offsets) + len(command.values) + len(command.value_offsets)
    return len(_encode_learner_command(command))


def _encode_into(out: list[bytes], command: Command) -> None:
    if isinstance(command, Put):
        out += (b"\x01", _U32x2.pack(len(command.key), len(command.value)), command.key, command.value)
    elif isinstance(command, Delete):
        out += (b"\x02", _U32.pack(len(command.key)), command.key)
    elif isinstance(command, DeleteRange):
        out += (b"\x03", _U32x2.pack(len(command.start), len(command.end)), command.start, command.end)
    elif isinstance(command, Cas):
        flags = (command.expected is not None) | ((command.new is not None) << 1)
        expected, new = command.expected or b"", command.new or b""
        out += (
            b"\x04",
            _CAS_HEAD.pack(flags, len(command.key), len(expected), len(new)),
            command.key,
            expected,
            new,
        )
    elif isinstance(command, Batch):
        out += (b"\x05", _U32.pack(len(command.ops)))
        for op in command.ops:
            if isinstance(op, (Cas, Batch, PutMany)):
                raise ValueError("a batch holds only put, delete and delete_range")
            _encode_into(out, op)
    elif isinstance(command, PutMany):
        fields = (command.keys, command.key_offsets, command.values, command.value_offsets)
        out += (b"\x09", _U32x4.pack(*map(len, fields)), *fields)
    elif isinstance(command, (RegisterLearner, RemoveLearner, LearnerProgress)):
        out.append(_encode_learner_command(command))
    else:
        raise TypeError(f"not a command: {command!r}")


def _encode_learner_command(command: LearnerCommand) -> bytes:
    name = command.name.encode()
    if isinstance(command, RegisterLearner):
        sink = command.sink.encode()
        options = json.dumps(dict(command.options), sort_keys=True).encode()
        return b"\x06" + _U32x3.pack(len(name), len(sink), len(options)) + name + sink + options
    if isinstance(command, RemoveLearner):
        return b"\x07" + _U32.pack(len(name)) + name
    return b"\x08" + _PROGRESS_HEAD.pack(len(name), command.index) + name


def encode_proposal(commands: list[Command] | tuple[Command, ...]) -> bytes:
    out: list[bytes] = [bytes((VERSION,))]
    for command in commands:
        _encode_into(out, command)
    return b"".join(out)


class DecodeError(ValueError):
    """The bytes are not a proposal this version understands."""


def _decode_one(buf: bytes, pos: int) -> tuple[Command, int]:
    tag = buf[pos]
    pos += 1
    if tag == _TAG_PUT:
        klen, vlen = _U32x2.unpack_from(buf, pos)
        pos += 8
        end = pos + klen
        return Put(buf[pos:end], buf[end : end + vlen]), end + vlen
    if tag == _TAG_DELETE:
        (klen,) = _U32.unpack_from(buf, pos)
        pos += 4
        return Delete(buf[pos : pos + klen]), pos + klen
    if tag == _TAG_RANGE:
        slen, elen = _U32x2.unpack_from(buf, pos)
        pos += 8
        mid = pos + slen
        return DeleteRange(buf[pos:mid], buf[mid : mid + elen]), mid + elen
    if tag == _TAG_CAS:
        flags, klen, elen, nlen = _CAS_HEAD.unpack_from(buf, pos)
        pos += _CAS_HEAD.size
        if flags & ~3 or (not flags & 1 and elen) or (not flags & 2 and nlen):
            raise DecodeError(f"malformed cas at byte {pos - _CAS_HEAD.size - 1}")
        key_end = pos + klen
        exp_end = key_end + elen
        new_end = exp_end + nlen
        expected = buf[key_end:exp_end] if flags & 1 else None
        new = buf[exp_end:new_end] if flags & 2 else None
        return Cas(buf[pos:key_end], expected, new), new_end
    if tag == _TAG_BATCH:
        (count,) = _U32.unpack_from(buf, pos)
        pos += 4
        ops = []
        for _ in range(count):
            if buf[pos] not in (_TAG_PUT, _TAG_DELETE, _TAG_RANGE):
                raise DecodeError(f"tag {buf[pos]} is not allowed inside a batch")
            op, pos = _decode_one(buf, pos)
            ops.append(op)
        return Batch(tuple(ops)), pos
    if tag == _TAG_PUT_MANY:
        lengths = _U32x4.unpack_from(buf, pos)
        pos += _U32x4.size
        _, key_offsets_len, _, value_offsets_len = lengths
        if key_offsets_len != value_offsets_len or key_offsets_len < 8 or key_offsets_len % 4:
            raise DecodeError(f"malformed put_many at byte {pos - _U32x4.size - 1}")
        fields = []
        for length in lengths:
            fields.append(buf[pos : pos + length])
            pos += length
        return PutMany(*fields), pos
    if tag == _TAG_REGISTER:
        nlen, slen, olen = _U32x3.unpack_from(buf, pos)
        pos += _U32x3.size
        name_end, sink_end = pos + nlen, pos + nlen + slen
        options = json.loads(buf[sink_end : sink_end + olen])
        command = RegisterLearner(buf[pos:name_end].decode(), buf[name_end:sink_end].decode(),
                                  tuple(sorted(options.items())))
        return command, sink_end + olen
    if tag == _TAG_REMOVE:
        (nlen,) = _U32.unpack_from(buf, pos)
        pos += 4
        return RemoveLearner(buf[pos : pos + nlen].decode()), pos + nlen
    if tag == _TAG_PROGRESS:
        nlen, index = _PROGRESS_HEAD.unpack_from(buf, pos)
        pos += _PROGRESS_HEAD.size
        return LearnerProgress(buf[pos : pos + nlen].decode(), index), pos + nlen
    raise DecodeError(f"unknown command tag {tag}")


def decode_proposal(buf: bytes) -> list[Command]:
    if not buf or buf[0] != VERSION:
        raise DecodeError(f"unsupported proposal version {buf[:1]!r}")
    commands: list[Command] = []
    pos, end = 1, len(buf)
    try:
        while pos < end:
            command, pos = _decode_one(buf, pos)
            commands.append(command)
    except DecodeError:
        raise
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:  # ValueError: bad options JSON
        raise DecodeError(f"truncated or malformed proposal at byte {pos}") from exc
    if pos > end:  # a length field pointed past the end: slices do not raise
        raise DecodeError(f"truncated proposal: a field runs to byte {pos} of {end}")
    return commands


LEARNER_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True, slots=True)
class Limits:
    max_key_bytes: int = 4096
    max_value_bytes: int = 1024 * 1024


def check_command(command: Command, limits: Limits) -> None:
    """Raise InvalidRequest naming what is wrong with `command`."""
    def key(k: bytes, what: str = "key") -> None:
        if not k:
            raise InvalidRequest(f"{what} must not be empty")
        if len(k) > limits.max_key_bytes:
            raise InvalidRequest(
                f"{what} is {len(k)} bytes; the limit is {limits.max_key_bytes} (cluster.max_key_bytes)"
            )

    def value(v: bytes | None) -> None:
        if v is not None and len(v) > limits.max_value_bytes:
            raise InvalidRequest(
                f"value is {len(v)} bytes; the limit is {limits.max_value_bytes} (cluster.max_value_bytes)"
            )

    if isinstance(command, Put):
        key(command.key)
        value(command.value)
    elif isinstance(command, Delete):
        key(command.key)
    elif isinstance(command, DeleteRange):
        key(command.start, "range start")
        key(command.end, "range end")
        if command.start >= command.end:
            raise InvalidRequest("range start must be below range end")
    elif isinstance(command, Cas):
        key(command.key)
        value(command.expected)
        value(command.new)
    elif isinstance(command, (RegisterLearner, RemoveLearner, LearnerProgress)):
        if not LEARNER_NAME.fullmatch(command.name):
            raise InvalidRequest(f"learner name {command.name!r}: use 1-64 letters, digits, '-', '_' or '.'")
        if isinstance(command, RegisterLearner) and not command.sink:
            raise InvalidRequest("a learner needs a sink")
    elif isinstance(command, PutMany):
        _check_put_many(command, limits)
    elif isinstance(command, Batch):
        if not command.ops:
            raise InvalidRequest("a batch needs at least one operation")
        for op in command.ops:
            if isinstance(op, (Cas, Batch, PutMany)):
                raise InvalidRequest("a batch holds only put, delete and delete_range")
            check_command(op, limits)


def _check_put_many(command: PutMany, limits: Limits) -> None:
    columns = []
    for what, data, offsets in (("key", command.keys, command.key_offsets),
                                ("value", command.values, command.value_offsets)):
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
