"""Tests for raftkv.chaos.linearizability: known verdicts, and histories of a correct register."""

from __future__ import annotations

import itertools
import random
import time

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from raftkv.chaos.history import Op
from raftkv.chaos.linearizability import check_register


def _status(complete, status):
    return status or ("info" if complete is None else "ok")


def write(value, invoke, complete, *, client=0, status=None, key="k"):
    return Op(client, "write", key, value, None, invoke, complete, _status(complete, status))


def read(result, invoke, complete, *, client=0, status=None, key="k"):
    return Op(client, "read", key, None, result, invoke, complete, _status(complete, status))


def cas(expected, new, swapped, invoke, complete, *, client=0, status=None, key="k"):
    return Op(client, "cas", key, (expected, new), swapped, invoke, complete, _status(complete, status))


LINEARIZABLE = {
    "a read of an absent key": [read(None, 0, 10)],
    "a write, then a read of it": [write(1, 0, 10), read(1, 20, 30)],
    "reads during a write see the old value, then the new": [
        write(1, 0, 10), write(2, 20, 100, client=1), read(1, 30, 40, client=2), read(2, 50, 60, client=2),
    ],
    # Porcupine's register test: the read that returns first may still be linearized second.
    "porcupine: overlapping reads of old and new": [
        write(0, 0, 5), write(100, 10, 100, client=1), read(100, 25, 75, client=2), read(0, 30, 60, client=3),
    ],
    "a cas from the current value": [write(1, 0, 10), cas(1, 2, True, 20, 30), read(2, 40, 50)],
    "a cas from the absent value": [cas(None, 1, True, 0, 10), read(1, 20, 30)],
    "a cas that fails because the value differs": [write(1, 0, 10), cas(5, 2, False, 20, 30), read(1, 40, 50)],
    "an op invoked at the instant another returned may precede it": [write(1, 0, 10), read(None, 10, 20, client=1)],
    "failed ops never happened": [
        write(5, 0, 10, status="fail"), read(None, 20, 30), cas(None, 6, None, 40, 50, status="fail"),
    ],
    # These hold only because an info op may take effect any time after its call, or never.
    "an info write takes effect long after its call": [
        write(1, 0, 10), write(2, 20, None), read(1, 30, 40, client=1), read(2, 1000, 1010, client=1),
    ],
    "an info write never takes effect": [write(1, 0, 10), write(2, 20, None), read(1, 1000, 1010, client=1)],
    "an info cas that swapped": [write(1, 0, 10), cas(1, 2, None, 20, None), read(2, 100, 110, client=1)],
    "an info cas that did not": [write(1, 0, 10), cas(1, 2, None, 20, None), read(1, 100, 110, client=1)],
    "an info write lets a later cas fail": [
        write(1, 0, 10), write(2, 20, None), cas(1, 3, False, 30, 40, client=1),
        write(1, 50, 60, client=1), read(1, 70, 80, client=1),
    ],
}

NOT_LINEARIZABLE = {
    "a read of a value never written": ([write(1, 0, 10), read(3, 20, 30, client=1)], "client 1 read -> 3"),
    "a stale read after an acknowledged write": (
        [write(1, 0, 10), write(2, 20, 30), read(1, 40, 50, client=2)], "client 2 read -> 1",
    ),
    "a read of an absent key after an acknowledged write": (
        [write(1, 0, 10), read(None, 11, 20, client=1)], "read -> None",
    ),
    # Porcupine's register test: a read sees the new value, a later one the old.
    "porcupine: reads see a write, then unsee it": (
        [write(0, 0, 5), write(200, 6, 100, client=1), read(200, 10, 30, client=2), read(0, 40, 90, client=2)],
        "client 2 read -> 0",
    ),
    "a cas succeeds from a value that was not current": (
        [write(1, 0, 10), write(2, 20, 30), cas(1, 3, True, 40, 50, client=1)], "client 1 cas 1 -> 3 = True",
    ),
    "a cas fails although its expected value was current": (
        [write(1, 0, 10), cas(1, 2, False, 20, 30, client=1)], "client 1 cas 1 -> 2 = False",
    ),
    "a read of a failed write's value": ([write(2, 0, 10, status="fail"), read(2, 20, 30, client=1)], "read -> 2"),
    "an info write read before its call": (
        [write(1, 0, 5), read(2, 10, 20, client=1), write(2, 30, None)], "client 1 read -> 2",
    ),
    "an info write, once seen, cannot be unseen": (
        [write(1, 0, 10), write(2, 20, None), read(2, 30, 40, client=1), read(1, 50, 60, client=1)],
        "client 1 read -> 1",
    ),
    "two info cas cannot both swap from the same value": (
        [write(1, 0, 10), cas(1, 2, None, 20, None), cas(1, 3, None, 20, None, client=1),
         read(2, 30, 40, client=2), read(3, 50, 60, client=2)],
        "client 2 read -> 3",
    ),
}


