"""Fuzzing, in process, of what raftkv reads from the Raft hub's peers (security item 5).

Each target is one test; tests/fuzzing.py sets how many inputs it sends and tallies them.

3. Raft hub frames -> `frame_length` and `decode`: random bytes, valid frames truncated, extended and
   re-flagged, pickles that name globals, pickle bombs (deep nesting, memo references, marks) and zlib
   bombs, lengths 0 and past MAX_FRAME_BYTES. It must give the documented tuple or BadFrame, decode a
   frame of at most 1 MiB within a second, and not grow the process by more than 512 MiB in all.
"""

from __future__ import annotations

import functools
import gc
import os
import pickle
import resource
import struct
import time
import zlib

from hypothesis import strategies as st

from raftkv.raft import hub_frames
from raftkv.raft.hub_frames import CONTROL, BadFrame
from tests.fuzzing import containers, fuzz

# -- 3. Raft hub frames ----------------------------------------------------------------

FRAME_SECONDS = 1.0  # a decode may hold the hub's loop this long at most...
FRAME_BYTES_TIMED = 1 << 20  # ...for a frame of up to this many bytes (every one sent here)
MEMORY_GROWTH = 512 << 20
_MIB = 1 << 20

plain_data = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10)
                          | st.binary(max_size=20), lambda inner: containers(inner) | st.tuples(inner, inner),
                          max_leaves=12)
bodies = (st.tuples(st.integers(-2**63, 2**63), plain_data)
          | st.tuples(st.just(CONTROL), st.sampled_from(["hello", "join", "leave", "ping", "pong"]) | st.text(),
                      plain_data)
          | st.tuples(plain_data, plain_data) | plain_data)


def _raw(body: bytes, flag: int = 0) -> bytes:
    """A frame (length, flag, body) around bytes that need not be a pickle."""
    return struct.pack(">I", len(body) + 1) + bytes((flag,)) + body


def _pickle_attacks() -> list[bytes]:
    """Pickles that name globals, call what they must not, or blow up the unpickler's stacks."""
    proto = b"\x80\x05"
    return [
        *(pickle.dumps((0, os.system), protocol=p) for p in range(pickle.HIGHEST_PROTOCOL + 1)),
        b"cos\nsystem\n(S'true'\ntR.",  # GLOBAL + REDUCE, protocol 0
        proto + b"\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R.",  # STACK_GLOBAL + REDUCE
        proto + b"\x82\x01.",  # EXT1: the copyreg extension registry
        proto + b"P0\n.",  # PERSID
        proto + b"K\x01K\x02R.",  # REDUCE with a number as the callable
        proto + b"]K\x01b.",  # BUILD on a list
        proto + b"]" * 100_000 + b"a" * 99_999 + b".",  # lists 100,000 deep
        proto + b"]\x94(" + b"h\x00" * 30_000 + b"e.",  # one list holding itself 30,000 times
        proto + b"(" * 60_000 + b".",  # 60,000 marks
        proto + b"]" * 60_000 + b".",  # 60,000 lists on the stack
        proto + b"\x8e" + struct.pack("<Q", 2**62) + b"x.",  # BINBYTES8 longer than the frame
        proto + b"\x8a\xff" + b"\xff" * 255 + b".",  # a 2040-bit int
    ]


def _compressed(*parts: tuple[bytes, int]) -> bytes:
    """zlib of each (bytes, times) in turn, level 9, without holding the whole in memory."""
    packer, out = zlib.compressobj(9), []
    for chunk, times in parts:
        for _ in range(times):
            out.append(packer.compress(chunk))
    return b"".join(out) + packer.flush()


def _zlib_bombs() -> list[bytes]:
    """Compressed bodies from 1 MiB to past MAX_FRAME_BYTES, of zeros and of pickle opcodes, and the
    worst the inflation limit lets through: as many EMPTY_LIST opcodes as it allows beside bytes that
    do not compress."""
    noise = os.urandom(60_000)
    lists = hub_frames.inflation_limit(len(noise)) - len(noise) - 100
    worst = (b"\x80\x05", 1), (b"]", lists), (b"\x8e" + struct.pack("<Q", len(noise)) + noise + b".", 1)
    return [_compressed((b"\x00" * _MIB, 1)), _compressed((b"]" * _MIB, 16)),
            _compressed((b"\x80\x05", 1), (b"(" * _MIB, 64)),
            _compressed((b"\x00" * _MIB, hub_frames.MAX_FRAME_BYTES // _MIB + 1)), _compressed(*worst)]


@functools.cache
def hostile_frames() -> list[bytes]:
    return [*(_raw(p) for p in _pickle_attacks()), *(_raw(zlib.compress(p), 1) for p in _pickle_attacks()),
            *(_raw(bomb, 1) for bomb in _zlib_bombs()),
            *(struct.pack(">I", n) + b"\x00" for n in (0, 1, hub_frames.MAX_FRAME_BYTES + 1, 2**32 - 1))]


@st.composite
def frames(draw) -> bytes:
    """A whole frame, header included: valid ones broken, attacks, or random bytes."""
    kind = draw(st.sampled_from(["valid", "broken", "broken", "attack", "random"]))
    if kind == "attack":
        return draw(st.sampled_from(hostile_frames()))
    if kind == "random":
        return draw(st.binary(max_size=64))
    frame = hub_frames.encode(draw(bodies), draw(st.sampled_from([0, 0, 1, 9])))
    if kind == "broken":
        cut = draw(st.integers(0, len(frame)))
        how = draw(st.sampled_from(["truncate", "extend", "flag", "flip"]))
        if how == "truncate":
            frame = frame[:cut]
        elif how == "extend":
            frame += draw(st.binary(min_size=1, max_size=32))
        elif how == "flag" and len(frame) > 4:
            frame = frame[:4] + bytes((draw(st.integers(0, 255)),)) + frame[5:]
        elif cut < len(frame):
            frame = frame[:cut] + bytes((frame[cut] ^ draw(st.integers(1, 255)),)) + frame[cut + 1:]
    return frame


def check_frame(frame: bytes) -> str:
    header, rest = frame[:hub_frames.HEADER_BYTES], frame[hub_frames.HEADER_BYTES:]
    try:
        assert 1 <= hub_frames.frame_length(header) <= hub_frames.MAX_FRAME_BYTES
    except BadFrame:
        pass
    body, seconds = _decode_timed(rest)
    assert len(rest) > FRAME_BYTES_TIMED or seconds < FRAME_SECONDS, f"decoding {len(rest)} bytes took {seconds} s"
    assert body is None or (body[0] == CONTROL and len(body) == 3 and isinstance(body[1], str)) or (
        len(body) == 2 and type(body[0]) is int), body
    return "BadFrame" if body is None else "a tuple"


def _decode_timed(frame: bytes) -> tuple[tuple | None, float]:
    """decode's tuple (None for BadFrame) and its seconds of CPU (a loaded machine once stretched a
    1 MiB decode past a second of wall time), with the collector off: a full collection of this test
    process's heap (hypothesis keeps a lot in it) is not the decode's time."""
    gc.disable()
    started = time.thread_time()
    try:
        return hub_frames.decode(frame), time.thread_time() - started
    except BadFrame:
        return None, time.thread_time() - started
    finally:
        gc.enable()


def _rss_peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def test_hostile_frames_decode_or_fail_as_bad_frames_within_bounds():
    before = _rss_peak()
    fuzz("Raft hub frames -> frame_length, decode", 2500, frames(), check_frame, always=hostile_frames())
    assert _rss_peak() - before < MEMORY_GROWTH
