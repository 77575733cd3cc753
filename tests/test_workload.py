"""The chaos workload's pure parts: what an error means for an op, and key rotation."""

from __future__ import annotations

import random

import pytest

from raftkv.chaos.history import Op
from raftkv.chaos.workload import RegisterKeys, outcome
from raftkv.core.errors import (
    CorruptData, InvalidRequest, NotLeader, StorageFull, Timeout, Unavailable, Undetermined,
)


@pytest.mark.parametrize("error, status", [
    (None, "ok"),
    (Unavailable("no leader"), "fail"),
    (NotLeader(0, None), "fail"),
    (InvalidRequest("too big"), "fail"),
    (StorageFull("disk full"), "fail"),
    (Undetermined("lost the connection"), "info"),
    (Timeout("read did not complete"), "info"),
    (CorruptData("a node stopped"), "info"),
    (ConnectionResetError(), "info"),
])
def test_only_errors_that_mean_nothing_was_written_fail_an_op(error, status):
    assert outcome(error) == status


def op(key: str, f: str, status: str) -> Op:
    return Op(0, f, key, 1 if f == "write" else None, None, 0, None if status == "info" else 1, status)


def test_a_key_is_retired_after_its_share_of_ops_or_of_maybe_applied_writes():
    keys = RegisterKeys(slots=1, ops_per_key=5, infos_per_key=2)
    rng = random.Random(0)
    first = keys.pick(rng)
    for _ in range(4):
        keys.record(first, op(first, "read", "ok"))
    assert keys.pick(rng) == first
    keys.record(first, op(first, "read", "ok"))
    second = keys.pick(rng)
    assert second != first
    keys.record(second, op(second, "read", "info"))  # an info read constrains nothing
    keys.record(second, op(second, "write", "info"))
    assert keys.pick(rng) == second
    keys.record(second, op(second, "write", "info"))
    assert keys.pick(rng) not in (first, second)
