"""The frames of the Raft hub's connections (`hub.py`): length-prefixed, one group's message each.

    frame  = length (4 bytes, big-endian) + flag (1 byte: 0 plain, 1 zlib) + body
    body   = pickle of (group, message)      a Raft message of one group (pysyncobj's dicts)
           | pickle of (CONTROL, verb, arg)  the connection's own: hello, join, leave, ping, pong
           | pickle of (ENGINE, [item, ...]) the node engine's items of every group (raftkv/raft/engine/items.py)

A node running the engine says so in a ping sent right after its hello (`ENGINE_PING`), whose argument
nodes of earlier releases ignore; engine frames go only to nodes that said so (an earlier release
would close the connection on one).

Bodies are pickles of plain data only (dicts, lists, tuples, bytes, text, numbers): the
unpickler here refuses every global, so a frame cannot name a class or a function to call,
whoever sent it. A frame longer than MAX_FRAME_BYTES, a body that is not such a pickle, or a
tuple of another shape is `BadFrame`, and the connection is closed.

zlib is off by default: on loopback and a LAN its CPU costs more than the bytes save (for a
10,000-row bulk entry of half-random 100-byte values, level 3 took 4.9 µs per row and no
compression 0.37 µs). `tuning.wire_compression` sets the level for slow links. A zlib body may
inflate to INFLATION times its size (64 KiB at least), and `encode` sends plain a body that would
inflate more: unpickling takes up to ~70 bytes of memory per byte of pickle (an empty list per
EMPTY_LIST opcode), so a 64 KiB body inflating a thousandfold would take gigabytes. Raft entries of
JSON-like values compress about ninefold.
"""

from __future__ import annotations

import io
import pickle
import struct
import zlib

CONTROL = "hub"  # the group field of a control frame
ENGINE = "engine"  # ... and of an engine frame
ENGINE_VERSION = 1
MAX_FRAME_BYTES = 256 * 1024 * 1024  # far above any entry batch or snapshot chunk; a larger length is garbage
_LENGTH = struct.Struct(">I")
HEADER_BYTES = _LENGTH.size
_PLAIN, _ZLIB = 0, 1
INFLATION = 16
_MIN_INFLATED = 64 * 1024


class BadFrame(Exception):
    """Bytes that are not a frame of this protocol; the connection that sent them is closed."""


class _PlainData(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise BadFrame(f"a frame names {module}.{name}: only plain data is accepted")


class _PlainDataSafely(pickle._Unpickler):
    """The same in pure Python, whose memo is a dict: C's is an array grown to the largest index a
    PUT names, so 10 bytes (`r` and a 4-byte index) made it allocate and zero gigabytes. About ten
    times slower, so kept for the frames of peers that are not nodes (learners, hellos)."""

    find_class = _PlainData.find_class


def encode(body: tuple, level: int = 0) -> bytes:
    data = pickle.dumps(body, protocol=pickle.HIGHEST_PROTOCOL)
    flag = _PLAIN
    if level:
        packed = zlib.compress(data, level)
        if len(data) <= inflation_limit(len(packed)):
            data, flag = packed, _ZLIB
    return _LENGTH.pack(len(data) + 1) + bytes((flag,)) + data


def inflation_limit(compressed: int) -> int:
    """How many bytes a zlib body of `compressed` bytes may inflate to."""
    return min(MAX_FRAME_BYTES, max(_MIN_INFLATED, INFLATION * compressed))


def frame_length(header: bytes) -> int:
    """The length of the frame whose first HEADER_BYTES are `header`."""
    if len(header) != HEADER_BYTES:
        raise BadFrame(f"a frame header of {len(header)} bytes")
    (length,) = _LENGTH.unpack(header)
    if not 1 <= length <= MAX_FRAME_BYTES:
        raise BadFrame(f"a frame of {length} bytes")
    return length


def decode(frame: bytes, from_node: bool = False) -> tuple:
    """(group, message) or (CONTROL, verb, arg), from a frame's bytes after its length. `from_node`:
    the sender is a node (its certificate says so, or the cluster runs without TLS, where the hello is
    trusted): a node holds the data and could forge any message anyway, so it gets the fast unpickler."""
    if not frame:
        raise BadFrame("an empty frame")
    flag, data = frame[0], frame[1:]
    try:
        if flag == _ZLIB:
            limit = inflation_limit(len(data))
            data = zlib.decompressobj().decompress(data, limit + 1)
            if len(data) > limit:
                raise BadFrame(f"a frame that inflates past {limit} bytes ({INFLATION} times its size)")
        elif flag != _PLAIN:
            raise BadFrame(f"unknown frame flag {flag}")
        body = (_PlainData if from_node else _PlainDataSafely)(io.BytesIO(data)).load()
    except BadFrame:
        raise
    except Exception as exc:  # truncated, corrupt or hostile: all the same to us
        raise BadFrame(f"undecodable frame: {type(exc).__name__}") from None
    if not isinstance(body, tuple) or not body:
        raise BadFrame("a frame that is not a tuple")
    if body[0] == CONTROL:
        if len(body) != 3 or not isinstance(body[1], str):
            raise BadFrame("a malformed control frame")
    elif body[0] == ENGINE:
        if len(body) != 2 or not isinstance(body[1], list):
            raise BadFrame("a malformed engine frame")
    elif len(body) != 2 or not isinstance(body[0], int) or isinstance(body[0], bool):
        raise BadFrame("a message frame without a group number")
    return body


ENGINE_PING = encode((CONTROL, "ping", {"engine": ENGINE_VERSION}))


def announces_engine(arg: object) -> bool:
    """Whether a ping's argument says the sender runs the node engine."""
    return isinstance(arg, dict) and arg.get("engine") == ENGINE_VERSION
