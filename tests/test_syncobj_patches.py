"""Tests for raftkv.raft.syncobj_patches (pysyncobj follower AppendEntries fix).

The deterministic tests drive a single follower by calling its message handler
directly with crafted append_entries messages, which reproduces delivery orders
that real TCP cannot force on demand. A recording transport (a TCPTransport that
also keeps what was sent) lets them check the follower's replies.

The cluster tests run three real voters over loopback TCP.
"""

from __future__ import annotations

import logging
import runpy
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Type

import pysyncobj
import pysyncobj.pickle
import pysyncobj.version
import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.node import TCPNode
from pysyncobj.transport import TCPTransport

from raftkv.dev.local_cluster import free_port_block
from raftkv.raft.syncobj_patches import PatchedSyncObj

UPSTREAM_TRUNCATION_LOG = 'truncating already-applied log entries'
NO_OP = pysyncobj._COMMAND_TYPE.NO_OP
MEMBERSHIP = pysyncobj._COMMAND_TYPE.MEMBERSHIP

Entry = Tuple[bytes, int, int]


# --------------------------------------------------------------------------- helpers

def free_ports(count: int) -> List[int]:
    base = free_port_block(count)
    return list(range(base, base + count))


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError('timed out after %.0f s waiting for %s' % (timeout, what))
        time.sleep(0.01)


def entry(idx: int, term: int, command: Optional[bytes] = None) -> Entry:
    # NO_OP-typed commands are inert when applied; the suffix makes them distinguishable.
    if command is None:
        command = bytes([NO_OP]) + b'entry-%d-term-%d' % (idx, term)
    return (command, idx, term)


def entries(first: int, last: int, term: int) -> List[Entry]:
    return [entry(i, term) for i in range(first, last + 1)]


class RecordingTransport(TCPTransport):
    """TCPTransport that also records every message the node tries to send."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.sent: List[Tuple[Any, Dict[str, Any]]] = []
        super().__init__(*args, **kwargs)

    def send(self, node: Any, message: Any) -> bool:
        self.sent.append((node, message))
        return super().send(node, message)

    def notify(self, node: Any, message: Any) -> bool:
        """`GroupTransport.notify`: a send that acknowledges nothing."""
        return self.send(node, message)


class Follower:
    """A SyncObj (patched or not) fed with crafted messages from a fake leader."""

    def __init__(self, cls: Type[SyncObj], **conf: Any) -> None:
        ports = free_ports(3)
        self_addr, *other_addrs = ['127.0.0.1:%d' % p for p in ports]
        self.obj = cls(self_addr, other_addrs, SyncObjConf(
            autoTick=False, bindAddress=self_addr, **conf), transportClass=RecordingTransport)
        self.leader, self.other = sorted(self.obj.otherNodes, key=lambda n: n.id)

    @property
    def transport(self) -> RecordingTransport:
        return self.obj._SyncObj__transport

    @property
    def log(self) -> List[Entry]:
        raftLog = self.obj._SyncObj__raftLog
        return [tuple(raftLog[i]) for i in range(len(raftLog))]

    @property
    def commit_index(self) -> int:
        return self.obj.raftCommitIndex

    def deliver(self, prev_idx: int, prev_term: int, new: List[Entry], *, term: int,
                commit: int, node: Any = None) -> Dict[str, Any]:
        """Deliver one append_entries and return the follower's reply to it."""
        self.deliver_raw(node or self.leader, {
            'type': 'append_entries', 'term': term, 'commit_index': commit,
            'entries': new, 'prevLogIdx': prev_idx, 'prevLogTerm': prev_term,
        })
        return self.last_reply()

    def deliver_raw(self, node: Any, message: Dict[str, Any]) -> None:
        self.transport.sent.clear()
        self.obj._SyncObj__onMessageReceived(node, message)

    def last_reply(self) -> Dict[str, Any]:
        replies = [m for _, m in self.transport.sent if m['type'] == 'next_node_idx']
        assert len(replies) == 1, self.transport.sent
        return replies[0]

    def apply(self) -> None:
        self.obj.doTick(0.0)


