"""The engine's messages: plain tuples, many groups' in one hub frame per peer per turn.

Every item starts with its kind, then `(group, term, epoch)`: the group it is for, the leader's term
and the ownership epoch of the hand-over it belongs to. A receiver drops an item whose pair is not the
one it holds for the group (counted as stale).

    ("take", group, term, epoch, last_index, last_term, commit)   leader -> follower: drive it with me
    ("taken", group, term, epoch)                                 follower -> leader
    ("handback", group, term, epoch)                              either way: pysyncobj drives it again
    ("steps", group, term, epoch, prev_index, prev_term, commit, entries)   entries: [(command, index, term)]
    ("ack", group, term, epoch, index, ok)   ok: the follower's log matches the leader's up to `index`;
                                             not ok: it ends at `index`, before the append's previous entry
    ("beat", group, term, epoch, commit)     a heartbeat of a group that sent nothing else in the period
    ("rest", group, term, epoch, index)      leader -> follower: idle, every entry to `index` committed; no
                                             beats until the next `steps` (docs/raft-engine.md, "Resting")
"""

from __future__ import annotations

TAKE, TAKEN, HANDBACK, STEPS, ACK, BEAT, REST = "take", "taken", "handback", "steps", "ack", "beat", "rest"

_INTS = {TAKE: 6, TAKEN: 3, HANDBACK: 3, STEPS: 6, ACK: 4, BEAT: 4, REST: 4}  # how many ints follow the kind
_LENGTH = {TAKE: 7, TAKEN: 4, HANDBACK: 4, STEPS: 8, ACK: 6, BEAT: 5, REST: 5}


def _int(value: object) -> bool:
    return type(value) is int


def well_formed(item: object) -> bool:
    """Whether `item` (from a peer: anything plain data can be) is an engine item of a known shape."""
    if not isinstance(item, tuple) or not item or item[0] not in _LENGTH or len(item) != _LENGTH[item[0]]:
        return False
    kind = item[0]
    if not all(_int(value) for value in item[1:1 + _INTS[kind]]):
        return False
    if kind == ACK:
        return type(item[5]) is bool
    if kind == STEPS:
        entries = item[7]
        return isinstance(entries, list) and all(
            isinstance(e, tuple) and len(e) == 3 and isinstance(e[0], bytes) and _int(e[1]) and _int(e[2])
            for e in entries)
    return True


def take(group: int, term: int, epoch: int, last_index: int, last_term: int, commit: int) -> tuple:
    return (TAKE, group, term, epoch, last_index, last_term, commit)


def taken(group: int, term: int, epoch: int) -> tuple:
    return (TAKEN, group, term, epoch)


def handback(group: int, term: int, epoch: int) -> tuple:
    return (HANDBACK, group, term, epoch)


def steps(group: int, term: int, epoch: int, prev_index: int, prev_term: int, commit: int, entries: list) -> tuple:
    return (STEPS, group, term, epoch, prev_index, prev_term, commit, entries)


def ack(group: int, term: int, epoch: int, index: int, ok: bool) -> tuple:
    return (ACK, group, term, epoch, index, ok)


def beat(group: int, term: int, epoch: int, commit: int) -> tuple:
    return (BEAT, group, term, epoch, commit)


def rest(group: int, term: int, epoch: int, index: int) -> tuple:
    return (REST, group, term, epoch, index)


def describe(item: tuple) -> str:
    """One short line, for traces and golden files."""
    kind, group, term, epoch = item[:4]
    head = f"{kind} g{group} t{term} e{epoch}"
    if kind == TAKE:
        return f"{head} last {item[4]}:{item[5]} commit {item[6]}"
    if kind == STEPS:
        entries = item[7]
        span = f" {entries[0][1]}..{entries[-1][1]}" if entries else ""
        return f"{head} prev {item[4]}:{item[5]} commit {item[6]}{span}"
    if kind == ACK:
        return f"{head} {'match' if item[5] else 'ends at'} {item[4]}"
    if kind == BEAT:
        return f"{head} commit {item[4]}"
    if kind == REST:
        return f"{head} at {item[4]}"
    return head
