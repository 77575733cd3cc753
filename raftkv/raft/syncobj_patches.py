"""Safety fix for pysyncobj's follower-side AppendEntries handling.

raftkv pins ``pysyncobj==0.3.17`` exactly; this module checks that at import
time and refuses to load against any other version, because it reaches into
pysyncobj's private (name-mangled) state.

The bug
-------
``SyncObj.__onMessageReceived`` handles a regular ``append_entries`` message
whose ``prevLogIdx`` is below the follower's last entry by deleting *every*
entry after ``prevLogIdx`` and re-adding the message's entries, whether or not
anything conflicts. That happens routinely: with ``appendEntriesUseBatch=False``
the leader pipelines messages and rewinds its ``nextIndex`` on acknowledgements,
so stale or overlapping messages (including empty heartbeats) reach followers.
A follower then drops entries it has already acknowledged, committed and even
applied (pysyncobj logs "truncating already-applied log entries ... may have
diverged"). If the leader dies before re-sending them, acknowledged writes are
lost and replicas diverge.

A second defect in the same branch: the follower sets
``commitIndex = min(leaderCommit, last log index)`` instead of
``min(leaderCommit, index of last new entry)``, so stale entries beyond the
point verified against the leader can be marked committed.

The fix
-------
``PatchedSyncObj`` replaces the message handler. Regular ``append_entries``
messages (term >= current term, with ``prevLogIdx``) are handled by
``_patchedAppendEntries``, which follows Raft (Figure 2, AppendEntries receiver):

* entries already present with the same index and term are skipped;
* only at the first entry whose term differs is the log truncated, and the
  remaining entries are appended;
* a conflict at or below the commit index (or last applied index) is never
  truncated: it is logged as critical and answered with a failure, since it
  can only happen with a faulty leader;
* ``commitIndex = max(commitIndex, min(leaderCommit, prevLogIdx + len(entries)))``.

Everything else the original branch does (election deadline, leader change,
term/state update, ``next_node_idx`` replies, dynamic-membership rollback and
apply) is kept, restricted to entries actually deleted or appended.

An ``append_entries`` *without* ``prevLogIdx`` (a snapshot transfer chunk, or
``serialized=None`` while the leader is still compacting) verifies none of the
follower's entries, yet upstream also ends it with
``commitIndex = min(leaderCommit, last log index)``, committing and applying
stale entries before any snapshot arrives. ``_patchedAppendEntries`` takes
these too: after the same bookkeeping, ``_patchedInstallSnapshot`` runs
upstream's snapshot branch unchanged but raises the commit index only when a
snapshot is installed, and only to its last index (where the journal then
ends), never from ``leaderCommit``. In both paths the commit index never
decreases, except to stay at or below the last log index. A complete snapshot
whose last entry the log already holds (same index and term, or compacted
past it) is not installed at all (Raft's InstallSnapshot rule 6): upstream
would clear the journal, dropping committed entries. All other messages go
to the original handler unchanged.

A follower asked about an entry below its log's first one (its snapshot)
answers by asking from that first entry on, not with its log end: a leader
whose log holds that entry in another term, or ends before it (a leader of
ours answers such an ask with an append marked ``log_end``), then proves that
a loss of committed entries (lose-last-second mode, a power cut of every
member) left this replica's snapshot with entries no leader will send again,
and ``_snapshotContradicted`` says so (upstream's leader and follower passed
``nextIndex`` back and forth for ever). A leader of ours never resumes a
follower past its own log's end.

A follower whose log holds another term at ``prevLogIdx`` answers upstream's
``next_node_idx`` (one entry back) with the term it holds there and the first
index it holds it at; a leader running this class resumes past the whole term
at once (Raft section 5.3) instead of one entry per heartbeat. Upstream's
leader ignores the extra keys, so releases mix.

The ``transmission`` path (one entry larger than ``appendEntriesBatchSizeBytes``
sent in chunks) ends in the same branch. Its ``start``/``process`` chunks only
buffer data and are delegated to upstream; the ``finish`` chunk is reassembled
exactly as upstream does and then handled by ``_patchedAppendEntries``. raftkv
nevertheless configures ``appendEntriesBatchSizeBytes`` above its largest entry
so that path, whose chunking upstream has quirks of its own, is never taken.

Why an override and not a vendored fork
---------------------------------------
It is the smallest surface: one handler path is replaced and everything else
stays upstream code, so upgrading means re-reading one method (the version
check forces that review) rather than re-diffing a fork.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import time
from typing import Any, Dict, List, Sequence, Tuple

import pysyncobj
import pysyncobj.version
from pysyncobj import syncobj as _upstream
from pysyncobj.node import Node

PINNED_PYSYNCOBJ_VERSION = '0.3.17'

if pysyncobj.version.VERSION != PINNED_PYSYNCOBJ_VERSION:
    raise RuntimeError(
        'raftkv.raft.syncobj_patches requires pysyncobj==%s, found %s: the patch uses '
        'pysyncobj private state; re-review SyncObj.__onMessageReceived before '
        'changing the pin' % (PINNED_PYSYNCOBJ_VERSION, pysyncobj.version.VERSION))

logger = logging.getLogger(__name__)

# pysyncobj reads CLOCK_MONOTONIC_RAW (its monotonic.py), and the adapter writes deadlines into it on
# time.monotonic (core/clock.py). NTP slews one and not the other: they stood 0.25 s apart on the CI
# machine, and drift further with uptime. One clock for both.
_upstream.monotonicTime = time.monotonic

# (command, index, term), as stored in pysyncobj's journal.
LogEntry = Tuple[bytes, int, int]
Message = Dict[str, Any]

_originalOnMessageReceived = pysyncobj.SyncObj._SyncObj__onMessageReceived


class PatchedSyncObj(pysyncobj.SyncObj):
    """``pysyncobj.SyncObj`` with Raft-correct follower AppendEntries handling.

    Subclass it exactly like ``SyncObj``. Do not set instance attributes after
    ``__init__``: pysyncobj snapshots every attribute created after its own.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._SyncObj__commandsLocalCounter = self._requestIdsFrom()

    def _requestIdsFrom(self) -> int:
        """Where the numbers of the commands this member forwards to its leader start. pysyncobj starts at 1
        and matches an answer by the number alone: a replica re-created in the same process (moved away
        and back, started over) took the answer to its predecessor's command 1 for its own, and
        acknowledged its command at the index of the other (the simulation with `--stale`, seed 158).
        From the clock in nanoseconds, two incarnations' numbers never meet: one would have to forward
        more than a command a nanosecond."""
        return int(_upstream.monotonicTime() * 1e9)

    def _patchedOnMessageReceived(self, node: Node, message: Message) -> None:
        if message['type'] == 'next_node_idx' and node not in self._SyncObj__raftMatchIndex:
            # A reply from a member this leader removed (its link lives on while the cluster metadata
            # still names it, or arrives late): upstream reads its match index and raises KeyError,
            # and the transport drops the connection every group shares. Found by tests/engine_sim.
            return
        if (message['type'] == 'next_node_idx' and message.get('reset') is True
                and self._SyncObj__raftState == _upstream._RAFT_STATE.LEADER):
            message = {**message, 'next_node_idx': self._resumeAt(message)}
            self._answerAskFromBase(node, message.get('log_begins'))
        if (message['type'] == 'append_entries'
                and message['term'] >= self._SyncObj__raftCurrentTerm
                and message.get('transmission') in (None, 'finish')):
            self._patchedAppendEntries(node, message)
        elif message['type'] == 'vote_refused':
            self._adoptTerm(message.get('term'))
        else:
            _originalOnMessageReceived(self, node, message)

    # SyncObj.__init__ registers self.__onMessageReceived with the transport;
    # this name is what that lookup resolves to (no mangling: one underscore).
    _SyncObj__onMessageReceived = _patchedOnMessageReceived

    def _adoptTerm(self, term: Any) -> None:
        """A member answered this one's vote request from a term before its own with that term (Raft's
        RequestVote reply, which pysyncobj never sends): a later one, and this member follows in it, so
        its next campaign is heard."""
        if type(term) is int and term > self._SyncObj__raftCurrentTerm:
            self._SyncObj__setCurrentTerm(term, None)
            self._SyncObj__setState(_upstream._RAFT_STATE.FOLLOWER)
            self._SyncObj__raftLeader = None

    def _patchedAppendEntries(self, node: Node, message: Message) -> None:
        # Same bookkeeping as upstream before it looks at the log.
        if message['term'] > self._SyncObj__raftCurrentTerm:
            self._SyncObj__transferInProgress = False
        if not self._SyncObj__transferInProgress:
            self._SyncObj__raftElectionDeadline = (
                _upstream.monotonicTime() + self._SyncObj__generateRaftTimeout())
        if self._SyncObj__raftLeader != node:
            self._SyncObj__onLeaderChanged()
        self._SyncObj__raftLeader = node
        if message['term'] > self._SyncObj__raftCurrentTerm:
            self._SyncObj__setCurrentTerm(message['term'], None)
        self._SyncObj__setState(_upstream._RAFT_STATE.FOLLOWER)
        leaderCommitIndex: int = message['commit_index']
        self._SyncObj__leaderCommitIndex = leaderCommitIndex
        if 'prevLogIdx' not in message:
            self._patchedInstallSnapshot(node, message.get('serialized'))
            return

        entries: Sequence[LogEntry] = message.get('entries', [])
        if message.get('transmission') == 'finish':
            # Reassemble exactly like upstream (the buffer is kept if loads fails).
            self._SyncObj__recvTransmission += message['data']
            entries = [_upstream.pickle.loads(self._SyncObj__recvTransmission)]
            self._SyncObj__recvTransmission = ''

        prevLogIdx = message['prevLogIdx']
        base: LogEntry = self._SyncObj__raftLog[0]
        if prevLogIdx is not None and prevLogIdx < base[1]:
            if message.get('log_end') is True:
                self._snapshotContradicted(node, f'the leader\'s log ends at {prevLogIdx}, before entry {base[1]}, '
                                                 'which this log begins at')
                return
            # Upstream answers with its log end, and a leader whose log contradicts this one's base then
            # walks back below it again: for ever. Asked from the base on, a leader of ours says whether
            # its log ends before it (`_answerAskFromBase`): a heartbeat cannot, as one sent before this
            # replica installed its snapshot may arrive after (test_chaos's bad-disk run, twice).
            self._SyncObj__transport.send(node, {
                'type': 'next_node_idx', 'next_node_idx': base[1] + 1, 'reset': True, 'success': False,
                'log_begins': base[1],
            })
            return
        prevEntries = self._SyncObj__getEntries(prevLogIdx, 1)
        if not prevEntries:
            self._SyncObj__sendNextNodeIdx(node, success=False, reset=True)
            return
        if prevEntries[0][2] != message['prevLogTerm']:
            if prevLogIdx == base[1]:
                self._snapshotContradicted(node, f'the leader holds entry {base[1]} in term {message["prevLogTerm"]}, '
                                                 f'and this log begins at it in term {base[2]}')
            else:
                self._sendMismatch(node, prevLogIdx, prevEntries[0][2])
            return

        existing: List[LogEntry] = self._SyncObj__getEntries(prevLogIdx + 1, len(entries))
        firstNew = _firstMismatch(existing, entries)
        if firstNew < len(existing):
            conflictIdx = prevLogIdx + 1 + firstNew
            protectedIdx = max(self._SyncObj__raftCommitIndex, self._SyncObj__raftLastApplied)
            if conflictIdx <= protectedIdx and not self._mayReplaceCommitted(conflictIdx):
                logger.critical(
                    'refusing append_entries from %s: entry %d (term %d) conflicts with '
                    'leader term %d but is committed (commit index %d, last applied %d)',
                    node, conflictIdx, existing[firstNew][2], entries[firstNew][2],
                    self._SyncObj__raftCommitIndex, self._SyncObj__raftLastApplied)
                self._SyncObj__sendNextNodeIdx(node, success=False, reset=False)
                return
            self._patchedTruncateFrom(conflictIdx)

        newEntries = entries[firstNew:]
        for entry in newEntries:
            self._SyncObj__raftLog.add(*entry)
        if self._SyncObj__conf.dynamicMembershipChange:
            for entry in newEntries:
                request = self._SyncObj__parseChangeClusterRequest(entry[0])
                if request is not None:
                    self._SyncObj__doChangeCluster(request)

        lastVerifiedIdx = prevLogIdx + len(entries)
        self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=lastVerifiedIdx + 1, success=True)

        self._patchedAdvanceCommitIndex(min(leaderCommitIndex, lastVerifiedIdx))

    def _snapshotContradicted(self, node: Node, detail: str) -> None:
        """The leader's log contradicts the entry this log begins at, one this replica committed and
        compacted into its snapshot: only a loss of committed entries (every member cut from power, no fsync
        before an acknowledgement) leaves logs so, and no entry the leader can send repairs it. Logged, and
        answered as upstream would; a subclass that can start the replica over does so."""
        logger.critical('the log of %s contradicts this snapshot: %s', node, detail)
        self._SyncObj__sendNextNodeIdx(node, success=False, reset=True)

    def _sendMismatch(self, node: Node, prevLogIdx: int, term: int) -> None:
        """The answer to an append whose previous entry this log holds with another term, `term`:
        upstream's (resume one entry back, which a leader of pysyncobj's reads), and the first index
        this log holds `term` at, which ours reads to go back past the whole term at once."""
        log = self._SyncObj__raftLog
        base = log[0][1]
        first = base + bisect.bisect_left(log, term, 1, prevLogIdx - base, key=_term)
        self._SyncObj__transport.send(node, {
            'type': 'next_node_idx', 'next_node_idx': prevLogIdx, 'reset': True, 'success': False,
            'conflict_term': term, 'conflict_index': first,
        })

    def _resumeAt(self, message: Message) -> int:
        """Where a leader resumes a follower that answered an append with `next_node_idx` and `reset`:
        there, but never past this log's end (a follower whose log begins after it asks from its first
        entry: sent from past the end, the append would carry no previous entry), and for one whose log
        holds `conflict_term` at that index, from `conflict_index` on: after this log's last entry of
        that term, or, if it has none, where the follower's entries of it begin (Raft, section 5.3).
        Upstream goes back one entry a heartbeat: a follower that kept a second of writes the rest of
        the cluster lost in a power cut took 20 s to resume at 200 entries. Never below this log's first
        entry but where the follower's own answer already is."""
        back, term, first = message['next_node_idx'], message.get('conflict_term'), message.get('conflict_index')
        log = self._SyncObj__raftLog
        base = log[0][1]
        if type(back) is not int:
            return back
        back = min(back, log[-1][1] + 1)
        if not (type(term) is int and type(first) is int) or back <= base + 1:
            return back
        at_most = bisect.bisect_right(log, term, 0, min(back - base, len(log)), key=_term) - 1
        resume = base + at_most + 1 if at_most >= 0 and log[at_most][2] == term else first
        return min(back, max(resume, base + 1))

    def _answerAskFromBase(self, node: Node, begins: Any) -> None:
        """A follower whose log begins at entry `begins`, one it committed, asked to resume there: if this
        log ends before it, it lacks a committed entry, and the follower is told so by an append marked
        `log_end` (`_patchedAppendEntries`). Sent in answer to the ask, it cannot predate the follower's
        snapshot; and a leader's log never ends earlier later in its term."""
        last = self._SyncObj__raftLog[-1]
        if type(begins) is int and begins > last[1]:
            self._SyncObj__transport.send(node, {
                'type': 'append_entries', 'term': self._SyncObj__raftCurrentTerm,
                'commit_index': self._SyncObj__raftCommitIndex, 'entries': [], 'prevLogIdx': last[1],
                'prevLogTerm': last[2], 'log_end': True,
            })

    def _mayReplaceCommitted(self, idx: int) -> bool:
        """Whether a leader may replace this log's committed entries from ``idx`` on. Never in Raft;
        a subclass whose whole cluster can lose committed entries (no fsync before an acknowledgement,
        and a power cut of every member) says where it may, and repairs its state in
        ``__deleteEntriesFrom``."""
        return False

    def _patchedInstallSnapshot(self, node: Node, serialized: Any) -> None:
        """Upstream's snapshot branch, but commit only what the snapshot holds, and never
        install a snapshot that the log already covers."""
        snapshotIdx = 0
        dumpFile = self._SyncObj__conf.fullDumpFile
        serializer = self._SyncObj__serializer
        ownDump = None
        if dumpFile is not None and serialized is not None and serialized[2]:
            ownDump = _keepAside(dumpFile)  # the last chunk replaces the file: keep ours at hand
        ownMemory = serializer._Serializer__inMemorySerializedData  # ... or, without a file, replaces this
        if serializer.setTransmissionData(serialized):
            last = self._snapshotLastEntry()
            if last is not None and self._logCovers(last):
                if dumpFile is None:
                    serializer._Serializer__inMemorySerializedData = ownMemory
                else:
                    _putBack(ownDump, dumpFile)
                logger.info('ignoring a snapshot up to entry %d: the log already holds it', last[1])
                self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=last[1] + 1, success=True)
                return
            _discard(ownDump)
            self._SyncObj__loadDumpFile(clearJournal=True)
            self._SyncObj__sendNextNodeIdx(node, success=True)
            # After an install, lastApplied is the snapshot's last index, where the
            # journal now ends. __loadDumpFile logs and swallows errors: if loading
            # failed, lastApplied is unchanged and covers no unverified entry.
            snapshotIdx = self._SyncObj__raftLastApplied
        self._patchedAdvanceCommitIndex(snapshotIdx)

    def _snapshotLastEntry(self) -> LogEntry | None:
        """The last entry the snapshot file just received covers (None: unreadable).

        Subclasses whose snapshot format can tell without loading it should override this.
        """
        try:
            return tuple(self._SyncObj__serializer.deserialize()[1])
        except Exception:
            return None

    def _logCovers(self, last: LogEntry) -> bool:
        """Whether the log already holds the snapshot's last entry (or was compacted past it).

        Raft's InstallSnapshot rule 6: such a snapshot must not replace the log. Upstream
        clears the journal and resets the commit index to the snapshot's end, dropping
        committed entries a majority may be counting on this replica for. A leader sends one
        when a stale reply rewound its nextIndex below its compacted log.
        """
        _, idx, term = last
        log = self._SyncObj__raftLog
        if not len(log):
            return False
        if idx < log[0][1]:
            return True
        if idx > log[-1][1]:
            return False
        return self._SyncObj__getEntries(idx, 1)[0][2] == term

    def _patchedAdvanceCommitIndex(self, committedIdx: int) -> None:
        """Raise the commit index to ``committedIdx``; lower it only to the log end."""
        commitIndex = max(self._SyncObj__raftCommitIndex, committedIdx)
        # Upstream's clamp: never beyond the log end (e.g. commit index restored
        # from journal metadata ahead of journal entries lost in a crash).
        commitIndex = min(commitIndex, self._SyncObj__getCurrentLogIndex())
        self._SyncObj__raftCommitIndex = commitIndex
        self._SyncObj__raftLog.setRaftCommitIndex(commitIndex)

    def _patchedTruncateFrom(self, idx: int) -> None:
        """Delete log entries from ``idx`` on, undoing their membership changes."""
        if self._SyncObj__conf.dynamicMembershipChange:
            for entry in reversed(self._SyncObj__getEntries(idx)):
                request = self._SyncObj__parseChangeClusterRequest(entry[0])
                if request is not None:
                    self._SyncObj__doChangeCluster(request, reverse=True)
        self._SyncObj__deleteEntriesFrom(idx)


KEPT_ASIDE = '.own'  # suffix of the snapshot kept at hand while a received one is checked


def _keepAside(path: str) -> str | None:
    """A hard link to the file at `path` (None if there is none)."""
    aside = path + KEPT_ASIDE
    with contextlib.suppress(FileNotFoundError):
        os.unlink(aside)
    try:
        os.link(path, aside)
    except FileNotFoundError:
        return None
    return aside


def _putBack(aside: str | None, path: str) -> None:
    """Undo the received file: the kept one goes back, or there was none."""
    if aside is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    else:
        os.replace(aside, path)


def _discard(aside: str | None) -> None:
    if aside is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(aside)


def _term(entry: LogEntry) -> int:
    return entry[2]


def _firstMismatch(existing: Sequence[LogEntry], incoming: Sequence[LogEntry]) -> int:
    """Position of the first incoming entry not already in the log.

    ``existing`` holds the log's entries at the same indices as ``incoming``
    (possibly fewer, if the log ends first); entries match when terms match.
    """
    for pos, (ours, theirs) in enumerate(zip(existing, incoming)):
        if ours[2] != theirs[2]:
            return pos
    return len(existing)
