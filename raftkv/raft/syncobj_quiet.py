"""Quiescence acted out on one pysyncobj member: its ticker, its two clocks and its messages.

`quiescence` decides when a group rests and what wakes it; this reads pysyncobj's state for
those decisions and carries them out. A resting group is a `Ticker` without its periodic
timer. Messages, proposals and the hub's link changes still tick it, and before each such
tick the two clocks a tick judges time by are moved to now, so that time spent resting is
never taken for silence:

- a follower's election deadline (pysyncobj would campaign at the first tick);
- a leader's record of when each member last answered (it would step down), and when its
  next heartbeat is due (it would send one).

On waking, the follower's deadline starts a fresh randomized election timeout and the
leader heartbeats at once. docs/pysyncobj.md says why overriding these is safe. Around a
tick the member hands in `now`; what wakes a group between ticks reads its ticker's clock.
"""

from __future__ import annotations

from typing import Callable

from raftkv.core import metrics
from raftkv.core.spec import Tuning
from raftkv.raft import quiescence
from raftkv.raft.group import Role
from raftkv.raft.quiescence import LeaderState, Settling
from raftkv.raft.syncobj_loop import Ticker

_LEADER, _FOLLOWER = Role.LEADER.value, Role.FOLLOWER.value  # pysyncobj's _RAFT_STATE values, as Role mirrors them


