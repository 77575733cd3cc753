"""Why a voter refuses a candidate, and the log lines that say so.

pysyncobj answers a refused vote with nothing, so a candidate never learns why it lost, and a group
whose elections all fail (two live voters of three, each campaigning in ever higher terms) leaves
no trace of the rule that refused. Every refusal is decided before pysyncobj sees the request:
our own (the vote guard, a stranger while a leader is live: `syncobj_votes.Votes.admits`) and Raft's,
which `raft_refusal` restates from pysyncobj's `request_vote` handler. The voter logs the first
refusal of a group every `EVERY` seconds, and a candidate its campaigns as often, with what each
side's configuration and log hold: enough to tell from two nodes' logs which rule kept the group
leaderless (docs/chaos.md, the soak of seed 1880499202).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from raftkv.core.clock import Throttle

log = logging.getLogger(__name__)

EVERY = 10.0  # seconds between two lines of one kind for one group


@dataclass(frozen=True)
class Voter:
    """What a voter holds when a vote request arrives."""

    term: int
    voted_for: str | None  # in `term`
    leading: bool
    last_term: int  # of its log's last entry
    last_index: int


def raft_refusal(term: int, last_term: int, last_index: int, voter: Voter) -> str | None:
    """Why Raft (as pysyncobj has it) refuses a candidate asking in `term` with a log ending at
    `last_term:last_index`; None: it grants the vote. A higher term is adopted first, with no vote cast."""
    if term < voter.term:
        return f"its term {term} is behind this replica's {voter.term}"
    if term == voter.term and voter.leading:
        return "this replica leads in that term"
    if (last_term, last_index) < (voter.last_term, voter.last_index):
        return (f"its log ends at {last_term}:{last_index}, behind this replica's "
                f"{voter.last_term}:{voter.last_index}")
    if term == voter.term and voter.voted_for is not None:
        return f"this replica voted for {voter.voted_for} in term {term}"
    return None


class ElectionLog:
    """One group's throttled lines about its elections."""

    def __init__(self, partition: int):
        self._name = "the metadata group" if partition < 0 else f"partition {partition}"  # -1: raftkv.meta's
        self._refusals = Throttle(EVERY)
        self._campaigns = Throttle(EVERY)
        self._held_back = Throttle(EVERY)

    def refused(self, now: float, candidate: str, term: int, why: str, members: list[str]) -> None:
        if self._refusals.due(now):
            log.info("%s: no vote for %s in term %d: %s (members here: %s)", self._name, candidate,
                     term, why, ", ".join(sorted(members)))

    def campaigns(self, now: float, term: int, last_term: int, last_index: int, members: list[str]) -> None:
        if self._campaigns.due(now):
            log.info("%s: campaigns in term %d with its log to %d:%d (members here: %s)", self._name,
                     term, last_term, last_index, ", ".join(sorted(members)))

    def held_back(self, now: float, why: str) -> None:
        if self._held_back.due(now):
            log.info("%s: does not campaign: %s", self._name, why)
