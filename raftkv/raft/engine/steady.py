"""One group's side of the node engine, acted out on its pysyncobj member (`_Member`).

The engine keeps no copy of the group's Raft state: it reads and writes pysyncobj's own (the log,
commit index, match and next indices, last response times, election deadline, the commands waiting
for their commit) and applies through pysyncobj's apply step. So handing the group back writes nothing
that could be forgotten; it only puts pysyncobj's clock-driven parts back in charge (docs/raft-engine.md,
"Step 4, as built"). `rules` decides; this carries it out. It reads no clock: each entry is given `now`
(a tick by the member, an item, a turn and the heartbeat timer by the node engine), on pysyncobj's clock.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Protocol

from raftkv.core import metrics
from raftkv.core.errors import CorruptData, StorageFull
from raftkv.raft.engine import items as it
from raftkv.raft.engine.learners import LearnerFeed, needs_snapshot
from raftkv.raft.engine.rules import IDLE_HEARTBEATS, MAX_STEP_ENTRIES, LeaderView, Match, follower_takes, \
    match_steps, may_offer, quorum_commit

log = logging.getLogger(__name__)

_LEADER, _FOLLOWER = 2, 0  # pysyncobj's _RAFT_STATE
PYSYNCOBJ, LEADING, FOLLOWING = "pysyncobj", "leading", "following"
SILENT_TIMEOUTS = 3  # a follower whose leader's node sends hands back after this many election timeouts of silence
_PASS_WHEN_LEADING = {"apply_command"}  # pysyncobj queues a forwarded proposal; the engine drains the queue
_PASS_WHEN_FOLLOWING = {"apply_command_response"}


class Engine(Protocol):
    """What a group calls on its node's engine (`node_engine.NodeEngine`)."""

    offering: bool  # whether its leaders offer groups to the engine (followers take them in any case)
    rests: bool  # whether its idle leaders rest their groups in the engine (every member knows `rest`)

    def attach(self, group: SteadyGroup) -> None: ...
    def detach(self, group: SteadyGroup) -> None: ...
    def next_epoch(self) -> int: ...
    def node_of(self, address: str) -> str | None: ...
    def heard_from(self, node_id: str) -> float: ...
    def supports(self, node_id: str) -> bool: ...
    def reaches(self, node_id: str) -> bool: ...
    def emit(self, peer: str, item: tuple) -> None: ...
    def ready(self, group: SteadyGroup) -> None: ...
    def handed_back(self, group: SteadyGroup) -> None: ...
    def wrote(self, group: SteadyGroup) -> None: ...
    def mark(self, group: SteadyGroup) -> int | None: ...
    def synced(self) -> int | None: ...
    def sync_now(self) -> None: ...


