"""The changelog sink: a durable, retained, re-readable change log."""

from __future__ import annotations

import pytest

from learners.change_event import ChangeEvent
from learners.entry_events import EntryEvents, EventRows
from learners.sinks.base import DeliveryBatch
from learners.sinks.changelog_sink import ChangelogSink, plan_ends
from raftkv.core.errors import ConfigError, InvalidRequest


def event(partition: int, index: int, seq: int = 0, key: bytes = b"k") -> ChangeEvent:
    return ChangeEvent("u", key, b"old", b"new", "c", partition, index, 1, seq, False, 0)


def opened(path, **config) -> ChangelogSink:
    sink = ChangelogSink()
    sink.open({"path": str(path), **config})
    sink.recover()
    return sink


def test_events_and_positions_survive_a_reopen_and_read_back_in_order(tmp_path):
    sink = opened(tmp_path)
    sink.deliver(DeliveryBatch([event(0, 3, 0), event(0, 3, 1), event(1, 2)], {0: 4, 1: 2}))
    sink.deliver(DeliveryBatch([event(0, 5, 0, b"k2")], {0: 5}))
    sink.flush()
    sink.deliver(DeliveryBatch([event(0, 6)], {0: 6}))  # never flushed: as if the learner crashed here
    sink.close()

    sink = opened(tmp_path)
    assert sink.recover() == {0: 5, 1: 2}
    assert [(c.index, c.seq, c.key) for c in sink.changes(0, 0, 5)] == [(3, 0, b"k"), (3, 1, b"k"), (5, 0, b"k2")]
    assert [(c.index, c.seq) for c in sink.changes(0, 3, 5)] == [(5, 0)]
    assert [c.index for c in sink.changes(1, 0, 2)] == [2]  # partition 0's events never leak into 1
    change = next(sink.changes(1, 0, 2))
    assert (change.op, change.before, change.after, change.HasField("before")) == ("u", b"old", b"new", True)
    with pytest.raises(InvalidRequest, match="beyond the delivered index 5"):
        list(sink.changes(0, 0, 9))


def test_events_delivered_as_columns_read_back_as_the_same_changes(tmp_path):
    entries = [EntryEvents("c", 0, 3, 2, False, 7, ["c", "u", "d"], [b"a", b"b", b"c"], [None, b"1", b"2"],
                           [b"1", b"2", None]),
               EntryEvents("c", 0, 4, 2, True, 8, ["r"], [b"d"], [b""], [b"x" * 300])]
    read_back = []
    for name, events in (("columns", EventRows(entries)), ("rows", [e for entry in entries for e in entry])):
        sink = opened(tmp_path / name)
        sink.deliver(DeliveryBatch(events, {0: 4}))
        sink.flush()
        read_back.append(list(sink.changes(0, 0, 4)))
        sink.close()
    columns, rows = read_back
    assert columns == rows and [(c.index, c.seq, c.op) for c in columns] == [(3, 0, "c"), (3, 1, "u"), (3, 2, "d"),
                                                                              (4, 0, "r")]
    assert [(c.HasField("before"), c.HasField("after"), c.snapshot) for c in columns] == [
        (False, True, False), (True, True, False), (True, False, False), (True, True, True)]


def test_offsets_keep_whole_entries_within_max_rows(tmp_path):
    sink = opened(tmp_path)
    sink.deliver(DeliveryBatch([event(0, i, s) for i in (1, 2, 3) for s in range(4)], {0: 10}))
    sink.deliver(DeliveryBatch([event(1, 1)], {1: 1}))
    sink.flush()
    by_partition = {o.partition: o for o in sink.offsets({}, 0)}
    assert (by_partition[0].earliest, by_partition[0].latest, by_partition[0].end) == (0, 10, 10)
    planned = {o.partition: o.end for o in sink.offsets({0: 0, 1: 0}, 10)}
    assert planned == {0: 2, 1: 1}  # 8 rows of partition 0 (entries 1-2) and partition 1's one
    assert {o.partition: o.end for o in sink.offsets({0: 3, 1: 1}, 10)} == {0: 10, 1: 1}
    # an offset past the last event (the fuzzer's uint64 max once overflowed the event key) plans nothing new
    assert {o.partition: o.end for o in sink.offsets({0: 2**64 - 1}, 10)} == {0: 2**64 - 1, 1: 1}


def test_plan_ends_never_stalls_on_an_entry_larger_than_the_budget():
    assert plan_ends({0: [(7, 500), (8, 1)]}, 10) == {0: 7}
    assert plan_ends({0: [(1, 3), (2, 3)], 1: [(4, 3)]}, 6) == {0: 1, 1: 4}
    assert plan_ends({0: [], 1: [(2, 1), (9, 0)]}, 6) == {1: 9}


def test_retention_trims_old_entries_and_a_read_of_them_says_so(tmp_path):
    sink = opened(tmp_path, retain_entries="5")
    sink.deliver(DeliveryBatch([event(0, i) for i in range(1, 21)], {0: 20}))
    sink.flush()
    assert [c.index for c in sink.changes(0, 15, 20)] == [16, 17, 18, 19, 20]
    assert sink.offsets({}, 0)[0].earliest == 15
    with pytest.raises(InvalidRequest, match="no longer retained"):
        list(sink.changes(0, 3, 20))


def test_resyncs_are_kept_with_the_events_they_stand_for_and_listed_by_offsets(tmp_path):
    sink = opened(tmp_path, retain_entries="10")
    sink.deliver(DeliveryBatch([event(0, 3)], {0: 3}))
    sink.deliver(DeliveryBatch([event(0, 9)], {0: 9}, resyncs={0: 3}))  # a snapshot at 9, against the copy at 3
    sink.deliver(DeliveryBatch([event(1, 4)], {1: 4}, resyncs={1: 0}))  # a new learner: against an empty copy
    sink.flush()
    sink.close()
    sink = opened(tmp_path, retain_entries="10")
    resyncs = {o.partition: [(r.base, r.index) for r in o.resyncs] for o in sink.offsets({}, 0)}
    assert resyncs == {0: [(3, 9)], 1: [(0, 4)]}
    sink.deliver(DeliveryBatch([event(0, 15)], {0: 15}, resyncs={0: 12}))
    sink.deliver(DeliveryBatch([], {0: 19}))  # retention now keeps index > 9: the first re-sync goes with it
    sink.flush()
    assert [(r.base, r.index) for r in sink.offsets({}, 0)[0].resyncs] == [(12, 15)]


@pytest.mark.parametrize("config, message", [
    ({}, "option 'path' is required: path=DIR"),
    ({"path": "x", "retain_entries": "many"}, "option 'retain_entries': expected an integer, got 'many'"),
    ({"path": "x", "retain_entries": "0"}, "option 'retain_entries': must be at least 1"),
    ({"path": "x", "retain": "5"}, "unknown option 'retain'"),
])
def test_bad_options_are_named(tmp_path, config, message):
    if "path" in config:
        config = {**config, "path": str(tmp_path / config["path"])}
    with pytest.raises(ConfigError, match=message):
        ChangelogSink().open(config)
