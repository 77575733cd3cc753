"""`RaftGroup` over pysyncobj: one member of a partition's Raft group.

This is where our parts are wired into pysyncobj (docs/pysyncobj.md lists every override):
- the Raft log is the group's part of the node log (`replica_logs`), or without one a `RaftJournal`
  of its own (both checksummed, fsync-able), plugged in through pysyncobj's `createJournal`;
- the transport (`GroupTransport`) carries the group's messages over the node's Raft hub (one
  connection per pair of nodes, mutual TLS with the cluster's), a journal of its own synced before
  any message leaves in fsync mode, and keeps the members the cluster metadata names linked whatever
  a snapshot or the journal replays;
- log compaction writes the state machine's checkpoint into a snapshot file (`syncobj_snapshots`);
- every committed proposal goes to the `StateMachine` with its index and term; entries at or below
  the state machine's position are skipped, so replaying the journal after a restart is idempotent;
- the follower's AppendEntries handling is `PatchedSyncObj`'s;
- with the node engine (`raft_engine = "steady"`), a settled group's steady state is its (`engine/`).

pysyncobj is driven by composition: `_Member` is the SyncObj subclass, and everything else only
holds a `SyncObjGroup`. Groups run on the node's asyncio loop (`syncobj_loop`), not on threads of
their own: `propose`, its callback and every pysyncobj call happen on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pysyncobj import syncobj as upstream
from pysyncobj import FAIL_REASON, SyncObjConf, replicated

from raftkv import failpoints
from raftkv.core import metrics
from raftkv.core.clock import Throttle
from raftkv.core.durable import make_dirs
from raftkv.core.errors import CorruptData, StorageFull
from raftkv.core.spec import Tuning
from raftkv.raft.engine.node_engine import NodeEngine
from raftkv.raft.engine.undriven import steady_part
from raftkv.raft.group import Entry, Outcome, ProposalCallback, Role, StateMachine
from raftkv.raft.journal import RaftJournal
from raftkv.raft.node_log import GroupLog
from raftkv.raft.replica_logs import JOURNAL, ReplicaLogs, log_group
from raftkv.raft.syncobj_callbacks import Proposals, Waiting, keep_unapplied, unappended
from raftkv.raft.syncobj_journal import REGULAR, JournalConfig, apply_call, membership_change, outcome, payload_of
from raftkv.raft.syncobj_loop import LoopPoller, Ticker
from raftkv.raft.syncobj_patches import LogEntry, PatchedSyncObj
from raftkv.raft.syncobj_quiet import Quiet
from raftkv.raft.state_repair import StateRepair
from raftkv.raft.syncobj_snapshots import SnapshotFiles, SnapshotHooks
from raftkv.raft.hub import RaftHub
from raftkv.raft.syncobj_transport import GroupTransport
from raftkv.raft.syncobj_votes import Votes
from raftkv.raft.vote_guard import VoteGuard


@dataclass(frozen=True)
class GroupConfig:
    partition: int  # the group's number, on the hub's wire too
    hub: RaftHub  # carries the group's messages
    self_address: str | None  # None: a learner (pysyncobj's readonly node), which never votes
    peers: tuple[str, ...]  # the voters other than this member
    folder: Path
    fsync: bool
    tuning: Tuning
    on_role_changed: Callable[[Role, Role], None] | None = None
    membership_changes: bool = False  # pysyncobj's dynamicMembershipChange (add_member, remove_member)
    on_corrupt: Callable[[CorruptData], None] | None = None  # the group found its files untrustworthy and stopped
    guard: VoteGuard | None = None  # a voter that lost its data: when it may vote and campaign (vote_guard)
    node_log: ReplicaLogs | None = None  # the node's log of every group; None: a RaftJournal in folder/journal
    engine: NodeEngine | None = None  # the node's engine, which may drive the group's steady state (raft_engine)
    clock: Callable[[], float] = time.monotonic  # pysyncobj's (core/clock.py): it compares our deadlines with it
    after_apply: Callable[[], None] = lambda: None  # after every apply step (a learner's feed pump wakes on it)
    resyncs_itself: bool = False  # a learner process's: a log that contradicts the copy is no reason to stop
    new_cluster: bool = False  # opened by a node that knows no metadata yet: its first election need not wait


log = logging.getLogger(__name__)

REFUSAL_LOG_SECONDS = 10.0
SNAPSHOT_CHUNK_BYTES = 1024 * 1024  # a snapshot is sent to a replica that needs one in chunks of this size
NEVER = 10**12
_LEADER, _CANDIDATE = Role.LEADER.value, Role.CANDIDATE.value


class _Member(SnapshotHooks, PatchedSyncObj):
    """The pysyncobj side of a group. Everything it decides is delegated to its `SyncObjGroup`.

    Attributes are set before `SyncObj.__init__`: pysyncobj snapshots every attribute created after it.
    """

    def __init__(self, group: SyncObjGroup, self_address, peers, conf):
        self._group = group
        self._first_election_hastened = not group.config.new_cluster
        super().__init__(self_address, list(peers), conf, transportClass=GroupTransport)
        self._SyncObj__commandsQueue = Proposals(conf.commandsQueueSize)
        self._SyncObj__commandsWaitingCommit = Waiting()

    @replicated
    def _apply(self, payload: bytes):
        return self._group._apply_committed(payload)

    def _SyncObj__applyLogEntries(self) -> bool:
        """pysyncobj's apply step (every tick), less its commit notice while a proposal is queued (group commit
        proposes its next batch from the apply callback: this tick sends it with the new commit index; unbatched,
        each entry and each notice cost a message and an answer per replica). Then `after_apply` is told."""
        self._SyncObj__commandsWaitingCommit.taken = None
        try:
            need_send = PatchedSyncObj._SyncObj__applyLogEntries(self)
        except StorageFull:
            keep_unapplied(self._SyncObj__commandsWaitingCommit, self._SyncObj__raftLastApplied)
            raise
        self._group.config.after_apply()
        return need_send and not self._SyncObj__commandsQueue._FastQueue__queue

    def next_timer(self) -> float:
        """When (on the group's clock) a tick next has something to do by itself: a leader's heartbeat, a
        follower's election; at once while commands wait (a tick takes them for at most a heartbeat period)."""
        if self._SyncObj__commandsQueue._FastQueue__queue:
            return 0.0
        if self._group.steady.leading:  # the node engine's timer heartbeats for it
            return NEVER
        if self._SyncObj__raftState == _LEADER:
            return self._SyncObj__newAppendEntriesTime
        if self._SyncObj__selfNode is None:  # a learner never campaigns
            return NEVER
        return self._SyncObj__raftElectionDeadline

    def hasten_first_election(self, reachable_voters: int) -> None:
        """A new cluster's group that never had a term campaigns within `election_timeout_min` of reaching a
        majority of its voters, not a whole timeout after it opened (etcd fast-forwards its first election
        alike): its campaign is for term 1, which cannot unseat a leader, whose term is at least 1. Only in
        a new cluster: a replica added to a running group opens without a term too, and its whole timeout
        gives its leader time to reach it (docs/elasticity.md). Once; drawn from pysyncobj's randomness, as
        its timeouts are (the simulation seeds it)."""
        if (self._first_election_hastened or self.raftCurrentTerm != 0 or self._SyncObj__selfNode is None
                or 2 * reachable_voters <= len(self._SyncObj__otherNodes) + 1):
            return
        self._first_election_hastened = True
        soon = self._group.config.clock() + upstream.random.uniform(0, self._group.config.tuning.election_timeout_min)
        self._SyncObj__raftElectionDeadline = min(self._SyncObj__raftElectionDeadline, soon)

    def postpone_election(self, now: float) -> None:
        """A fresh election timeout from now: the loop was blocked, so silence from the leader meant nothing."""
        if self._SyncObj__raftState != _LEADER:
            self._SyncObj__raftElectionDeadline = now + self._SyncObj__generateRaftTimeout()

    def _onTick(self, timeToWait=0.0):
        """A guarded voter (vote_guard) does not campaign: its election timer never runs out. A resting
        group's clocks stand still (`syncobj_quiet`), and a settled leader may make its group rest."""
        if self._SyncObj__needLoadDumpFile:
            self._group.load_state()
        now = self._group.config.clock()  # read again after pysyncobj's tick: it takes time, and stamps answers
        guard = self._group.config.guard
        if guard is not None and guard.recovering:  # (every voter has a guard; few ever lost their data)
            guard.caught_up(self.raftCommitIndex)
            last = self._SyncObj__raftLog[-1]
            if (why := guard.held_back(last[2], last[1])) is not None:
                if self._SyncObj__raftElectionDeadline < now and self._SyncObj__raftState != _LEADER:
                    self._group.votes.held_back(why)
                self._SyncObj__raftElectionDeadline = now + self._group.config.tuning.election_timeout_max
        if self._group.steady.before_tick(now):  # the node engine drives the group (engine/steady.py)
            return
        self._group.quiet.before_tick(now)
        term = self.raftCurrentTerm
        PatchedSyncObj._onTick(self, timeToWait)
        if self._SyncObj__raftState == _CANDIDATE and self.raftCurrentTerm > term:
            self._group.votes.campaigned()
        self._group.quiet.after_tick(self._group.config.clock())

    def _checkCommandsToApply(self) -> None:
        """pysyncobj's loop over queued proposals, less the loss of one whose append met a full disk."""
        proposals = self._SyncObj__commandsQueue
        try:
            PatchedSyncObj._checkCommandsToApply(self)
        except StorageFull:
            journal = self._SyncObj__raftLog
            if (lost := unappended(proposals, journal[-1][0] if len(journal) else None)) is not None:
                command, callback = lost
                if self._SyncObj__conf.dynamicMembershipChange and (
                        change := self._SyncObj__parseChangeClusterRequest(command)) is not None:
                    self._SyncObj__doChangeCluster(change, reverse=True)  # pysyncobj made it before the append
                self._SyncObj__callErrCallback(FAIL_REASON.REQUEST_DENIED, callback)  # a follower's: answered
            raise
        proposals.taken = None

    def _SyncObj__doApplyCommand(self, command: bytes):
        """pysyncobj's, less its replay of a membership entry: the configuration took the entry when it was
        appended, or at start-up (`SyncObjGroup.load_state`)."""
        self._group.repair.check_committed()
        result = None if self._SyncObj__conf.dynamicMembershipChange and membership_change(command) is not None \
            else PatchedSyncObj._SyncObj__doApplyCommand(self, command)
        self._SyncObj__commandsWaitingCommit.taken = None  # applied: its proposals are answered next, once
        return result

    def sync_journal(self) -> None:
        self._group.sync_journal()

    def on_sent(self, message: dict) -> None:
        self._group.count_sent(message)

    def _mayReplaceCommitted(self, idx: int) -> bool:
        return not self._group.config.fsync

    def _snapshotContradicted(self, node, detail: str) -> None:
        self._group.repair.snapshot_contradicted(detail)

    def _SyncObj__deleteEntriesFrom(self, fromIDx: int) -> None:
        self._group.repair.before_truncation(fromIDx)
        PatchedSyncObj._SyncObj__deleteEntriesFrom(self, fromIDx)

    def _SyncObj__deleteEntriesTo(self, toIDx: int) -> None:
        """A compaction drops the log up to its snapshot, but for the entries kept for seeded replicas."""
        PatchedSyncObj._SyncObj__deleteEntriesTo(self, self._group._compacted_to(toIDx))

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:
        """pysyncobj's snapshot load, after compacting the journal to the snapshot at start-up.

        At start-up pysyncobj keeps the journal only if its first two entries are the
        snapshot's last two, and otherwise clears it down to them. But the snapshot file
        is renamed into place before the journal is compacted (`SnapshotFiles.state`), so a
        replica killed in between restarts with a journal that begins earlier, and
        pysyncobj would drop every entry after the snapshot, acknowledged ones
        included. Found by the chaos harness: a write acknowledged just before
        `kill all` survived only on the old leader, which had already applied it.
        """
        snapshots = self._group.snapshots
        if clearJournal:
            snapshots.sync_received()
        else:
            snapshots.before_load()
        PatchedSyncObj._SyncObj__loadDumpFile(self, clearJournal)


class SyncObjGroup:
    """A `RaftGroup` backed by pysyncobj, ticked on `loop`."""

    def __init__(self, config: GroupConfig, state_machine: StateMachine, loop: asyncio.AbstractEventLoop):
        self.config = config
        self.partition = config.partition
        self._sm = state_machine
        folder = Path(config.folder)
        make_dirs(folder)
        self.snapshots = SnapshotFiles(config.partition, folder, state_machine)
        self._change_pending = False  # a membership change was asked for and has not ended yet
        self._refusals = Throttle(REFUSAL_LOG_SECONDS)
        self._fsyncs = metrics.JOURNAL_FSYNCS.labels(config.partition)
        self._entry_bytes_sent = metrics.RAFT_BYTES_SENT.labels(config.partition, "entries")
        self._snapshot_bytes_sent = metrics.RAFT_BYTES_SENT.labels(config.partition, "snapshot")
        self._keep_from = 0  # the first entry the next compaction keeps (`compact`)
        self._snapshot_base = 0  # the entry the last compaction dropped the log to, had it kept none
        self._compaction_coming = False  # the state machine flushes on the worker first (`compact`)
        tuning = config.tuning
        poller = self.poller = LoopPoller(loop, config.clock)  # the transport hands it the hub's messages
        on_role_changed = config.on_role_changed
        conf = SyncObjConf(
            autoTick=False,  # ticked on the node's event loop, see syncobj_loop
            pollerType=poller,
            appendEntriesUseBatch=False,  # we batch ourselves (group commit); pysyncobj's batching adds ~100 ms
            appendEntriesBatchSizeBytes=4 * tuning.max_batch_bytes,  # > any entry: never the chunked path
            logCompactionBatchSize=SNAPSHOT_CHUNK_BYTES,  # pysyncobj's 64 KiB chunks made snapshots crawl
            journalFile=JournalConfig(folder / JOURNAL, config.fsync, config.node_log, log_group(config.partition)),
            fullDumpFile=str(self.snapshots.path),
            serializer=self.snapshots.write,
            serializeChecker=self.snapshots.state,
            deserializer=self.snapshots.read,
            useFork=False,
            raftMinTimeout=tuning.election_timeout_min,
            raftMaxTimeout=tuning.election_timeout_max,
            appendEntriesPeriod=tuning.heartbeat_period,
            leaderFallbackTimeout=tuning.leader_fallback_timeout,
            # the owner decides when to compact (`compact`)
            logCompactionMinEntries=NEVER,
            logCompactionMinTime=NEVER,
            commandsWaitLeader=False,
            dynamicMembershipChange=config.membership_changes,
            onStateChanged=None if on_role_changed is None else lambda old, new: on_role_changed(Role(old), Role(new)),
        )
        self._member = _Member(self, config.self_address, config.peers, conf)
        self._member.hasten_first_election(reachable_voters=1)  # a single voter is a majority of itself
        self._journal: RaftJournal | GroupLog = self._member._SyncObj__raftLog
        self._apply_id = self._member._methodToID[self._member._getFuncName("_apply")]
        self.snapshots.journal = self._journal
        self.repair = StateRepair(config.partition, folder, config.fsync, state_machine, self.snapshots, self._member,
                                  config.resyncs_itself)
        self._ticker = Ticker(self._member, poller, loop, period=min(0.05, tuning.heartbeat_period / 2),
                             on_corrupt=config.on_corrupt, on_stall=self._member.postpone_election,
                             next_timer=self._member.next_timer, clock=config.clock)
        self.quiet = Quiet(self._member, self._ticker, tuning, config.partition, busy=lambda: self._change_pending)
        self.votes = Votes(self)
        self.snapshots.on_written = self._ticker.soon_from_thread
        self.steady = steady_part(self, config.engine)
        self._ticker.start()
        self._ticker.soon()  # the first tick loads the snapshot; until then the transport drops what arrives

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
        return self.snapshots.bytes_received

    def learners_caught_up(self) -> int:
        if self.role != Role.LEADER:
            return 0
        match, applied = self._member._SyncObj__raftMatchIndex, self.last_applied
        return sum(1 for node in self._member.readonlyNodes if match.get(node, 0) >= applied - 1)

    def committed_entries(self, after: int, limit: int) -> list[Entry]:
        journal = self._journal
        first = journal[0][1]
        last = min(self.last_applied, journal[-1][1])
        if after + 1 < first:
            raise LookupError(f"partition {self.partition}: entries after {after} were compacted away")
        return [Entry(index, term, payload_of(command))
                for command, index, term in journal[after + 1 - first: min(last, after + limit) + 1 - first]]

    # -- commands ---------------------------------------------------------

    def propose(self, payload: bytes, callback: ProposalCallback) -> None:
        """Append an encoded proposal; `callback(result, outcome)` runs once it is applied or failed."""
        self._member._applyCommand(apply_call(self._apply_id, payload),
                                   lambda result, reason: callback(result, outcome(reason)), REGULAR)
        self.quiet.wake(tell_leader=True)
        self._ticker.soon()

    def compact(self, keep_from: int = 0) -> None:
        """The state machine flushes on the snapshot worker first, then pysyncobj compacts (its checkpoint
        on the loop has little left to write: `SnapshotFiles.prepare`). Asked again meanwhile: one compaction."""
        self._keep_from = keep_from
        if not self._compaction_coming:
            self._compaction_coming = True
            self.snapshots.prepare(lambda: self._ticker.from_thread(self._compact_now))

    def _compact_now(self) -> None:
        self._compaction_coming = False
        self.steady.asked("a compaction")
        self._member.forceLogCompaction()
        self._ticker.soon()

    def _compacted_to(self, index: int) -> int:
        """Where a compaction whose snapshot covers the log to `index` drops it to. The kept entries
        go at the next restart: pysyncobj loads a journal only if it starts at the snapshot."""
        self._snapshot_base = index
        return min(index, self._keep_from - 1) if self._keep_from else index

    def transfer_leadership(self, to: str | None = None) -> None:
        """Best effort: pysyncobj refuses when no connected follower holds every entry."""
        self.steady.asked("a leadership transfer")
        self._member.transferLeadership(to)
        self.quiet.wake(tell_leader=True)
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
            if self._refusals.due(time.monotonic()):
                log.info("partition %d: a membership change is refused: %s", self.partition,
                         "the last one asked has not ended" if self._change_pending else
                         f"one is in the log and not committed (commit {self.commit_index}, log to "
                         f"{self.last_log_index})")
            callback(None, Outcome.REJECTED)
            return
        self.steady.asked("a membership change")
        self._change_pending = True

        def done(result, reason) -> None:
            self._change_pending = False
            callback(result, outcome(reason))

        change(address, callback=done)
        self.quiet.wake(tell_leader=True)
        self._ticker.soon()

    def _uncommitted_membership(self) -> bool:
        journal = self._journal
        after = self.commit_index + 1 - journal[0][1]
        return any(membership_change(command) is not None for command, _, _ in journal[max(after, 0):])

    def membership_busy(self) -> bool:
        return self._change_pending or self._uncommitted_membership()

    def name_members(self, addresses: frozenset[str]) -> None:
        self._member._SyncObj__transport.name_members(addresses - {self.config.self_address})

    def close(self) -> None:
        self.steady.close()
        self.quiet.close()
        self._ticker.stop()
        self._member.destroy()  # with autoTick off this closes sockets and the journal at once

    # -- called by pysyncobj ----------------------------------------------

    def load_state(self) -> None:
        """The first tick: pysyncobj's load of the snapshot file, then the state checked against the log."""
        member = self._member
        if self.snapshots.path.is_file():
            member._SyncObj__loadDumpFile(clearJournal=False)
        member._SyncObj__needLoadDumpFile = False
        self._take_logged_members()
        self.repair.after_load()
        if self.snapshots.seeded and self.config.self_address is not None:
            self.compact()  # a seed of 0.2 holds no database: a full one, so that it can send one

    def _take_logged_members(self) -> None:
        """The configuration as the log has it, uncommitted entries included, as Raft's is. pysyncobj counts a
        membership entry when it appends one, but at start-up only once it applies it: a leader restarted with
        an uncommitted `add` counted votes and acknowledgements among too few members, and a majority of the
        old configuration committed entries the new one's majority did not hold (the simulation, fsync mode,
        seed 9: two of four voters)."""
        member = self._member
        if not member._SyncObj__conf.dynamicMembershipChange:
            return
        journal = self._journal
        for command, _, _ in journal[max(0, member.raftLastApplied + 1 - journal[0][1]):]:
            if (change := member._SyncObj__parseChangeClusterRequest(command)) is not None:
                member._SyncObj__doChangeCluster(change)

    def _apply_committed(self, payload: bytes):
        index = self._member.raftLastApplied + 1  # pysyncobj increments it right after this call
        if index <= self._sm.position.index:
            return None
        self._stored(index)
        term = self._journal[index - self._journal[0][1]][2]
        failpoints.hit("apply-before")
        result = self._sm.apply(Entry(index, term, payload))
        failpoints.hit("apply-after")
        return result

    def count_sent(self, message: dict) -> None:
        """An append-entries message left for another member: count its entries' or snapshot chunk's bytes."""
        serialized = message.get("serialized")
        sent = len(serialized[0]) if serialized is not None else \
            sum(len(entry[0]) for entry in message.get("entries", ())) + len(message.get("data", b""))
        (self._snapshot_bytes_sent if serialized is not None else self._entry_bytes_sent).inc(sent)
        metrics.NODE_RAFT_BYTES_SENT.inc(sent)

    def sync_journal(self) -> None:
        """Before a message leaves, fsync mode: a journal of its own synced (one fdatasync for all its
        writes). On the node log, the node's turn writes and syncs every group's records before any frame
        leaves (`log_turn`)."""
        if self.config.node_log is None and self._journal.dirty:
            self._journal.sync()
            self._fsyncs.inc()

    def _stored(self, index: int) -> None:
        """Entry `index` as durable as its application needs. An entry a quorum with another voter
        committed was written (and in fsync mode synced) before the append that it answered left; a
        single-voter leader commits without sending, so it writes and syncs here. And the database never
        holds an entry still in the node log's batch: a kill -9 would leave the database past the log."""
        journal = self._journal
        if self.config.node_log is None:
            self.sync_journal()
            return
        if journal.waiting(index):
            journal.write_pending()
        if self.config.fsync and not self._member._SyncObj__otherNodes and journal.dirty:
            journal.sync()
            metrics.NODE_LOG_FSYNCS.inc()
