"""The client's retry decision, over plain values: error, attempt, now, deadline."""

from __future__ import annotations

import pytest

from raftkv.client.retry import MAX_DELAY, decide
from raftkv.core.errors import InvalidRequest, NotLeader, StorageFull, Timeout, Unavailable, Undetermined


def decision(error, *, attempt=1, now=0.0, deadline=10.0, is_write=False, hinted=False):
    return decide(error, attempt=attempt, now=now, deadline=deadline, is_write=is_write, hinted_new_leader=hinted,
                  what="write" if is_write else "read", timeout=10.0)


@pytest.mark.parametrize("error", [InvalidRequest("bad"), StorageFull("full")])
def test_errors_about_the_request_are_final(error):
    d = decision(error)
    assert not d.retry and d.error is error


def test_a_write_that_may_have_applied_is_never_retried():
    error = Undetermined("lost the connection after sending")
    assert decision(error, is_write=True).error is error
    assert decision(error, is_write=False).retry  # a read may be asked again


def test_a_hint_naming_another_leader_is_followed_at_once():
    d = decision(NotLeader(0, "n2"), attempt=7, hinted=True)
    assert d.retry and d.follow_hint and d.delay == 0


@pytest.mark.parametrize("error", [NotLeader(0, None), Unavailable("down"), Timeout("slow")])
def test_other_failures_back_off_longer_each_attempt_up_to_a_cap(error):
    delays = [decision(error, attempt=a).delay for a in (1, 2, 5, 100)]
    assert delays == sorted(delays) and delays[0] > 0 and delays[-1] == MAX_DELAY
    assert all(decision(error, attempt=a).retry and not decision(error, attempt=a).follow_hint for a in (1, 100))


def test_at_the_deadline_a_read_times_out_and_a_write_was_certainly_not_applied():
    read = decision(Unavailable("no leader"), now=9.99)
    assert not read.retry and isinstance(read.error, Timeout) and "no leader" in str(read.error)
    write = decision(NotLeader(0, None), now=9.99, is_write=True)
    assert not write.retry and type(write.error) is Unavailable and "no leader accepted the write" in str(write.error)
