"""When an idle Raft group may rest, and what wakes it: the decisions, apart from pysyncobj.

A resting group neither ticks nor heartbeats, so an idle partition costs nothing
(docs/raft-transport.md, "Quiescence"). The liveness that heartbeats gave comes from the
hub instead, which pings every peer node whatever its groups do: a resting follower
wakes, and may campaign, when the hub's connection to its leader's node goes down.

- A leader rests once its log is committed and applied, every member and learner is
  connected and holds its last entry, nothing is proposed, transferred or changed, and
  this has held for SETTLE_HEARTBEATS heartbeats, each member answering since. It then
  sends each one a `quiesce` message naming its term and last entry.
- A follower rests on that message only if it comes from its leader, in its term, and
  its own log ends at that entry, committed. Otherwise it asks the leader to `wake`, so
  that no follower is left counting down to an election against a leader that rests.
- Any Raft message wakes a resting member, except the answers a resting leader expects
  (a member acknowledging its last entry).

These two message types travel as the group's messages beside pysyncobj's, and never
reach pysyncobj.
"""

from __future__ import annotations

from dataclasses import dataclass

QUIESCE = "quiesce"  # leader -> member or learner: rest; my log ends at `index` of `term`, committed
WAKE = "wake"  # member -> member: tick again (a follower that needs its resting leader, a replica opening or closing)
SETTLE_HEARTBEATS = 3


def quiesce_message(term: int, index: int) -> dict:
    return {"type": QUIESCE, "term": term, "index": index}


def wake_message(term: int) -> dict:
    return {"type": WAKE, "term": term}


def is_quiescence_message(message: object) -> bool:
    return isinstance(message, dict) and message.get("type") in (QUIESCE, WAKE)


def well_formed(message: dict) -> bool:
    fields = ("term", "index") if message["type"] == QUIESCE else ("term",)
    return all(type(message.get(name)) is int for name in fields)


@dataclass(frozen=True)
class LeaderState:
    """What a leader's quiescence is decided on, read from its Raft state."""

    last_index: int
    commit_index: int
    last_applied: int
    members_hold_last: bool  # every member and learner is connected and has acknowledged the last entry
    busy: bool  # commands queued or waiting to commit, a membership change or a leadership transfer under way

    @property
    def settled(self) -> bool:
        return (not self.busy and self.members_hold_last
                and self.commit_index == self.last_applied == self.last_index)


class Settling:
    """Since when a leader has been settled; whether it may rest now."""

    def __init__(self, heartbeat_period: float):
        self._heartbeat_period = heartbeat_period
        self._since: float | None = None

    def reset(self) -> None:
        self._since = None

    def may_rest(self, state: LeaderState, oldest_answer: float, now: float) -> bool:
        """`oldest_answer`: when the member heard from longest ago last answered."""
        if not state.settled:
            self._since = None
            return False
        if self._since is None:
            self._since = now
        return now - self._since >= SETTLE_HEARTBEATS * self._heartbeat_period and oldest_answer > self._since


def follower_may_rest(message: dict, *, term: int, from_leader: bool, last_index: int, commit_index: int,
                      transfer_to_it: bool = False) -> bool:
    """Whether a follower (or learner) may rest on a well-formed `quiesce` message. `transfer_to_it`: its leader
    asked it to campaign (Raft's TimeoutNow), which the leader's quiescence does not know of."""
    return (from_leader and not transfer_to_it and message["term"] == term
            and message["index"] == last_index == commit_index)


def leader_stays_at_rest(message: object, last_index: int) -> bool:
    """Whether a resting leader may hear `message` and rest on: a member acknowledging its last entry."""
    return (isinstance(message, dict) and message.get("type") == "next_node_idx" and message.get("success") is True
            and message.get("next_node_idx") == last_index + 1)
