"""Tests for raftkv.core.batching.GroupCommit: the group commit policy."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from raftkv.core.batching import GroupCommit

# An action is either ("add", size) or ("done",); "done" is skipped when nothing is in flight.
actions = st.lists(
    st.one_of(st.tuples(st.just("add"), st.integers(0, 40)), st.just(("done",))),
    max_size=60,
)
configs = st.tuples(st.integers(1, 5), st.integers(1, 60), st.integers(1, 3))


class Driver:
    """Runs a GroupCommit, checking its invariants after every call."""

    def __init__(self, max_ops: int, max_bytes: int, max_in_flight: int):
        self.policy: GroupCommit[int] = GroupCommit(max_ops, max_bytes, max_in_flight)
        self.sizes: dict[int, int] = {}
        self.sent: list[list[int]] = []
        self.next_item = 0

    def add(self, size: int) -> list[list[int]]:
        item = self.next_item
        self.next_item += 1
        self.sizes[item] = size
        was_idle = self.policy.in_flight < self.policy.max_in_flight
        batches = self.policy.add(item, size)
        if was_idle:
            assert batches == [[item]], "an idle policy sends a new item at once, alone"
        else:
            assert batches == [], "a busy policy only queues"
        return self._sent(batches)

    def done(self) -> list[list[int]]:
        return self._sent(self.policy.completed())

    def drain(self) -> None:
        while self.policy.in_flight:
            self.done()
        assert self.policy.pending == 0

    def _sent(self, batches: list[list[int]]) -> list[list[int]]:
        p = self.policy
        # Each returned batch is full: the item after it (first of the next batch, or the
        # head of the queue) would have broken max_ops or max_bytes.
        # Items are numbered in arrival order, so (given FIFO) the queue head is the count sent.
        queue_head = sum(len(b) for b in self.sent) + sum(len(b) for b in batches)
        followers = [b[0] for b in batches[1:]] + [queue_head if p.pending else None]
        for batch, follower in zip(batches, followers):
            assert batch, "no empty batches"
            assert len(batch) <= p.max_ops
            total = sum(self.sizes[i] for i in batch)
            assert total <= p.max_bytes or len(batch) == 1
            if follower is not None:
                assert len(batch) == p.max_ops or total + self.sizes[follower] > p.max_bytes
        assert 0 <= p.in_flight <= p.max_in_flight
        # Work is queued only while every in-flight slot is taken.
        assert p.pending == 0 or p.in_flight == p.max_in_flight
        self.sent += batches
        return batches

    def run(self, script) -> None:
        for action in script:
            if action[0] == "add":
                self.add(action[1])
            elif self.policy.in_flight:
                self.done()


@given(configs, actions)
@settings(max_examples=200)
def test_every_item_is_sent_exactly_once_in_arrival_order(config, script):
    d = Driver(*config)
    d.run(script)
    d.drain()
    assert [item for batch in d.sent for item in batch] == list(range(d.next_item))


@given(configs, actions)
@settings(max_examples=200)
def test_batches_respect_limits_are_full_and_in_flight_stays_bounded(config, script):
    # The Driver asserts the invariants after every call; here we also exercise the
    # queued-head follower check by not draining until the end.
    d = Driver(*config)
    d.run(script)
    assert d.policy.pending == d.next_item - sum(len(b) for b in d.sent)
    d.drain()


@given(configs, actions)
def test_abandon_returns_the_queued_items_in_order_and_nothing_is_lost(config, script):
    d = Driver(*config)
    d.run(script)
    queued = d.policy.abandon()
    sent = [item for batch in d.sent for item in batch]
    assert sent + queued == list(range(d.next_item))
    assert d.policy.pending == 0
    assert d.policy.abandon() == []


def test_an_idle_policy_sends_each_item_at_once():
    policy = GroupCommit(max_ops=10, max_bytes=100)
    assert policy.add("a", 5) == [["a"]]
    assert policy.in_flight == 1
    assert policy.add("b", 5) == []
    assert policy.add("c", 5) == []
    assert policy.pending == 2
    assert policy.completed() == [["b", "c"]]
    assert policy.completed() == []
    assert policy.in_flight == 0
    assert policy.add("d", 5) == [["d"]]


def test_queued_items_are_split_by_max_ops():
    policy = GroupCommit(max_ops=2, max_bytes=1000)
    policy.add(0, 1)
    for i in range(1, 6):
        policy.add(i, 1)
    assert policy.completed() == [[1, 2]]
    assert policy.completed() == [[3, 4]]
    assert policy.completed() == [[5]]


def test_queued_items_are_split_by_max_bytes_but_an_oversized_item_goes_alone():
    policy = GroupCommit(max_ops=100, max_bytes=10)
    policy.add("first", 1)
    for item, size in [("a", 4), ("b", 6), ("c", 1), ("big", 50), ("d", 10)]:
        policy.add(item, size)
    assert policy.completed() == [["a", "b"]]
    assert policy.completed() == [["c"]]
    assert policy.completed() == [["big"]]
    assert policy.completed() == [["d"]]


def test_several_batches_can_be_in_flight():
    policy = GroupCommit(max_ops=1, max_bytes=100, max_in_flight=2)
    assert policy.add("a", 1) == [["a"]]
    assert policy.add("b", 1) == [["b"]]
    assert policy.add("c", 1) == []
    assert policy.add("d", 1) == []
    assert policy.in_flight == 2
    assert policy.completed() == [["c"]]
    assert policy.completed() == [["d"]]
    assert policy.completed() == []
    assert policy.completed() == []
    assert policy.in_flight == 0


def test_widening_lets_the_queue_go_and_narrowing_recalls_nothing():
    policy = GroupCommit(max_ops=10, max_bytes=100, max_in_flight=1)
    assert policy.add("a", 1) == [["a"]]
    assert policy.add("b", 1) == [] and policy.add("c", 1) == []
    assert policy.set_max_in_flight(2) == [["b", "c"]]  # beside the batch that seems stuck
    assert policy.add("d", 1) == []
    assert policy.set_max_in_flight(1) == []
    assert policy.in_flight == 2
    assert policy.completed() == []  # still one in flight, at the limit again
    assert policy.completed() == [["d"]]


def test_abandon_keeps_in_flight_batches_counted():
    policy = GroupCommit(max_ops=10, max_bytes=100)
    policy.add("a", 1)
    policy.add("b", 1)
    policy.add("c", 1)
    assert policy.abandon() == ["b", "c"]
    assert policy.in_flight == 1
    assert policy.completed() == []
    assert policy.in_flight == 0


def test_completed_without_a_batch_in_flight_raises():
    policy = GroupCommit(max_ops=1, max_bytes=1)
    with pytest.raises(RuntimeError, match="without a batch in flight"):
        policy.completed()
    policy.add("a", 1)
    policy.completed()
    with pytest.raises(RuntimeError):
        policy.completed()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(max_ops=0, max_bytes=1),
        dict(max_ops=1, max_bytes=0),
        dict(max_ops=1, max_bytes=1, max_in_flight=0),
        dict(max_ops=-1, max_bytes=1),
        dict(max_ops=1, max_bytes=-5),
        dict(max_ops=1, max_bytes=1, max_in_flight=-1),
    ],
)
def test_constructor_rejects_non_positive_limits(kwargs):
    with pytest.raises(ValueError, match="must be positive"):
        GroupCommit(**kwargs)


def test_constructor_accepts_the_smallest_limits_and_defaults_to_one_in_flight():
    policy = GroupCommit(max_ops=1, max_bytes=1)
    assert (policy.max_ops, policy.max_bytes, policy.max_in_flight) == (1, 1, 1)
    assert policy.in_flight == 0
    assert policy.pending == 0
