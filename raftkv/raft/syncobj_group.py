"""`RaftGroup` over pysyncobj: one member of a partition's Raft group.

This is where our parts are wired into pysyncobj (docs/pysyncobj.md lists every override):
- the Raft log is our `RaftJournal` (checksummed, fsync-able), plugged in
  through pysyncobj's module-level `createJournal`;
- the transport (`GroupTransport`) syncs the journal before any message leaves
  in fsync mode, and keeps the peers named at open connected while a snapshot
  (whose members may be older) is loaded;
- log compaction writes the state machine's checkpoint into a snapshot file
  (`snapshot_file`), never pysyncobj's pickle of the whole object, and never
  with fork;
- every committed proposal goes to the `StateMachine` with its index and
  term; entries at or below the state machine's position are skipped, so
  replaying the journal after a restart is idempotent;
- the follower's AppendEntries handling is `PatchedSyncObj`'s.

pysyncobj is driven by composition: `_Member` is the SyncObj subclass, and
everything else only holds a `SyncObjGroup`. Groups run on the node's asyncio
loop (`syncobj_loop`), not on threads of their own: `propose`, its callback
and every pysyncobj call happen on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Callable

import pysyncobj.pickle
from pysyncobj import FAIL_REASON, SERIALIZER_STATE, SyncObjConf, SyncObjException, replicated
from pysyncobj.node import TCPNode

from raftkv import failpoints
from raftkv.core import metrics
from raftkv.core.errors import CorruptData, DiskFailed
from raftkv.core.spec import Tuning
from raftkv.raft import snapshot_file
from raftkv.raft.group import (AddressInUse, Entry, Outcome, ProposalCallback, Role, Snapshot, StateMachine,
                               contradicts)
from raftkv.core.durable import fsync_directory, fsync_path, make_dirs
from raftkv.raft.journal import RaftJournal
from raftkv.raft.syncobj_journal import JournalConfig
from raftkv.raft.syncobj_loop import LoopPoller, Ticker
from raftkv.raft.syncobj_patches import KEPT_ASIDE, LogEntry, PatchedSyncObj
from raftkv.raft.syncobj_transport import GroupTransport
from raftkv.raft.syncobj_wire import set_compression_level
from raftkv.storage.engine import Position

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupConfig:
    partition: int
    self_address: str | None  # None: a learner (pysyncobj's readonly node), which never votes
    peers: tuple[str, ...]  # the voters other than this member
    folder: Path
    fsync: bool
    tuning: Tuning
    on_role_changed: Callable[[Role, Role], None] | None = None
    membership_changes: bool = False  # pysyncobj's dynamicMembershipChange (add_member, remove_member)
    on_corrupt: Callable[[CorruptData], None] | None = None  # the group found its files untrustworthy and stopped


SNAPSHOT_FILE = "raft.snapshot"  # in the replica's folder: pysyncobj's fullDumpFile
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
SNAPSHOT_CHUNK_BYTES = 1024 * 1024  # a snapshot is sent to a replica that needs one in chunks of this size
NEVER = 10**12
_REGULAR = 0  # pysyncobj's _COMMAND_TYPE.REGULAR: a call of a @replicated method
_MEMBERSHIP = bytes([2])  # _COMMAND_TYPE.MEMBERSHIP: the first byte of an add or remove entry

# pysyncobj reasons after which the proposal was certainly not applied; any other failure may
# have been (leadership changed while it was in flight).
_NOT_APPLIED = {FAIL_REASON.QUEUE_FULL, FAIL_REASON.MISSING_LEADER, FAIL_REASON.DISCARDED, FAIL_REASON.NOT_LEADER,
                FAIL_REASON.REQUEST_DENIED}


def _outcome(reason: int) -> Outcome:
    if reason == FAIL_REASON.SUCCESS:
        return Outcome.APPLIED
    return Outcome.REJECTED if reason in _NOT_APPLIED else Outcome.UNKNOWN


@cache
def _snapshot_writer() -> ThreadPoolExecutor:
    """One thread per process writes snapshot files, one at a time."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="raftkv-snapshot")


def _payload_of(command: bytes) -> bytes | None:
    """The proposal in a journal entry; None for pysyncobj's own entries (no-ops, membership)."""
    if not command or command[0] != _REGULAR:
        return None
    call = pysyncobj.pickle.loads(command[1:])  # (method id, args) of `_Member._apply`: args == (payload,)
    return call[1][0]


