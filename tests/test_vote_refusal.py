"""Why a voter refuses a candidate, as its log says (raftkv/raft/vote_refusal.py)."""

from __future__ import annotations

import logging

from raftkv.raft.vote_guard import VoteFloor, VoteGuard
from raftkv.raft.vote_refusal import ElectionLog, Voter, raft_refusal

FOLLOWER = Voter(term=5, voted_for=None, leading=False, last_term=4, last_index=100)


def test_raft_grants_a_vote_only_to_a_log_at_least_as_up_to_date_in_a_term_it_has_not_voted_in():
    assert raft_refusal(6, 4, 100, FOLLOWER) is None  # a tie of logs wins the vote
    assert raft_refusal(6, 5, 2, FOLLOWER) is None  # a later last term wins whatever the length
    assert raft_refusal(4, 9, 900, FOLLOWER) == "its term 4 is behind this replica's 5"
    assert raft_refusal(6, 4, 99, FOLLOWER) == "its log ends at 4:99, behind this replica's 4:100"
    assert raft_refusal(6, 3, 500, FOLLOWER) == "its log ends at 3:500, behind this replica's 4:100"
    voted = Voter(term=6, voted_for="n2", leading=False, last_term=4, last_index=100)
    assert raft_refusal(6, 4, 100, voted) == "this replica voted for n2 in term 6"
    assert raft_refusal(7, 4, 100, voted) is None  # a new term, no vote cast in it yet
    leader = Voter(term=6, voted_for="n1", leading=True, last_term=6, last_index=101)
    assert raft_refusal(6, 6, 101, leader) == "this replica leads in that term"


def test_a_guarded_voter_names_the_floor_that_refuses(tmp_path):
    guard = VoteGuard(tmp_path, guarded=True)
    assert "does not know yet" in guard.refusal(99, 99, 10**9)
    guard.settle(VoteFloor(term=7, index=120, log_term=6))
    assert guard.refusal(7, 7, 500) == "this replica lost its data, and may have voted in terms up to 7"
    assert guard.refusal(8, 6, 119) == ("its log ends at 6:119, behind 6:120, the most up-to-date log of the voters "
                                        "asked when this replica lost its data")
    assert guard.refusal(8, 6, 120) is None


def test_each_kind_of_election_line_is_logged_once_per_period_per_group(caplog):
    elections = ElectionLog(partition=4)
    with caplog.at_level(logging.INFO, logger="raftkv.raft.vote_refusal"):
        elections.refused(0.0, "n5", 800, "its term 800 is behind this replica's 801", ["n15", "n5", "n8"])
        elections.refused(1.0, "n5", 801, "again", ["n15", "n5", "n8"])
        elections.campaigns(1.0, 802, 696, 44908, ["n15", "n5", "n8"])
        elections.refused(10.5, "n5", 803, "later", ["n15", "n5"])
    assert [r.getMessage() for r in caplog.records] == [
        "partition 4: no vote for n5 in term 800: its term 800 is behind this replica's 801 "
        "(members here: n15, n5, n8)",
        "partition 4: campaigns in term 802 with its log to 696:44908 (members here: n15, n5, n8)",
        "partition 4: no vote for n5 in term 803: later (members here: n15, n5)",
    ]
