"""The one registry of command kinds: how each is encoded, checked, routed, permitted and applied.

Each kind of command (raftkv/core/commands.py) registers a `Kind` under the
one-byte tag it has in the log (raftkv/core/log_codec.py frames a proposal
around them) and the name of its field in the API's `Op` message
(raftkv/api/convert.py converts by it). Everything that treats commands alike
looks its kind up here instead of testing types: the state machine applies a
command with its `apply`, the gatekeeper asks for the access it names, the
change feed reads a mutation's rows. Mutations (the commands that are written
to the engine as they are) also say how to write themselves to a `Writer`: an
engine's write batch, or an overlay of pending writes.

A new kind is a dataclass in commands.py, a `register` here, its message in
kv.proto and the client method that sends it.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from array import array
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Protocol

from raftkv.core.commands import (
    Batch, Cas, CasResult, Command, Delete, DeleteRange, Guard, GuardedBatch, IngestSst, LearnerCommand, LearnerProgress,
    Limits, Mutation, Put, PutMany, RegisterLearner, RemoveLearner,
)
from raftkv.core.errors import InvalidRequest
from raftkv.core.learner_registry import progress_updates, register_updates, remove_updates

_U32 = struct.Struct("<I")
_U32x2 = struct.Struct("<II")
_U32x3 = struct.Struct("<III")
_U32x4 = struct.Struct("<IIII")
_CAS_HEAD = struct.Struct("<BIII")
_GUARD_HEAD = struct.Struct("<BII")
_PROGRESS_HEAD = struct.Struct("<IQ")
_INGEST_HEAD = struct.Struct("<I32sI")
ALL_KEYS_END = b"\xff" * 4097  # past every key a cluster accepts (cluster.max_key_bytes is at most 4096)


class DecodeError(ValueError):
    """The bytes are not a proposal this version understands."""


class Writer(Protocol):
    """Where mutations go: a RocksDB WriteBatch has exactly these."""

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...

    def delete_range(self, start: bytes, end: bytes) -> None: ...


class State(Protocol):
    """A partition's state as a command's `apply` sees it: as the commands before it in its entry left it."""

    def get(self, key: bytes) -> bytes | None: ...

    def record(self, m: Mutation) -> None:
        """Write `m` with the entry."""

    def meta_get(self, key: bytes) -> bytes | None:
        """The state machine's metadata (raftkv/core/learner_registry.py), apart from user keys."""

    def update_meta(self, updates: Mapping[bytes, bytes | None]) -> None:
        """Write metadata with the entry (None deletes)."""


Range = tuple[bytes, bytes]  # keys [start, end)


@dataclass(frozen=True, eq=False)
class Kind:
    """Everything that differs between kinds of command, under its log tag. One object per kind (`register`)."""

    tag: int
    type: type
    encode: Callable[[Any], tuple[bytes, ...]]  # the fields after the tag
    decode: Callable[[bytes, int], tuple[Any, int]]  # from just after the tag: (command, next position)
    check: Callable[[Any, Limits], None]  # raise InvalidRequest naming the problem
    routing_keys: Callable[[Any], list[bytes]]  # the keys that decide its partition
    ranges_written: Callable[[Any], list[Range]]  # what a caller needs write access to (raftkv/node/gatekeeper.py)
    admin_verb: str = ""  # or the admin verb a caller needs instead: a command that changes no keys
    apply: Callable[[Any, State], Any] | None = None  # its effect, and what its caller gets; None: a mutation, recorded
    proto_field: str = ""  # its field in the API's Op message (raftkv/api/convert.py); "": not in the API
    write: Callable[[Any, Writer], None] | None = None  # mutations only: write it
    rows: Callable[[Any], tuple[list[bytes], list[bytes | None]]] | None = None  # point mutations: the keys
    #   written and each one's value after (None: deleted), as the change feed reports them (learners/change_capture.py)
    in_batch: bool = False  # may appear inside a Batch
    since: str = ""  # the cluster version from which every member applies it ("": every release does)

    tag_byte: bytes = b""  # set when registered


KINDS: dict[int, Kind] = {}
_BY_TYPE: dict[type, Kind] = {}
_BY_PROTO_FIELD: dict[str, Kind] = {}


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


def by_proto_field(name: str) -> Kind | None:
    """The kind whose message the API's Op carries in field `name` (None: not a write)."""
    return _BY_PROTO_FIELD.get(name)


