"""The node log's files: the segment it appends to, the older segments, and the meta file.

No locks here: NodeLog calls these under its lock, but for `fsync`, `save_meta` and `delete`, which
it calls holding only its sync lock (see `NodeLog._sync_written`).
A write is one os.write, cut back off the file if it fails; the segment is rolled first when it
has passed `segment_bytes`, once it is synced, so only the last segment can have a torn tail.
After a failed fsync `failed` is set and no later sync may be believed (fsyncgate).
"""

from __future__ import annotations

import os
from pathlib import Path

from raftkv import failpoints
from raftkv.core import metrics
from raftkv.core.durable import fsync_directory, fsync_failed, fsync_file, make_dirs
from raftkv.core.errors import DiskFailed, StorageFull
from raftkv.raft.node_log_format import SEGMENT_HEADER, Point, decode_meta, encode_meta, segment_name
from raftkv.raft.node_log_groups import GroupState
from raftkv.raft.node_log_recovery import corrupt, recover, remedy
from raftkv.raft.record_file import TMP_SUFFIX, DiskSpace, append_whole, read_file, write_new_file

META_NAME = "meta"


class SegmentFiles:
    def __init__(self, folder: Path, fsync: bool, segment_bytes: int):
        """Open the log in `folder` (created, durably, if missing) and read every group back from it
        (`recovered`); what was read counts as durable from here on."""
        self.folder = folder
        self._fsync = fsync
        self._segment_bytes = segment_bytes
        self._meta_path = folder / META_NAME
        self.failed: DiskFailed | None = None
        self.space = DiskSpace(folder)
        self._retired: list[int] = []  # fds of segments rolled away from, closed by `close_retired`
        make_dirs(folder)  # in both modes: a log whose directory a power cut took is all lost
        for tmp in folder.glob(f"*{TMP_SUFFIX}"):
            tmp.unlink()
        self._meta_point = self._read_meta()
        found = recover(folder, self._meta_point)
        self.recovered: dict[int, GroupState] = found.groups
        self.seqs = found.segments  # oldest first
        if not self.seqs:
            if self._meta_point is not None:
                raise corrupt(self._meta_path, 0, "a durable point but no segment file")
            self.seqs, self.seq, self.end = [1], 1, len(SEGMENT_HEADER)
            self.fd = write_new_file(self.path(1), SEGMENT_HEADER, fsync=True)
        else:
            self.seq, self.end = self.seqs[-1], found.end
            path = self.path(self.seq)
            if path.stat().st_size > self.end:
                os.truncate(path, self.end)
            self.fd = os.open(path, os.O_RDWR | os.O_APPEND)
            self.fsync(self.fd, self.seq)  # a kill -9 may have left what was read in the page cache only
        self._head_path = self.path(self.seq)
        self.durable: Point = (self.seq, self.end)  # what the last sync covered
        self.save_meta()

    def path(self, seq: int) -> Path:
        return self.folder / segment_name(seq)

    def write(self, data: bytes) -> int:
        """Append `data` with one os.write (rolling first if the segment is full); return its segment."""
        if self.end >= self._segment_bytes and self.end > len(SEGMENT_HEADER):
            self._roll()
        failpoints.hit("journal-append-before")
        append_whole(self.fd, data, self._head_path, self.end, self.space)
        self.end += len(data)
        metrics.JOURNAL_WRITES.inc()
        failpoints.hit("journal-append-after")
        return self.seq

    def _roll(self) -> None:
        self.fsync(self.fd, self.seq)
        self.mark_durable((self.seq, self.end))
        seq = self.seq + 1
        try:
            fd = write_new_file(self.path(seq), SEGMENT_HEADER, fsync=True)  # whole, or not there at all
        except StorageFull:
            self.space.mark(True)
            raise
        self._retired.append(self.fd)
        self.fd, self.seq, self.end = fd, seq, len(SEGMENT_HEADER)
        self._head_path = self.path(seq)
        self.seqs.append(seq)

    def fsync(self, fd: int, seq: int, fail_point: str | None = None) -> None:
        """fdatasync segment `seq` through `fd`; DiskFailed, now and for good, if it fails (or if
        `fail_point` injects an error: it stands for the fsync's)."""
        if self.failed is not None:
            raise self.failed
        path = self.path(seq)
        try:
            if fail_point is not None:
                failpoints.hit(fail_point)
            fsync_file(fd, path, data_only=True)
        except (DiskFailed, OSError) as error:
            self.failed = self.failed or (error if isinstance(error, DiskFailed) else fsync_failed(path, error))
            raise self.failed from None

    def mark_durable(self, point: Point) -> None:
        self.durable = max(self.durable, point)

    def close_retired(self) -> None:
        """Close the fds of segments rolled away from (no fsync may be running on them)."""
        for fd in self._retired:
            os.close(fd)
        self._retired.clear()

    def dead_below(self, floor: int) -> list[int]:
        """Drop the segments below `floor` (never the head) from the list and return them, to `delete`."""
        dead = [seq for seq in self.seqs if seq < min(floor, self.seq)]
        del self.seqs[: len(dead)]
        return dead

    def delete(self, dead: list[int]) -> None:
        for seq in dead:  # oldest first: a crash between leaves a log that starts later, never one with a gap
            self.path(seq).unlink()
        if dead:
            try:
                fsync_directory(self.folder)
            except DiskFailed as error:
                self.failed = self.failed or error
                raise

    def save_meta(self) -> None:
        """Record the durable point in the meta file (atomically: temp file, fsync, rename)."""
        point = self.durable
        if point != self._meta_point:
            os.close(write_new_file(self._meta_path, encode_meta(point), fsync=self._fsync))
            self._meta_point = point

    def _read_meta(self) -> Point | None:
        try:
            data = read_file(self._meta_path, remedy(self.folder))
        except FileNotFoundError:
            return None
        return decode_meta(data, lambda offset, reason: corrupt(self._meta_path, offset, reason))

    def close(self) -> None:
        self.close_retired()
        os.close(self.fd)