class SteadyGroup:
    def __init__(self, group, engine: Engine):
        """`group`: the `SyncObjGroup`, whose `_member` is pysyncobj's."""
        self._group = group
        self._member = group._member
        self._engine = engine
        self.partition = group.partition
        self.mode = PYSYNCOBJ
        self.term = self.epoch = 0
        self._peers: dict[str, object] = {}  # leading: node id -> the follower's pysyncobj node
        self._took: set[str] = set()  # leading: the followers that took the group
        self._offered_at = 0.0
        self._sent_at: dict[str, float] = {}  # leading: when a follower was last sent something
        self._match_seen: dict[str, int] = {}  # leading: a follower's matchIndex at the last period
        self._active_at = 0.0  # leading: when it last proposed
        self._durable = 0  # leading: the last entry its node log's sync covers, as far as it knows
        self._marks: deque[tuple[int, int]] = deque()  # leading: (write, last entry) not yet known synced
        self._leader_node: str | None = None  # following
        self._heard_at = 0.0  # following: when the group last heard from its leader
        self.resting = False  # idle in the engine: no beats, no time-outs, until the next entries
        self._learners = LearnerFeed(self._member)  # leading: pysyncobj's appends to the read-only members
        engine.attach(self)

    @property
    def leading(self) -> bool:
        return self.mode == LEADING

    # -- hooks in pysyncobj's member --------------------------------------------

    def before_tick(self, now: float) -> bool:
        """At the start of a tick; True if the engine did the tick's work for a leader (pysyncobj's is skipped)."""
        member = self._member
        if self.mode == FOLLOWING:
            if member._SyncObj__raftState != _FOLLOWER or member.raftCurrentTerm != self.term:
                self.handback("the term or the role changed")
            elif self.resting:
                if not self._group.quiet.resting:  # woken by other than its leader (a proposal here): the leader
                    member._SyncObj__raftElectionDeadline = now + member._SyncObj__generateRaftTimeout()
                    self.handback("woken while the group rests")  # beats again, as pysyncobj's
            elif member._SyncObj__raftElectionDeadline < now:
                self._leader_silent(now)
            return False
        if self.mode == PYSYNCOBJ:
            if (not self._engine.offering or member._SyncObj__raftState != _LEADER
                    or not member._SyncObj__commandsQueue._FastQueue__queue):
                return False  # an offer needs a proposal to carry: the check below costs more than this one
            view = self._leader_view()
            if not may_offer(view):
                return False
            self._offer(view, now)
        self._leader_tick(now)
        return True

    def heard(self, node, message: object) -> bool:
        """A pysyncobj message for the group, before pysyncobj sees it; True: dropped here."""
        if self.mode == PYSYNCOBJ or node in self._member._SyncObj__readonlyNodes:
            return False  # a learner's answer moves only its own indices, pysyncobj's (engine/learners.py)
        kind = message.get("type") if isinstance(message, dict) else None
        if self.mode == LEADING:
            if kind == "next_node_idx" and message.get("success") is True:
                metrics.ENGINE_STALE.inc()  # an answer to an append pysyncobj sent before the offer
                return True
            if kind in _PASS_WHEN_LEADING:
                return False
        elif kind in _PASS_WHEN_FOLLOWING:
            return False
        self.handback(f"pysyncobj's {kind!r} arrived")
        return False

    def asked(self, what: str) -> None:
        """A transfer, a membership change or a compaction was asked of the group: pysyncobj does those,
        driving the group again first."""
        self.handback(f"{what} asked")

    def sync_journal(self) -> None:
        self._group.sync_journal()

    def close(self) -> None:
        self.handback("the replica closes")
        self._engine.detach(self)

    # -- leading ------------------------------------------------------------------

    def _leader_view(self) -> LeaderView:
        member, group = self._member, self._group
        journal = member._SyncObj__raftLog
        others = member._SyncObj__otherNodes
        match, connected = member._SyncObj__raftMatchIndex, member._SyncObj__connectedNodes
        last = journal[-1][1]
        self._peers = {self._engine.node_of(node.address): node for node in others}
        return LeaderView(
            term=member.raftCurrentTerm, last_term=journal[-1][2], last_index=last,
            commit_index=member.raftCommitIndex, last_applied=member.raftLastApplied, voters=len(others),
            voters_matched=all(peer is not None and node in connected and match.get(node, 0) >= last
                               and self._engine.supports(peer) for peer, node in self._peers.items()),
            learner_needs_snapshot=needs_snapshot(member),
            busy=(member._SyncObj__transferInProgress or group.membership_busy() or member._SyncObj__forceLogCompaction
                  or any(member._SyncObj__commandsWaitingCommit.values())),
            queued=bool(member._SyncObj__commandsQueue._FastQueue__queue))

    def _offer(self, view: LeaderView, now: float) -> None:
        self.mode, self.term, self.epoch = LEADING, view.term, self._engine.next_epoch()
        self._durable, self._marks = view.commit_index, deque()  # what pysyncobj committed it had synced
        self._mark()
        self._took = set()
        self._offered_at = self._active_at = now
        self._sent_at, self._match_seen = {}, {}
        metrics.ENGINE_HANDOVERS.labels("take").inc()
        for peer in self._peers:
            self._engine.emit(peer, it.take(self.partition, self.term, self.epoch, view.last_index, view.last_term,
                                            view.commit_index))

    def _leader_tick(self, now: float) -> None:
        """pysyncobj's tick, as much of it as an engine-driven leader needs: the once-a-second work, the
        transport's look at its links, and its queued proposals, which become entries of its term."""
        member = self._member
        if now - member._SyncObj__startTime > member._SyncObj__numOneSecondDumps:
            member._SyncObj__numOneSecondDumps += 1
            member._SyncObj__raftLog.onOneSecondTimer()
        for callback in list(member._SyncObj__onTickCallbacks):
            callback()
        connected = member._SyncObj__connectedNodes
        if any(node not in connected for node in self._peers.values()):
            self.handback("a follower's node is out of reach")
            return
        if self.resting and member._SyncObj__readonlyNodes:  # joined since (the callbacks follow the hub's links)
            self.handback("a learner joined the resting group")  # pysyncobj feeds it, snapshot first
            return
        self._drain(now)

    def _drain(self, now: float) -> None:
        member = self._member
        queue = member._SyncObj__commandsQueue._FastQueue__queue
        if not queue:
            return
        if self.resting:
            self._wake_leader(now)
        journal, waiting, term = member._SyncObj__raftLog, member._SyncObj__commandsWaitingCommit, self.term
        dynamic = member._SyncObj__conf.dynamicMembershipChange
        while queue:
            command, callback = queue[0]
            if dynamic and member._SyncObj__parseChangeClusterRequest(command) is not None:
                self.handback("a membership change was proposed")
                return
            queue.popleft()
            index = journal[-1][1] + 1
            journal.add(command, index, term)
            if isinstance(callback, tuple):  # forwarded by a follower: it waits for the index
                node, request = callback
                member._SyncObj__transport.send(node, {"type": "apply_command_response", "request_id": request,
                                                       "log_idx": index, "log_term": term})
            elif callback is not None:
                waiting[index].append((term, callback))
        self._active_at = now
        self._engine.wrote(self)
        self._engine.ready(self)

    def send_steps(self, now: float) -> None:
        """The turn: each follower that took the group gets the entries it was not sent yet."""
        if self.mode != LEADING:
            return
        self._mark()
        member = self._member
        journal = member._SyncObj__raftLog
        first, last = journal[0][1], journal[-1][1]
        next_index, commit = member._SyncObj__raftNextIndex, member.raftCommitIndex
        for peer in self._took:
            node = self._peers[peer]
            start = next_index[node]
            if start > last:
                continue
            if start - 1 < first:
                self.handback("a follower needs entries the log no longer holds")
                return
            entries = self._entries(journal, start - first, min(last, start + MAX_STEP_ENTRIES - 1) + 1 - first)
            self._engine.emit(peer, it.steps(self.partition, self.term, self.epoch, start - 1,
                                             journal[start - 1 - first][2], commit, entries))
            next_index[node] = entries[-1][1] + 1
            self._sent_at[peer] = now
            if next_index[node] <= last:
                self._engine.ready(self)  # the rest in the next turn
        if self._learners.due():
            if needs_snapshot(member):
                self.handback("a learner needs a snapshot")
                return
            self._learners.feed(now)

    def _entries(self, journal, start: int, end: int) -> list:
        """The log's entries at positions `start` to `end` (excluded), as many as fit in a pysyncobj batch."""
        limit, size, entries = self._member._SyncObj__conf.appendEntriesBatchSizeBytes, 0, []
        for entry in journal[start:end]:
            size += len(entry[0])
            if entries and size > limit:
                break
            entries.append(tuple(entry))
        return entries

    def periodic(self, now: float, heartbeat: float, silent_after: float) -> None:
        """The node timer, once a heartbeat period: time-outs, resends and coalesced heartbeats."""
        member = self._member
        if self.mode != LEADING or self.resting:
            return
        if member._SyncObj__raftState != _LEADER or member.raftCurrentTerm != self.term:
            self.handback("the term or the role changed")
            return
        if len(self._took) < len(self._peers) and now - self._offered_at > silent_after:
            self.handback("a follower did not take the group")
            return
        answered, match, next_index = (member._SyncObj__lastResponseTime, member._SyncObj__raftMatchIndex,
                                       member._SyncObj__raftNextIndex)
        last = member._SyncObj__raftLog[-1][1]
        if any(now - answered.get(self._peers[p], 0.0) > silent_after for p in self._took):
            self.handback("a follower went silent")
            return
        if (now - self._active_at > IDLE_HEARTBEATS * heartbeat and member.raftCommitIndex == last
                and all(match.get(n, 0) == last for n in self._peers.values())):
            if self._engine.rests and len(self._took) == len(self._peers) and not member._SyncObj__readonlyNodes:
                self._rest(last)
            else:
                self.handback("idle: quiescence rests it")
            return
        for peer in self._took:
            node = self._peers[peer]
            if match[node] < last:
                if self._match_seen.get(peer) == match[node]:  # no progress in a period: resend (lost, or a gap)
                    next_index[node] = match[node] + 1
                    self._engine.ready(self)
                self._match_seen[peer] = match[node]
                continue
            self._match_seen.pop(peer, None)
            if now - self._sent_at.get(peer, 0.0) >= heartbeat / 2:
                self._engine.emit(peer, it.beat(self.partition, self.term, self.epoch, member.raftCommitIndex))
                self._sent_at[peer] = now
        if self._learners.heartbeat(now, heartbeat):
            self._engine.ready(self)

    def _rest(self, last: int) -> None:
        """Idle, every entry committed and held by every follower: no beats until the next proposal."""
        self.resting = True
        metrics.ENGINE_RESTS.inc()
        self._group.quiet.engine_rests(True)
        self._member._SyncObj__raftLog.onOneSecondTimer()  # a resting leader has no ticks to run it (a sync is due)
        for peer in self._took:
            self._engine.emit(peer, it.rest(self.partition, self.term, self.epoch, last))

    def _wake_leader(self, now: float) -> None:
        """A proposal for a resting group: the followers were silent by agreement, not gone quiet (the
        leader's links to them held, or `_leader_tick` would have handed the group back)."""
        self.resting = False
        self._group.quiet.engine_rests(False)
        answered = self._member._SyncObj__lastResponseTime
        for peer in self._took:
            answered[self._peers[peer]] = self._sent_at[peer] = now
        self._match_seen = {}

    def _on_taken(self, peer: str, now: float) -> None:
        node = self._peers.get(peer)
        if node is None:
            return
        self._took.add(peer)
        member = self._member
        member._SyncObj__raftNextIndex[node] = member._SyncObj__raftMatchIndex[node] + 1
        member._SyncObj__lastResponseTime[node] = now
        self._engine.ready(self)

    def _on_ack(self, peer: str, index: int, ok: bool, now: float) -> None:
        node = self._peers.get(peer)
        if node is None or peer not in self._took:
            return
        member = self._member
        match, next_index = member._SyncObj__raftMatchIndex, member._SyncObj__raftNextIndex
        member._SyncObj__lastResponseTime[node] = now
        last = member._SyncObj__raftLog[-1][1]
        if index > last:
            self.handback(f"a follower's log ends past the leader's ({index} > {last})")
            return
        if not ok:  # its log ends at `index`, before an append's previous entry: send from there
            next_index[node] = max(match[node] + 1, min(next_index[node], index + 1))
            self._engine.ready(self)
            return
        if index <= match[node]:
            return
        match[node] = index
        next_index[node] = max(next_index[node], index + 1)
        self._commit()

    def _mark(self) -> None:
        """Note that the entries appended so far are durable once the node log's sync covers the write
        that holds them; the leader counts itself toward their quorum only then (fsync mode: it sends them
        before its own sync, docs/raft-engine.md, "The sync off the loop")."""
        write = self._engine.mark(self)
        if write is not None:
            self._marks.append((write, self._member._SyncObj__raftLog[-1][1]))

    def _own_index(self) -> int:
        """The last entry this leader may count itself for: its last, or in fsync mode its last synced."""
        synced = self._engine.synced()
        if synced is None:
            return self._member._SyncObj__raftLog[-1][1]
        marks = self._marks
        while marks and marks[0][0] <= synced:
            self._durable = max(self._durable, marks.popleft()[1])
        return self._durable

    def synced(self) -> bool:
        """The node log's sync completed: commit what it made durable here; whether marks still wait."""
        if self.mode == LEADING:
            before = self._durable
            if self._own_index() > before:
                self._commit()
        return self.mode == LEADING and bool(self._marks)

    def _commit(self) -> None:
        member = self._member
        journal = member._SyncObj__raftLog
        first = journal[0][1]
        commit = quorum_commit(self._own_index(), [member._SyncObj__raftMatchIndex[n] for n in self._peers.values()],
                               lambda i: journal[i - first][2] if first <= i else None, self.term,
                               member.raftCommitIndex)
        if commit > member.raftCommitIndex:
            member._SyncObj__raftCommitIndex = member._SyncObj__leaderCommitIndex = commit
            journal.setRaftCommitIndex(commit)
            member._SyncObj__applyLogEntries()
            if member._SyncObj__readonlyNodes and not member._SyncObj__commandsQueue._FastQueue__queue:
                self._engine.ready(self)  # the learners hear the new commit index in the turn (a queued
                # proposal's turn carries it with its entries, as `_Member._SyncObj__applyLogEntries` does)

    # -- following ------------------------------------------------------------------

    def _on_take(self, peer: str, item: tuple, now: float) -> None:
        _, group, term, epoch, last_index, last_term, commit = item
        member = self._member
        journal = member._SyncObj__raftLog
        leader = member._getLeader()
        takes = (self.mode != LEADING and member._SyncObj__raftState == _FOLLOWER and member._SyncObj__selfNode
                 is not None and follower_takes(
                     term=term, current_term=member.raftCurrentTerm,
                     following_sender=leader is not None and self._engine.node_of(leader.address) == peer,
                     last_index=last_index, last_term=last_term, log_last_index=journal[-1][1],
                     log_last_term=journal[-1][2]))
        if not takes:
            self._engine.emit(peer, it.handback(group, term, epoch))
            return
        self.mode, self.term, self.epoch, self._leader_node = FOLLOWING, term, epoch, peer
        metrics.ENGINE_HANDOVERS.labels("taken").inc()
        self._group.quiet.wake()
        self._heard_leader(commit, now)
        self._advance_commit(min(commit, last_index))
        self._engine.emit(peer, it.taken(group, term, epoch))

    def _leader_silent(self, now: float) -> None:
        """The election deadline passed. While the leader's node sends frames (for any group) and this group
        heard from it lately, a stalled loop or a slow disk held its items up: no election for that."""
        member = self._member
        conf = member._SyncObj__conf
        if (now - self._engine.heard_from(self._leader_node) < conf.raftMinTimeout
                and now - self._heard_at < SILENT_TIMEOUTS * conf.raftMaxTimeout):
            member._SyncObj__raftElectionDeadline = now + member._SyncObj__generateRaftTimeout()
        else:
            self.handback("the leader went silent")

    def _heard_leader(self, commit: int, now: float) -> None:
        self._heard_at = now
        member = self._member
        if not member._SyncObj__transferInProgress:
            member._SyncObj__raftElectionDeadline = now + member._SyncObj__generateRaftTimeout()
        member._SyncObj__leaderCommitIndex = commit

    def _on_steps(self, peer: str, item: tuple, now: float) -> None:
        _, group, term, epoch, prev_index, prev_term, commit, entries = item
        member = self._member
        self._heard_leader(commit, now)
        journal = member._SyncObj__raftLog
        first, last = journal[0][1], journal[-1][1]
        verdict, new = match_steps(lambda i: journal[i - first][2] if first <= i <= last else None, last,
                                   prev_index, prev_term, entries)
        if verdict is Match.GAP:
            self._engine.emit(peer, it.ack(group, term, epoch, last, False))
            return
        if verdict is Match.CONFLICT:
            self.handback(f"an append does not match the log (previous entry {prev_index}:{prev_term})")
            return
        dynamic = member._SyncObj__conf.dynamicMembershipChange
        if dynamic and any(member._SyncObj__parseChangeClusterRequest(e[0]) is not None for e in new):
            self.handback("an append carries a membership change")
            return
        for command, index, entry_term in new:
            journal.add(command, index, entry_term)
        if new:
            self._engine.wrote(self)
        verified = prev_index + len(entries)
        self._engine.emit(peer, it.ack(group, term, epoch, verified, True))
        self._advance_commit(min(commit, verified))

    def _on_rest(self, item: tuple) -> None:
        """The leader rests the group, every entry to `index` committed: so does this follower, its ticker too
        (quiescence's rest: it wakes when the leader's node is out of reach), if its log ends there. The item
        is its last commit notice (its log is a prefix of the leader's while the engine drives, as `_on_beat`)."""
        member = self._member
        index = item[4]
        if index == member._SyncObj__raftLog[-1][1]:
            self._advance_commit(index)
        if index == member._SyncObj__raftLog[-1][1] == member.raftCommitIndex:
            self.resting = True
            self._group.quiet.rest()
        else:
            self.handback(f"told to rest at {index}, its log at {member._SyncObj__raftLog[-1][1]} committed to "
                          f"{member.raftCommitIndex}")

    def _wake_follower(self) -> None:
        self.resting = False
        self._group.quiet.wake()

    def _on_beat(self, peer: str, item: tuple, now: float) -> None:
        _, group, term, epoch, commit = item
        self._heard_leader(commit, now)
        last = self._member._SyncObj__raftLog[-1][1]
        # the log is a prefix of the leader's while the engine drives: everything after the take came
        # from this leader's `steps`, appended after their previous entry matched
        self._engine.emit(peer, it.ack(group, term, epoch, last, True))
        self._advance_commit(min(commit, last))

    def _advance_commit(self, index: int) -> None:
        member = self._member
        if index > member.raftCommitIndex:
            member._patchedAdvanceCommitIndex(index)
            member._SyncObj__applyLogEntries()

    # -- items from the node engine -------------------------------------------------

    def on_item(self, peer: str, item: tuple, now: float) -> None:
        """An item from node `peer`, in a frame that arrived `now`."""
        kind, _, term, epoch = item[:4]
        if kind == it.TAKE:
            self._on_take(peer, item, now)
            return
        if self.mode == PYSYNCOBJ or (term, epoch) != (self.term, self.epoch) or not self._from_partner(peer):
            metrics.ENGINE_STALE.inc()
            return
        if kind == it.HANDBACK:
            self.handback(f"{peer} handed it back", tell=peer if self.mode == LEADING else None)
        elif self.mode == LEADING and kind in (it.TAKEN, it.ACK):
            self._on_taken(peer, now) if kind == it.TAKEN else self._on_ack(peer, item[4], item[5], now)
        elif self.mode == FOLLOWING and kind in (it.STEPS, it.BEAT):
            if self.resting:
                self._wake_follower()
            self._on_steps(peer, item, now) if kind == it.STEPS else self._on_beat(peer, item, now)
        elif self.mode == FOLLOWING and kind == it.REST:
            self._on_rest(item)
        else:
            metrics.ENGINE_STALE.inc()

    def _from_partner(self, peer: str) -> bool:
        return peer in self._peers if self.mode == LEADING else peer == self._leader_node

    def links_changed(self) -> None:
        partners = self._peers if self.mode == LEADING else [self._leader_node] if self.mode == FOLLOWING else []
        if any(not self._engine.reaches(peer) for peer in partners):
            self.handback("a partner's node is out of reach")

    # -- back to pysyncobj ---------------------------------------------------------

    def failed(self, error: StorageFull | CorruptData) -> None:
        """Its log could not be written, or is corrupt: pysyncobj drives the group again, and the error is
        handled as when pysyncobj's own handlers meet it (`LoopPoller.failed`)."""
        self.handback(f"{type(error).__name__}: {error}")
        self._group.poller.failed(error)

    def handback(self, why: str, tell: str | bool | None = True) -> None:
        """pysyncobj drives the group again. `tell`: the partners (all: True; all but one: its node id) hear it."""
        if self.mode == PYSYNCOBJ:
            return
        member = self._member
        metrics.ENGINE_HANDOVERS.labels("handback").inc()
        log.debug("partition %d: back to pysyncobj (%s)", self.partition, why)
        item = it.handback(self.partition, self.term, self.epoch)
        if self.mode == LEADING:
            if self._marks:  # pysyncobj counts its whole log toward every quorum: make it true first
                self._marks.clear()
                try:
                    self._engine.sync_now()
                except (CorruptData, OSError) as exc:
                    self._group.poller.on_corrupt(exc if isinstance(exc, CorruptData) else CorruptData(
                        f"partition {self.partition}: its log could not be synced before pysyncobj led it: {exc}"))
            for peer, node in self._peers.items():
                member._SyncObj__raftNextIndex[node] = member._SyncObj__raftMatchIndex[node] + 1
                if tell is True or tell != peer and tell is not None:
                    self._engine.emit(peer, item)
            member._SyncObj__newAppendEntriesTime = 0.0  # pysyncobj heartbeats at once
            self._group.quiet.handed_back()
            if self.resting:
                self._group.quiet.engine_rests(False)
        elif tell is True and self._leader_node is not None:
            self._engine.emit(self._leader_node, item)
        if self.resting and self.mode == FOLLOWING:
            self._group.quiet.wake()  # quiescence rests a follower only while its leader rests it
        self.mode, self._took, self._leader_node, self.resting = PYSYNCOBJ, set(), None, False
        self._engine.handed_back(self)
        self._group.poller.on_event()  # a tick soon (the Ticker)
