"""A group's snapshot file, as pysyncobj's serializer, serializeChecker and deserializer.

A snapshot is a RocksDB checkpoint of the state machine with its metadata (`snapshot_file`), never
pysyncobj's pickle of the whole object, and never written by a fork:

- `prepare`, before pysyncobj is asked to compact, has the state machine flush on one worker thread per
  process, so that the checkpoint on the loop has little left to write;
- `write` (the serializer) checkpoints on the loop (hard links, a millisecond or two) into a folder it
  keeps beside the snapshot file, and on the worker syncs the journal and writes a file of the head
  only, naming that folder: a compaction costs the loop the same whatever the size of the database,
  and no sync (docs/durability.md, docs/benchmarks.md "What a worker thread can take off the loop");
- `state` (the serializeChecker) answers SERIALIZING until the worker is done, then renames the new
  file into place, deletes the previous snapshot's folder and answers SUCCESS, after which
  pysyncobj compacts the journal to it;
- `read` (the deserializer) installs a snapshot into the state machine;
- `sendable` (asked before pysyncobj sends) answers whether the file holds its database: a head is
  withheld from every member that needs a snapshot (`SnapshotHooks`), and `withheld` has the worker
  pack the kept checkpoint into a full tar, which replaces the head once it is written.

A replica seeded in place (`syncobj_seed`) starts with a head too, naming a checkpoint of the seed as
a compaction's names its own. A seed of 0.2 named none, its database being the live one: such a head
is read as the record of where the seed left the database, and withheld until a compaction replaces
it (a voter compacts when it opens, `SyncObjGroup.load_state`).

The rest keeps the journal and the snapshot consistent across crashes (docs/pysyncobj.md, and the
rewound log in docs/chaos.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Callable

from pysyncobj import SERIALIZER_STATE, SyncObj
from pysyncobj.node import TCPNode

from raftkv import failpoints
from raftkv.core.durable import fsync_directory, fsync_path, fsync_tree
from raftkv.core.errors import CorruptData, DiskFailed
from raftkv.raft import snapshot_file
from raftkv.raft.group import Snapshot, StateMachine
from raftkv.raft.journal import RaftJournal
from raftkv.raft.syncobj_journal import membership_change
from raftkv.raft.syncobj_patches import KEPT_ASIDE, LogEntry
from raftkv.storage.engine import Position

log = logging.getLogger(__name__)

SNAPSHOT_FILE = "raft.snapshot"  # in the replica's folder: pysyncobj's fullDumpFile


@cache
def snapshot_writer() -> ThreadPoolExecutor:
    """One thread per process writes snapshot files, one at a time."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="raftkv-snapshot")


