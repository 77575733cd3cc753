"""Point-in-time restore's decisions (learners/restore_plan.py): which backup, which events, and whether the feed
proves it holds them. Pure; the property tests check plan + replay against a naive twin, the state after every
index of a generated log."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learners.change_event import ChangeEvent
from learners.restore_plan import (Coverage, Replay, Replayer, Resync, index_at_time, parse_index_targets, parse_time,
                                   plan_partition, plan_restore)
from raftkv.backup.manifest import BackupInfo, PartitionCopy, backup_id_for
from raftkv.core.errors import ConfigError, CorruptData, InvalidRequest
from raftkv.core.overlay import Overlay
from raftkv.storage.engine import Position

START = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone.utc)


def backup(minute: int, **indices: int) -> BackupInfo:
    """A backup made `minute` minutes after START, with partition pN at indices[pN]."""
    copies = tuple(PartitionCopy(int(name[1:]), Position(index, 1), ()) for name, index in sorted(indices.items()))
    return BackupInfo(backup_id_for(START + timedelta(minutes=minute)), "c", START, copies)


def event(index: int, seq: int, key: bytes, before: bytes | None, after: bytes | None, partition: int = 0,
          snapshot: bool = False, ts_ms: int = 0) -> ChangeEvent:
    op = "d" if after is None else ("r" if snapshot else "c" if before is None else "u")
    return ChangeEvent(op, key, before, after, "c", partition, index, 1, seq, snapshot, ts_ms)


def replayed(plan: Replay, start: dict[bytes, bytes], events: list[ChangeEvent]) -> dict[bytes, bytes]:
    """The copy `start` (a dict), with the plan's events applied as restore applies them."""
    state = dict(start)
    view = Overlay(state.get)
    Replayer(plan).apply([e for e in events if plan.after < e.index <= plan.until], view)
    for m in view.mutations:
        if hasattr(m, "value"):
            state[m.key] = m.value
        else:
            state.pop(m.key, None)
    return state


# -- targets ---------------------------------------------------------------------------


def test_index_targets_name_each_partition_once():
    assert parse_index_targets("0:120, 1:340,") == {0: 120, 1: 340}
    for bad, message in [("0=1", "PARTITION:INDEX"), ("0:1,0:2", "named twice"), ("", "every partition"),
                         ("a:1", "PARTITION:INDEX"), ("0:-1", "PARTITION:INDEX")]:
        with pytest.raises(ConfigError, match=message):
            parse_index_targets(bad)


def test_a_time_needs_its_zone():
    assert parse_time("2026-03-04T05:06:07.250Z") == round(START.timestamp() * 1000) + 250
    assert parse_time("2026-03-04T06:06:07+01:00") == round(START.timestamp() * 1000)
    with pytest.raises(ConfigError, match="no time zone"):
        parse_time("2026-03-04T05:06:07")
    with pytest.raises(ConfigError, match="not an ISO 8601 time"):
        parse_time("yesterday")


def test_a_time_ends_before_the_first_entry_captured_after_it():
    stamps = [(3, 100), (4, 100), (9, 250), (12, 400)]
    assert index_at_time(0, Coverage(0, 20), stamps, 99) == 2
    assert index_at_time(0, Coverage(0, 20), stamps, 100) == 8
    assert index_at_time(0, Coverage(0, 20), stamps, 399) == 11
    assert index_at_time(0, Coverage(0, 20), stamps, 400) == 20  # every change by then: the feed's latest
    assert index_at_time(0, Coverage(2, 20), stamps, 250) == 11
    with pytest.raises(InvalidRequest, match="oldest retained change .index 3. is after the time"):
        index_at_time(0, Coverage(2, 20), stamps, 99)  # what retention trimmed may have been before it or not


# -- the plan ----------------------------------------------------------------------------


