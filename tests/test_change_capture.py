"""change_capture against the voters' state machine: events replay to the same state."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from learners.change_capture import EntryContext, capture_entry, capture_snapshot, pending_view
from raftkv.core.commands import Batch, Cas, Delete, DeleteRange, Put, PutMany
from raftkv.storage.engine import KeyRange, MemoryEngine, Position
from raftkv.core.state_machine import apply_proposal

keys = st.sampled_from([b"a", b"b", b"c", b"d", b"e"])
values = st.sampled_from([b"1", b"2", b"3"])
mutations = st.one_of(
    st.builds(Put, keys, values),
    st.builds(Delete, keys),
    st.tuples(keys, keys).filter(lambda r: r[0] < r[1]).map(lambda r: DeleteRange(*r)),
)
put_manys = st.lists(st.tuples(keys, values), min_size=1, max_size=4).map(  # keys may repeat
    lambda rows: PutMany.of([k for k, _ in rows], [v for _, v in rows]))
commands = st.one_of(mutations, put_manys, st.builds(Cas, keys, st.none() | values, st.none() | values),
                     st.lists(mutations, min_size=1, max_size=3).map(lambda ops: Batch(tuple(ops))))
entries = st.lists(st.lists(commands, max_size=4), min_size=1, max_size=6)


def ctx(index: int) -> EntryContext:
    return EntryContext("c", 0, index, 1, 0)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(keys, values), entries)
def test_events_replay_to_what_the_voters_apply(initial, batch):
    copy, voter = MemoryEngine(), MemoryEngine()
    for engine in (copy, voter):
        engine.write([Put(k, v) for k, v in initial.items()], Position(1, 1))
    view = pending_view(copy)
    replayed = dict(initial)
    for index, proposal in enumerate(batch, start=2):
        events = capture_entry(view, proposal, ctx(index))
        voter.write(apply_proposal(voter.get, proposal).mutations, Position(index, 1))
        assert [e.seq for e in events] == list(range(len(events)))
        for e in events:
            assert e.before == replayed.get(e.key)  # the before-image is what the key held
            assert e.op == ("d" if e.after is None else "c" if e.before is None else "u")
            if e.after is None:
                replayed.pop(e.key)
            else:
                replayed[e.key] = e.after
    copy.write(view.mutations, Position(len(batch) + 1, 1))
    assert replayed == dict(voter.scan(KeyRange())[1]) == dict(copy.scan(KeyRange())[1])


@given(st.dictionaries(keys, values), st.dictionaries(keys, values))
def test_snapshot_diff_turns_the_copy_into_the_snapshot(mine, theirs):
    copy, snapshot = MemoryEngine(), MemoryEngine()
    copy.write([Put(k, v) for k, v in mine.items()], Position(1, 1))
    snapshot.write([Put(k, v) for k, v in theirs.items()], Position(9, 2))
    events = capture_snapshot(copy, snapshot, ctx(9))
    state = dict(mine)
    for e in events:
        assert e.snapshot and e.op in ("r", "d")
        if e.op == "d":
            del state[e.key]
        else:
            state[e.key] = e.after
    assert state == theirs
    assert len(events) == sum(mine.get(k) != v for k, v in theirs.items()) + len(mine.keys() - theirs.keys())


def test_a_put_many_becomes_one_event_per_row_with_before_images():
    engine = MemoryEngine()
    engine.write([Put(b"a", b"old")], Position(1, 1))
    view = pending_view(engine)
    events = capture_entry(view, [PutMany.of([b"a", b"b"], [b"new", b"1"])], EntryContext("c", 0, 2, 1, 0))
    assert [(e.op, e.key, e.before, e.after, e.seq) for e in events] == [
        ("u", b"a", b"old", b"new", 0), ("c", b"b", None, b"1", 1)]


def test_a_key_repeated_in_a_put_many_sees_its_own_earlier_row():
    view = pending_view(MemoryEngine())
    events = capture_entry(view, [PutMany.of([b"a", b"a"], [b"1", b"2"])], EntryContext("c", 0, 2, 1, 0))
    assert [(e.op, e.before, e.after) for e in events] == [("c", None, b"1"), ("u", b"1", b"2")]
