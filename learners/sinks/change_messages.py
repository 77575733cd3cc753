"""An entry's events as serialized `Change` messages (raftkv/api/kv.proto), built from its columns. Pure.

The changelog sink stores one message per event. Building each through
protobuf (a message object, then SerializeToString) cost more than capturing
the row; this writes the same bytes protobuf does: fields in number order,
proto3 defaults left out, `before` and `after` present whenever not None.
"""

from __future__ import annotations

from learners.change_event import OPS
from learners.entry_events import EntryEvents

_U64 = (1 << 64) - 1  # int64 ts_ms: a negative one is sent as its 64-bit two's complement


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class _Varints(dict):
    """`prefix + varint(n)` by n: a dict lookup per row rather than a call. Small n are kept."""

    def __init__(self, prefix: bytes):
        super().__init__()
        self.prefix = prefix

    def __missing__(self, n: int) -> bytes:
        encoded = self.prefix + _varint(n)
        if n < 1 << 14:
            self[n] = encoded
        return encoded


_LENGTHS = _Varints(b"")
_SEQ_FIELDS = _Varints(b"\x10")  # field 2 (seq)
_SEQ_FIELDS[0] = b""  # proto3 leaves a 0 out
_OP_FIELDS = {op: b"\x1a\x01" + op.encode() for op in OPS}  # field 3 (op), one byte long


def change_messages(entry: EntryEvents) -> list[bytes]:
    """The serialized Change of each event, in seq order (each op one of OPS)."""
    index = _varint_field(0x08, entry.index)
    source = b"".join((_varint_field(0x38, entry.term), b"\x40\x01" if entry.snapshot else b"",
                       _varint_field(0x48, entry.ts_ms & _U64)))
    lengths, seqs, ops = _LENGTHS, _SEQ_FIELDS, _OP_FIELDS
    return [b"".join((index, seqs[seq], ops[op],
                      key and b"\x22" + lengths[len(key)] + key,
                      b"" if before is None else b"\x2a" + lengths[len(before)] + before,
                      b"" if after is None else b"\x32" + lengths[len(after)] + after,
                      source))
            for seq, op, key, before, after in zip(range(entry.first_seq, entry.first_seq + len(entry)),
                                                   entry.ops, entry.keys, entry.befores, entry.afters)]


def _varint_field(tag: int, value: int) -> bytes:
    """A varint field; nothing for 0, proto3's default."""
    return bytes((tag,)) + _varint(value) if value else b""