@pytest.fixture
def make_follower() -> Iterator[Callable[..., Follower]]:
    created: List[Follower] = []

    def make(cls: Type[SyncObj] = PatchedSyncObj, **conf: Any) -> Follower:
        f = Follower(cls, **conf)
        created.append(f)
        return f

    yield make
    for f in created:
        f.obj.destroy()


def filled_follower(make_follower: Callable[..., Follower], cls: Type[SyncObj],
                    last: int, commit: int, term: int = 1) -> Follower:
    """Follower whose log is entries 2..last of `term`, committed (and applied) up to `commit`."""
    f = make_follower(cls)
    reply = f.deliver(1, 0, entries(2, last, term), term=term, commit=commit)
    assert reply['success'] and reply['next_node_idx'] == last + 1
    f.apply()
    assert f.commit_index == commit and f.obj.raftLastApplied == commit
    assert [e[1] for e in f.log] == list(range(1, last + 1))
    return f


UNPATCHED_BASELINE = pytest.param(SyncObj, id='unpatched-SyncObj-expected-bad')
PATCHED = pytest.param(PatchedSyncObj, id='PatchedSyncObj')


# --------------------------------------------------------------------------- deterministic

def test_version_pin_is_enforced(monkeypatch: pytest.MonkeyPatch) -> None:
    import raftkv.raft.syncobj_patches as patches

    monkeypatch.setattr(pysyncobj.version, 'VERSION', '0.3.18')
    with pytest.raises(RuntimeError, match=r'pysyncobj==0\.3\.17.*found 0\.3\.18'):
        runpy.run_path(patches.__file__)


def test_patched_handler_is_the_one_registered(make_follower: Callable[..., Follower]) -> None:
    f = make_follower(PatchedSyncObj)
    callback = f.transport._onMessageReceivedCallback
    assert callback.__func__ is PatchedSyncObj._SyncObj__onMessageReceived
    assert callback.__func__ is not SyncObj._SyncObj__onMessageReceived


@pytest.mark.parametrize('cls', [UNPATCHED_BASELINE, PATCHED])
@pytest.mark.parametrize('stale_entries', [
    pytest.param(entries(4, 6, 1), id='matching-prefix'),
    pytest.param([], id='empty-heartbeat'),
])
def test_stale_append_entries_keeps_committed_entries(
        make_follower: Callable[..., Follower], caplog: pytest.LogCaptureFixture,
        cls: Type[SyncObj], stale_entries: List[Entry]) -> None:
    """A delayed/duplicated append_entries whose entries all match must delete nothing."""
    f = filled_follower(make_follower, cls, last=11, commit=11)
    log_before = f.log

    caplog.set_level(logging.CRITICAL, logger='pysyncobj')
    reply = f.deliver(3, 1, stale_entries, term=1, commit=11)

    if cls is SyncObj:
        # Expected-bad baseline: upstream truncates committed, applied entries.
        assert len(f.log) == 3 + len(stale_entries) < len(log_before)
        assert f.commit_index < 11
        assert UPSTREAM_TRUNCATION_LOG in caplog.text
        return

    assert f.log == log_before
    assert f.commit_index == 11
    assert f.obj.raftLastApplied == 11
    assert reply == {'type': 'next_node_idx', 'next_node_idx': 3 + len(stale_entries) + 1,
                     'reset': False, 'success': True}
    assert not caplog.records


def test_stale_append_entries_does_not_reapply(make_follower: Callable[..., Follower]) -> None:
    f = filled_follower(make_follower, PatchedSyncObj, last=11, commit=8)
    f.deliver(5, 1, entries(6, 9, 1), term=1, commit=9)
    f.apply()
    assert [e[1] for e in f.log] == list(range(1, 12))
    assert f.commit_index == 9 and f.obj.raftLastApplied == 9


