"""A replica that lost its data must not vote until it knows what the group has committed.

Raft's safety rests on each voter remembering its log and the vote it cast in each term. A
voter whose data was wiped (a failed disk, a damaged file moved away, as the error tells the
operator to) comes back with an empty log and no memory of its votes. Two such voters of a
three-voter group elected one of themselves in a low term while the third, which held the
acknowledged writes, still led in a higher one: the writes the impostor acknowledged were lost
when the real leader's log replaced them (a one-minute chaos run of corrupt files, docs/chaos.md).

So a voter replica that opens with no data for a group that has had a history is *guarded*: it
neither campaigns nor grants a vote until it has a floor, learned from enough of the other voters
that every majority the group could have committed an entry with, less this replica, has one of
them among it (`answers_needed`; the node asks them, `LostData._learn_vote_floor`): the highest
term they are in, and the most up-to-date last log entry (term, index) they hold. That log holds
every entry committed by then, as Raft's election rule proves for any log at least as up-to-date as
one holding it. From then on the replica grants votes only in terms above the floor's term (it may
have voted in any of those before) and only to candidates whose last entry is at least as
up-to-date as the floor's, and it does not campaign before its own is. The guard is kept in the
replica's folder from the moment it opens, so a restart before it learned its floor or caught up
keeps it.

Asking only one voter was not enough (the engine simulation's `wipe` fault, seed 30): a wiped
leader's last entries were committed with the one voter that was down, and the floor the other
reported, its commit index, lay below them; the wiped replica voted for that other and the entries
were lost.

Once the replica has committed up to the floor's index, it holds what the group had committed, as
every other voter does, and the log part is retired: Raft's own rule is enough from then on. Until
then it asks again now and then, and lowers the log part to what a quorum's logs hold when every one
of them ends before it (`lower`): in lose-last-second mode a power cut of every node can take the
entries near the floor from every log. Without both, the simulation's groups stayed leaderless for
good after such cuts, the guarded replica neither campaigning nor voting for anyone (docs/chaos.md).
The term part stays: it never blocks for long, since every campaign raises the term.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from raftkv.core.durable import make_dirs, replace_file
from raftkv.core.errors import CorruptData, DiskFailed

FLOOR_FILE = "vote_floor"


@dataclass(frozen=True)
class VoteFloor:
    term: int  # the highest current term of the voters asked
    index: int  # their most up-to-date last entry's index (0: caught up, no log part)
    log_term: int | None  # and its term; None: an older release's floor, a commit index without a term

    def reached_by(self, last_log_term: int, last_log_index: int) -> bool:
        if self.log_term is None:
            return last_log_index >= self.index
        return (last_log_term, last_log_index) >= (self.log_term, self.index)

    def describe(self) -> str:
        """`term:index` (as `vote_refusal` writes a log's end), or an older release's `entry index`."""
        return f"entry {self.index}" if self.log_term is None else f"{self.log_term}:{self.index}"


@dataclass(frozen=True)
class VoterAnswer:
    """What another voter of the group reports (`Admin.ReplicaProgress`)."""

    term: int
    commit_index: int
    last_log: tuple[int, int] | None  # its last entry's (term, index); None from a release that does not say
    recovering: bool = False  # it lost its data too, and has not caught up with it (`VoteGuard.recovering`)


def floor_from(answers: list[VoterAnswer], voters: int) -> VoteFloor | None:
    """The floor the answers of the other voters of a group of `voters` give; None while they cannot.

    Enough voters that kept their data must answer (`answers_needed`), or every other voter, at least one
    of them having kept its data: what only voters that lost their data held is gone whatever this
    replica does (two disks of three replaced), and the group goes on from the rest. Every answer's log
    counts, a recovering voter's too: it may hold entries committed since it lost its own data."""
    kept = [a for a in answers if not a.recovering]
    if not kept or len(kept) < answers_needed(voters) and len(answers) < voters - 1:
        return None
    term = max(a.term for a in answers)
    if any(a.last_log is None for a in answers):  # an older release's node: commit indexes, as they were then
        return VoteFloor(term, max(a.commit_index for a in answers), None)
    log_term, index = max(a.last_log for a in answers)
    return VoteFloor(term, index, log_term)


def answers_needed(voters: int) -> int:
    """How many of the other voters of a group of `voters` (n) a wiped replica must hear from. A majority
    holds each committed entry, so at least n // 2 of the n - 1 others do, and any n - n // 2 of them
    include one."""
    return voters - voters // 2


class VoteGuard:
    def __init__(self, folder: Path, guarded: bool):
        """`guarded`: the replica opens with no data for a group with a history (it waits for a floor)."""
        self._path = Path(folder) / FLOOR_FILE
        self.floor, self.waiting = _read(self._path)  # waiting: no vote, no campaign, until `settle`
        if guarded and self.floor is None and not self.waiting:
            # kept before the replica writes anything: once its folder holds files, a restart no longer
            # sees an empty one, and must still know it waits
            make_dirs(self._path.parent)
            replace_file(self._path, json.dumps({"waiting": True}).encode())
            self.waiting = True

    @property
    def recovering(self) -> bool:
        """It waits for its floor, or has not committed up to it yet: what it reports is not to be learned from."""
        return self.waiting or self.floor is not None and self.floor.index > 0

    def settle(self, floor: VoteFloor) -> None:
        """The floor, learned from the group's other voters; kept before it is used."""
        replace_file(self._path, json.dumps(
            {"term": floor.term, "index": floor.index, "log_term": floor.log_term}).encode())
        self.floor, self.waiting = floor, False

    def learn(self, floor: VoteFloor) -> bool:
        """A floor the other voters gave: the first settles, a later one may only lower it. True: it changed."""
        if self.floor is None:
            self.settle(floor)
            return True
        return self.lower(floor)

    def lower(self, floor: VoteFloor) -> bool:
        """`floor`, learned again while this replica has not reached its own: when every log of that quorum
        ends before its own floor's entry, the entries past theirs were never committed or a power cut of
        every holder took them (lose-last-second mode), and waiting for them would wait for ever. The
        term part never goes down. True: lowered."""
        now = self.floor
        if now is None or not now.index or floor.log_term is None or now.reached_by(floor.log_term, floor.index):
            return False
        self.settle(VoteFloor(max(now.term, floor.term), floor.index, floor.log_term))
        return True

    def caught_up(self, commit_index: int) -> None:
        """The replica has committed up to `commit_index`: the floor's log part retires once it is reached."""
        if self.floor is not None and 0 < self.floor.index <= commit_index:
            try:
                self.settle(VoteFloor(self.floor.term, 0, 0))
            except OSError:  # a full disk: the floor stays whole, and the next tick tries again
                pass

    def admits_leader(self, term: int) -> bool:
        """Whether this replica may take appends from a leader of `term`: none while it waits (it forgot the
        term it was in), and none from a term before the floor's (a deposed leader's)."""
        return not self.waiting and (self.floor is None or term >= self.floor.term)

    def refusal(self, term: int, last_log_term: int, last_log_index: int) -> str | None:
        """Why a vote is not granted to a candidate asking in `term` with this last entry; None: it may be."""
        if self.waiting:
            return "this replica lost its data and does not know yet what the group committed"
        if self.floor is None:
            return None
        if term <= self.floor.term:
            return f"this replica lost its data, and may have voted in terms up to {self.floor.term}"
        if not self.floor.reached_by(last_log_term, last_log_index):
            return (f"its log ends at {last_log_term}:{last_log_index}, behind {self.floor.describe()}, the most "
                    "up-to-date log of the voters asked when this replica lost its data")
        return None

    def held_back(self, last_log_term: int, last_log_index: int) -> str | None:
        """Why this replica may not campaign with its log ending at this entry; None: it may."""
        if self.waiting:
            return "it lost its data and does not know yet what the group committed"
        if self.floor is not None and not self.floor.reached_by(last_log_term, last_log_index):
            return (f"it lost its data, and its log ends at {last_log_term}:{last_log_index}, behind "
                    f"{self.floor.describe()}, the most up-to-date log of the voters it asked")
        return None


def _read(path: Path) -> tuple[VoteFloor | None, bool]:
    """The floor kept in `path`, and whether the replica still waits for one."""
    try:
        doc = json.loads(path.read_bytes())
        if doc.get("waiting") is True:
            return None, True
        log_term = doc.get("log_term")
        return VoteFloor(int(doc["term"]), int(doc["index"]), None if log_term is None else int(log_term)), False
    except FileNotFoundError:
        return None, False
    except OSError as exc:
        raise DiskFailed(f"{path} is unreadable ({exc.strerror}): check the disk (dmesg), then move {path.parent} "
                         "away and restart the node so the partition re-syncs from its peers") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise CorruptData(f"{path} is corrupt; stop the node, move {path.parent} away and restart it so the "
                          "partition re-syncs from its peers") from None