class Quiet:
    def __init__(self, member, ticker: Ticker, tuning: Tuning, partition: int, busy: Callable[[], bool]):
        """`busy()`: a membership change asked of the group has not ended yet."""
        self._member = member
        self._ticker = ticker
        self._transport = member._SyncObj__transport
        self._tuning = tuning
        self._busy = busy
        self._settling = Settling(tuning.heartbeat_period)
        self._resting_gauge = metrics.GROUP_RESTING.labels(partition)

    @property
    def resting(self) -> bool:
        return self._ticker.resting

    # -- around every tick --------------------------------------------------

    def before_tick(self, now: float) -> None:
        if self._ticker.resting:
            self._set_clocks(now, waking=False)

    def _set_clocks(self, now: float, waking: bool) -> None:
        """A leader heard every member now, and heartbeats next at once (`waking`) or a period from now; a
        follower's election is a fresh randomized timeout away (`waking`) or at least the longest one."""
        member = self._member
        if member._SyncObj__raftState == _LEADER:
            answered = member._SyncObj__lastResponseTime
            for node in answered:
                answered[node] = now
            member._SyncObj__newAppendEntriesTime = 0.0 if waking else now + self._tuning.heartbeat_period
        else:
            timeout = member._SyncObj__generateRaftTimeout() if waking else self._tuning.election_timeout_max
            member._SyncObj__raftElectionDeadline = now + timeout

    def after_tick(self, now: float) -> None:
        member = self._member
        if self._ticker.resting or member._SyncObj__raftState != _LEADER:
            self._settling.reset()
            return
        last = member._SyncObj__getCurrentLogIndex()
        if not member.raftCommitIndex == member.raftLastApplied == last:  # not `settled`, found cheaply under load
            self._settling.reset()
            return
        members = member._SyncObj__otherNodes | member._SyncObj__readonlyNodes
        answered = member._SyncObj__lastResponseTime
        oldest_answer = min((answered.get(node, 0.0) for node in members), default=now)
        if self._settling.may_rest(self._leader_state(members, last), oldest_answer, now):
            message = quiescence.quiesce_message(member.raftCurrentTerm, last)
            for node in members:
                self._transport.notify(node, message)
            self.rest()

    def _leader_state(self, members, last: int) -> LeaderState:
        member = self._member
        match, connected = member._SyncObj__raftMatchIndex, member._SyncObj__connectedNodes
        return LeaderState(
            last_index=last,
            commit_index=member.raftCommitIndex,
            last_applied=member.raftLastApplied,
            members_hold_last=all(node in connected and match.get(node, 0) >= last for node in members),
            busy=(bool(member._SyncObj__commandsQueue._FastQueue__queue)
                  or any(member._SyncObj__commandsWaitingCommit.values())
                  or member._SyncObj__transferInProgress or self._busy()),
        )

    # -- what wakes it --------------------------------------------------------

    def heard(self, node, message: object) -> bool:
        """Before pysyncobj sees a message from member `node`; True if it was quiescence's own."""
        if quiescence.is_quiescence_message(message):
            if quiescence.well_formed(message):
                if message["type"] == quiescence.QUIESCE:
                    self._on_quiesce(node, message)
                else:
                    self.wake(tell_leader=True, sender=node)
            return True
        member = self._member
        if self._ticker.resting and not (member._SyncObj__raftState == _LEADER and quiescence.leader_stays_at_rest(
                message, member._SyncObj__getCurrentLogIndex())):
            self.wake()
        return False

    def links_changed(self) -> None:
        """A leader wakes to look at its members again; a voter wakes when its leader's node is out of reach."""
        if not self._ticker.resting:
            return
        member = self._member
        if member._SyncObj__raftState == _LEADER:
            self.wake()
        elif member._SyncObj__selfNode is not None:  # a learner has no election to hold
            leader = member._getLeader()
            if leader is None or not self._transport.reaches(leader.address):
                self.wake()

    def wake(self, tell_leader: bool = False, sender=None) -> None:
        """Tick again. `tell_leader`: woken by something other than the leader, so wake it too: a
        follower counting down to an election must hear its heartbeats."""
        if not self._ticker.resting:
            return
        self._set_clocks(self._ticker.clock(), waking=True)
        self._settling.reset()
        self._ticker.wake()
        self._resting_gauge.set(0)
        member = self._member
        leader = member._getLeader()
        if (tell_leader and member._SyncObj__raftState == _FOLLOWER and member._SyncObj__selfNode is not None
                and leader is not None and (sender is None or leader.address != sender.address)):
            self._transport.notify(leader, quiescence.wake_message(member.raftCurrentTerm))

    def engine_rests(self, resting: bool) -> None:
        """A leader the node engine rests or wakes: the gauge says so (its ticker has nothing to rest: the
        engine ticks it only for its proposals)."""
        self._resting_gauge.set(1 if resting else 0)

    def handed_back(self) -> None:
        """The node engine drove the group as its leader, and pysyncobj does again: it was not settled all that
        time (the engine's ticks skip `after_tick`), so it settles anew before it rests. Without this, a
        leadership transfer that handed the group back was followed at once by a `quiesce`, and its target
        rested instead of campaigning."""
        self._settling.reset()

    def close(self) -> None:
        """The replica closes, maybe while its node stays up (a move, a test): its resting members must
        not wait on it, so they wake (and elect, if this was their leader)."""
        member = self._member
        if member._SyncObj__selfNode is not None:  # a learner's messages other than its answers are dropped
            for node in member._SyncObj__otherNodes:
                self._transport.notify(node, quiescence.wake_message(member.raftCurrentTerm))
        self._resting_gauge.set(0)

    # -- the rest -------------------------------------------------------------

    def _on_quiesce(self, node, message: dict) -> None:
        member = self._member
        leader = member._getLeader()
        if member._SyncObj__raftState == _FOLLOWER and quiescence.follower_may_rest(
                message, term=member.raftCurrentTerm, from_leader=leader is not None and leader.address == node.address,
                last_index=member._SyncObj__getCurrentLogIndex(), commit_index=member.raftCommitIndex,
                transfer_to_it=member._SyncObj__transferInProgress):
            self.rest()
        elif member._SyncObj__selfNode is not None:
            self._transport.notify(node, quiescence.wake_message(member.raftCurrentTerm))

    def rest(self) -> None:
        """No more ticks but for events (the quiescence `quiesce` asked for, or the node engine's `rest`)."""
        self._member._SyncObj__raftLog.onOneSecondTimer()  # a sync it would run (or ran into) comes before rest
        self._ticker.rest()
        self._resting_gauge.set(1)
