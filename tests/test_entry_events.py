"""learners.entry_events: an entry's events as columns, and the same events read back as rows."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from learners.change_event import ChangeEvent
from learners.entry_events import EntryEvents, EventRows, entries_of
from learners.sinks.base import DeliveryBatch

events = st.lists(st.builds(
    ChangeEvent, st.sampled_from("cudr"), st.binary(max_size=2), st.none() | st.binary(max_size=2),
    st.none() | st.binary(max_size=2), st.sampled_from(["c", "d"]), st.integers(0, 1), st.integers(1, 2),
    st.just(1), st.integers(0, 3), st.booleans(), st.just(0)), max_size=12)


@given(events)
def test_events_regrouped_as_columns_read_back_as_the_same_events(rows):
    entries = entries_of(rows)
    assert list(EventRows(entries)) == [e for entry in entries for e in entry] == rows
    assert all(e.seq == entry.first_seq + n for entry in entries for n, e in enumerate(entry))
    assert DeliveryBatch(rows).entries() == entries


def test_one_entry_s_events_with_consecutive_seqs_make_one_entry():
    def event(index: int, seq: int) -> ChangeEvent:
        return ChangeEvent("c", b"k%d" % seq, None, b"v", "c", 0, index, 1, seq, False, 0)

    entries = entries_of([event(5, 0), event(5, 1), event(5, 2), event(6, 0), event(6, 2), event(6, 3)])
    assert [(e.index, e.first_seq, list(e.keys)) for e in entries] == [
        (5, 0, [b"k0", b"k1", b"k2"]), (6, 0, [b"k0"]), (6, 2, [b"k2", b"k3"])]


def test_event_rows_are_a_sequence_of_the_entries_events():
    entries = [EntryEvents("c", 0, i, 1, False, 0, ["c"] * i, [b"k%d" % n for n in range(i)], [None] * i,
                           [b"v"] * i) for i in (2, 0, 3)]
    rows, flat = EventRows(entries), [e for entry in entries for e in entry]
    assert len(rows) == len(flat) == 5
    assert [rows[i] for i in range(-5, 5)] == flat[-5:] + flat
    assert rows[1:4] == flat[1:4] and rows[::-2] == flat[::-2]
    with pytest.raises(IndexError):
        rows[5]
    assert DeliveryBatch(rows).entries() is entries
    assert len(EventRows([])) == 0 and list(EventRows([])) == []