@pytest.mark.parametrize("ops", LINEARIZABLE.values(), ids=LINEARIZABLE.keys())
def test_linearizable_histories_pass(ops):
    result = check_register(ops)
    assert result.ok and not result.unknown
    assert (result.keys_checked, result.ops_checked) == (1, len(ops))


@pytest.mark.parametrize("ops, culprit", NOT_LINEARIZABLE.values(), ids=NOT_LINEARIZABLE.keys())
def test_broken_histories_are_rejected_naming_the_op(ops, culprit):
    result = check_register(ops)
    assert not result.ok and not result.unknown
    (violation,) = result.violations
    assert (violation.check, violation.key) == ("linearizable", "k")
    assert culprit in violation.detail and "cannot be linearized" in violation.detail
    assert "\n" not in violation.detail
    assert sorted(violation.ops, key=repr) == sorted(ops, key=repr)


def test_the_detail_says_what_the_register_could_hold_and_why():
    stale = check_register([write(1, 0, 10), write(2, 20, 30), read(1, 40, 50, client=2)]).violations[0]
    assert stale.detail.startswith("client 0 write 2 (ok, ")
    assert "after 1 of 3 ops the register holds 1; it would overwrite 1, which client 2 read -> 1 (ok, " in stale.detail
    never = check_register([write(1, 0, 10), write(2, 20, 30, client=1), write(3, 20, 30, client=2),
                            read(4, 40, 50)]).violations[0]
    assert "read -> 4" in never.detail
    assert "after 3 of 4 ops the register holds 2 or 3; no op ever wrote 4" in never.detail
    failed = check_register([write(2, 0, 10, status="fail"), read(2, 20, 30)]).violations[0]
    assert "only failed ops (never applied) wrote 2" in failed.detail


def test_op_times_in_the_detail_are_milliseconds_from_the_key_s_first_call():
    ms = 1_000_000
    detail = check_register([write(1, 5 * ms, 6 * ms), read(3, 7 * ms, 9_500_000)]).violations[0].detail
    assert detail.startswith("client 0 read -> 3 (ok, +2.000 ms .. +4.500 ms) cannot be linearized")


def test_keys_are_checked_independently():
    ops = [write(1, 0, 10, key="a"), read(1, 20, 30, key="a"),
           write(1, 0, 10, key="b"), read(None, 20, 30, key="b"), read(5, 0, 100, key="c")]
    result = check_register(ops)
    assert [v.key for v in result.violations] == ["b", "c"]
    assert all(op.key == "b" for op in result.violations[0].ops)
    assert (result.keys_checked, result.ops_checked) == (3, 5)


def test_set_ops_are_refused():
    with pytest.raises(ValueError, match="not a register op"):
        check_register([Op(0, "add", "s", 1, None, 0, 1, "ok")])


def test_a_search_over_budget_makes_the_key_unknown_not_violated():
    # Either of the two reads needs its write placed last: refuting that takes every order of the other writes.
    ops = [write(v, 0, 100, client=v) for v in range(1, 13)] + [read(1, 200, 210), read(2, 220, 230)]
    over = check_register(ops, budget=1_000)
    assert over.ok and over.unknown == ("k",) and over.keys_checked == 1
    assert not check_register(ops).ok