class _Member(PatchedSyncObj):
    """The pysyncobj side of a group. Everything it decides is delegated to its `SyncObjGroup`.

    Attributes are set before `SyncObj.__init__`: pysyncobj snapshots every attribute created after it.
    """

    def __init__(self, group: SyncObjGroup, self_address, peers, conf):
        self._group = group
        super().__init__(self_address, list(peers), conf, transportClass=GroupTransport)

    @replicated
    def _apply(self, payload: bytes):
        return self._group._apply_committed(payload)

    def _SyncObj__applyLogEntries(self) -> bool:
        """pysyncobj's apply step, less its commit notice while a proposal is queued: unbatched, a leader
        sends each entry, then once it is applied an empty AppendEntries with the new commit index, and
        each replica answers both. A proposal queued meanwhile (group commit proposes its next batch from
        the apply callback) is sent later in this same tick, with the new commit index."""
        need_send = PatchedSyncObj._SyncObj__applyLogEntries(self)
        return need_send and not self._SyncObj__commandsQueue._FastQueue__queue

    def _SyncObj__doApplyCommand(self, command: bytes):
        self._group._check_committed()
        return PatchedSyncObj._SyncObj__doApplyCommand(self, command)

    def sync_journal(self) -> None:
        self._group.sync_journal()

    def on_sent(self, message: dict) -> None:
        self._group.count_sent(message)

    def _SyncObj__deleteEntriesTo(self, toIDx: int) -> None:
        """A compaction drops the log up to its snapshot, but for the entries kept for seeded replicas."""
        PatchedSyncObj._SyncObj__deleteEntriesTo(self, self._group._compacted_to(toIDx))

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:
        """pysyncobj's snapshot load, after compacting the journal to the snapshot at start-up.

        At start-up pysyncobj keeps the journal only if its first two entries are the
        snapshot's last two, and otherwise clears it down to them. But the snapshot file
        is renamed into place before the journal is compacted (`_snapshot_state`), so a
        replica killed in between restarts with a journal that begins earlier, and
        pysyncobj would drop every entry after the snapshot, acknowledged ones
        included. Found by the chaos harness: a write acknowledged just before
        `kill all` survived only on the old leader, which had already applied it.
        """
        if clearJournal:  # a received snapshot replaces the log: durable first (pysyncobj never syncs it)
            self._group._sync_snapshot_file()
        else:
            self._group._settle_kept_aside_snapshot()
            self._group._compact_journal_to_snapshot()
        with self._SyncObj__transport.loading_snapshot():
            PatchedSyncObj._SyncObj__loadDumpFile(self, clearJournal)

    def _snapshotLastEntry(self):
        """The received snapshot's last entry, read without installing it (see PatchedSyncObj)."""
        try:
            return snapshot_file.read_meta(self.conf.fullDumpFile).last_entry
        except CorruptData:
            return None


