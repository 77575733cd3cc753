"""Hostile bytes for the live-cluster fuzzer (tests/test_fuzz_cluster.py): pure, seeded, no I/O.

Three kinds, mixed by `hostile_payload`: random bytes; a well-formed request mutated at the byte
level (flips, truncation, splices, repeated slices, stray fields and over-long varints); and a
message built field by field from its descriptor with values at the edges of each type (the
largest integers, empty and long bytes, unknown enum numbers, deep nesting) — well-formed
protobuf that no client of ours would send.
"""

from __future__ import annotations

import random

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

_EDGE_INTS = (0, 1, -1, 2**31 - 1, -(2**31), 2**32 - 1, 2**63 - 1, -(2**63), 2**64 - 1)
_INT_TYPES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1), FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1), FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1), FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def random_bytes(rng: random.Random, longest: int = 4096) -> bytes:
    return rng.randbytes(min(longest, int(rng.expovariate(1 / 64))))


def mutate(rng: random.Random, data: bytes, others: list[bytes]) -> bytes:
    """`data` changed by one to four byte-level edits."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        edit = rng.randrange(7)
        at = rng.randint(0, len(buf))
        if edit == 0 and buf:
            buf[min(at, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif edit == 1:
            del buf[at:]
        elif edit == 2:
            buf[at:at] = rng.randbytes(rng.randint(1, 16))
        elif edit == 3 and others:
            other = rng.choice(others)
            buf[at:] = other[rng.randint(0, len(other)):]
        elif edit == 4 and buf:
            start = rng.randrange(len(buf))
            buf[at:at] = buf[start:start + rng.randint(1, 32)] * rng.randint(2, 50)
        elif edit == 5:  # an unknown or repeated field with a varint that never ends
            buf[at:at] = bytes((rng.randrange(1, 32) << 3,)) + b"\xff" * rng.randint(1, 12)
        else:  # a length-delimited field that claims more than there is
            buf[at:at] = bytes(((rng.randrange(1, 16) << 3) | 2,)) + b"\xff\xff\xff\xff\x0f" + rng.randbytes(4)
    return bytes(buf)


def edge_message(rng: random.Random, descriptor: Descriptor, depth: int = 0, key_prefix: bytes = b"") -> Message:
    """A message of `descriptor` with a random subset of its fields set to edge values."""
    message = GetMessageClass(descriptor)()
    oneofs_done: set[str] = set()
    for field in descriptor.fields:
        oneof = field.containing_oneof
        if rng.random() < 0.5 or (oneof is not None and oneof.name in oneofs_done):
            continue
        if oneof is not None:
            oneofs_done.add(oneof.name)
        repeated = field.is_repeated
        count = rng.choice((1, 2, 5, 100)) if repeated else 1
        for _ in range(count):
            _set(rng, message, field, repeated, depth, key_prefix)
    return message


def _set(rng: random.Random, message: Message, field: FieldDescriptor, repeated: bool, depth: int,
         key_prefix: bytes) -> None:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if depth > 4:
            return
        if field.message_type.GetOptions().map_entry:
            getattr(message, field.name)[_scalar(rng, field.message_type.fields_by_name["key"], key_prefix)] = \
                _scalar(rng, field.message_type.fields_by_name["value"], key_prefix)
            return
        child = edge_message(rng, field.message_type, depth + 1, key_prefix)
        if repeated:
            getattr(message, field.name).append(child)
        else:
            getattr(message, field.name).CopyFrom(child)
        return
    value = _scalar(rng, field, key_prefix)
    if repeated:
        getattr(message, field.name).append(value)
    else:
        setattr(message, field.name, value)


def _scalar(rng: random.Random, field: FieldDescriptor, key_prefix: bytes):
    kind = field.type
    if kind in _INT_TYPES:
        low, high = _INT_TYPES[kind]
        pick = rng.choice(_EDGE_INTS) if rng.random() < 0.5 else rng.randint(0, 9)
        return min(max(pick, low), high)
    if kind == FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if kind == FieldDescriptor.TYPE_ENUM:
        return rng.choice([v.number for v in field.enum_type.values] + [99, -1])
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return rng.choice((0.0, -1.0, 1e308, float("inf"), float("nan")))
    if kind == FieldDescriptor.TYPE_STRING:
        return rng.choice(("", "n1", "../../etc/passwd", "é" * 1000, "\x00", "x" * rng.randint(1, 300)))
    length = rng.choices((0, 1, 8, 100, 5000, 2**20 + 1), weights=(4, 4, 4, 4, 2, 1))[0]
    return rng.choice((key_prefix, b"")) + rng.randbytes(length)


def hostile_payload(rng: random.Random, descriptor: Descriptor, seeds: list[bytes], key_prefix: bytes) -> bytes:
    """One request body for a method taking `descriptor`, its well-formed examples being `seeds`."""
    roll = rng.random()
    if roll < 0.1:
        return random_bytes(rng)
    if roll < 0.35:
        return mutate(rng, rng.choice(seeds), seeds)
    built = edge_message(rng, descriptor, key_prefix=key_prefix).SerializeToString()
    return mutate(rng, built, seeds) if roll < 0.45 else built
