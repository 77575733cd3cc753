"""The power-loss filesystem's undo log: what is not yet durable, and how a power cut takes it back. Pure.

The filesystem (`raftkv.powerloss.fs`) applies every operation to its backing directory at once
and tells this log what it would take to undo it; here nothing touches a file. Durability
follows POSIX:

- file data (a write, a truncate) is durable once its file is fsynced (or fdatasynced) after it;
- a change of names (create, mkdir, unlink, rmdir, rename, link, symlink) is durable once every
  directory it changed is fsynced after it (a rename between two directories needs both);
- a name change that became durable takes with it the earlier change of each name it touched
  (the rename that brought in the name it renames or removes, the unlink that freed the name it
  takes): a real disk cannot keep a change and lose the one it builds on, and undoing the earlier
  one would have nothing to move back;
- fsyncgate: a failed fsync leaves the file's pending data non-durable for good ("poisoned"), as
  on Linux, which marks the dirty pages clean after a writeback error, so a later fsync that
  succeeds does not write them.

A power cut (`crash_plan`) undoes everything non-durable, newest first, and keeps the rest: the
result is as if only the durable operations had happened, in order. The one case where undoing is
not just replaying pre-images backwards is a poisoned file: durable writes may follow a poisoned
one there, so they stay in the log as extents (without pre-image), and undoing the poisoned write
restores only the bytes that no kept entry has set since.

Files and directories are known by inode number, so renames and unlinks do not lose them; paths
are the mount's ('/dir/name'), for undoing name changes and for the report.
"""

from __future__ import annotations

import enum
import random
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterable, Union


class Status(enum.Enum):
    PENDING = "pending"
    POISONED = "poisoned"  # its file's fsync failed: never durable
    DURABLE = "durable"  # kept only as an extent, because a poisoned entry of its file precedes it


@dataclass(frozen=True)
class Write:
    seq: int
    file: int
    path: str
    offset: int
    length: int
    size_before: int
    pre_image: bytes  # the file's bytes at [offset, min(offset + length, size_before)) before the write
    status: Status = Status.PENDING

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class Truncate:
    seq: int
    file: int
    path: str
    length: int
    size_before: int
    pre_image: bytes  # the bytes it cut off, [length, size_before), when it shrank the file
    status: Status = Status.PENDING


@dataclass(frozen=True)
class Created:
    """A name that did not exist before: create, mknod, mkdir, link or symlink."""

    seq: int
    kind: str
    path: str
    unsynced: frozenset[int]  # the directories it changed that were not fsynced since
    after: frozenset[int] = frozenset()  # the pending entries that last changed the names it touches


@dataclass(frozen=True)
class Removed:
    """unlink or rmdir; what the name held waits in the trash until the removal is durable."""

    seq: int
    kind: str
    path: str
    trash: str
    unsynced: frozenset[int]
    directory: int | None = None  # rmdir: the removed directory, whose pending name changes go with it
    after: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Renamed:
    seq: int
    old: str
    new: str
    unsynced: frozenset[int]
    replaced_trash: str | None = None  # the file it replaced, waiting in the trash
    replaced_dir_mode: int | None = None  # the empty directory it replaced
    after: frozenset[int] = frozenset()


DataEntry = Union[Write, Truncate]
NameEntry = Union[Created, Removed, Renamed]


# The undo steps a crash plan lists, for the filesystem to carry out in order.

@dataclass(frozen=True)
class PutBytes:
    file: int
    offset: int
    data: bytes


@dataclass(frozen=True)
class SetSize:
    file: int
    size: int


@dataclass(frozen=True)
class Discard:
    """Move whatever `path` names (a file, a directory with its contents) to the trash."""

    path: str
    directory: int | None = None  # the directory the name was made in: moot if `path` is in another now


@dataclass(frozen=True)
class Move:
    old: str
    new: str
    directory: int | None = None  # the directory `new` was removed from: moot if `new` is in another now


@dataclass(frozen=True)
class MakeDir:
    path: str
    mode: int


