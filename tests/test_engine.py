"""Tests for raftkv.storage.engine (MemoryEngine, KeyRange, prefix_end) and raftkv.storage.rocks_engine.RocksEngine.

The shared tests run against both engines: MemoryEngine is RocksEngine's twin,
so the two must agree on every get, scan and write.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from raftkv.core.commands import Delete, DeleteRange, Put
from raftkv.storage.engine import ZERO, KeyRange, MemoryEngine, Position, prefix_end
from raftkv.storage.rocks_engine import RocksEngine

# --- prefix_end and KeyRange -------------------------------------------------


@pytest.mark.parametrize(
    "prefix, end",
    [
        (b"a", b"b"),
        (b"a\xff", b"b"),
        (b"a\xff\xff", b"b"),
        (b"ab", b"ac"),
        (b"\x00", b"\x01"),
        (b"\xfe", b"\xff"),
        (b"a\xfe\xff", b"a\xff"),
        (b"\xff", None),
        (b"\xff\xff", None),
        (b"", None),
    ],
)
def test_prefix_end_known_values(prefix, end):
    assert prefix_end(prefix) == end


@given(st.binary(max_size=6), st.binary(max_size=6))
def test_every_key_with_the_prefix_is_below_prefix_end(prefix, suffix):
    end = prefix_end(prefix)
    key = prefix + suffix
    assert key >= prefix
    assert end is None or key < end


@given(st.binary(max_size=6), st.binary(max_size=8))
def test_prefix_end_splits_keys_exactly_into_with_and_without_the_prefix(prefix, key):
    """[prefix, prefix_end) holds exactly the keys that start with prefix."""
    in_range = KeyRange(prefix, prefix_end(prefix)).contains(key)
    assert in_range == key.startswith(prefix)


@given(st.binary(min_size=1, max_size=6))
def test_prefix_end_increments_the_last_byte_below_ff_and_drops_what_follows(prefix):
    end = prefix_end(prefix)
    if end is None:
        assert set(prefix) == {0xFF}
    else:
        assert end > prefix and not end.startswith(prefix)
        assert len(end) <= len(prefix)
        assert set(prefix[len(end):]) <= {0xFF}
        assert end[:-1] == prefix[: len(end) - 1]
        assert end[-1] == prefix[len(end) - 1] + 1


def test_key_range_contains_is_half_open_and_unbounded_when_end_is_none():
    r = KeyRange(b"b", b"d")
    assert [r.contains(k) for k in (b"a", b"b", b"c", b"czz", b"d", b"e")] == [False, True, True, True, False, False]
    assert KeyRange(b"b").contains(b"\xff" * 10)
    assert KeyRange().contains(b"")
    assert not KeyRange(b"b", b"b").contains(b"b")


# --- shared engine tests -----------------------------------------------------


@pytest.fixture(params=["memory", "rocks"])
def engine(request, tmp_path):
    if request.param == "memory":
        e = MemoryEngine()
    else:
        e = RocksEngine(tmp_path / "partition")
    yield e
    e.close()


def scan(engine, key_range=KeyRange()) -> list[tuple[bytes, bytes]]:
    _, items = engine.scan(key_range)
    return list(items)


KEYS = [b"", b"\x00", b"a", b"a\x00", b"ab", b"abc", b"b", b"ba", b"c", b"\xff", b"\xff\xff"]


@pytest.fixture
def filled(engine):
    engine.write([Put(k, b"v" + k) for k in reversed(KEYS)], Position(1, 1))
    return engine


def test_a_new_engine_is_empty_at_position_zero(engine):
    assert engine.position == ZERO == Position(0, 0)
    assert engine.get(b"a") is None
    assert scan(engine) == []
    pos, items = engine.scan(KeyRange())
    assert pos == ZERO and list(items) == []


def test_get_returns_written_values_including_empty_and_binary(engine):
    engine.write([Put(b"k", b"v"), Put(b"empty", b""), Put(b"\x00\xff", b"\xff\x00")], Position(3, 2))
    assert engine.get(b"k") == b"v"
    assert engine.get(b"empty") == b""
    assert engine.get(b"\x00\xff") == b"\xff\x00"
    assert engine.get(b"missing") is None
    assert engine.position == Position(3, 2)


def test_get_many_answers_each_key_in_order(engine):
    engine.write([Put(b"k", b"v"), Put(b"empty", b""), Put(b"\x00\xff", b"\xff\x00")], Position(3, 2))
    assert engine.get_many([b"missing", b"k", b"empty", b"k", b"\x00\xff"]) == [None, b"v", b"", b"v", b"\xff\x00"]
    assert engine.get_many([]) == []


def test_full_scan_is_in_bytewise_key_order(filled):
    assert scan(filled) == [(k, b"v" + k) for k in sorted(KEYS)]


@pytest.mark.parametrize(
    "key_range, expected",
    [
        (KeyRange(b"a", b"b"), [b"a", b"a\x00", b"ab", b"abc"]),
        (KeyRange(b"a\x00", b"abc"), [b"a\x00", b"ab"]),
        (KeyRange(b"aa", b"b"), [b"ab", b"abc"]),
        (KeyRange(b"b"), [b"b", b"ba", b"c", b"\xff", b"\xff\xff"]),
        (KeyRange(b"", b"a"), [b"", b"\x00"]),
        (KeyRange(b"\xff"), [b"\xff", b"\xff\xff"]),
        (KeyRange(b"c", b"c"), []),
        (KeyRange(b"c", b"a"), []),
        (KeyRange(b"zz", b"\xff"), []),
        (KeyRange(b"a", b"b", limit=2), [b"a", b"a\x00"]),
        (KeyRange(b"a", b"b", limit=4), [b"a", b"a\x00", b"ab", b"abc"]),
        (KeyRange(b"a", b"b", limit=100), [b"a", b"a\x00", b"ab", b"abc"]),
        (KeyRange(limit=1), [b""]),
        (KeyRange(b"ab", prefix_end(b"ab")), [b"ab", b"abc"]),
        (KeyRange(b"\xff", prefix_end(b"\xff")), [b"\xff", b"\xff\xff"]),
    ],
)
def test_scan_ranges_are_half_open_and_limited(filled, key_range, expected):
    assert [k for k, _ in scan(filled, key_range)] == expected


def test_scan_reports_the_position_of_its_view(engine):
    engine.write([Put(b"a", b"1")], Position(5, 2))
    pos, items = engine.scan(KeyRange())
    assert pos == Position(5, 2)
    assert list(items) == [(b"a", b"1")]


def test_write_records_the_position_even_with_no_mutations(engine):
    engine.write([Put(b"a", b"1")], Position(1, 1))
    engine.write([], Position(2, 3))
    assert engine.position == Position(2, 3)
    assert engine.get(b"a") == b"1"


def test_delete_removes_one_key_and_ignores_missing_keys(filled):
    filled.write([Delete(b"ab"), Delete(b"nope")], Position(2, 1))
    assert filled.get(b"ab") is None
    assert filled.get(b"abc") == b"vabc"
    assert [k for k, _ in scan(filled)] == [k for k in sorted(KEYS) if k != b"ab"]


@pytest.mark.parametrize(
    "start, end, removed",
    [
        (b"a", b"b", {b"a", b"a\x00", b"ab", b"abc"}),
        (b"a\x00", b"ab", {b"a\x00"}),
        (b"", b"\x00", {b""}),
        (b"b", b"\xff\xff\xff", {b"b", b"ba", b"c", b"\xff", b"\xff\xff"}),
        (b"c", b"c\x00", {b"c"}),
        (b"bb", b"bz", set()),
        (b"c", b"c", set()),
    ],
)
def test_delete_range_removes_exactly_the_half_open_range(filled, start, end, removed):
    filled.write([DeleteRange(start, end)], Position(2, 1))
    assert [k for k, _ in scan(filled)] == [k for k in sorted(KEYS) if k not in removed]


def test_mutations_in_one_write_apply_in_order(engine):
    engine.write([Put(b"a", b"1"), Delete(b"a"), Delete(b"b"), Put(b"b", b"2")], Position(1, 1))
    engine.write([Put(b"c", b"3"), DeleteRange(b"a", b"d"), Put(b"c", b"4")], Position(2, 1))
    assert scan(engine) == [(b"c", b"4")]
    engine.write([Put(b"c", b"5"), Put(b"c", b"6")], Position(3, 1))
    assert engine.get(b"c") == b"6"


def test_a_checkpoint_installed_brings_back_its_keys_metadata_and_position_and_none_the_empty_state(
        filled, tmp_path):
    """What a replica's snapshot and roll-back do to its engine, on either engine (the metadata read
    between the steps: RocksEngine keeps it until the next change)."""
    filled.write([Put(b"a", b"old")], Position(2, 1), {b"learner": b"x"})
    assert filled.meta_items() == [(b"learner", b"x")]
    assert filled.checkpoint(tmp_path / "checkpoint") == Position(2, 1)
    filled.write([Put(b"a", b"new"), Put(b"later", b"1")], Position(3, 2), {b"learner": None})
    assert filled.meta_items() == []

    assert filled.install(tmp_path / "checkpoint") == filled.position == Position(2, 1)
    assert (filled.get(b"a"), filled.get(b"later"), filled.meta_items()) == (b"old", None, [(b"learner", b"x")])
    assert len(scan(filled)) == len(KEYS)
    assert filled.install(None) == filled.position == ZERO
    assert (scan(filled), filled.meta_items()) == ([], [])


def test_scan_iterator_is_lazy_and_can_be_abandoned(filled):
    _, items = filled.scan(KeyRange())
    assert next(items) == (b"", b"v")
    del items
    filled.write([Put(b"new", b"1")], Position(2, 1))
    assert filled.get(b"new") == b"1"


# --- the twins agree on random histories -------------------------------------

twin_keys = st.sampled_from([b"", b"a", b"a\x00", b"ab", b"b", b"b\xff", b"c", b"\xff"])
twin_mutations = st.one_of(
    st.builds(Put, twin_keys, st.binary(max_size=3)),
    st.builds(Delete, twin_keys),
    # start < end: check_command guarantees it before a range reaches an engine.
    st.tuples(twin_keys, twin_keys).filter(lambda r: r[0] < r[1]).map(lambda r: DeleteRange(*r)),
)
twin_scans = st.builds(
    KeyRange, twin_keys, st.none() | twin_keys, st.integers(0, 4)
)


@given(st.lists(st.lists(twin_mutations, max_size=5), max_size=6), st.lists(twin_scans, min_size=1, max_size=4))
@settings(max_examples=100, deadline=None)
def test_memory_and_rocks_engines_agree_on_random_histories(writes, scans):
    folder = tempfile.mkdtemp(prefix="raftkv-twin-")
    rocks, memory = RocksEngine(Path(folder) / "p"), MemoryEngine()
    try:
        for i, mutations in enumerate(writes, start=1):
            for e in (rocks, memory):
                e.write(mutations, Position(i, 1))
        for key_range in scans:
            assert scan(rocks, key_range) == scan(memory, key_range)
        for key in [b"", b"a", b"a\x00", b"ab", b"b", b"b\xff", b"c", b"\xff"]:
            assert rocks.get(key) == memory.get(key)
        assert rocks.position == memory.position
    finally:
        rocks.close()
        shutil.rmtree(folder, ignore_errors=True)