class SnapshotFiles:
    """The snapshot file of one partition's replica, in its folder. `journal` is set once pysyncobj
    has made it (it needs these callbacks first)."""

    def __init__(self, partition: int, folder: Path, state_machine: StateMachine):
        self.partition = partition
        self.folder = folder
        self.path = folder / SNAPSHOT_FILE
        self.journal: RaftJournal | None = None
        self.job: Future | None = None  # the file being written on the worker
        # Called on the worker when a file is written: only a tick finds it done (`state`), and a resting
        # group is ticked only by events, so the group asks for one (`SyncObjGroup`).
        self.on_written: Callable[[], None] = lambda: None
        self._next = folder / f"{SNAPSHOT_FILE}.next"
        self._full = folder / f"{SNAPSHOT_FILE}.full"  # a head's tar, packed for a member that needs it
        self._sm = state_machine
        self._drop_placeholder()
        snapshot_file.check(self.path)
        meta = snapshot_file.read_meta(self.path) if self.path.exists() else None
        # the file holds no database (a head: `snapshot_file.write_head`): it is never sent, so it is known
        # without a read; `kept` is the checkpoint folder it names (a compaction's), None for a seed's
        self.in_place = meta is not None and meta.in_place
        self.kept = meta.checkpoint if meta is not None else None
        self.packing: Future | None = None  # the tar of `kept` being written on the worker (`withheld`)
        self._sweep()
        self.withheld_count = 0  # snapshots this file kept from members that needed one (`withheld`)
        self._withheld_from: set[str] = set()  # ... logged once a member

    def _drop_placeholder(self) -> None:
        """An empty snapshot file is the placeholder of a first snapshot that a crash interrupted (`_start`):
        the journal was not compacted to it, so the replica starts from the journal alone. Removed before
        pysyncobj sees it: its load would fail, with an ERROR and a traceback, to the same end."""
        if self.path.exists() and self.path.stat().st_size == 0:
            self.path.unlink()
            log.info("partition %d: the last run stopped while writing its first snapshot (an empty %s is "
                     "left); expected after a crash: the replica starts from its log", self.partition, SNAPSHOT_FILE)

    @property
    def seeded(self) -> bool:
        """The file is the head of a seed of 0.2: its database is the live one, and only a compaction gives it one
        to send (or to roll back to)."""
        return self.in_place and self.kept is None

    def _sweep(self) -> None:
        """At start-up: the checkpoint folders no snapshot file names (a crash came before the new file was
        renamed in, or before the old folder was deleted), and a tar packed to be sent, deleted. Also the
        work folders of the tar writer of 0.2, which a crash left behind."""
        named = {self.kept}
        with contextlib.suppress(CorruptData, FileNotFoundError):  # the one kept aside may go back (`settle_kept_aside`)
            named.add(snapshot_file.read_meta(f"{self.path}{KEPT_ASIDE}").checkpoint)
        for folder in [*self.folder.glob(snapshot_file.KEPT_PREFIX + "*"), *self.folder.glob("checkpoint-*")]:
            if folder.is_dir() and folder.name not in named:
                shutil.rmtree(folder)
        self._full.unlink(missing_ok=True)

    def _retire(self, kept: str | None) -> None:
        """Delete checkpoint folder `kept`, which no snapshot file names any longer (that made durable first).
        While the worker may be packing it, the worker deletes it after: read from under the pack, the
        checkpoint would look damaged (a snapshot received meanwhile retires it, `read`)."""
        if kept is None:
            return
        if self.packing is not None and not self.packing.done():
            snapshot_writer().submit(shutil.rmtree, self.folder / kept, ignore_errors=True)
        else:
            shutil.rmtree(self.folder / kept, ignore_errors=True)

    @property
    def bytes_received(self) -> int:
        try:  # pysyncobj's serializer writes the chunks it receives to this file
            return os.stat(f"{self.path}.1.tmp").st_size
        except FileNotFoundError:
            return 0

    def write(self, tmp_filename: str, data) -> None:
        """pysyncobj's serializer. A failure is recorded as a failed job as well as raised.

        pysyncobj swallows the exception and marks itself busy until the checker answers
        SUCCESS or FAILED; answering NOT_SERIALIZING instead would wedge it for good: no more
        compaction, and no snapshot ever sent to a replica that needs one.
        """
        try:
            self.job = self._start(tmp_filename, data)
        except Exception as exc:
            failed: Future = Future()
            failed.set_exception(exc)
            self.job = failed
            raise

    def _start(self, tmp_filename: str, data) -> Future:
        """Checkpoint now, into a folder the snapshot keeps; sync it and write the head on the worker.

        pysyncobj renames `tmp_filename` over the snapshot file as soon as this returns, so it gets a
        hard link of the current snapshot (or an empty file) and the new file replaces the snapshot
        when complete. Until then `state` answers SERIALIZING, which keeps pysyncobj from compacting
        the journal or sending the snapshot file.
        """
        last_entry, prev_entry, cluster = data
        # The entries up to the snapshot's written, to be synced on the worker before the snapshot can
        # count (`_finish`). The checkpoint may make the live database durable past the log's end
        # meanwhile, as RocksDB's own memtable flushes may at any time: after a power cut the replica
        # rolls back to the snapshot in place, which is never past its synced log (`StateRepair.after_load`).
        self.journal.write_pending()
        kept = Path(tempfile.mkdtemp(dir=self.folder, prefix=snapshot_file.KEPT_PREFIX))
        try:
            meta = snapshot_file.Meta(
                partition=self.partition,
                position=self._sm.checkpoint(kept / "db", Position(last_entry[1], last_entry[2])),
                last_entry=last_entry,
                prev_entry=prev_entry,
                cluster=self._members_at(last_entry[1], cluster),
                in_place=True,
                checkpoint=kept.name,
            )
            # Renaming a hard link over its own inode is a no-op that leaves the link behind.
            Path(tmp_filename).unlink(missing_ok=True)
            if self.path.exists():
                os.link(self.path, tmp_filename)
            else:
                open(tmp_filename, "wb").close()
        except BaseException:
            shutil.rmtree(kept, ignore_errors=True)
            raise
        job = snapshot_writer().submit(self._finish, kept, meta)
        job.add_done_callback(lambda _: self.on_written())
        return job

    def prepare(self, then: Callable[[], None]) -> None:
        """A compaction is coming: on the worker, the state machine writes out what the checkpoint would
        write on the loop (`StateMachine.flush`: a memtable flush held the GIL for tens to hundreds of
        ms there); then `then()`, on the worker, whatever the outcome (a flush that failed is the
        checkpoint's to do, and to fail, as before)."""
        def flush() -> None:
            try:
                self._sm.flush()
            except Exception as exc:  # the checkpoint meets it again, and says so (`state`)
                log.debug("partition %d: the flush before a compaction failed: %s", self.partition, exc)
            then()
        snapshot_writer().submit(flush)

    def _members_at(self, index: int, cluster) -> list[str]:
        """The members' addresses as of entry `index`, from pysyncobj's members as of its last entry.

        pysyncobj applies a membership change when it is appended, and stores its current members in
        the snapshot: a change after the snapshot's last entry, which a new leader may still truncate,
        would outlive the truncation in the snapshot, and a member restarted from it would count votes
        against the wrong members. So the changes after `index` are undone here, newest first.
        """
        members = {node.address for node in cluster if node is not None}  # a learner has no address
        journal = self.journal
        for command, _, _ in reversed(journal[max(index + 1 - journal[0][1], 0):]):
            if (change := membership_change(command)) is not None:
                kind, address = change
                (members.discard if kind == "add" else members.add)(address)
        return sorted(members)

    def _finish(self, kept: Path, meta: snapshot_file.Meta) -> snapshot_file.Meta:
        """On the worker thread: the journal synced to the snapshot's entry (the journal will drop the entries
        before it, and a snapshot durable past the log's end would hold entries a whole-cluster power cut
        took: no point to roll back to), the checkpoint made durable (its files are hard links, but
        MANIFEST, CURRENT and the links themselves are new), then the head written beside the snapshot
        (renamed in `state`)."""
        try:
            self.journal.sync_written()
            fsync_tree(kept)
            fsync_directory(self.folder)
            snapshot_file.write_head(self._next, meta)
        except BaseException:
            shutil.rmtree(kept, ignore_errors=True)
            raise
        return meta

    def state(self) -> int:
        """pysyncobj's serializeChecker."""
        job = self.job
        if job is None:
            return SERIALIZER_STATE.NOT_SERIALIZING
        if not job.done():
            return SERIALIZER_STATE.SERIALIZING
        self.job = None
        if (error := job.exception()) is not None:
            if isinstance(error, DiskFailed):  # the replica stops (Ticker): its disk cannot be trusted
                raise error
            log.warning("partition %d: no snapshot this time: %s", self.partition, error)
            return SERIALIZER_STATE.FAILED
        meta = job.result()
        installed = self.last_index()
        if installed is not None and (installed > meta.last_entry[1] or installed == meta.last_entry[1] and not self.seeded):
            # A leader's snapshot, as new or newer, was installed while this one was written. Renamed
            # over it, this one would begin before the journal, which pysyncobj then clears down to it
            # at the next start: the entries between them gone from the log, though the database holds
            # them (the rewound log, docs/chaos.md); and after a whole-cluster power cut, one up to the
            # same index may hold other entries than ours. A seed's file of 0.2 (no database) is the exception:
            # a moved replica that led before any entry after its seed compacted up to the seed's entry,
            # kept the seed's file, and withheld snapshots for good.
            self._next.unlink(missing_ok=True)
            self._retire(meta.checkpoint)
            log.info("partition %d: the snapshot up to entry %d is dropped: one up to entry %d was installed "
                     "meanwhile", self.partition, meta.last_entry[1], installed)
            return SERIALIZER_STATE.FAILED
        # Here, not on the worker: pysyncobj renames its placeholder over the snapshot file right
        # after the serializer returns, and a fast worker finishing first would see its new file
        # replaced by the old one while the journal is compacted past it. A replica needing a
        # snapshot would then get the old one again and again, and never catch up.
        failpoints.hit("snapshot-rename-before")
        os.replace(self._next, self.path)
        previous, self.in_place, self.kept = self.kept, True, meta.checkpoint
        fsync_directory(self.folder)  # durable before pysyncobj compacts the journal past the old one
        failpoints.hit("snapshot-rename-after")
        self._retire(previous)
        return SERIALIZER_STATE.SUCCESS

    def read(self, filename: str):
        """pysyncobj's deserializer: installs the snapshot into the state machine."""
        meta = snapshot_file.read_meta(filename)
        if meta.partition != self.partition:
            raise ValueError(f"snapshot {filename} is of partition {meta.partition}, not {self.partition}")
        last = Position(meta.last_entry[1], meta.last_entry[2])
        if meta.seeded:  # the database is this replica's own already
            self._check_in_place(meta)
        else:
            self._sm.restore(Snapshot(Path(filename), meta.position, last))
        previous, self.in_place, self.kept = self.kept, meta.in_place, meta.checkpoint
        if previous != self.kept:  # a received snapshot replaced a compaction's (synced: `sync_received`)
            self._retire(previous)
        # As nodes: with membership changes on, pysyncobj takes its peers from this list, leaving out
        # the entry equal to its own node, and an address string never equals a node.
        return meta.last_entry, meta.prev_entry, [TCPNode(address) for address in meta.cluster]

    def _check_in_place(self, meta: snapshot_file.Meta) -> None:
        """The database of a replica a seed of 0.2 made is at the position its snapshot file records, or past it
        by entries of its own log (it applied some before a restart, or before it reopened as a voter);
        CorruptData if not: there is nothing to roll back to."""
        position, journal = self._sm.position, self.journal
        if position == meta.position:
            return
        first = journal[0][1] if len(journal) else position.index + 1
        if position.index > meta.position.index and first <= position.index <= journal[-1][1] \
                and journal[position.index - first][2] == position.term:
            return
        raise CorruptData(f"partition {self.partition}: the database is at entry {position.index} (term "
                          f"{position.term}), not where its seed left it ({meta.position.index}, term "
                          f"{meta.position.term}) or after it in the log; stop the node, move {self.folder} away and "
                          "restart it so the partition re-syncs from its peers")

    def withheld(self, node) -> None:
        """Member `node` needs a snapshot, and this one holds no database (`SnapshotHooks`): the kept checkpoint
        packed into a tar on the worker, if it is not being packed already; logged once a member."""
        self.withheld_count += 1
        if self.kept is not None and self.packing is None and self.job is None:  # a compaction replaces it anyway
            full = replace(snapshot_file.read_meta(self.path), in_place=False, checkpoint=None)
            self.packing = snapshot_writer().submit(self._pack, self.kept, full)
            self.packing.add_done_callback(lambda _: self.on_written())
        if node.id not in self._withheld_from:
            self._withheld_from.add(node.id)
            if self.seeded:
                log.info("partition %d: %s needs a snapshot; this replica's holds no database until its first "
                         "compaction (it was seeded in place by 0.2), so it is sent one after that", self.partition, node.id)
            else:
                log.info("partition %d: %s needs a snapshot; it is sent one once the snapshot's checkpoint is packed",
                         self.partition, node.id)

    def _pack(self, kept: str, meta: snapshot_file.Meta) -> str:
        """On the worker thread: the full tar of checkpoint `kept` (renamed in by `sendable`), the checkpoint
        checked first (`StateMachine.verify`): the tar's digests are of the files as they are, damage and all."""
        self._sm.verify(self.folder / kept / "db")
        snapshot_file.write(self._full, self.folder / kept / "db", meta, fsync=True)
        return kept

    def sendable(self) -> bool:
        """Whether pysyncobj may send the snapshot file (it holds its database). On the loop: a tar packed
        meanwhile replaces the head that names its checkpoint first, unless a compaction is under way or
        replaced the head (the tar is then dropped, and the next member withheld packs the new one)."""
        packing = self.packing
        if packing is None or not packing.done() or self.job is not None:
            return not self.in_place
        self.packing = None
        if (error := packing.exception()) is not None:
            if isinstance(error, CorruptData):  # a damaged block, or a failed disk: the replica stops
                raise error
            log.warning("partition %d: no snapshot to send this time: %s", self.partition, error)
        elif packing.result() == self.kept:
            os.replace(self._full, self.path)
            previous, self.in_place, self.kept = self.kept, False, None
            fsync_directory(self.folder)
            self._retire(previous)
            return True
        self._full.unlink(missing_ok=True)
        return not self.in_place

    def before_load(self) -> None:
        """At start-up, before pysyncobj loads the snapshot file: the journal and the database made to agree
        with it, or CorruptData (raised here: pysyncobj's load would only log it)."""
        self.settle_kept_aside()
        self.compact_journal_to_snapshot()
        try:  # read again: the one kept aside may be back
            meta = snapshot_file.read_meta(self.path)
        except (CorruptData, FileNotFoundError):
            return  # pysyncobj's own load decides
        self.in_place, self.kept = meta.in_place, meta.checkpoint
        if meta.seeded:
            self._check_in_place(meta)

    def sync_received(self) -> None:
        """A snapshot received from the leader replaces the log: durable first (pysyncobj never syncs it)."""
        with contextlib.suppress(FileNotFoundError):
            fsync_path(self.path)
            fsync_directory(self.folder)

    def current(self) -> Snapshot | None:
        """The snapshot file this replica holds, if any. An empty file is none: the placeholder of a first
        snapshot still being written (`_start`), before which the journal is whole; a roll-back after a
        power cut (`state_repair`) that read it as corrupt stopped the node."""
        if not self.path.is_file() or self.path.stat().st_size == 0:
            return None
        meta = snapshot_file.read_meta(self.path)
        return Snapshot(self.path, meta.position, Position(meta.last_entry[1], meta.last_entry[2]))

    def last_index(self) -> int | None:
        try:
            return snapshot_file.read_meta(self.path).last_entry[1]
        except (CorruptData, FileNotFoundError):
            return None

    def settle_kept_aside(self) -> None:
        """At start-up, after a crash while a received snapshot was checked (`PatchedSyncObj`): it was
        renamed over this replica's own, which was kept aside to be put back if the log already covers
        it. If the journal begins after the snapshot on disk, that was the received one, and the own one
        goes back: pysyncobj would clear the journal down to the older snapshot."""
        aside = Path(f"{self.path}{KEPT_ASIDE}")
        if not aside.exists():
            return
        last = self.last_index()
        journal = self.journal
        if last is not None and len(journal) and journal[0][1] >= last:
            os.replace(aside, self.path)
            log.info("partition %d: the snapshot kept aside is back (the last run stopped while checking a "
                     "received one, up to entry %d, that the log had passed)", self.partition, last)
        else:
            aside.unlink()
            self._sweep()  # the checkpoint folder it named, unless the file on disk names it too

    def compact_journal_to_snapshot(self) -> None:
        """At start-up: a journal that begins before the snapshot (the last run ended between the
        snapshot's rename and the journal's compaction) is compacted to it, so pysyncobj keeps it."""
        try:
            meta = snapshot_file.read_meta(self.path)
        except (CorruptData, FileNotFoundError):
            return  # nothing to align with: pysyncobj's own load decides
        journal = self.journal
        first = journal[0][1] if len(journal) else None
        prev_index = meta.prev_entry[1]
        if first is None or not first < prev_index <= journal[-1][1] - 1:
            return
        at = prev_index - first
        if journal[at] == meta.prev_entry and journal[at + 1] == meta.last_entry:
            journal.deleteEntriesTo(at)
            log.info("partition %d: journal compacted to its snapshot at index %d on start-up (the last run "
                     "ended between the two)", self.partition, meta.last_entry[1])