def test_each_partition_starts_from_the_newest_backup_at_or_before_its_target():
    backups = [backup(0, p0=10, p1=10), backup(1, p0=20, p1=50), backup(2, p0=30, p1=60)]
    feed = {0: Coverage(0, 100), 1: Coverage(0, 100)}
    plans = plan_restore(backups, {0: 25, 1: 55}, feed, [0, 1])
    assert (plans[0].backup.id, plans[0].after, plans[0].until) == (backups[1].id, 20, 25)
    assert (plans[1].backup.id, plans[1].after, plans[1].until) == (backups[1].id, 50, 55)
    exact = plan_partition(0, backups, 30, None)  # exactly a backup: no feed needed
    assert (exact.backup.id, exact.needs_feed) == (backups[2].id, False)


def test_every_partition_must_be_named():
    with pytest.raises(ConfigError, match="missing: 1; not in the backups: 2"):
        plan_restore([backup(0, p0=1, p1=1)], {0: 5, 2: 5}, {}, [0, 1])


@pytest.mark.parametrize("target, coverage, message", [
    (5, Coverage(0, 100), "no backup at or before index 5 .the oldest is at index 10."),
    (40, None, "no feed holds the partition's changes"),
    (40, Coverage(0, 35), "the feed has delivered only up to index 35"),
    (40, Coverage(25, 100), r"only the changes after index 25 \(entries 21..25 are no longer retained\)"),
    (40, Coverage(0, 100, (Resync(15, 25),)), "re-synced from a snapshot at index 25: entries 16..25"),
    (40, Coverage(0, 100, (Resync(30, 45),)), "re-synced from a snapshot at index 45: entries 31..45"),
])
def test_a_gap_between_the_backup_and_the_target_is_named(target, coverage, message):
    with pytest.raises(InvalidRequest, match=message):
        plan_partition(0, [backup(0, p0=10), backup(1, p0=20)], target, coverage)


def test_every_gap_is_named_in_one_line_and_nothing_is_restored():
    with pytest.raises(InvalidRequest) as raised:
        plan_restore([backup(0, p0=10, p1=10)], {0: 40, 1: 50}, {0: Coverage(0, 30), 1: Coverage(20, 60)}, [0, 1])
    text = str(raised.value)
    assert "partition 0:" in text and "partition 1:" in text and text.endswith("nothing was restored")
    assert "\n" not in text


def test_a_resync_inside_the_range_is_replayed_as_its_diff_and_others_are_ignored():
    coverage = Coverage(0, 100, (Resync(2, 8), Resync(20, 30), Resync(60, 70)))
    plan = plan_partition(0, [backup(0, p0=10)], 50, coverage)
    assert plan.diffs == (Resync(20, 30),)


# -- replaying ------------------------------------------------------------------------------

PLAN = Replay(0, backup(0, p0=10), 10, 20)


def test_events_set_the_after_image_and_a_delete_removes_the_key():
    events = [event(11, 0, b"a", b"1", b"2"), event(11, 1, b"b", None, b"x"), event(14, 0, b"a", b"2", None)]
    assert replayed(PLAN, {b"a": b"1", b"z": b"9"}, events) == {b"b": b"x", b"z": b"9"}


@pytest.mark.parametrize("events, message", [
    ([event(11, 0, b"a", b"0", b"2")], r"expects the value b'0' but the backup and the events before it give b'1'"),
    ([event(11, 0, b"a", b"1", b"2"), event(11, 2, b"b", None, b"x")], "follows .0, 11, 0.: an event is missing"),
    ([event(12, 1, b"a", b"1", b"2")], "follows the backup: an event is missing"),
    ([event(12, 0, b"a", b"1", b"2"), event(11, 0, b"b", None, b"x")], "missing or out of order"),
    ([event(12, 0, b"b", None, b"x", snapshot=True)], "snapshot diff at index 12 that no recorded re-sync"),
    ([event(21, 0, b"b", None, b"x")], "sent event .0, 21, 0. for the range 11..20"),
])
def test_a_feed_that_does_not_continue_the_backup_is_corrupt(events, message):
    with pytest.raises(CorruptData, match=message):
        view = Overlay({b"a": b"1"}.get)
        Replayer(PLAN).apply(events, view)