def register(kind: Kind) -> Kind:
    """Add a kind: its tag, type and Op field must be new. A kind without `apply` is a mutation, recorded as it is."""
    if kind.tag in KINDS or kind.type in _BY_TYPE or (kind.proto_field and kind.proto_field in _BY_PROTO_FIELD):
        raise ValueError(f"{kind.type.__name__}: tag {kind.tag}, its type or its Op field is registered already")
    if kind.apply is None and kind.write is None:
        raise ValueError(f"{kind.type.__name__} needs an apply, or a write to be recorded as a mutation")
    kind = replace(kind, tag_byte=bytes((kind.tag,)), apply=kind.apply or _record)
    KINDS[kind.tag] = _BY_TYPE[kind.type] = kind
    if kind.proto_field:
        _BY_PROTO_FIELD[kind.proto_field] = kind
    return kind


def unregister(kind: Kind) -> None:
    """Remove a kind registered for a test."""
    del KINDS[kind.tag], _BY_TYPE[kind.type]
    _BY_PROTO_FIELD.pop(kind.proto_field, None)


def _record(m: Mutation, state: State) -> None:
    state.record(m)


def _none(command: Any) -> list:
    return []


def point(key: bytes) -> Range:
    """The range holding just `key`."""
    return key, key + b"\x00"


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


def _apply_range(c: DeleteRange, state: State) -> None:
    # The API rejects start >= end; the log may still hold one (an older client, a bug), and
    # every replica must treat it the same harmless way rather than fail on it.
    if c.start < c.end:
        state.record(c)


def _write_range(c: DeleteRange, w: Writer) -> None:
    if c.start < c.end:  # RocksDB fails the whole database on end < start
        w.delete_range(c.start, c.end)


register(Kind(1, Put, lambda c: (_U32x2.pack(len(c.key), len(c.value)), c.key, c.value), _decode_put, _check_put,
              lambda c: [c.key], ranges_written=lambda c: [point(c.key)], proto_field="put",
              write=lambda c, w: w.put(c.key, c.value), rows=lambda c: ([c.key], [c.value]), in_batch=True))
register(Kind(2, Delete, lambda c: (_U32.pack(len(c.key)), c.key), _decode_delete,
              lambda c, limits: _check_key(c.key, limits), lambda c: [c.key], ranges_written=lambda c: [point(c.key)],
              proto_field="delete", write=lambda c, w: w.delete(c.key), rows=lambda c: ([c.key], [None]),
              in_batch=True))
register(Kind(3, DeleteRange, lambda c: (_U32x2.pack(len(c.start), len(c.end)), c.start, c.end), _decode_range,
              _check_range, _none, ranges_written=lambda c: [(c.start, c.end)], apply=_apply_range,
              proto_field="delete_range", write=_write_range, in_batch=True))


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


def _apply_cas(c: Cas, state: State) -> CasResult:
    current = state.get(c.key)
    if current != c.expected:
        return CasResult(False, current)
    state.record(Put(c.key, c.new) if c.new is not None else Delete(c.key))
    return CasResult(True, c.new)


register(Kind(4, Cas, _encode_cas, _decode_cas, _check_cas, lambda c: [c.key],
              ranges_written=lambda c: [point(c.key)], apply=_apply_cas, proto_field="cas"))


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


def _apply_batch(c: Batch, state: State) -> None:
    for op in c.ops:
        kind_of(op).apply(op, state)


register(Kind(5, Batch, _encode_batch, _decode_batch, _check_batch,
              lambda c: [k for op in c.ops for k in routing_keys(op)],
              ranges_written=lambda c: [r for op in c.ops for r in kind_of(op).ranges_written(op)],
              apply=_apply_batch, proto_field="batch"))


# -- GuardedBatch 0x0b: u32 count, each guard (u8 flags: bit0 expected present, u32 klen u32 elen, key
#    expected), then a Batch's fields ----------------------------------------------------------------

GUARDED_BATCH_SINCE = "0.3.0.dev0"


def _encode_guarded(c: GuardedBatch) -> tuple[bytes, ...]:
    guards = [part for g in c.guards for part in (
        _GUARD_HEAD.pack(g.expected is not None, len(g.key), len(g.expected or b"")), g.key, g.expected or b"")]
    return (_U32.pack(len(c.guards)), *guards, *_encode_batch(Batch(c.ops)))


