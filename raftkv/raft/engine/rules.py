"""The engine's decisions, apart from pysyncobj and I/O: who may hand a group to the engine, how a
follower matches an append, and what a leader may commit (docs/raft-engine.md, "Step 4, as built")."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable, Sequence

Entry = tuple[bytes, int, int]  # (command, index, term), as pysyncobj's log keeps them
IDLE_HEARTBEATS = 10  # an engine-driven group that proposed nothing this long rests (in the engine, or in pysyncobj)
MAX_STEP_ENTRIES = 512  # entries of one group in one `steps` item


@dataclass(frozen=True)
class LeaderView:
    """What a leader's offer is decided on, read from its pysyncobj state."""

    term: int
    last_term: int  # the term of its last entry
    last_index: int
    commit_index: int
    last_applied: int
    voters: int  # other voters
    voters_matched: bool  # every other voter connected, its matchIndex at the last entry, its node an engine peer
    learner_needs_snapshot: bool  # a read-only member's next entry is compacted away (pysyncobj sends snapshots)
    busy: bool  # a transfer, a membership change asked or uncommitted, a compaction asked
    queued: bool  # a proposal waits


def may_offer(view: LeaderView) -> bool:
    """A settled leader (quiescence's preconditions, less "nothing queued") with something to propose."""
    return (view.queued and view.voters > 0 and view.voters_matched and not view.learner_needs_snapshot
            and not view.busy and view.last_term == view.term
            and view.commit_index == view.last_applied == view.last_index)


def follower_takes(*, term: int, current_term: int, following_sender: bool, last_index: int, last_term: int,
                   log_last_index: int, log_last_term: int) -> bool:
    """A voter follows the sender in its current term, and its log ends where the leader's does."""
    return (following_sender and term == current_term
            and (last_index, last_term) == (log_last_index, log_last_term))


class Match(Enum):
    OK = "ok"  # append the new entries
    GAP = "gap"  # the log ends before the previous entry: an earlier append was lost, ask from the end
    CONFLICT = "conflict"  # another term at an index: not the steady state, pysyncobj repairs it


def match_steps(term_at: Callable[[int], int | None], last_index: int, prev_index: int, prev_term: int,
                entries: Sequence[Entry]) -> tuple[Match, Sequence[Entry]]:
    """Raft's AppendEntries receiver rules 2–4 for one group, without truncation: the entries to append."""
    if prev_index > last_index:
        return Match.GAP, ()
    if term_at(prev_index) != prev_term:
        return Match.CONFLICT, ()
    for pos, (_, index, term) in enumerate(entries):
        if index != prev_index + 1 + pos:
            return Match.CONFLICT, ()
        if index > last_index:
            return Match.OK, entries[pos:]
        if term_at(index) != term:
            return Match.CONFLICT, ()
    return Match.OK, ()


def quorum_commit(own_last: int, matches: Sequence[int], term_at: Callable[[int], int | None], term: int,
                  commit: int) -> int:
    """The highest index a majority of the voters (this leader and `matches`) holds, if it is of `term`."""
    indices = sorted([own_last, *matches], reverse=True)
    candidate = indices[len(indices) // 2]
    return candidate if candidate > commit and term_at(candidate) == term else commit
