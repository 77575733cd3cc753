"""What a member's pysyncobj sees of the votes it is asked for and given (raftkv/raft/syncobj_votes.py), on
one member fed crafted messages as tests/test_syncobj_patches.py feeds a follower."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Iterator

import pysyncobj
import pytest

from raftkv.raft.hub import Directory
from raftkv.raft.syncobj_patches import PatchedSyncObj
from raftkv.raft.syncobj_votes import Votes
from tests.test_syncobj_patches import Follower

CANDIDATE = pysyncobj.syncobj._RAFT_STATE.CANDIDATE


@pytest.fixture
def member() -> Iterator[Follower]:
    f = Follower(PatchedSyncObj)
    f.obj._SyncObj__setCurrentTerm(5, None)
    yield f
    f.obj.destroy()


def votes_of(f: Follower) -> Votes:
    config = SimpleNamespace(guard=None, clock=time.monotonic, hub=SimpleNamespace(directory=Directory))
    return Votes(SimpleNamespace(_member=f.obj, config=config, partition=0, voters=[]))


def test_a_vote_delivered_twice_counts_once(member: Follower) -> None:
    """pysyncobj adds one for every `response_vote` of its term. The simulation (seed 89 at 0f6c9cf, 5 nodes,
    4 groups) delivered n4's vote for n1 twice, and n1 led g1 in term 8 on it without entry 116:4,
    committed in term 4 (docs/pysyncobj.md)."""
    member.obj._SyncObj__setState(CANDIDATE)
    votes = votes_of(member)
    vote = {'type': 'response_vote', 'term': 5}
    assert votes.admits(member.leader, vote)
    assert not votes.admits(member.leader, vote)
    assert votes.admits(member.other, vote)
    assert votes.admits(member.leader, dict(vote, term=4))  # not of its term: pysyncobj ignores it anyway


def test_a_request_from_an_earlier_term_is_answered_with_this_members_term(member: Follower) -> None:
    """pysyncobj ignores it without a word: a candidate that this member never asks (its configuration leaves
    the candidate out) campaigned below its term for good (the simulation with `--stale`, seed 1006)."""
    votes = votes_of(member)
    request = {'type': 'request_vote', 'term': 3, 'last_log_term': 9, 'last_log_index': 99}
    member.transport.sent.clear()
    assert votes.admits(member.leader, request)
    assert member.transport.sent == [(member.leader, {'type': 'vote_refused', 'term': 5})]
    member.transport.sent.clear()
    assert votes.admits(member.leader, dict(request, term=6))
    assert member.transport.sent == []
