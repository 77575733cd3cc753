"""A replica that lost its data must not vote until it knows what the group has committed.

Raft's safety rests on each voter remembering its log and the vote it cast in each term. A
voter whose data was wiped (a failed disk, a damaged file moved away, as the error tells the
operator to) comes back with an empty log and no memory of its votes. Two such voters of a
three-voter group elected one of themselves in a low term while the third, which held the
acknowledged writes, still led in a higher one: the writes the impostor acknowledged were lost
when the real leader's log replaced them (a one-minute chaos run of corrupt files, docs/chaos.md).

So a voter replica that opens with no data for a group that has had a history is *guarded*: it
neither campaigns nor grants a vote until it has a floor, the highest term and commit index an
unguarded member reported (the node asks them, `Node._learn_vote_floor`). From then on it grants
votes only in terms above the floor's term (it may have voted in any of those before) and only to
candidates whose log reaches the floor's index (the entries a majority acknowledged), and it does
not campaign before its own log reaches that index. The floor is kept in the replica's folder, so
a restart before it caught up keeps it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from raftkv.core.durable import replace_file
from raftkv.core.errors import CorruptData, DiskFailed

FLOOR_FILE = "vote_floor"


@dataclass(frozen=True)
class VoteFloor:
    term: int
    index: int


class VoteGuard:
    def __init__(self, folder: Path, guarded: bool):
        """`guarded`: the replica opens with no data for a group with a history (it waits for a floor)."""
        self._path = Path(folder) / FLOOR_FILE
        self.floor: VoteFloor | None = _read(self._path)
        self.waiting = guarded and self.floor is None  # no vote, no campaign, until `settle`

    def settle(self, floor: VoteFloor) -> None:
        """The floor, learned from the group's unguarded members; kept before it is used."""
        replace_file(self._path, json.dumps({"term": floor.term, "index": floor.index}).encode())
        self.floor, self.waiting = floor, False

    def refusal(self, term: int, last_log_index: int) -> str | None:
        """Why a vote is not granted to a candidate asking in `term` with this last log index; None: it may be."""
        if self.waiting:
            return "this replica lost its data and does not know yet what the group committed"
        if self.floor is None:
            return None
        if term <= self.floor.term:
            return f"this replica lost its data, and may have voted in terms up to {self.floor.term}"
        if last_log_index < self.floor.index:
            return (f"its log ends at {last_log_index}, before entry {self.floor.index}, which the group had "
                    "committed when this replica lost its data")
        return None

    def held_back(self, last_log_index: int) -> str | None:
        """Why this replica may not campaign with its log ending at `last_log_index`; None: it may."""
        if self.waiting:
            return "it lost its data and does not know yet what the group committed"
        if self.floor is not None and last_log_index < self.floor.index:
            return (f"it lost its data, and its log ends at {last_log_index}, before entry {self.floor.index}, "
                    "which the group had committed by then")
        return None


def _read(path: Path) -> VoteFloor | None:
    try:
        doc = json.loads(path.read_bytes())
        return VoteFloor(int(doc["term"]), int(doc["index"]))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DiskFailed(f"{path} is unreadable ({exc.strerror}): check the disk (dmesg), then move {path.parent} "
                         "away and restart the node so the partition re-syncs from its peers") from None
    except (ValueError, KeyError, TypeError):
        raise CorruptData(f"{path} is corrupt; stop the node, move {path.parent} away and restart it so the "
                          "partition re-syncs from its peers") from None