def test_a_resyncs_diff_replaces_the_entries_it_stands_for():
    """The sink had delivered entries 13..14 before the learner re-synced from its copy at 12: the diff
    is against the copy at 12, so those entries' events are skipped."""
    plan = Replay(0, backup(0, p0=10), 10, 20, (Resync(12, 16),))
    events = [event(11, 0, b"a", b"1", b"2"),
              event(13, 0, b"b", None, b"tmp"), event(14, 0, b"a", b"2", b"3"),  # delivered, then re-synced over
              event(16, 0, b"a", b"2", b"4", snapshot=True), event(16, 1, b"c", None, b"5", snapshot=True),
              event(18, 0, b"c", b"5", None)]
    assert replayed(plan, {b"a": b"1"}, events) == {b"a": b"4"}


# -- against a naive twin ---------------------------------------------------------------------

KEYS = [b"a", b"b", b"c"]
entries = st.lists(st.lists(st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.sampled_from([b"1", b"2"]))),
                            max_size=3), min_size=1, max_size=25)  # an empty entry: a no-op


def log_of(ops_per_entry: list) -> tuple[list[ChangeEvent], list[dict[bytes, bytes]]]:
    """The feed's events of a log, as change capture makes them, and the state after each index (0: empty)."""
    state: dict[bytes, bytes] = {}
    states, events = [dict(state)], []
    for index, ops in enumerate(ops_per_entry, 1):
        seq = 0
        for key, value in ops:
            before = state.get(key)
            if value is None and before is None:
                continue  # deleting an absent key changes nothing: no event
            events.append(event(index, seq, key, before, value, ts_ms=index * 10))
            seq += 1
            if value is None:
                del state[key]
            else:
                state[key] = value
        states.append(dict(state))
    return events, states


def resynced(events: list[ChangeEvent], states: list[dict], base: int, index: int, ahead: int) -> list[ChangeEvent]:
    """The feed of a learner whose sink had entries up to `ahead` (>= base) when it re-synced from its copy at
    `base` to a snapshot at `index`: the diff replaces entries base+1..index, the rest are as they were."""
    old, new = states[base], states[index]
    diff = [event(index, 0, k, old.get(k), new.get(k), snapshot=True) for k in sorted(old.keys() | new.keys())
            if old.get(k) != new.get(k)]
    diff = [ChangeEvent(e.op, e.key, e.before, e.after, e.cluster, e.partition, e.index, e.term, seq, True, e.ts_ms)
            for seq, e in enumerate(diff)]
    return [e for e in events if e.index <= ahead and e.index < index] + diff + [e for e in events if e.index > index]


@settings(max_examples=200, deadline=None)
@given(ops=entries, data=st.data())
def test_plan_and_replay_give_the_state_after_the_target_index(ops, data):
    events, states = log_of(ops)
    last = len(states) - 1
    at = sorted(data.draw(st.sets(st.integers(0, last), min_size=1, max_size=4)))
    backups = [backup(n, p0=index) for n, index in enumerate(at)]
    target = data.draw(st.integers(0, last))
    earliest = data.draw(st.integers(0, last))
    try:
        plan = plan_partition(0, backups, target, Coverage(earliest, last))
    except InvalidRequest:
        assert target < at[0] or earliest > max(i for i in at if i <= target)
        return
    assert replayed(plan, states[plan.after], events) == states[target]


@settings(max_examples=200, deadline=None)
@given(ops=entries, data=st.data())
def test_across_a_resync_the_plan_replays_exactly_or_refuses(ops, data):
    events, states = log_of(ops)
    last = len(states) - 1
    base = data.draw(st.integers(0, last - 1))
    index = data.draw(st.integers(base + 1, last))  # a snapshot the learner is not past yet
    ahead = data.draw(st.integers(base, index))
    feed = resynced(events, states, base, index, ahead)
    backups = [backup(n, p0=i) for n, i in enumerate(sorted(data.draw(st.sets(st.integers(0, last), min_size=1))))]
    target = data.draw(st.integers(0, last))
    try:
        plan = plan_partition(0, backups, target, Coverage(0, last, (Resync(base, index),)))
    except InvalidRequest:
        return
    assert replayed(plan, states[plan.after], feed) == states[target]
