"""Which vote requests (and, for a guarded member, appends) a member's pysyncobj sees, and its election
lines (`vote_refusal`).

A guarded member (vote_guard) lost its current term with its data, so it takes no append until it
has a floor, and none from a leader of a term before the floor's after: a deposed leader's entries
counted on it, as they would not have before the wipe, and were committed over entries a later
leader had committed (the engine simulation's `wipe` fault, seed 121).

A request from a term before this member's is answered with that term (`vote_refused`), which a
candidate of ours adopts (`PatchedSyncObj`), as Raft's RequestVote reply does: pysyncobj answers
nothing, so a candidate that the other side never sends to (its configuration lacks it, after an
uncommitted removal) campaigned below that side's term for good, and a group of three stayed without
a leader (the simulation with `--stale`, seed 1006).

pysyncobj answers a refused vote with nothing either, so a request is dropped here when:
- the member is guarded and may not grant it;
- the member has a live leader (it leads, rests, or its election timer still runs) and the candidate
  is not in its configuration. Raft does not tell a removed member, which campaigns with ever higher
  terms, and pysyncobj adopts any higher term it hears: a removed member its peers still hear (the
  metadata names a move's source until its target is added, and a dead source is removed first)
  would depose the leader at every timeout. A member added since this one last heard is not refused
  for long: without a leader, the timer runs out (docs/pysyncobj.md).
Every refusal, ours or the one pysyncobj will make, is logged (throttled), as is every campaign.

And a candidate counts each member's vote once: pysyncobj adds one for every `response_vote` of its
term that arrives, so a vote delivered twice counted twice, and a candidate of a five-voter group
led with one other's vote while another leader held committed entries it lacked (the simulation,
which delivers a message twice as Raft must survive, seed 89; docs/pysyncobj.md).
"""

from __future__ import annotations

from raftkv.raft.group import Role
from raftkv.raft.vote_refusal import ElectionLog, Voter, raft_refusal

_LEADER = Role.LEADER.value


class Votes:
    def __init__(self, group):
        """`group`: the `SyncObjGroup`."""
        self._group = group
        self._member = group._member
        self._config = group.config
        self._log = ElectionLog(group.partition)
        self._ballots: tuple[int, set[str]] = (0, set())  # a term, and the members whose votes in it were counted

    def admits(self, node, message: object) -> bool:
        """Whether pysyncobj may see `message` from member `node`."""
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "response_vote":
            return self._first_vote(node, message.get("term"))
        guard = self._config.guard
        if kind == "append_entries":
            return guard is None or guard.admits_leader(message.get("term", 0))
        if kind != "request_vote":
            return True
        term = message.get("term", 0)
        if type(term) is int and term < self._member.raftCurrentTerm:
            self._refuse_stale_term(node)
        last_term, last_index = message.get("last_log_term", 0), message.get("last_log_index", 0)
        if guard is not None and (why := guard.refusal(term, last_term, last_index)) is not None:
            self._refused(node, term, why)
            return False
        if node not in self._member._SyncObj__otherNodes and self._has_live_leader():
            self._refused(node, term, "not a member here, and this replica's leader is live")
            return False
        if (why := raft_refusal(term, last_term, last_index, self._voter())) is not None:
            self._refused(node, term, why)  # pysyncobj refuses it, silently
        return True

    def _refuse_stale_term(self, node) -> None:
        """Tell a candidate asking from an earlier term this member's, which it adopts (`PatchedSyncObj`)."""
        member = self._member
        member._SyncObj__transport.notify(node, {"type": "vote_refused", "term": member.raftCurrentTerm})

    def _first_vote(self, node, term: object) -> bool:
        """Whether a vote is one pysyncobj may count: a member's first in the current term."""
        member = self._member
        if term != member.raftCurrentTerm:
            return True  # pysyncobj counts only votes of its current term
        if self._ballots[0] != term:
            self._ballots = (term, set())
        counted = self._ballots[1]
        if node not in member._SyncObj__otherNodes or node.address in counted:
            return False
        counted.add(node.address)
        return True

    def campaigned(self) -> None:
        """This member began an election (in its tick)."""
        last = self._member._SyncObj__raftLog[-1]
        self._log.campaigns(self._config.clock(), self._member.raftCurrentTerm, last[2], last[1], self._members())

    def held_back(self, why: str) -> None:
        """The election timer ran out, and the vote guard keeps this member from campaigning (`why`)."""
        self._log.held_back(self._config.clock(), why)

    def _has_live_leader(self) -> bool:
        member = self._member
        return member._SyncObj__raftState == _LEADER or member._SyncObj__raftLeader is not None and (
            self._group.quiet.resting or self._config.clock() < member._SyncObj__raftElectionDeadline)

    def _voter(self) -> Voter:
        member = self._member
        last = member._SyncObj__raftLog[-1]
        voted = member._SyncObj__votedForNodeId
        return Voter(member.raftCurrentTerm, None if voted is None else self._name(str(voted)),
                     member._SyncObj__raftState == _LEADER, last[2], last[1])

    def _refused(self, node, term: int, why: str) -> None:
        self._log.refused(self._config.clock(), self._name(node.address), term, why, self._members())

    def _members(self) -> list[str]:
        return [self._name(address) for address in self._group.voters]

    def _name(self, address: str) -> str:
        """A Raft address's node, for a log line."""
        where = self._config.hub.directory().locate(address)
        return where[0] if where else address