def test_conflict_after_commit_index_truncates_only_from_conflict(
        make_follower: Callable[..., Follower]) -> None:
    f = filled_follower(make_follower, PatchedSyncObj, last=11, commit=8)
    log_before = f.log

    # New leader (term 2) agrees up to 10, has a term-2 entry at 11, and one more.
    new = [log_before[9], entry(11, 2), entry(12, 2)]
    reply = f.deliver(9, 1, new, term=2, commit=8, node=f.other)

    assert f.log == log_before[:10] + [entry(11, 2), entry(12, 2)]
    assert f.commit_index == 8
    assert reply['success'] and reply['next_node_idx'] == 13
    assert f.obj.raftCurrentTerm == 2
    assert f.obj._getLeader() == f.other


def test_conflict_at_or_below_commit_index_is_refused(
        make_follower: Callable[..., Follower], caplog: pytest.LogCaptureFixture) -> None:
    f = filled_follower(make_follower, PatchedSyncObj, last=11, commit=8)
    log_before = f.log

    caplog.set_level(logging.CRITICAL)
    # A faulty "leader" claims index 6..7 hold term-2 entries: 6 is committed here.
    reply = f.deliver(5, 1, [entry(6, 2), entry(7, 2)], term=2, commit=8, node=f.other)

    assert f.log == log_before
    assert f.commit_index == 8 and f.obj.raftLastApplied == 8
    assert reply['success'] is False
    assert any(r.levelno == logging.CRITICAL and 'refusing append_entries' in r.getMessage()
               for r in caplog.records)


def test_commit_index_stops_at_last_verified_entry(make_follower: Callable[..., Follower]) -> None:
    """Stale entries beyond the verified prefix must not be marked committed.

    Upstream masks this rule by always truncating after prevLogIdx; once extra
    entries are kept, min(leaderCommit, last log index) would commit them.
    """
    # Entries 2..11 of term 1 from an old leader; only 2..5 are committed.
    f = filled_follower(make_follower, PatchedSyncObj, last=11, commit=5)
    log_before = f.log

    # The term-2 leader shares entries up to 7 and has committed 10 of its own
    # entries; its heartbeat only vouches for index 7.
    reply = f.deliver(7, 1, [], term=2, commit=10, node=f.other)

    assert reply['success'] and reply['next_node_idx'] == 8
    assert f.commit_index == 7
    assert f.log == log_before  # no conflict seen yet, so nothing deleted


@pytest.mark.parametrize('cls', [UNPATCHED_BASELINE, PATCHED])
@pytest.mark.parametrize('serialized', [
    pytest.param(None, id='leader-compacting'),
    pytest.param((b'first snapshot chunk', True, False), id='non-final-snapshot-chunk'),
    pytest.param((b'not a snapshot', True, True), id='snapshot-fails-to-load'),
])
def test_snapshot_path_message_does_not_commit_unverified_entries(
        make_follower: Callable[..., Follower], cls: Type[SyncObj], serialized: Any) -> None:
    """An append_entries without prevLogIdx verifies none of the follower's entries."""
    # Entries 2..11 of term 1 from an old leader; only 2..5 are committed.
    f = filled_follower(make_follower, cls, last=11, commit=5)
    log_before = f.log

    f.deliver_raw(f.other, {'type': 'append_entries', 'term': 2, 'commit_index': 10,
                            'serialized': serialized})
    f.apply()

    assert f.log == log_before
    assert f.obj.raftCurrentTerm == 2 and f.obj._getLeader() == f.other
    if cls is SyncObj:
        # Expected-bad baseline: upstream commits and applies stale entries 6..10.
        assert f.commit_index == 10 and f.obj.raftLastApplied == 10
        return
    assert f.commit_index == 5 and f.obj.raftLastApplied == 5