class SyncObjGroup:
    """A `RaftGroup` backed by pysyncobj, ticked on `loop`."""

    def __init__(self, config: GroupConfig, state_machine: StateMachine, loop: asyncio.AbstractEventLoop):
        self.config = config
        self.partition = config.partition
        self._sm = state_machine
        folder = Path(config.folder)
        make_dirs(folder)
        self._snapshot_path = folder / SNAPSHOT_FILE
        self._next_snapshot = folder / f"{SNAPSHOT_FILE}.next"
        snapshot_file.check(self._snapshot_path)
        self._snapshot_job: Future | None = None
        self._change_pending = False  # a membership change was asked for and has not ended yet
        self._fsyncs = metrics.JOURNAL_FSYNCS.labels(config.partition)
        self._entry_bytes_sent = metrics.RAFT_BYTES_SENT.labels(config.partition, "entries")
        self._snapshot_bytes_sent = metrics.RAFT_BYTES_SENT.labels(config.partition, "snapshot")
        self._keep_from = 0  # the first entry the next compaction keeps (`compact`)
        self._snapshot_base = 0  # the entry the last compaction dropped the log to, had it kept none
        tuning = config.tuning
        set_compression_level(tuning.wire_compression)
        poller = LoopPoller(loop)
        on_role_changed = config.on_role_changed
        conf = SyncObjConf(
            autoTick=False,  # ticked on the node's event loop, see syncobj_loop
            pollerType=poller,
            appendEntriesUseBatch=False,  # we batch ourselves (group commit); pysyncobj's batching adds ~100 ms
            appendEntriesBatchSizeBytes=4 * tuning.max_batch_bytes,  # > any entry: never the chunked path
            logCompactionBatchSize=SNAPSHOT_CHUNK_BYTES,  # pysyncobj's 64 KiB chunks made snapshots crawl
            sendBufferSize=SOCKET_BUFFER_BYTES,  # pysyncobj's 64 KiB makes big appends trickle out
            recvBufferSize=SOCKET_BUFFER_BYTES,
            journalFile=JournalConfig(folder / "journal", config.fsync),
            fullDumpFile=str(self._snapshot_path),
            serializer=self._write_snapshot,
            serializeChecker=self._snapshot_state,
            deserializer=self._read_snapshot,
            useFork=False,
            bindAddress=config.self_address,  # pysyncobj would otherwise listen on 0.0.0.0
            maxBindRetries=3,
            bindRetryTime=0.2,
            raftMinTimeout=tuning.election_timeout_min,
            raftMaxTimeout=tuning.election_timeout_max,
            appendEntriesPeriod=tuning.heartbeat_period,
            leaderFallbackTimeout=tuning.leader_fallback_timeout,
            connectionTimeout=max(3.5, tuning.election_timeout_max),
            connectionRetryTime=tuning.connection_retry_seconds,
            # the owner decides when to compact (`compact`)
            logCompactionMinEntries=NEVER,
            logCompactionMinTime=NEVER,
            commandsWaitLeader=False,
            dynamicMembershipChange=config.membership_changes,
            onStateChanged=None if on_role_changed is None else lambda old, new: on_role_changed(Role(old), Role(new)),
        )
        try:
            self._member = _Member(self, config.self_address, config.peers, conf)
        except SyncObjException as exc:
            if "BindError" in str(exc):
                raise AddressInUse(config.self_address) from None
            raise
        self._journal: RaftJournal = self._member._SyncObj__raftLog
        self._ticker = Ticker(self._member, poller, loop, period=min(0.05, tuning.heartbeat_period / 2),
                             on_corrupt=config.on_corrupt)
        self._ticker.start()

    # -- state ------------------------------------------------------------

    @property
    def role(self) -> Role:
        return Role(self._member._SyncObj__raftState)

    @property
    def leader(self) -> str | None:
        leader = self._member._getLeader()
        return leader.address if leader is not None else None

    @property
    def term(self) -> int:
        return self._member.raftCurrentTerm

    @property
    def commit_index(self) -> int:
        return self._member.raftCommitIndex

    @property
    def leader_commit_index(self) -> int | None:
        return self._member._SyncObj__leaderCommitIndex  # pysyncobj sets it on the leader too

    @property
    def last_applied(self) -> int:
        return self._member.raftLastApplied

    @property
    def last_log_index(self) -> int:
        return self._journal[-1][1]

    def term_at(self, index: int) -> int | None:
        first = self._journal[0][1]
        return self._journal[index - first][2] if first <= index <= self.last_log_index else None

    def log_base_at(self, index: int) -> tuple[LogEntry, LogEntry] | None:
        """The log's entries `index - 1` and `index` as pysyncobj keeps them (a seeded replica's log
        starts with them, `syncobj_seed`); None unless the log holds both."""
        first = self._journal[0][1]
        if not first < index <= self.last_log_index:
            return None
        prev, last = self._journal[index - 1 - first], self._journal[index - first]
        return (bytes(prev[0]), prev[1], prev[2]), (bytes(last[0]), last[1], last[2])

    @property
    def voters(self) -> frozenset[str]:
        others = {node.address for node in self._member._SyncObj__otherNodes}
        return frozenset(others | {self.config.self_address} if self.config.self_address else others)

    @property
    def has_quorum(self) -> bool:
        return self._member.hasQuorum

    @property
    def log_entries(self) -> int:
        return len(self._journal) - max(0, self._snapshot_base - self._journal[0][1])

    def log_bytes_after(self, index: int) -> int:
        return self._journal.bytes_from(index + 1 - self._journal[0][1])

    @property
    def log_bytes(self) -> int:
        return self._journal.size_bytes

    @property
    def log_full(self) -> bool:
        return self._journal.full

    @property
    def snapshot_bytes_received(self) -> int:
        try:  # pysyncobj's serializer writes the chunks it receives to this file
            return os.stat(f"{self._snapshot_path}.1.tmp").st_size
        except FileNotFoundError:
            return 0

    def learners_caught_up(self) -> int:
        if self.role != Role.LEADER:
            return 0
        match = self._member._SyncObj__raftMatchIndex
        applied = self.last_applied
        return sum(1 for node in self._member.readonlyNodes if match.get(node, 0) >= applied - 1)

    def committed_entries(self, after: int, limit: int) -> list[Entry]:
        journal = self._journal
        first = journal[0][1]
        last = min(self.last_applied, journal[-1][1])
        if after + 1 < first:
            raise LookupError(f"partition {self.partition}: entries after {after} were compacted away")
        return [Entry(index, term, _payload_of(command))
                for command, index, term in journal[after + 1 - first: min(last, after + limit) + 1 - first]]

    # -- commands ---------------------------------------------------------

    def propose(self, payload: bytes, callback: ProposalCallback) -> None:
        """Append an encoded proposal; `callback(result, outcome)` runs once it is applied or failed."""
        self._member._apply(payload, callback=lambda result, reason: callback(result, _outcome(reason)))
        self._ticker.soon()

    def compact(self, keep_from: int = 0) -> None:
        self._keep_from = keep_from
        self._member.forceLogCompaction()
        self._ticker.soon()

    def _compacted_to(self, index: int) -> int:
        """Where a compaction whose snapshot covers the log to `index` drops it to. The kept entries
        go at the next restart: pysyncobj loads a journal only if it starts at the snapshot."""
        self._snapshot_base = index
        return min(index, self._keep_from - 1) if self._keep_from else index

    def transfer_leadership(self, to: str | None = None) -> None:
        """Best effort: pysyncobj refuses when no connected follower holds every entry."""
        self._member.transferLeadership(to)
        self._ticker.soon()

    def add_member(self, address: str, callback: ProposalCallback) -> None:
        self._change_membership(self._member.addNodeToCluster, address, callback)

    def remove_member(self, address: str, callback: ProposalCallback) -> None:
        self._change_membership(self._member.removeNodeFromCluster, address, callback)

    def _change_membership(self, change, address: str, callback: ProposalCallback) -> None:
        """One change at a time: pysyncobj means to refuse a second one while the first is uncommitted,
        but never records the first (`__changeClusterIDx` stays None), and two uncommitted single-server
        changes can leave two disjoint majorities. So a change is refused here while one is queued or
        uncommitted in the log. (pysyncobj itself refuses one before the leader's no-op is applied.)"""
        if self._change_pending or self._uncommitted_membership():
            callback(None, Outcome.REJECTED)
            return
        self._change_pending = True

        def done(result, reason) -> None:
            self._change_pending = False
            callback(result, _outcome(reason))

        change(address, callback=done)
        self._ticker.soon()

    def _uncommitted_membership(self) -> bool:
        journal = self._journal
        after = self.commit_index + 1 - journal[0][1]
        return any(command[:1] == _MEMBERSHIP for command, _, _ in journal[max(after, 0):])

    def close(self) -> None:
        self._ticker.stop()
        self._member.destroy()  # with autoTick off this closes sockets and the journal at once

    # -- called by pysyncobj ----------------------------------------------

    def _apply_committed(self, payload: bytes):
        index = self._member.raftLastApplied + 1  # pysyncobj increments it right after this call
        if index <= self._sm.position.index:
            return None
        self.sync_journal()  # a single-member leader commits without sending, so no send synced it
        term = self._journal[index - self._journal[0][1]][2]
        failpoints.hit("apply-before")
        result = self._sm.apply(Entry(index, term, payload))
        failpoints.hit("apply-after")
        return result

    def _check_committed(self) -> None:
        """Before pysyncobj applies its next committed entry (no-ops and membership changes too): one the
        state already reflects must fit the state's position, or this replica's log was rewound and
        refilled with other entries (docs/chaos.md), and its state cannot be trusted."""
        index = self._member.raftLastApplied + 1
        position = self._sm.position
        if index > position.index:
            return
        term = self._journal[index - self._journal[0][1]][2]
        if contradicts(index, term, position):
            raise CorruptData(
                f"partition {self.partition}: the Raft log contradicts the database: committed entry {index} "
                f"(term {term}) cannot come before its position {position.index} (term {position.term}); stop "
                f"the node, move {self.config.folder} away and restart it so the partition re-syncs from its peers")

    def count_sent(self, message: dict) -> None:
        """An append-entries message left for another member: count its entries' or snapshot chunk's bytes."""
        serialized = message.get("serialized")
        if serialized is not None:
            self._snapshot_bytes_sent.inc(len(serialized[0]))
        else:
            self._entry_bytes_sent.inc(sum(len(entry[0]) for entry in message.get("entries", ()))
                                       + len(message.get("data", b"")))

    def sync_journal(self) -> None:
        """fsync mode: make every journal write so far durable (one fdatasync for all of them)."""
        if self._journal.dirty:
            self._journal.sync()
            self._fsyncs.inc()

    def _write_snapshot(self, tmp_filename: str, data) -> None:
        """pysyncobj's serializer. A failure is recorded as a failed job as well as raised.

        pysyncobj swallows the exception and marks itself busy until the checker answers
        SUCCESS or FAILED; answering NOT_SERIALIZING instead would wedge it for good: no more
        compaction, and no snapshot ever sent to a replica that needs one.
        """
        try:
            self._snapshot_job = self._start_snapshot(tmp_filename, data)
        except Exception as exc:
            failed: Future = Future()
            failed.set_exception(exc)
            self._snapshot_job = failed
            raise

    def _start_snapshot(self, tmp_filename: str, data) -> Future:
        """Checkpoint now (hard links, milliseconds); write the file on a thread.

        The group shares the node's event loop, so writing a large tar here would stall every
        partition's heartbeats. pysyncobj renames `tmp_filename` over the snapshot file as soon as
        this returns, so it gets a hard link of the current snapshot (or an empty file) and the
        new file replaces the snapshot when complete. Until then `_snapshot_state` (pysyncobj's
        serializeChecker) answers SERIALIZING, which keeps pysyncobj from compacting the journal
        or sending the snapshot file.
        """
        last_entry, prev_entry, cluster = data
        # In both modes: the journal will drop the entries before it (in a compaction that is
        # always synced), so the snapshot and the database must not be lost to a power cut. The
        # journal first: a database durable past the log's end contradicts the log after a cut.
        self._journal.sync()
        self._sm.flush()
        work = Path(tempfile.mkdtemp(dir=self.config.folder, prefix="checkpoint-"))
        try:
            meta = snapshot_file.Meta(
                partition=self.partition,
                position=self._sm.checkpoint(work / "db", Position(last_entry[1], last_entry[2])),
                last_entry=last_entry,
                prev_entry=prev_entry,
                cluster=self._members_at(last_entry[1], cluster),
            )
            # Renaming a hard link over its own inode is a no-op that leaves the link behind.
            Path(tmp_filename).unlink(missing_ok=True)
            if self._snapshot_path.exists():
                os.link(self._snapshot_path, tmp_filename)
            else:
                open(tmp_filename, "wb").close()
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        return _snapshot_writer().submit(self._finish_snapshot, work, meta)

    def _members_at(self, index: int, cluster) -> list[str]:
        """The members' addresses as of entry `index`, from pysyncobj's members as of its last entry.

        pysyncobj applies a membership change when it is appended, and stores its current members in
        the snapshot: a change after the snapshot's last entry, which a new leader may still truncate,
        would outlive the truncation in the snapshot, and a member restarted from it would count votes
        against the wrong members. So the changes after `index` are undone here, newest first.
        """
        members = {node.address for node in cluster if node is not None}  # a learner has no address
        journal = self._journal
        for command, _, _ in reversed(journal[max(index + 1 - journal[0][1], 0):]):
            if command[:1] == _MEMBERSHIP:
                change, address = pysyncobj.pickle.loads(command[1:])[:2]
                (members.discard if change == "add" else members.add)(address)
        return sorted(members)

    def _finish_snapshot(self, work: Path, meta: snapshot_file.Meta) -> int:
        """On the worker thread: write the tar beside the snapshot (renamed in `_snapshot_state`);
        returns the index of the last entry it covers."""
        try:
            snapshot_file.write(self._next_snapshot, work / "db", meta, fsync=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return meta.last_entry[1]

    def _snapshot_state(self) -> int:
        job = self._snapshot_job
        if job is None:
            return SERIALIZER_STATE.NOT_SERIALIZING
        if not job.done():
            return SERIALIZER_STATE.SERIALIZING
        self._snapshot_job = None
        if (error := job.exception()) is not None:
            if isinstance(error, DiskFailed):  # the replica stops (Ticker): its disk cannot be trusted
                raise error
            log.warning("partition %d: no snapshot this time: %s", self.partition, error)
            return SERIALIZER_STATE.FAILED
        if (installed := self._snapshot_last_index()) is not None and installed >= job.result():
            # A leader's newer snapshot was installed while this one was written. Renamed over it,
            # this one would begin before the journal, which pysyncobj then clears down to it at
            # the next start: the entries between them gone from the log, though the database
            # holds them (the rewound log, docs/chaos.md).
            self._next_snapshot.unlink(missing_ok=True)
            log.info("partition %d: the snapshot up to entry %d is dropped: one up to entry %d was installed "
                     "meanwhile", self.partition, job.result(), installed)
            return SERIALIZER_STATE.FAILED
        # Here, not on the worker: pysyncobj renames its placeholder over the snapshot file right
        # after the serializer returns, and a fast worker finishing first would see its new file
        # replaced by the old one while the journal is compacted past it. A replica needing a
        # snapshot would then get the old one again and again, and never catch up.
        failpoints.hit("snapshot-rename-before")
        os.replace(self._next_snapshot, self._snapshot_path)
        fsync_directory(self.config.folder)  # durable before pysyncobj compacts the journal past the old one
        failpoints.hit("snapshot-rename-after")
        return SERIALIZER_STATE.SUCCESS

    def _sync_snapshot_file(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            fsync_path(self._snapshot_path)
            fsync_directory(self.config.folder)

    def _snapshot_last_index(self) -> int | None:
        try:
            return snapshot_file.read_meta(self._snapshot_path).last_entry[1]
        except (CorruptData, FileNotFoundError):
            return None

    def _settle_kept_aside_snapshot(self) -> None:
        """At start-up, after a crash while a received snapshot was checked (`PatchedSyncObj`): it was
        renamed over this replica's own, which was kept aside to be put back if the log already covers
        it. If the journal begins after the snapshot on disk, that was the received one, and the own one
        goes back: pysyncobj would clear the journal down to the older snapshot."""
        aside = Path(f"{self._snapshot_path}{KEPT_ASIDE}")
        if not aside.exists():
            return
        last = self._snapshot_last_index()
        journal = self._journal
        if last is not None and len(journal) and journal[0][1] >= last:
            os.replace(aside, self._snapshot_path)
            log.info("partition %d: the snapshot kept aside is back (the last run stopped while checking a "
                     "received one, up to entry %d, that the log had passed)", self.partition, last)
        else:
            aside.unlink()

    def _compact_journal_to_snapshot(self) -> None:
        try:
            meta = snapshot_file.read_meta(self._snapshot_path)
        except (CorruptData, FileNotFoundError):
            return  # nothing to align with: pysyncobj's own load decides
        journal = self._journal
        first = journal[0][1] if len(journal) else None
        prev_index = meta.prev_entry[1]
        if first is None or not first < prev_index <= journal[-1][1] - 1:
            return
        at = prev_index - first
        if journal[at] == meta.prev_entry and journal[at + 1] == meta.last_entry:
            journal.deleteEntriesTo(at)
            log.info("partition %d: journal compacted to its snapshot at index %d on start-up (the last run "
                     "ended between the two)", self.partition, meta.last_entry[1])

    def _read_snapshot(self, filename: str):
        meta = snapshot_file.read_meta(filename)
        if meta.partition != self.partition:
            raise ValueError(f"snapshot {filename} is of partition {meta.partition}, not {self.partition}")
        last = Position(meta.last_entry[1], meta.last_entry[2])
        self._sm.restore(Snapshot(Path(filename), meta.position, last))
        # As nodes: with membership changes on, pysyncobj takes its peers from this list, leaving out
        # the entry equal to its own node, and an address string never equals a node.
        return meta.last_entry, meta.prev_entry, [TCPNode(address) for address in meta.cluster]
