"""The node log and the replica folders whose Raft logs it holds (docs/raft-engine.md, "The node log, wired").

Every group of a node keeps its Raft log in the one `NodeLog` of `<data dir>/raft-log/`; a replica
folder says which log and group is its own with a marker file, written once the group is in the log.
At start-up, before any replica opens, `settle` makes folders and groups agree: a group whose folder
is gone, empty or unmarked is dropped (the folder was moved away or wiped: the replica re-syncs),
a folder marked for another log is emptied (the node log was moved away: every replica re-syncs),
and a folder of the previous release (its own `journal/`) is converted into the log.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Mapping

from raftkv import failpoints
from raftkv.core.durable import fsync_directory, make_dirs
from raftkv.core.errors import ConfigError, CorruptData
from raftkv.raft.journal_syncer import SYNCER
from raftkv.raft.node_log import MAX_GROUP, GroupLog, NodeLog
from raftkv.raft.node_log_recovery import remedy
from raftkv.raft.record_file import write_new_file

log = logging.getLogger(__name__)

IDENTITY = "identity"  # in the node log's folder: a random id, written once
LOCK = "LOCK"  # in the node log's folder: held (flock) by the one process that has the log open
MARKER = "raft-log-group"  # in a replica folder: "<identity> <group>", once its group is in that log
JOURNAL = "journal"  # a replica folder's own RaftJournal, as the previous release kept it
META_GROUP = MAX_GROUP  # the metadata group's (partition -1) group in the node log


def log_group(partition: int) -> int:
    """The node log's group of a partition's replica (the metadata group's is META_GROUP)."""
    return partition if partition >= 0 else META_GROUP


class ReplicaLogs:
    def __init__(self, folder: Path, fsync: bool):
        """Open the node log in `folder` (CorruptData, with what to do, if it cannot be trusted; ConfigError
        if another process has it open)."""
        make_dirs(folder)
        self._lock = _lock(folder)
        self.fsync = fsync
        try:
            self.log = NodeLog(folder, fsync)
            try:
                self.identity = _identity(folder, empty=not self.log.groups())
            except BaseException:
                self.log.close()
                raise
        except BaseException:
            os.close(self._lock)
            raise
        if not fsync:
            SYNCER.add(self.log)  # once a second, for every group

    def settle(self, folders: Mapping[int, Path]) -> None:
        """At start-up, before any replica opens: `folders` are the replica folders there are, by group."""
        for group, folder in sorted(folders.items()):
            self._settle(group, folder)
        for group in self.log.groups():
            if group not in folders:
                log.info("node log: group %d has no replica folder here any more; dropped", group)
                self.log.remove(group)

    def open(self, folder: Path, group: int) -> GroupLog:
        """The log of the replica in `folder` (pysyncobj's `createJournal`)."""
        marker = _marker(folder)
        if marker is not None and (marker != (self.identity, group) or group not in self.log.groups()):
            raise CorruptData(f"{folder / MARKER} names a Raft log that is not {self.log.folder} (group {group}); "
                              f"stop the node, move {folder} away and restart it so the partition re-syncs")
        if marker is None and group in self.log.groups():
            self.log.remove(group)  # a stale group of a folder moved away: never found by this one
        view = self.log.group(group)
        if marker is None:
            self.log.sync()  # the group is durable in the log before the marker names it
            self._mark(folder, group)
        return view

    def drop(self, group: int) -> None:
        """The replica of `group` is deleted: its group first (synced), then the caller deletes its folder."""
        self.log.remove(group)

    def close(self) -> None:
        try:
            self.log.close()
        finally:
            if self._lock >= 0:
                os.close(self._lock)
                self._lock = -1

    def _settle(self, group: int, folder: Path) -> None:
        marker, journal = _marker(folder), folder / JOURNAL
        ours = marker == (self.identity, group) and group in self.log.groups()
        if marker is not None and not ours:
            if marker == (self.identity, group):  # `drop`, then killed before the folder was deleted
                log.info("%s: its group was dropped from the node log (the replica was being deleted when the "
                         "node stopped); the folder is deleted", folder)
            else:
                log.warning("%s belongs to a Raft log that is not %s (was the node log moved away?): its data is "
                            "deleted and the replica re-syncs from its peers", folder, self.log.folder)
            shutil.rmtree(folder)
            fsync_directory(folder.parent)
        elif journal.is_dir() and ours:  # converted; killed before the journal was deleted
            _delete_journal(folder)
        elif journal.is_dir():
            self._convert(folder, group)
        elif marker is None and group in self.log.groups():
            self.log.remove(group)

    def _convert(self, folder: Path, group: int) -> None:
        """A folder of the previous release: its journal into the node log (synced), the marker (synced),
        then the journal deleted. Killed before the marker, this runs again (it replaces); after, the
        journal is deleted (`_settle`)."""
        self.log.convert(folder / JOURNAL, group)
        failpoints.hit("log-convert-after")
        self._mark(folder, group)
        failpoints.hit("log-convert-marked")
        _delete_journal(folder)
        log.info("%s: its Raft journal was converted into the node log %s (group %d)", folder, self.log.folder,
                 group)

    def _mark(self, folder: Path, group: int) -> None:
        os.close(write_new_file(folder / MARKER, f"{self.identity} {group}\n".encode(), fsync=True))


def _marker(folder: Path) -> tuple[str, int] | None:
    try:
        text = (folder / MARKER).read_text()
    except FileNotFoundError:
        return None
    parts = text.split()
    if len(parts) != 2 or not parts[1].isdigit():
        raise CorruptData(f"{folder / MARKER} is damaged ({text[:40]!r}); stop the node, move {folder} away and "
                          "restart it so the partition re-syncs from its peers")
    return parts[0], int(parts[1])


def _identity(folder: Path, empty: bool) -> str:
    """The node log's id: made when the log is new; a log with groups but no id cannot be matched to any
    replica folder, so it is not trusted."""
    path = folder / IDENTITY
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        if not empty:
            raise CorruptData(f"node log {folder} holds groups but no {IDENTITY} file; {remedy(folder)}") from None
    identity = uuid.uuid4().hex
    os.close(write_new_file(path, f"{identity}\n".encode(), fsync=True))
    return identity


def _lock(folder: Path) -> int:
    """An open fd holding the folder's lock file: one process at a time appends to a node log."""
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(f"{folder} is in use by another process (is this node already running?)",
                          source="raft log") from None
    return fd


def _delete_journal(folder: Path) -> None:
    shutil.rmtree(folder / JOURNAL)
    fsync_directory(folder)
