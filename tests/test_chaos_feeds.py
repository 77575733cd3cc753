"""The chaos run's check of a learner's feed (raftkv/chaos/feeds.py), on feeds read back from lists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from learners.change_event import ChangeEvent
from raftkv.chaos import feeds
from raftkv.chaos.feeds import Feed, feed_violations
from raftkv.core.errors import Unavailable


def event(key: bytes, index: int, before: bytes | None, after: bytes | None) -> ChangeEvent:
    return ChangeEvent("u" if before else "c", key, before, after, "chaos", 0, index, 1, 0, False, 0)


@pytest.fixture
def running():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def feed_of(read, process) -> Feed:
    return Feed("changelog", "changelog 127.0.0.1:1", lambda: process, Path("learner.log"), read)


def test_a_feed_that_replays_to_the_final_contents_in_order_passes(running):
    events = [event(b"a", 1, None, b"1"), event(b"b", 2, None, b"1"), event(b"a", 3, b"1", b"2")]
    assert feed_violations(feed_of(lambda: events, running), {b"a": b"2", b"b": b"1"}) == []


def test_a_feed_missing_an_event_is_a_violation_twice_over(running, monkeypatch):
    monkeypatch.setattr(feeds, "FEED_DEADLINE", 0.0)
    events = [event(b"a", 1, None, b"1"), event(b"a", 3, b"2", b"3")]  # the update at index 2 is missing
    found = [v.detail for v in feed_violations(feed_of(lambda: events, running), {b"a": b"4"})]
    assert len(found) == 2
    assert "b'a': event (0, 3, 0) does not follow (0, 1, 0) (an event is missing)" in found[0]
    assert "replays to 1 keys, not the voters' 1: 0 missing, 1 with another value" in found[1]


def test_a_feed_that_cannot_be_read_says_why(running, monkeypatch):
    monkeypatch.setattr(feeds, "FEED_DEADLINE", 0.0)

    def unreadable():
        raise Unavailable("the changelog at 127.0.0.1:1 did not answer")

    [violation] = feed_violations(feed_of(unreadable, running), {b"a": b"1"})
    assert violation.detail == ("the feed could not be read at the end of 0s of waiting for it to catch up: "
                                "the changelog at 127.0.0.1:1 did not answer")


def test_a_learner_that_exited_is_named_with_its_log():
    exited = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    exited.wait()
    [violation] = feed_violations(feed_of(lambda: [], exited), {b"a": b"1"})
    assert violation.detail == "the changelog learner exited with 3; see learner.log"