UndoStep = Union[PutBytes, SetSize, Discard, Move, MakeDir]


@dataclass(frozen=True)
class TornWrite:
    path: str
    offset: int
    length: int
    kept: int  # the prefix that reached the disk


@dataclass(frozen=True)
class CrashReport:
    writes_dropped: int = 0  # whole writes undone (the torn one is not counted)
    truncates_dropped: int = 0
    bytes_dropped: int = 0  # written bytes undone, the torn write's lost part included
    poisoned_dropped: int = 0  # of the writes and truncates dropped, those a failed fsync had poisoned
    namespace_undone: int = 0
    torn: TornWrite | None = None
    failed_undo: tuple[str, ...] = ()  # undo steps the filesystem could not carry out: a state no real disk is in

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "failed_undo": list(self.failed_undo)}

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> CrashReport:
        torn = fields.get("torn")
        return cls(**{**fields, "torn": TornWrite(**torn) if torn else None,
                      "failed_undo": tuple(fields.get("failed_undo", ()))})


@dataclass(frozen=True)
class CrashPlan:
    steps: tuple[UndoStep, ...]
    report: CrashReport


class PendingLog:
    """Every operation not yet durable, with what undoing it takes. Not thread-safe."""

    def __init__(self) -> None:
        self._seq = 0
        self._data: dict[int, list[DataEntry]] = {}
        self._names: dict[int, NameEntry] = {}  # by seq, oldest first
        self._last_change: dict[str, int] = {}  # name -> the pending entry that last changed it

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # -- what happened ---------------------------------------------------------

    def write(self, file: int, path: str, offset: int, length: int, size_before: int, pre_image: bytes) -> None:
        if len(pre_image) != max(0, min(offset + length, size_before) - offset):
            raise ValueError(f"a write of {length} at {offset} to {size_before} bytes needs the bytes it "
                             f"overwrote, not {len(pre_image)}")
        if length:
            self._data.setdefault(file, []).append(
                Write(self._next_seq(), file, path, offset, length, size_before, pre_image))

    def truncate(self, file: int, path: str, length: int, size_before: int, pre_image: bytes) -> None:
        if len(pre_image) != max(0, size_before - length):
            raise ValueError(f"a truncate from {size_before} to {length} needs the bytes it cut, "
                             f"not {len(pre_image)}")
        # One that changes nothing still counts after a poisoned write: kept, it fixes the size.
        if length != size_before or file in self._data:
            self._data.setdefault(file, []).append(
                Truncate(self._next_seq(), file, path, length, size_before, pre_image))

    def create(self, kind: str, path: str, dirs: Iterable[int]) -> None:
        seq = self._next_seq()
        self._add_name(Created(seq, kind, path, frozenset(dirs), self._after(path)))

    def remove(self, kind: str, path: str, trash: str, dirs: Iterable[int], directory: int | None = None) -> None:
        seq = self._next_seq()
        self._add_name(Removed(seq, kind, path, trash, frozenset(dirs), directory, self._after(path)))

    def rename(self, old: str, new: str, dirs: Iterable[int], replaced_trash: str | None = None,
               replaced_dir_mode: int | None = None) -> None:
        seq = self._next_seq()
        self._add_name(Renamed(seq, old, new, frozenset(dirs), replaced_trash, replaced_dir_mode,
                               self._after(old, new)))

    def _after(self, *paths: str) -> frozenset[int]:
        return frozenset(self._last_change[p] for p in paths if p in self._last_change)

    def _add_name(self, entry: NameEntry) -> None:
        self._names[entry.seq] = entry
        for path in _paths(entry):
            self._last_change[path] = entry.seq

    # -- what became durable ---------------------------------------------------

    def fsync(self, file: int) -> None:
        entries = self._data.get(file)
        if not entries:
            return
        if any(e.status is Status.POISONED for e in entries):
            self._data[file] = [replace(e, status=Status.DURABLE, pre_image=b"") if e.status is Status.PENDING
                                else e for e in entries]
        else:
            del self._data[file]

    def fsync_failed(self, file: int) -> None:
        entries = self._data.get(file)
        if entries:
            self._data[file] = [replace(e, status=Status.POISONED) if e.status is Status.PENDING else e
                                for e in entries]

    def fsyncdir(self, directory: int) -> list[str]:
        """Mark the directory synced; returns the trash entries whose removal became durable.

        A directory whose removal becomes durable takes its pending name changes with it: a
        directory made later under the same name is another one, and the unlinks that emptied
        the old one must not be undone into it."""
        purge: list[str] = []
        synced = [directory]
        while synced:
            directory = synced.pop()
            for seq, entry in list(self._names.items()):
                if seq not in self._names or directory not in entry.unsynced:
                    continue
                left = entry.unsynced - {directory}
                if left:
                    self._names[seq] = replace(entry, unsynced=left)
                else:
                    self._durable(seq, purge, synced)
        return purge

    def _durable(self, seq: int, purge: list[str], synced: list[int]) -> None:
        """The entry is durable, and so are the earlier changes it builds on, down the chain."""
        chain = [seq]
        while chain:
            entry = self._names.pop(chain.pop(), None)
            if entry is None:
                continue  # durable already, by another way down
            for path in _paths(entry):
                if self._last_change.get(path) == entry.seq:
                    del self._last_change[path]
            chain += sorted(entry.after)
            if isinstance(entry, Removed):
                purge.append(entry.trash)
                if entry.directory is not None:
                    synced.append(entry.directory)
            elif isinstance(entry, Renamed) and entry.replaced_trash:
                purge.append(entry.replaced_trash)

    # -- questions -------------------------------------------------------------

    def has_data(self, file: int) -> bool:
        """Whether the file still has entries (and so needs the descriptor undoing them takes)."""
        return file in self._data

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._data.values()) + len(self._names)

    # -- the power cut ---------------------------------------------------------

    def crash_plan(self, tear: random.Random | None = None) -> CrashPlan:
        """Undo steps, newest first, for everything not durable. With `tear`, the newest
        non-durable write keeps a random prefix (0 to length - 1 bytes) instead of going whole."""
        entries: list[DataEntry | NameEntry] = [e for file in self._data.values() for e in file]
        entries += self._names.values()
        entries.sort(key=lambda e: e.seq, reverse=True)
        torn_write = None
        if tear is not None:
            torn_write = max((e for e in entries if isinstance(e, Write) and e.status is not Status.DURABLE),
                             key=lambda e: e.seq, default=None)
        kept_prefix = tear.randrange(torn_write.length) if torn_write else 0

        steps: list[UndoStep] = []
        counts: dict[str, int] = defaultdict(int)
        kept: dict[int, _Kept] = defaultdict(_Kept)
        torn = None
        for entry in entries:
            if isinstance(entry, (Created, Removed, Renamed)):
                steps += _undo_name(entry)
                counts["namespace_undone"] += 1
                continue
            after = kept[entry.file]
            if entry.status is Status.DURABLE:
                after.add(entry)
            elif entry is torn_write:
                prefix, rest = _split(entry, kept_prefix)
                steps += _undo_write(rest, after)
                if prefix.length:
                    after.add(prefix)
                counts["bytes_dropped"] += rest.length
                torn = TornWrite(entry.path, entry.offset, entry.length, kept_prefix)
            else:
                if isinstance(entry, Write):
                    steps += _undo_write(entry, after)
                    counts["writes_dropped"] += 1
                    counts["bytes_dropped"] += entry.length
                else:
                    steps += _undo_truncate(entry, after)
                    counts["truncates_dropped"] += 1
                counts["poisoned_dropped"] += entry.status is Status.POISONED
        return CrashPlan(tuple(steps), CrashReport(torn=torn, **counts))


