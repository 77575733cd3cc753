"""The zlib level of pysyncobj's messages between replicas.

pysyncobj compresses every message it sends with zlib level 3. On loopback
and a LAN the CPU costs far more than the bytes save: for a 10,000-row bulk
entry of half-random 100-byte values, level 3 takes 4.9 µs per row to send
and level 0 0.37 µs, and a leader sends each entry to every other replica.
Level 0 still frames the message as zlib (stored blocks), so every receiver,
pysyncobj's admin tool included, reads it unchanged, and replicas with
different levels interoperate. `tuning.wire_compression` sets the level;
raise it for slow links between replicas.
"""

from __future__ import annotations

import zlib

import pysyncobj.tcp_connection


class _LeveledZlib:
    """Stands in for the `zlib` module inside pysyncobj.tcp_connection: the level is ours."""

    level = 0

    @classmethod
    def compress(cls, data: bytes, _upstream_level: int = -1) -> bytes:
        return zlib.compress(data, cls.level)

    decompress = staticmethod(zlib.decompress)


pysyncobj.tcp_connection.zlib = _LeveledZlib


def set_compression_level(level: int) -> None:
    """The zlib level (0-9) of every message this process sends from now on."""
    if not 0 <= level <= 9:
        raise ValueError(f"zlib level must be 0-9, not {level}")
    _LeveledZlib.level = level