def test_snapshot_install_commits_up_to_snapshot_end(
        make_follower: Callable[..., Follower]) -> None:
    # A real snapshot: the term-2 leader's log agrees with the follower up to 5,
    # holds term-2 entries 6..10, and is compacted at its last applied index 9.
    source = make_follower(PatchedSyncObj, logCompactionBatchSize=64)
    source.deliver(1, 0, entries(2, 5, 1) + entries(6, 10, 2), term=2, commit=9)
    source.apply()
    source.obj.snapshot_state = 'state up to 9'  # serialized with the snapshot
    source.obj.forceLogCompaction()
    source.apply()  # serialize
    source.apply()  # compact
    assert [e[1] for e in source.log] == [8, 9, 10]
    serializer = source.obj._SyncObj__serializer
    chunks = []
    while not chunks or not chunks[-1][2]:
        chunks.append(serializer.getTransmissionData('follower'))
    assert len(chunks) > 2

    f = filled_follower(make_follower, PatchedSyncObj, last=11, commit=5)
    log_before = f.log
    for chunk in chunks[:-1]:
        f.deliver_raw(f.other, {'type': 'append_entries', 'term': 2, 'commit_index': 10,
                                'serialized': chunk})
        assert f.log == log_before and f.commit_index == 5 and not f.transport.sent

    f.deliver_raw(f.other, {'type': 'append_entries', 'term': 2, 'commit_index': 10,
                            'serialized': chunks[-1]})
    assert f.last_reply() == {'type': 'next_node_idx', 'next_node_idx': 10,
                              'reset': False, 'success': True}
    assert f.log == source.log[:2]
    assert f.commit_index == 9 and f.obj.raftLastApplied == 9
    assert f.obj.snapshot_state == 'state up to 9'

    # Replication resumes after the snapshot.
    reply = f.deliver(9, 2, [source.log[2]], term=2, commit=10, node=f.other)
    f.apply()
    assert reply['success'] and reply['next_node_idx'] == 11
    assert f.commit_index == 10 and f.obj.raftLastApplied == 10


def test_commit_index_never_decreases(make_follower: Callable[..., Follower]) -> None:
    f = filled_follower(make_follower, PatchedSyncObj, last=11, commit=9)
    f.deliver(3, 1, entries(4, 5, 1), term=1, commit=9)
    assert f.commit_index == 9


@pytest.mark.parametrize('prev_idx, prev_term, expected_reply', [
    pytest.param(20, 1, {'next_node_idx': 12, 'reset': True, 'success': False}, id='prev-beyond-log'),
    pytest.param(9, 7, {'next_node_idx': 9, 'reset': True, 'success': False, 'conflict_term': 1, 'conflict_index': 2},
                 id='prev-term-mismatch'),
])
def test_prev_log_checks_reply_like_upstream_and_a_mismatch_names_its_term_and_where_it_begins(
        make_follower: Callable[..., Follower], prev_idx: int, prev_term: int,
        expected_reply: Dict[str, Any]) -> None:
    f = filled_follower(make_follower, PatchedSyncObj, last=11, commit=5)
    log_before = f.log
    reply = f.deliver(prev_idx, prev_term, [entry(prev_idx + 1, 7)], term=7, commit=5)
    assert reply == dict(expected_reply, type='next_node_idx')
    assert f.log == log_before