class _Kept:
    """What the kept entries of one file, after the point the backward pass has reached, decide:
    the bytes they wrote, where a truncate cut everything beyond, and the file's size."""

    def __init__(self) -> None:
        self.covered: list[tuple[int, int]] = []  # sorted, disjoint [start, stop) extents written
        self.cut: int | None = None  # from here on a kept truncate decides every byte
        self.end = 0  # the furthest byte a kept write reached

    def add(self, entry: DataEntry) -> None:
        if isinstance(entry, Truncate):
            self.cut = entry.length if self.cut is None else min(self.cut, entry.length)
            return
        self.end = max(self.end, entry.end)
        start, stop = entry.offset, entry.end
        merged = []
        for a, b in self.covered:
            if b < start or a > stop:
                merged.append((a, b))
            else:
                start, stop = min(a, start), max(b, stop)
        merged.append((start, stop))
        self.covered = sorted(merged)

    def size(self, size_before: int) -> int | None:
        """The file's size once the entry before them is undone; None if a kept truncate fixed it."""
        return None if self.cut is not None else max(size_before, self.end)

    def free(self, start: int, stop: int) -> list[tuple[int, int]]:
        """The parts of [start, stop) that no kept entry decides."""
        if self.cut is not None:
            stop = min(stop, self.cut)
        parts, position = [], start
        for a, b in self.covered:
            if a >= stop:
                break
            if b <= position:
                continue
            if a > position:
                parts.append((position, a))
            position = b
        if position < stop:
            parts.append((position, stop))
        return parts


