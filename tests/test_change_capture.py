"""change_capture against the voters' state machine: events replay to the same state."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learners.change_capture import EntryContext, capture_entry, capture_snapshot, pending_view
from learners.change_event import ChangeEvent
from raftkv.core.commands import Batch, Cas, Delete, DeleteRange, Put, PutMany
from raftkv.storage.engine import KeyRange, MemoryEngine, Position
from raftkv.storage import rocks_memory
from raftkv.storage.rocks_engine import RocksEngine
from raftkv.core.state_machine import apply_proposal

ROOT = Path(__file__).resolve().parents[1]

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


def test_a_snapshot_diff_holds_the_difference_not_the_copy_nor_its_blocks(tmp_path):
    """The lose-last-second hour: a learner re-synced partitions 281 times. Each diff held the copy as a
    dict, and filled the process's block cache with blocks of databases deleted right after: the
    learners' RSS grew by the cache's 64 MiB over the hour, 100 to 175 MiB. In a process of its own: in
    a full run this process's cache is full of other tests' blocks, and a diff's would only evict them."""
    measured = subprocess.run([sys.executable, "-c", "import sys; from tests.test_change_capture import "
                               "diff_measured; diff_measured(sys.argv[1])", str(tmp_path)],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert measured.returncode == 0, measured.stderr[-3000:]


def diff_measured(folder: str) -> None:
    copy, snapshot = RocksEngine(Path(folder) / "copy"), RocksEngine(Path(folder) / "snapshot")
    try:
        rows = [Put(b"key-%06d" % i, b"v" * 100) for i in range(50_000)]
        copy.write(rows + [Put(b"only-in-copy", b"x")], Position(1, 1))
        snapshot.write(rows + [Put(b"key-000007", b"new")], Position(9, 2))
        for engine in (copy, snapshot):  # a checkpoint flushes the memtable: the scans read table files
            engine.checkpoint(Path(folder) / f"{engine.folder.name}-flushed")
        cached = rocks_memory.usage()[0]
        tracemalloc.start()
        try:
            events = capture_snapshot(copy, snapshot, ctx(9))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert [(e.op, e.key) for e in events] == [("r", b"key-000007"), ("d", b"only-in-copy")]
        assert peak < 1024 * 1024, f"{peak} bytes held for a diff of two rows"
        # 10 MB of blocks read: kept, they took 5.9 MB of the cache; RocksDB's own threads may add an index
        # block or two meanwhile
        assert rocks_memory.usage()[0] - cached < 512 * 1024, rocks_memory.usage()[0] - cached
    finally:
        copy.close()
        snapshot.close()


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


def naive_capture(state: dict[bytes, bytes], commands, ctx: EntryContext) -> list[ChangeEvent]:
    """The row-by-row twin: each row read from and written to a dict of the copy, one after another."""
    events: list[ChangeEvent] = []

    def event(op: str, key: bytes, before: bytes | None, after: bytes | None) -> None:
        events.append(ChangeEvent(op, key, before, after, ctx.cluster, ctx.partition, ctx.index, ctx.term,
                                  len(events), False, ctx.ts_ms))

    for m in apply_proposal(state.get, commands).mutations:
        if type(m) is DeleteRange:
            for key in sorted(k for k in state if m.start <= k < m.end):
                event("d", key, state.pop(key), None)
        elif type(m) is Delete:
            if m.key in state:
                event("d", m.key, state.pop(m.key), None)
        else:
            for key, value in m.pairs() if type(m) is PutMany else [(m.key, m.value)]:
                event("u" if key in state else "c", key, state.get(key), value)
                state[key] = value
    return events


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(keys, values), entries)
def test_the_bulk_capture_gives_the_row_by_row_events(initial, batch):
    copy = MemoryEngine()
    copy.write([Put(k, v) for k, v in initial.items()], Position(1, 1))
    view, state = pending_view(copy), dict(initial)
    for index, proposal in enumerate(batch, start=2):
        assert list(capture_entry(view, proposal, ctx(index))) == naive_capture(state, proposal, ctx(index))


@pytest.fixture(params=["memory", "rocks"])
def copy(request, tmp_path):
    engine = MemoryEngine() if request.param == "memory" else RocksEngine(tmp_path / "copy")
    engine.write([Put(b"a", b"0"), Put(b"b", b"0"), Put(b"c", b"0")], Position(1, 1))
    yield engine
    engine.close()


BATCH = [  # entries 2-5, computed in one batch against the copy {a, b, c: 0}
    [PutMany.of([b"a", b"d", b"e"], [b"1", b"1", b""])],
    [Put(b"d", b"2"), PutMany.of([b"a", b"f", b"a", b"d"], [b"2", b"2", b"3", b"3"]), Delete(b"zz")],
    [Delete(b"b"), Delete(b"b"), Put(b"b", b"4"), DeleteRange(b"c", b"e"), PutMany.of([b"c", b"e"], [b"4", b"4"])],
    [DeleteRange(b"a", b"f"), Delete(b"f"), Delete(b"f"), PutMany.of([b"f", b"f"], [b"5", b"6"])],
]
EXPECTED = [
    [("u", b"a", b"0", b"1"), ("c", b"d", None, b"1"), ("c", b"e", None, b"")],
    [("u", b"d", b"1", b"2"), ("u", b"a", b"1", b"2"), ("c", b"f", None, b"2"), ("u", b"a", b"2", b"3"),
     ("u", b"d", b"2", b"3")],
    [("d", b"b", b"0", None), ("c", b"b", None, b"4"), ("d", b"c", b"0", None), ("d", b"d", b"3", None),
     ("c", b"c", None, b"4"), ("u", b"e", b"", b"4")],
    [("d", b"a", b"3", None), ("d", b"b", b"4", None), ("d", b"c", b"4", None), ("d", b"e", b"4", None),
     ("d", b"f", b"2", None), ("c", b"f", None, b"5"), ("u", b"f", b"5", b"6")],
]


def test_a_batch_sees_its_own_earlier_writes_row_by_row(copy):
    """Later entries of one batch overwrite what earlier ones wrote (an empty value is a value); deletes
    of absent keys yield nothing; delete-ranges remove pending and stored keys alike; a PutMany's
    repeated key sees its earlier row."""
    view, state = pending_view(copy), {b"a": b"0", b"b": b"0", b"c": b"0"}
    for index, (proposal, expected) in enumerate(zip(BATCH, EXPECTED), start=2):
        events = list(capture_entry(view, proposal, ctx(index)))
        assert events == naive_capture(state, proposal, ctx(index))
        assert [(e.op, e.key, e.before, e.after) for e in events] == expected
        assert [e.seq for e in events] == list(range(len(expected))) and {e.index for e in events} == {index}
    copy.write(view.mutations, Position(5, 1))
    assert dict(copy.scan(KeyRange())[1]) == state == {b"f": b"6"}
