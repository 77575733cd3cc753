"""One partition replica: a pysyncobj SyncObj over a RocksDB state machine.

This is the only module that wires our parts into pysyncobj:
- the Raft log is our `RaftJournal` (checksummed, fsync-able), plugged in
  through pysyncobj's module-level `createJournal`;
- in fsync mode the transport syncs the journal before any message leaves, so
  an entry is durable before a follower acknowledges it or a leader counts
  itself, at one fsync per group commit;
- log compaction serializes a RocksDB checkpoint (see `snapshot_file`), never
  pysyncobj's pickle of the whole object, and never with fork;
- every committed proposal is applied by `state_machine.apply_proposal` and
  written with its Raft position in one atomic engine write. Entries at or
  below the engine's position are skipped, so replaying the journal after a
  restart is idempotent.

Replicas run on the node's asyncio loop (`syncobj_loop`), not on threads of
their own: `propose`, its callback and every pysyncobj call happen on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pysyncobj.syncobj
from pysyncobj import FAIL_REASON, SERIALIZER_STATE, SyncObjConf, replicated
from pysyncobj.monotonic import monotonic
from pysyncobj.transport import TCPTransport

from raftkv.core import metrics

from raftkv.raft import snapshot_file
from raftkv.core.commands import decode_proposal
from raftkv.storage.engine import Position
from raftkv.core.errors import CorruptData
from raftkv.raft.journal import RaftJournal, fsync_directory
from raftkv.core.learner_registry import learners_from
from raftkv.core.retention import compaction_due
from raftkv.storage.rocks_engine import RocksEngine
from raftkv.core.spec import Tuning
from raftkv.core.state_machine import apply_proposal
from raftkv.raft.syncobj_loop import LoopPoller, Ticker
from raftkv.raft.syncobj_patches import PatchedSyncObj
from raftkv.raft.syncobj_wire import set_compression_level

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JournalConfig:
    """Passed as SyncObjConf.journalFile; our createJournal hook builds a RaftJournal from it."""

    directory: Path
    fsync: bool


_upstream_create_journal = pysyncobj.syncobj.createJournal


def _create_journal(journal_file):
    if isinstance(journal_file, JournalConfig):
        return RaftJournal(journal_file.directory, fsync=journal_file.fsync)
    return _upstream_create_journal(journal_file)


pysyncobj.syncobj.createJournal = _create_journal


class SyncingTransport(TCPTransport):
    """Syncs a dirty journal before sending, so nothing is acknowledged before it is durable."""

    def send(self, node, message):
        self._syncObj.sync_journal()
        return super().send(node, message)


SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
NEVER = 10**12


@cache
def _snapshot_writer() -> ThreadPoolExecutor:
    """One thread per process writes snapshot files, one at a time."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="raftkv-snapshot")


class Role:
    FOLLOWER, CANDIDATE, LEADER = 0, 1, 2
    NAMES = {0: "follower", 1: "candidate", 2: "leader"}


# pysyncobj reasons after which the proposal was certainly not applied.
NOT_APPLIED = {FAIL_REASON.QUEUE_FULL, FAIL_REASON.MISSING_LEADER, FAIL_REASON.DISCARDED, FAIL_REASON.NOT_LEADER,
               FAIL_REASON.REQUEST_DENIED}

ProposalCallback = Callable[[object, int], None]


def _check_snapshot(path: Path) -> None:
    """Refuse to start on a damaged snapshot file.

    pysyncobj loads it on the first tick and only logs a failure: the replica would then run with
    a compacted journal and no base to apply it on, and never apply another entry. An empty file
    is the placeholder of a snapshot a crash interrupted (the journal was not compacted yet).
    """
    if not path.exists() or path.stat().st_size == 0:
        return
    try:
        snapshot_file.read_meta(path)
    except CorruptData as exc:
        raise CorruptData(f"{exc}; stop the node, move {path.parent} away and restart it so the partition "
                          "re-syncs from its peers") from None