class SnapshotHooks(SyncObj):
    """What a member asks of its snapshot file, mixed into it (`_group.snapshots` is its `SnapshotFiles`)."""

    def _snapshotLastEntry(self) -> LogEntry | None:
        """The received snapshot's last entry, read without installing it (see PatchedSyncObj)."""
        try:
            return snapshot_file.read_meta(self.conf.fullDumpFile).last_entry
        except CorruptData:
            return None

    def _SyncObj__sendAppendEntries(self) -> None:
        """pysyncobj's AppendEntries, but while the snapshot file holds no database (`SnapshotFiles.sendable`)
        a member that needs a snapshot is sent what pysyncobj sends while it compacts, `serialized=None` (it
        keeps the member from campaigning, and installs nothing): pysyncobj's next heartbeat tries again.
        Left to pysyncobj's loop, the member would get the file, or while pysyncobj compacts that empty
        message over and over until a heartbeat period had passed, with the loop blocked."""
        snapshots = self._group.snapshots
        if snapshots.sendable():
            return super()._SyncObj__sendAppendEntries()
        first, next_index = self._SyncObj__raftLog[0][1], self._SyncObj__raftNextIndex
        voters, learners = self._SyncObj__otherNodes, self._SyncObj__readonlyNodes
        waiting = {node for node in voters | learners if next_index.get(node, first + 1) <= first}
        for node in waiting & self._SyncObj__connectedNodes:
            snapshots.withheld(node)
            self._SyncObj__transport.send(node, {"type": "append_entries", "term": self._SyncObj__raftCurrentTerm,
                                                 "commit_index": self._SyncObj__raftCommitIndex, "serialized": None})
        self._SyncObj__otherNodes, self._SyncObj__readonlyNodes = voters - waiting, learners - waiting
        try:
            super()._SyncObj__sendAppendEntries()
        finally:
            self._SyncObj__otherNodes, self._SyncObj__readonlyNodes = voters, learners