class Contradicted(PatchedSyncObj):
    """Records what the follower found contradicts its snapshot instead of answering."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.contradictions: List[str] = []
        super().__init__(*args, **kwargs)

    def _snapshotContradicted(self, node: Any, detail: str) -> None:
        self.contradictions.append(detail)


def compacted_follower(make_follower: Callable[..., Follower]) -> Follower:
    """Entries 2..11 of term 1, committed and applied, its log compacted to begin at entry 6."""
    f = filled_follower(make_follower, Contradicted, last=11, commit=11)
    f.obj._SyncObj__deleteEntriesTo(6)
    assert f.log[0][1] == 6
    return f


def asked_from(first: int) -> Dict[str, Any]:
    """A follower's answer to an append from below its log's first entry, `first`: resume after it."""
    return {'type': 'next_node_idx', 'next_node_idx': first + 1, 'reset': True, 'success': False,
            'log_begins': first}


def test_an_append_below_the_snapshot_is_asked_again_from_the_snapshot_not_the_log_end(
        make_follower: Callable[..., Follower]) -> None:
    """Upstream answers with its log end (12); a leader whose log contradicts entry 6 walks back below it
    again, and the two pass nextIndex back and forth for ever (CI, stop 44)."""
    f = compacted_follower(make_follower)
    assert f.deliver(3, 1, entries(4, 11, 1), term=1, commit=11) == asked_from(6)
    assert f.deliver(6, 1, entries(7, 11, 1), term=1, commit=11)['success']
    assert f.obj.contradictions == []


def test_a_leader_holding_the_snapshots_entry_in_another_term_contradicts_it(
        make_follower: Callable[..., Follower]) -> None:
    f = compacted_follower(make_follower)
    f.deliver_raw(f.leader, {'type': 'append_entries', 'term': 2, 'commit_index': 8, 'entries': entries(7, 8, 2),
                             'prevLogIdx': 6, 'prevLogTerm': 2})
    assert f.obj.contradictions == ['the leader holds entry 6 in term 2, and this log begins at it in term 1']


def test_heartbeats_from_below_the_snapshot_are_asked_again_however_many_and_never_taken_for_a_contradiction(
        make_follower: Callable[..., Follower]) -> None:
    """`test_chaos.py`'s bad-disk run, twice: a follower slowed by a 5 s fsync installed a snapshot at 1093,
    and heartbeats its leader had sent from entry 916 before it (commit index below 1093) arrived after it.
    Asked once, it read the second as a leader whose log ends at 916 and stopped the node, though no entry
    was lost. Nothing in a heartbeat tells whether it was sent before the ask or after."""
    f = compacted_follower(make_follower)
    stale = {'type': 'append_entries', 'term': 2, 'commit_index': 4, 'entries': [], 'prevLogIdx': 4,
             'prevLogTerm': 1}
    for _ in range(3):
        f.deliver_raw(f.leader, stale)
        assert f.last_reply() == asked_from(6)
    f.obj._SyncObj__deleteEntriesTo(8)  # a newer snapshot: the log begins at entry 8 now
    f.deliver_raw(f.leader, stale)
    assert f.last_reply() == asked_from(8) and f.obj.contradictions == []


def test_a_leader_whose_log_ends_before_the_snapshot_says_so_when_asked_and_contradicts_it(
        make_follower: Callable[..., Follower]) -> None:
    """The leader's answer to the ask is causal where a heartbeat is not: sent after it read the follower's
    first entry, by a log that ends before it, one that never ends earlier in its term."""
    leader = filled_follower(make_follower, PatchedSyncObj, last=4, commit=4)
    leader.obj._SyncObj__onBecomeLeader()
    leader.deliver_raw(leader.other, asked_from(6))
    marked = [m for _, m in leader.transport.sent if m.get('log_end') is True]
    assert marked == [{'type': 'append_entries', 'term': leader.obj.raftCurrentTerm, 'commit_index': 4,
                       'entries': [], 'prevLogIdx': 5, 'prevLogTerm': 1, 'log_end': True}]
    leader.deliver_raw(leader.other, asked_from(5))  # the leader holds entry 5: no contradiction to tell
    leader.deliver_raw(leader.other, dict(asked_from(6), log_begins=None))  # a follower of an older release
    assert not [m for _, m in leader.transport.sent if m.get('log_end')]

    f = compacted_follower(make_follower)
    f.deliver_raw(f.leader, dict(marked[0], term=2))
    assert f.obj.contradictions == ["the leader's log ends at 5, before entry 6, which this log begins at"]


def test_a_candidate_told_of_a_later_term_follows_in_it_and_an_earlier_one_changes_nothing(
        make_follower: Callable[..., Follower]) -> None:
    """Raft's RequestVote reply carries the voter's term; pysyncobj sends none, so a member answers a
    request from an earlier term with `vote_refused` (syncobj_votes), and a candidate adopts the term."""
    f = filled_follower(make_follower, PatchedSyncObj, last=4, commit=4)
    f.obj._SyncObj__setCurrentTerm(5, None)
    f.obj._SyncObj__setState(pysyncobj.syncobj._RAFT_STATE.CANDIDATE)
    f.deliver_raw(f.other, {'type': 'vote_refused', 'term': 4})
    assert f.obj.raftCurrentTerm == 5 and f.obj._SyncObj__raftState == pysyncobj.syncobj._RAFT_STATE.CANDIDATE
    f.deliver_raw(f.other, {'type': 'vote_refused', 'term': 9})
    assert f.obj.raftCurrentTerm == 9 and f.obj._SyncObj__raftState == pysyncobj.syncobj._RAFT_STATE.FOLLOWER
    assert f.obj._SyncObj__votedForNodeId is None and not f.transport.sent


def test_membership_change_rolled_back_only_when_truncated(
        make_follower: Callable[..., Follower]) -> None:
    f = make_follower(PatchedSyncObj, dynamicMembershipChange=True)
    new_node = TCPNode('127.0.0.1:%d' % free_ports(1)[0])
    add = entry(3, 1, bytes([MEMBERSHIP]) + pysyncobj.pickle.dumps(['add', new_node.id, new_node]))
    f.deliver(1, 0, [entry(2, 1), add, entry(4, 1)], term=1, commit=2)
    assert new_node in f.obj.otherNodes

    # Stale duplicate including the membership entry: no rollback, no re-apply.
    f.deliver(1, 0, [entry(2, 1), add], term=1, commit=2)
    assert new_node in f.obj.otherNodes and len(f.log) == 4

    # A term-2 leader never had the membership entry: it is rolled back.
    f.deliver(2, 1, [entry(3, 2)], term=2, commit=2, node=f.other)
    assert new_node not in f.obj.otherNodes
    assert f.log[2:] == [entry(3, 2)]


def test_chunked_transmission_finish_uses_patched_logic(
        make_follower: Callable[..., Follower]) -> None:
    f = filled_follower(make_follower, PatchedSyncObj, last=11, commit=11)
    log_before = f.log

    data = pysyncobj.pickle.dumps(log_before[5])  # entry 6, already present
    chunks = [data[i:i + 8] for i in range(0, len(data), 8)]
    kinds = ['start'] + ['process'] * (len(chunks) - 2) + ['finish']
    for kind, chunk in zip(kinds, chunks):
        f.deliver_raw(f.leader, {
            'type': 'append_entries', 'transmission': kind, 'data': chunk, 'term': 1,
            'commit_index': 11, 'prevLogIdx': 5, 'prevLogTerm': 1,
        })

    assert f.last_reply() == {'type': 'next_node_idx', 'next_node_idx': 7,
                              'reset': False, 'success': True}
    assert f.log == log_before
    assert f.commit_index == 11


@pytest.mark.parametrize('cls', [UNPATCHED_BASELINE, PATCHED])
def test_a_leader_ignores_a_reply_from_a_member_it_removed(make_follower: Callable[..., Follower],
                                                           cls: Type[SyncObj]) -> None:
    """Found by the simulation (tests/engine_sim): a member whose removal the leader appended is still
    linked while the cluster metadata names it, and its reply raised KeyError in the leader's handler."""
    f = make_follower(cls)
    f.obj._SyncObj__onBecomeLeader()
    removed = TCPNode('127.0.0.1:1')
    reply = {'type': 'next_node_idx', 'next_node_idx': 2, 'success': True, 'reset': True}
    if cls is SyncObj:
        with pytest.raises(KeyError):
            f.deliver_raw(removed, reply)
        return
    f.deliver_raw(removed, reply)
    assert removed not in f.obj._SyncObj__raftNextIndex and removed not in f.obj._SyncObj__raftMatchIndex


def test_pysyncobj_reads_the_clock_the_adapter_writes_its_deadlines_on():
    """pysyncobj read CLOCK_MONOTONIC_RAW while the adapter wrote election deadlines on time.monotonic:
    0.25 s apart on the CI machine (a reopened group's first election came that much early), more with
    uptime, as NTP slews one and not the other."""
    assert pysyncobj.syncobj.monotonicTime is time.monotonic