class PartitionReplica(PatchedSyncObj):
    def __init__(
        self,
        *,
        partition: int,
        self_address: str,
        peer_addresses: list[str],
        folder: Path,
        fsync: bool,
        tuning: Tuning,
        loop: asyncio.AbstractEventLoop,
        on_state_changed: Callable[[int, int], None] | None = None,
        on_corrupt: Callable[[CorruptData], None] | None = None,
    ):
        self.partition = partition
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        _check_snapshot(self.folder / "raft.snapshot")
        self.engine = RocksEngine(self.folder, on_corrupt=on_corrupt)
        self._snapshot_job: Future | None = None
        self._stepped_aside = 0.0  # when this leader last handed leadership on for want of disk space
        self._next_snapshot = self.folder / "raft.snapshot.next"
        self._tuning = tuning
        self._last_compaction = monotonic()
        self._apply_seconds = metrics.APPLY_SECONDS.labels(partition)
        self._fsyncs = metrics.JOURNAL_FSYNCS.labels(partition)
        set_compression_level(tuning.wire_compression)
        poller = LoopPoller(loop)
        conf = SyncObjConf(
            autoTick=False,  # ticked on the node's event loop, see syncobj_loop
            pollerType=poller,
            appendEntriesUseBatch=False,  # we batch ourselves (group commit); pysyncobj's batching adds ~100 ms
            appendEntriesBatchSizeBytes=4 * tuning.max_batch_bytes,  # > any entry: never the chunked path
            sendBufferSize=SOCKET_BUFFER_BYTES,  # pysyncobj's 64 KiB makes big appends trickle out
            recvBufferSize=SOCKET_BUFFER_BYTES,
            journalFile=JournalConfig(self.folder / "journal", fsync),
            fullDumpFile=str(self.folder / "raft.snapshot"),
            serializer=self._write_snapshot,
            serializeChecker=self._snapshot_state,
            deserializer=self._read_snapshot,
            useFork=False,
            bindAddress=self_address,  # pysyncobj would otherwise listen on 0.0.0.0
            maxBindRetries=3,
            bindRetryTime=0.2,
            raftMinTimeout=tuning.election_timeout_min,
            raftMaxTimeout=tuning.election_timeout_max,
            appendEntriesPeriod=tuning.heartbeat_period,
            leaderFallbackTimeout=tuning.leader_fallback_timeout,
            connectionTimeout=max(3.5, tuning.election_timeout_max),
            connectionRetryTime=tuning.connection_retry_seconds,
            # we decide when to compact (retention.compaction_due, via maybe_compact)
            logCompactionMinEntries=NEVER,
            logCompactionMinTime=NEVER,
            commandsWaitLeader=False,
            onStateChanged=on_state_changed,
        )
        super().__init__(self_address, peer_addresses, conf, transportClass=SyncingTransport)
        self._ticker = Ticker(self, poller, loop, period=min(0.05, tuning.heartbeat_period / 2))
        self._ticker.start()

    # -- write path -------------------------------------------------------

    def propose(self, payload: bytes, callback: ProposalCallback) -> None:
        """Append an encoded proposal; `callback(results, reason)` runs once it is applied or failed."""
        self._apply(payload, callback=callback)
        self._ticker.soon()

    @replicated
    def _apply(self, payload: bytes):
        index = self.raftLastApplied + 1  # pysyncobj increments it right after this call
        if index <= self.engine.position.index:
            return None
        self.sync_journal()  # a single-replica leader commits without sending, so no send synced it
        journal = self._SyncObj__raftLog
        started = time.perf_counter()
        term = journal[index - journal[0][1]][2]
        applied = apply_proposal(self.engine.get, decode_proposal(payload), self.engine.meta_get)
        self.engine.write(applied.mutations, Position(index, term), applied.meta)
        self._apply_seconds.observe(time.perf_counter() - started)
        return applied.results

    def maybe_compact(self) -> None:
        """Ask pysyncobj to compact when the retention policy allows (called about once a second)."""
        journal = self._SyncObj__raftLog
        now = monotonic()
        if compaction_due(
            entries=len(journal),
            size_bytes=journal.size_bytes,
            seconds_since_last=now - self._last_compaction,
            applied=self.raftLastApplied,
            learner_progress=[i.progress for i in learners_from(self.engine.meta_items()).values()],
            learners_streaming=self._readonly_caught_up(),
            tuning=self._tuning,
        ):
            self.forceLogCompaction()
            self._last_compaction = now

    def _readonly_caught_up(self) -> int:
        """On the leader: connected readonly replicas (learners) that have every applied entry."""
        if self.role != Role.LEADER:
            return 0
        match = self._SyncObj__raftMatchIndex
        return sum(1 for node in self.readonlyNodes if match.get(node, 0) >= self.raftLastApplied - 1)

    def sync_journal(self) -> None:
        """fsync mode: make every journal write so far durable (one fdatasync for all of them)."""
        journal = self._SyncObj__raftLog
        if journal.dirty:
            journal.sync()
            self._fsyncs.inc()

    @property
    def storage_full(self) -> bool:
        """This replica cannot write: its journal or its database found the disk full."""
        return self._SyncObj__raftLog.full or self.engine.broken

    def step_aside(self) -> None:
        """A leader that cannot write hands leadership to its most caught-up follower (at most once a
        second; pysyncobj refuses when no connected follower has every entry)."""
        if self.role == Role.LEADER and monotonic() - self._stepped_aside >= 1.0:
            self._stepped_aside = monotonic()
            self.transferLeadership()

    # -- status -----------------------------------------------------------

    @property
    def role(self) -> int:
        return self._SyncObj__raftState

    @property
    def leader_address(self) -> str | None:
        leader = self._getLeader()
        return leader.address if leader is not None else None

    @property
    def applied_index(self) -> int:
        """The index the local state reflects: pysyncobj's no-op entries advance it without
        touching the engine, and after a restart the engine is ahead until the replay catches up."""
        return max(self.raftLastApplied, self.engine.position.index)

    @property
    def last_log_index(self) -> int:
        return self._SyncObj__raftLog[-1][1]

    # -- snapshots --------------------------------------------------------

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

        The replica shares the node's event loop, so writing a large tar here would stall every
        partition's heartbeats. pysyncobj renames `tmp_filename` over the snapshot file as soon as
        this returns, so it gets a hard link of the current snapshot (or an empty file) and the
        new file replaces the snapshot when complete. Until then `_snapshot_state` (pysyncobj's
        serializeChecker) answers SERIALIZING, which keeps pysyncobj from compacting the journal
        or sending the snapshot file.
        """
        last_entry, prev_entry, cluster = data
        fsync = self.conf.journalFile.fsync
        if fsync:  # the journal will drop entries this database must then cover
            self.engine.flush()
        work = Path(tempfile.mkdtemp(dir=self.folder, prefix="checkpoint-"))
        try:
            meta = snapshot_file.Meta(
                partition=self.partition,
                position=self.engine.checkpoint(work / "db"),
                last_entry=last_entry,
                prev_entry=prev_entry,
                cluster=sorted(node.address for node in cluster),
            )
            # Renaming a hard link over its own inode is a no-op that leaves the link behind.
            Path(tmp_filename).unlink(missing_ok=True)
            current = Path(self.conf.fullDumpFile)
            if current.exists():
                os.link(current, tmp_filename)
            else:
                open(tmp_filename, "wb").close()
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        return _snapshot_writer().submit(self._finish_snapshot, work, meta, fsync)

    def _finish_snapshot(self, work: Path, meta: snapshot_file.Meta, fsync: bool) -> None:
        """On the worker thread: write the tar beside the snapshot (renamed in `_snapshot_state`)."""
        try:
            snapshot_file.write(self._next_snapshot, work / "db", meta, fsync=fsync)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _snapshot_state(self) -> int:
        job = self._snapshot_job
        if job is None:
            return SERIALIZER_STATE.NOT_SERIALIZING
        if not job.done():
            return SERIALIZER_STATE.SERIALIZING
        self._snapshot_job = None
        if job.exception() is not None:
            log.warning("partition %d: no snapshot this time: %s", self.partition, job.exception())
            return SERIALIZER_STATE.FAILED
        # Here, not on the worker: pysyncobj renames its placeholder over the snapshot file right
        # after the serializer returns, and a fast worker finishing first would see its new file
        # replaced by the old one while the journal is compacted past it. A replica needing a
        # snapshot would then get the old one again and again, and never catch up.
        os.replace(self._next_snapshot, self.conf.fullDumpFile)
        if self.conf.journalFile.fsync:  # durable before pysyncobj compacts the journal past the old one
            fsync_directory(self.folder)
        return SERIALIZER_STATE.SUCCESS

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
        if not clearJournal:
            self._compact_journal_to_snapshot()
        PatchedSyncObj._SyncObj__loadDumpFile(self, clearJournal)

    def _compact_journal_to_snapshot(self) -> None:
        try:
            meta = snapshot_file.read_meta(self.conf.fullDumpFile)
        except (CorruptData, FileNotFoundError):
            return  # nothing to align with: pysyncobj's own load decides
        journal = self._SyncObj__raftLog
        first = journal[0][1] if len(journal) else None
        prev_index = meta.prev_entry[1]
        if first is None or not first < prev_index <= journal[-1][1] - 1:
            return
        at = prev_index - first
        if journal[at] == meta.prev_entry and journal[at + 1] == meta.last_entry:
            journal.deleteEntriesTo(at)
            log.info("partition %d: journal compacted to its snapshot at index %d on start-up (the last run "
                     "ended between the two)", self.partition, meta.last_entry[1])

    def _snapshotLastEntry(self):
        """The received snapshot's last entry, read without installing it (see PatchedSyncObj)."""
        try:
            return snapshot_file.read_meta(self.conf.fullDumpFile).last_entry
        except CorruptData:
            return None

    def _read_snapshot(self, filename: str):
        meta = snapshot_file.read_meta(filename)
        if meta.partition != self.partition:
            raise ValueError(f"snapshot {filename} is of partition {meta.partition}, not {self.partition}")
        if meta.position.index > self.engine.position.index:
            with tempfile.TemporaryDirectory(dir=self.folder, prefix="install-") as tmp:
                checkpoint = snapshot_file.extract_db(filename, Path(tmp))
                self.engine.install(checkpoint)
            log.info("partition %d installed a snapshot at index %d", self.partition, meta.position.index)
        return meta.last_entry, meta.prev_entry, meta.cluster

    def close(self) -> None:
        self._ticker.stop()
        self.destroy()  # with autoTick off this closes sockets and the journal at once
        self.engine.close()