def simulate_register(rng, *, ops, clients, keys=("k",), info_rate=0.05, fail_rate=0.05, distinct=True):
    """A history of a correct register, for some of `keys`.

    Each op takes effect at one instant within its interval; an info op at
    any time after its call, or never; a failed op never. Writes and cas
    write distinct values, or, with `distinct` false, values from 1 to 3.
    """
    counter = itertools.count(1)

    def fresh():
        return next(counter) if distinct else rng.randint(1, 3)

    free_at = [0] * clients
    planned = []
    for _ in range(ops):
        client = min(range(clients), key=free_at.__getitem__)
        invoke = free_at[client] + rng.randint(0, 3)
        complete = invoke + rng.randint(0, 20)
        free_at[client] = complete
        f = rng.choice(("read", "write", "cas"))
        status = "info" if rng.random() < info_rate else "fail" if rng.random() < fail_rate else "ok"
        effect = rng.randint(invoke, complete)
        if status == "info":
            complete = None
            effect = None if rng.random() < 0.3 else invoke + rng.randint(0, 300)
        elif status == "fail":
            effect = None
        value = fresh() if f == "write" else None
        planned.append([effect, client, f, rng.choice(keys), value, invoke, complete, status])
    register = dict.fromkeys(keys)
    seen = {key: [None] for key in keys}
    history = []
    for effect, client, f, key, value, invoke, complete, status in sorted(
        planned, key=lambda p: (p[0] is None, p[0] or 0)
    ):
        result = None
        if f == "cas":
            current = register[key] if effect is not None else None
            expected = current if rng.random() < 0.5 else rng.choice(seen[key])
            value = (expected, fresh())
            result = expected == current if status == "ok" else None
        elif f == "read" and status == "ok":
            result = register[key]
        if effect is not None and (f == "write" or (f == "cas" and value[0] == register[key])):
            register[key] = value if f == "write" else value[1]
            seen[key].append(register[key])
        history.append(Op(client, f, key, value, result, invoke, complete, status))
    return sorted(history, key=lambda op: op.invoke)


def impossible_results(read_op, history):
    """Values `read_op` cannot have seen in any linearization, if written values are distinct.

    Never written; written only by a failed op; written by an op called after
    `read_op` returned; or overwritten by an applied write before it was called.
    """
    writers = [op for op in history if op.key == read_op.key and op.f in ("write", "cas")]

    def written(op):
        return op.value if op.f == "write" else op.value[1]

    applied = [op for op in writers if op.status == "ok" and (op.f == "write" or op.result)]
    impossible = {-1} | {written(op) for op in writers if op.status == "fail" or op.invoke > read_op.complete}
    for overwriter in applied:
        if overwriter.complete < read_op.invoke:
            impossible |= {None} | {written(op) for op in applied if op.complete < overwriter.invoke}
    return sorted(impossible, key=repr)


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(1, 40), st.integers(1, 6), st.booleans())
def test_a_correct_register_passes(rng, ops, clients, distinct):
    history = simulate_register(rng, ops=ops, clients=clients, keys=("a", "b"), distinct=distinct)
    result = check_register(history)
    assert result.ok and not result.unknown


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(st.randoms(use_true_random=False), st.integers(1, 40), st.integers(1, 6), st.data())
def test_one_read_of_a_value_never_current_in_its_interval_fails_it(rng, ops, clients, data):
    history = simulate_register(rng, ops=ops, clients=clients, keys=("a", "b"))
    reads = [i for i, op in enumerate(history) if op.f == "read" and op.status == "ok"]
    assume(reads)
    i = data.draw(st.sampled_from(reads))
    bad = data.draw(st.sampled_from(impossible_results(history[i], history)))
    assert bad != history[i].result
    history[i] = Op(**{**vars(history[i]), "result": bad})
    result = check_register(history)
    assert not result.ok and not result.unknown
    assert [v.key for v in result.violations] == [history[i].key]


def test_a_600_op_history_of_8_clients_checks_quickly():
    history = simulate_register(random.Random(0), ops=600, clients=8, info_rate=0.012, fail_rate=0.02)
    assert sum(op.status == "info" and op.f != "read" for op in history) == 5
    started = time.perf_counter()
    result = check_register(history)
    assert result.ok and not result.unknown
    assert time.perf_counter() - started < 10  # a few ms; this only catches a blow-up