def _decode_guarded(buf: bytes, pos: int) -> tuple[GuardedBatch, int]:
    (count,) = _U32.unpack_from(buf, pos)
    pos += 4
    guards = []
    for _ in range(count):
        present, _, elen = _GUARD_HEAD.unpack_from(buf, pos)
        if present > 1 or (not present and elen):
            raise DecodeError(f"malformed guard at byte {pos}")
        (key, expected), pos = _fields(buf, pos + 1, _U32x2)
        guards.append(Guard(key, expected if present else None))
    batch, pos = _decode_batch(buf, pos)
    return GuardedBatch(tuple(guards), batch.ops), pos


def _check_guarded(c: GuardedBatch, limits: Limits) -> None:
    if not c.guards:
        raise InvalidRequest("a guarded batch needs at least one guard (without one, send a batch)")
    for guard in c.guards:
        _check_key(guard.key, limits)
        _check_value(guard.expected, limits)
    _check_batch(Batch(c.ops), limits)


def _apply_guarded(c: GuardedBatch, state: State) -> bool:
    if any(state.get(g.key) != g.expected for g in c.guards):
        return False
    _apply_batch(Batch(c.ops), state)
    return True


register(Kind(11, GuardedBatch, _encode_guarded, _decode_guarded, _check_guarded,
              lambda c: [g.key for g in c.guards] + [k for op in c.ops for k in routing_keys(op)],
              # like a cas: whoever learns whether a key holds a value must be allowed to write it
              ranges_written=lambda c: [point(g.key) for g in c.guards] + [
                  r for op in c.ops for r in kind_of(op).ranges_written(op)],
              apply=_apply_guarded, proto_field="guarded_batch", since=GUARDED_BATCH_SINCE))


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


register(Kind(9, PutMany, _encode_put_many, _decode_put_many, _check_put_many, lambda c: c.split()[0],
              ranges_written=lambda c: [point(k) for k in c.split()[0]], proto_field="put_many",
              write=_write_put_many, rows=PutMany.split))


# -- IngestSst 0x0a: u32 rows, 32-byte SHA-256, u32 length, the table file (docs/bulk-ingest.md) -------

def _decode_ingest(buf: bytes, pos: int) -> tuple[IngestSst, int]:
    rows, sha256, length = _INGEST_HEAD.unpack_from(buf, pos)
    pos += _INGEST_HEAD.size
    return IngestSst(buf[pos:pos + length], sha256, rows), pos + length


def _check_ingest(c: IngestSst, limits: Limits) -> None:
    if c.rows < 1 or hashlib.sha256(c.data).digest() != c.sha256:
        raise InvalidRequest(f"a bulk-load file of {c.rows} rows is empty or does not match its SHA-256; build it again")


def _write_ingest(c: IngestSst, w: Writer) -> None:
    raise InvalidRequest("a bulk-load file is ingested whole by the engine, never read row by row within its entry")


register(Kind(10, IngestSst, lambda c: (_INGEST_HEAD.pack(c.rows, c.sha256, len(c.data)), c.data), _decode_ingest,
              _check_ingest, _none, ranges_written=lambda c: [(b"", ALL_KEYS_END)], write=_write_ingest))


# -- learner commands: RegisterLearner 0x06 (options as JSON), RemoveLearner 0x07, LearnerProgress 0x08

LEARNER_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _check_learner(c: LearnerCommand, limits: Limits) -> None:
    if not LEARNER_NAME.fullmatch(c.name):
        raise InvalidRequest(f"learner name {c.name!r}: use 1-64 letters, digits, '-', '_' or '.'")


def _check_register(c: RegisterLearner, limits: Limits) -> None:
    _check_learner(c, limits)
    if not c.sink:
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


register(Kind(6, RegisterLearner, _encode_register, _decode_register, _check_register, _none, ranges_written=_none,
              admin_verb="learners", apply=lambda c, state: state.update_meta(register_updates(c)),
              proto_field="register_learner"))
register(Kind(7, RemoveLearner, lambda c: (_U32.pack(len(c.name.encode())), c.name.encode()), _decode_remove,
              _check_learner, _none, ranges_written=_none, admin_verb="learners",
              apply=lambda c, state: state.update_meta(remove_updates(c)),
              proto_field="remove_learner"))
register(Kind(8, LearnerProgress, lambda c: (_PROGRESS_HEAD.pack(len(c.name.encode()), c.index), c.name.encode()),
              _decode_progress, _check_learner, _none, ranges_written=_none, admin_verb="report_progress",
              apply=lambda c, state: state.update_meta(progress_updates(c, state.meta_get)),
              proto_field="learner_progress"))
