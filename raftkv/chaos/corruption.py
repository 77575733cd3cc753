"""The corrupt fault's damage: bytes flipped in one file of a stopped node, a segment of its Raft log
(the `journal` variant), a snapshot or a RocksDB file, at an offset worth damaging."""

from __future__ import annotations

import random
from pathlib import Path

from raftkv.raft.node_log_format import SEGMENT_HEADER

FLIPPED_BYTES = 8
SNAPSHOT_HEAD_BYTES = 4096  # a snapshot tar's first members: meta.json and the two base entries


def flip_bytes(data_dir: Path, variant: str, rng: random.Random) -> str:
    """Flip FLIPPED_BYTES bytes in one file of a stopped node; says which and where."""
    candidates = sorted(_corruptible(data_dir, variant))
    if not candidates:
        return f"no {variant} file to damage yet"
    path, low = rng.choice(candidates)
    size = path.stat().st_size
    high = size - FLIPPED_BYTES
    if variant == "snapshot" and rng.random() < 0.5:  # its metadata, half the time: the rest is table data
        high = min(high, SNAPSHOT_HEAD_BYTES)
    offset = rng.randrange(low, max(low + 1, high))
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(FLIPPED_BYTES)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))
    return f"flipped {len(data)} bytes at offset {offset} of {path} ({size} bytes)"


def _corruptible(data_dir: Path, variant: str) -> list[tuple[Path, int]]:
    """Files of the variant's kind, each with the first offset worth damaging."""
    if variant == "journal":
        files = [(p, len(SEGMENT_HEADER)) for p in data_dir.glob("raft-log/*.log")]  # the node log's segments
    elif variant == "snapshot":
        files = [(p, 0) for p in data_dir.glob("p*/raft.snapshot")]
    else:  # rocksdb: table files once there are any, else the write-ahead log
        files = [(p, 0) for p in data_dir.glob("p*/db/*.sst")] or [(p, 0) for p in data_dir.glob("p*/db/*.log")]
    return [(p, low) for p, low in files if p.stat().st_size > low + FLIPPED_BYTES]
