"""raftkv.core.overlay: an engine's view plus recorded writes, read one key at a time or many at once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from raftkv.core.commands import Delete, DeleteRange, Put, PutMany
from raftkv.core.overlay import Overlay
from tests.test_change_capture import keys, mutations, put_manys, values


class Store:
    """A dict standing for the engine, counting the reads that reach it."""

    def __init__(self, data: dict[bytes, bytes]):
        self.data = data
        self.read_many_calls: list[list[bytes]] = []

    def read(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def read_many(self, keys: list[bytes]) -> list[bytes | None]:
        self.read_many_calls.append(keys)
        return [self.data.get(k) for k in keys]

    def scan(self, start: bytes, end: bytes):
        return iter(sorted((k, v) for k, v in self.data.items() if start <= k < end))

    def overlay(self) -> Overlay:
        return Overlay(self.read, self.scan, self.read_many)


def naive(stored: dict[bytes, bytes], recorded: list) -> dict[bytes, bytes]:
    state = dict(stored)
    for m in recorded:
        if type(m) is DeleteRange:
            state = {k: v for k, v in state.items() if not m.start <= k < m.end}
        elif type(m) is Delete:
            state.pop(m.key, None)
        else:
            state.update(m.pairs() if type(m) is PutMany else [(m.key, m.value)])
    return state


@given(st.dictionaries(keys, values), st.lists(st.lists(mutations | put_manys, max_size=3), max_size=4),
       st.lists(keys, max_size=8))
def test_get_many_reads_what_get_reads_with_one_call_for_the_undecided_keys(stored, rounds, wanted):
    """Mutations recorded between reads are spelled out on the next read, whichever kind it is."""
    store = Store(stored)
    overlay = store.overlay()
    recorded = []
    for more in rounds:
        for m in more:
            overlay.record(m)
        recorded += more
        expected = naive(stored, recorded)
        store.read_many_calls.clear()
        assert overlay.get_many(wanted) == [expected.get(k) for k in wanted] == [overlay.get(k) for k in wanted]
        [asked] = store.read_many_calls
        assert asked == [k for k in wanted if not decided(k, recorded)]
        assert list(overlay.items_in(b"b", b"e")) == sorted((k, v) for k, v in expected.items() if b"b" <= k < b"e")
    assert overlay.mutations == recorded


def decided(key: bytes, recorded: list) -> bool:
    """Whether a recorded write says what `key` holds (then the engine need not be asked)."""
    for m in recorded:
        if type(m) is DeleteRange:
            if m.start <= key < m.end:
                return True
        elif type(m) is PutMany:
            if key in m.split()[0]:
                return True
        elif m.key == key:
            return True
    return False


def test_get_many_of_no_keys_of_repeated_keys_and_of_empty_values():
    store = Store({b"a": b"1", b"e": b""})
    overlay = store.overlay()
    assert overlay.get_many([]) == []
    overlay.record(Put(b"b", b""))
    assert overlay.get_many([b"a", b"b", b"a", b"z", b"e"]) == [b"1", b"", b"1", None, b""]
    assert store.read_many_calls == [[], [b"a", b"a", b"z", b"e"]]
