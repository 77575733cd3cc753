"""Tests for raftkv.core.state_machine.apply_proposal, against a naive one-command-at-a-time model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from raftkv.core.commands import Batch, Cas, CasResult, Delete, DeleteRange, Guard, GuardedBatch, Put, PutMany
from raftkv.storage.engine import KeyRange, MemoryEngine, Position
from raftkv.core.state_machine import Applied, apply_proposal

# --- the naive model ---------------------------------------------------------


def model_apply(data: dict[bytes, bytes], command) -> CasResult | bool | None:
    """Apply one command to a plain dict, the obvious way."""
    if isinstance(command, GuardedBatch):
        if any(data.get(g.key) != g.expected for g in command.guards):
            return False
        model_apply(data, Batch(command.ops))
        return True
    if isinstance(command, Put):
        data[command.key] = command.value
    elif isinstance(command, Delete):
        data.pop(command.key, None)
    elif isinstance(command, DeleteRange):
        for key in [k for k in data if command.start <= k < command.end]:
            del data[key]
    elif isinstance(command, Batch):
        for op in command.ops:
            model_apply(data, op)
    elif isinstance(command, PutMany):
        for key, value in command.pairs():
            data[key] = value
    elif isinstance(command, Cas):
        current = data.get(command.key)
        if current != command.expected:
            return CasResult(False, current)
        if command.new is None:
            data.pop(command.key, None)
        else:
            data[command.key] = command.new
        return CasResult(True, command.new)
    return None


# --- strategies: a small alphabet so commands collide ------------------------

keys = st.sampled_from([b"a", b"ab", b"b", b"c", b"cc", b"d"])
values = st.sampled_from([b"", b"1", b"2", b"3"])
optional_values = st.none() | values
mutations = st.one_of(
    st.builds(Put, keys, values),
    st.builds(Delete, keys),
    st.builds(DeleteRange, keys, keys),
)
commands = st.one_of(
    mutations,
    st.builds(Cas, keys, optional_values, optional_values),
    st.builds(Batch, st.lists(mutations, min_size=1, max_size=4).map(tuple)),
    st.builds(GuardedBatch, st.lists(st.builds(Guard, keys, optional_values), min_size=1, max_size=2).map(tuple),
              st.lists(mutations, min_size=1, max_size=3).map(tuple)),
    st.lists(st.tuples(keys, values), min_size=1, max_size=4).map(
        lambda rows: PutMany.of([k for k, _ in rows], [v for _, v in rows])),
)


@st.composite
def proposals(draw) -> list[list]:
    """A command sequence split at random points into proposals (some may be empty barriers)."""
    cmds = draw(st.lists(commands, max_size=30))
    cuts = sorted(draw(st.lists(st.integers(0, len(cmds)), max_size=6)))
    bounds = [0, *cuts, len(cmds)]
    return [cmds[a:b] for a, b in zip(bounds, bounds[1:])]


def contents(engine: MemoryEngine) -> dict[bytes, bytes]:
    _, items = engine.scan(KeyRange())
    return dict(items)


def apply_all(engine: MemoryEngine, proposal_list: list[list]) -> list:
    results = []
    for index, proposal in enumerate(proposal_list, start=1):
        applied = apply_proposal(engine.get, proposal)
        engine.write(applied.mutations, Position(index, 1))
        results += applied.results
    return results


# --- properties --------------------------------------------------------------


@given(st.dictionaries(keys, values), proposals())
@settings(max_examples=300)
def test_applying_proposals_matches_the_naive_model(initial, proposal_list):
    engine = MemoryEngine()
    engine.write([Put(k, v) for k, v in initial.items()], Position(0, 0))
    model = dict(initial)

    expected_results = [model_apply(model, c) for p in proposal_list for c in p]
    results = apply_all(engine, proposal_list)

    assert results == expected_results
    assert contents(engine) == model
    assert engine.position == Position(len(proposal_list), 1)


@given(st.dictionaries(keys, values), st.lists(commands, max_size=20))
def test_one_proposal_equals_the_same_commands_one_entry_each(initial, cmds):
    together, apart = MemoryEngine(), MemoryEngine()
    for engine in (together, apart):
        engine.write([Put(k, v) for k, v in initial.items()], Position(0, 0))
    assert apply_all(together, [cmds]) == apply_all(apart, [[c] for c in cmds])
    assert contents(together) == contents(apart)


@given(st.dictionaries(keys, values), st.lists(commands, max_size=20))
def test_apply_only_reads_and_is_deterministic(initial, cmds):
    engine = MemoryEngine()
    engine.write([Put(k, v) for k, v in initial.items()], Position(0, 0))
    first = apply_proposal(engine.get, cmds)
    second = apply_proposal(engine.get, cmds)
    assert first == second
    assert contents(engine) == initial, "apply_proposal must not write"
    assert len(first.results) == len(cmds)
    assert all(isinstance(m, (Put, Delete, DeleteRange, PutMany)) for m in first.mutations)


# --- specific cases ----------------------------------------------------------


def run(initial: dict[bytes, bytes], cmds: list) -> tuple[Applied, dict[bytes, bytes]]:
    engine = MemoryEngine()
    engine.write([Put(k, v) for k, v in initial.items()], Position(1, 1))
    applied = apply_proposal(engine.get, cmds)
    engine.write(applied.mutations, Position(2, 1))
    return applied, contents(engine)


# A later command of a proposal sees the earlier ones: (engine before, proposal, results, engine after).
SAME_PROPOSAL = {
    "a cas after a put sees the put": (
        {b"k": b"old"}, [Put(b"k", b"mid"), Cas(b"k", b"mid", b"new")], [None, CasResult(True, b"new")],
        {b"k": b"new"}),
    "a cas after a put fails against the engine's stale value": (
        {b"k": b"old"}, [Put(b"k", b"mid"), Cas(b"k", b"old", b"new")], [None, CasResult(False, b"mid")],
        {b"k": b"mid"}),
    "a cas after a delete_range sees the key absent": (
        {b"b": b"1"}, [DeleteRange(b"a", b"c"), Cas(b"b", None, b"new")], [None, CasResult(True, b"new")],
        {b"b": b"new"}),
    "a cas after a delete_range does not see the old value": (
        {b"b": b"1"}, [DeleteRange(b"a", b"c"), Cas(b"b", b"1", b"new")], [None, CasResult(False, None)], {}),
    "a delete_range clears a put made earlier": (
        {}, [Put(b"b", b"1"), DeleteRange(b"a", b"c"), Cas(b"b", None, b"2")], [None, None, CasResult(True, b"2")],
        {b"b": b"2"}),
    "a delete_range's end is exclusive": (
        {b"c": b"1"}, [DeleteRange(b"a", b"c"), Cas(b"c", b"1", b"2")], [None, CasResult(True, b"2")],
        {b"c": b"2"}),
}


@pytest.mark.parametrize("initial, proposal, results, after", SAME_PROPOSAL.values(), ids=SAME_PROPOSAL)
def test_a_later_command_of_a_proposal_sees_the_earlier_ones(initial, proposal, results, after):
    applied, data = run(initial, proposal)
    assert applied.results == results
    assert data == after


def test_put_after_delete_range_survives():
    applied, data = run({b"a": b"1", b"b": b"1"}, [DeleteRange(b"a", b"z"), Put(b"b", b"2")])
    assert data == {b"b": b"2"}
    applied, data = run({b"a": b"1"}, [DeleteRange(b"a", b"z"), Put(b"b", b"2"), Cas(b"b", b"2", b"3")])
    assert applied.results[-1] == CasResult(True, b"3")
    assert data == {b"b": b"3"}


def test_cas_with_expected_none_succeeds_only_on_an_absent_key():
    applied, data = run({}, [Cas(b"k", None, b"v")])
    assert applied.results == [CasResult(True, b"v")]
    assert data == {b"k": b"v"}

    applied, data = run({b"k": b"v"}, [Cas(b"k", None, b"w")])
    assert applied.results == [CasResult(False, b"v")]
    assert applied.mutations == []
    assert data == {b"k": b"v"}


def test_cas_expected_empty_value_is_not_the_same_as_absent():
    applied, _ = run({}, [Cas(b"k", b"", b"v")])
    assert applied.results == [CasResult(False, None)]
    applied, data = run({b"k": b""}, [Cas(b"k", b"", b"v")])
    assert applied.results == [CasResult(True, b"v")]
    assert data == {b"k": b"v"}


def test_cas_with_new_none_deletes_the_key():
    applied, data = run({b"k": b"v", b"other": b"x"}, [Cas(b"k", b"v", None)])
    assert applied.results == [CasResult(True, None)]
    assert applied.mutations == [Delete(b"k")]
    assert data == {b"other": b"x"}


def test_cas_after_cas_delete_sees_absence():
    applied, data = run({b"k": b"v"}, [Cas(b"k", b"v", None), Cas(b"k", None, b"again")])
    assert applied.results == [CasResult(True, None), CasResult(True, b"again")]
    assert data == {b"k": b"again"}


def test_batch_ops_are_flattened_into_mutations_in_order_with_one_result():
    batch = Batch((Put(b"a", b"1"), Delete(b"b"), DeleteRange(b"c", b"d")))
    applied, _ = run({}, [batch, Put(b"e", b"2")])
    assert applied.mutations == [Put(b"a", b"1"), Delete(b"b"), DeleteRange(b"c", b"d"), Put(b"e", b"2")]
    assert applied.results == [None, None]


def test_an_empty_proposal_is_a_barrier_with_no_effect():
    applied, data = run({b"k": b"v"}, [])
    assert applied == Applied([], [])
    assert data == {b"k": b"v"}