def _undo_write(write: Write, after: _Kept) -> list[UndoStep]:
    size = after.size(write.size_before)
    steps: list[UndoStep] = [] if size is None else [SetSize(write.file, size)]
    for start, stop in after.free(write.offset, write.end):
        old_stop = min(stop, write.size_before)
        if start < old_stop:
            steps.append(PutBytes(write.file, start, write.pre_image[start - write.offset:old_stop - write.offset]))
        # Past the old end the write had extended the file; a kept write further on still holds
        # the file that long, and there these bytes were a hole.
        hole_start, hole_stop = max(start, write.size_before), stop if size is None else min(stop, size)
        if hole_start < hole_stop:
            steps.append(PutBytes(write.file, hole_start, bytes(hole_stop - hole_start)))
    return steps


def _undo_truncate(truncate: Truncate, after: _Kept) -> list[UndoStep]:
    size = after.size(truncate.size_before)
    steps: list[UndoStep] = [] if size is None else [SetSize(truncate.file, size)]
    for start, stop in after.free(truncate.length, truncate.size_before):
        steps.append(PutBytes(truncate.file, start, truncate.pre_image[start - truncate.length:stop - truncate.length]))
    return steps


def _split(write: Write, kept: int) -> tuple[Write, Write]:
    """A torn write as two: the prefix that reached the disk and the rest, undone like any write."""
    prefix = replace(write, length=kept, pre_image=write.pre_image[:kept])
    size_after_prefix = max(write.size_before, write.offset + kept) if kept else write.size_before
    rest = replace(write, offset=write.offset + kept, length=write.length - kept, size_before=size_after_prefix,
                   pre_image=write.pre_image[kept:])
    return prefix, rest


def _paths(entry: NameEntry) -> tuple[str, ...]:
    return (entry.old, entry.new) if isinstance(entry, Renamed) else (entry.path,)


def _undo_name(entry: NameEntry) -> list[UndoStep]:
    # Paths name what a later rename of a directory may have moved: the directory's inode tells.
    (directory,) = entry.unsynced if len(entry.unsynced) == 1 and not isinstance(entry, Renamed) else (None,)
    if isinstance(entry, Created):
        return [Discard(entry.path, directory)]
    if isinstance(entry, Removed):
        return [Move(entry.trash, entry.path, directory)]
    steps: list[UndoStep] = [Move(entry.new, entry.old)]
    if entry.replaced_trash:
        steps.append(Move(entry.replaced_trash, entry.new))
    if entry.replaced_dir_mode is not None:
        steps.append(MakeDir(entry.new, entry.replaced_dir_mode))
    return steps
