"""Reading the node log back at start-up: every group's state from the segments, a torn tail cut off.

The rules (docs/raft-engine.md, "The shared write-ahead log, as built"):

- Segments are numbered without gaps; older ones are whole (each was synced before the next was
  created), so any damage in one of them is corruption.
- In the last segment, a record that fails a check at or after the durable point (the latest of
  the meta file's point and those of the segments' `synced` records, wherever they are: each
  passed its checksum) is a torn tail, and so is one followed by nothing but zeros (RaftJournal's
  rule): a power cut keeps any part of what was written after the last sync, holes of zeros and
  a later write's pages included. It is cut off with a warning naming the file, the offset and
  the groups of the legible records lost with it.
- Any other damage raises CorruptData naming the file, the offset, the groups whose records the
  file holds, and what to do.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from raftkv.core.errors import CorruptData
from raftkv.raft.node_log_format import (
    FORMAT_VERSION, KIND_GROUP, NO_GROUP, SEGMENT_HEADER, SEGMENT_MAGIC, SYNCED_PREFIX, BadPayload, Kind, Point,
    legible_group, read_point, read_record, segment_name, segment_seq,
)
from raftkv.raft.node_log_groups import GroupState, replay
from raftkv.raft.record_file import BadRecord, check_file_header, legible_end, only_zeros_from, read_file

_logger = logging.getLogger("raftkv.raft.node_log")


@dataclass
class Recovered:
    groups: dict[int, GroupState]
    segments: list[int]  # the sequence numbers of the segment files, oldest first
    end: int  # where the last segment's good records end (its file is cut there by the caller)
    durable: Point | None  # the durable point as far as the log says


def remedy(folder: Path) -> str:
    return f"stop the node, move {folder} away and restart it so its partitions re-sync from their peers"


def corrupt(path: Path, offset: int, reason: str, groups: set[int] | None = None) -> CorruptData:
    held = "" if groups is None else f"; it holds records of groups {_names(groups)}"
    return CorruptData(f"node log {path} is corrupt at byte {offset} ({reason}){held}; {remedy(path.parent)}")


def recover(folder: Path, durable: Point | None) -> Recovered:
    """Every group's state from the segments in `folder`, given the meta file's durable point."""
    seqs = sorted(seq for name in os.listdir(folder) if (seq := segment_seq(name)) is not None)
    for seq, following in zip(seqs, seqs[1:]):
        if following != seq + 1:
            raise corrupt(folder / segment_name(seq + 1), 0, f"missing: {segment_name(seq)} is followed by "
                                                            f"{segment_name(following)}")
    groups: dict[int, GroupState] = {}
    offset = 0
    for seq in seqs:
        path = folder / segment_name(seq)
        data = read_file(path, remedy(folder))
        check_file_header(data, SEGMENT_MAGIC, (FORMAT_VERSION,), lambda at, reason: corrupt(path, at, reason))
        offset, durable = _scan(path, data, seq, seq == seqs[-1], groups, durable)
    return Recovered(groups, seqs, offset, durable)


def _scan(path: Path, data: bytes, seq: int, last: bool, groups: dict[int, GroupState],
          durable: Point | None) -> tuple[int, Point | None]:
    """Replay one segment; return where its good records end and the durable point then known."""
    offset = len(SEGMENT_HEADER)
    seen: set[int] = set()
    while offset < len(data):
        try:
            kind, group, start, end = read_record(data, offset)
        except BadRecord as bad:
            durable = max(filter(None, (durable, *_synced_points(data, offset))), default=None)
            beyond_sync = durable is not None and (seq, offset) >= durable
            if not (last and (beyond_sync or only_zeros_from(data, bad.torn_if_zeros_from))):
                raise corrupt(path, offset, bad.reason, seen | legible_groups(data, offset)) from None
            _logger.warning("node log %s: dropped %d bytes of a torn write at byte %d (%s); the legible records "
                            "among them were of groups: %s", path, len(data) - offset, offset, bad.reason,
                            _names(legible_groups(data, offset)))
            break
        try:
            if kind == Kind.SYNCED:
                point = read_point(data, start, end)
                durable = point if durable is None else max(durable, point)
            else:
                seen.add(group)
                replay(groups, kind, group, data, start, end, seq)
        except BadPayload as bad:
            raise corrupt(path, offset, str(bad), seen) from None
        offset = end
    return offset, durable


def _synced_points(data: bytes, offset: int) -> list[Point]:
    """The durable points of the synced records after the damage at `offset` (each checked)."""
    points = []
    at = data.find(SYNCED_PREFIX, offset + 1)
    while at >= 0:
        try:
            kind, _, start, end = read_record(data, at)
            if kind == Kind.SYNCED:
                points.append(read_point(data, start, end))
        except (BadRecord, BadPayload):
            pass
        at = data.find(SYNCED_PREFIX, at + 1)
    return points


def legible_groups(data: bytes, offset: int) -> set[int]:
    """The groups of the records from `offset` on, as far as their length fields can be followed
    (checksums unchecked) and over holes of zeros: whose records a torn tail takes."""
    groups: set[int] = set()
    while offset < len(data):
        end = legible_end(data, offset, KIND_GROUP.size)
        if end is not None:
            group = legible_group(data, offset)
            if group != NO_GROUP:
                groups.add(group)
            offset = end
            continue
        after_zeros = len(data) - len(data[offset:].lstrip(b"\0"))
        if after_zeros == offset:
            break
        offset = after_zeros
    return groups


def _names(groups: set[int]) -> str:
    return ", ".join(map(str, sorted(groups))) if groups else "none legible"
