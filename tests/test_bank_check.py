"""The bank checker (raftkv/chaos/bank_check.py) on hand-made histories: each anomaly it names, and none
in a clean one."""

from __future__ import annotations

import pytest

from raftkv.chaos.bank_check import check_bank
from raftkv.chaos.history import Op, dump_history, load_history

ACCOUNTS, OPENING = 3, 10


def transfer(i: int, source: int, target: int, amount: int, status: str = "ok", applied: bool = True) -> Op:
    return Op(1, "transfer", "bank0", (i, source, target, amount), applied if status == "ok" else None, 10 * i,
              None if status == "info" else 10 * i + 5, status)


def read(balances: tuple, at: int = 1) -> Op:
    return Op(2, "bank_read", "bank0", None, balances, at, at + 1, "ok")


def final(balances: tuple, recorded: set) -> Op:
    return Op(3, "bank_final", "bank0", None, (balances, frozenset(recorded)), 10_000, 10_001, "ok")


def checks(*ops: Op, may_lose: bool = False) -> list[str]:
    return [v.check for v in check_bank(ops, ACCOUNTS, OPENING, may_lose).violations]


def test_a_clean_history_passes_and_survives_its_encoding(tmp_path):
    ops = [read((10, 10, 10)), transfer(1, 0, 1, 3), transfer(2, 1, 2, 5, "info"), transfer(3, 2, 0, 1, "fail"),
           transfer(4, 0, 2, 1, applied=False), read((7, 13, 10), at=20), final((7, 8, 15), {(1, 0, 1, 3), (2, 1, 2, 5)})]
    assert checks(*ops) == []
    dump_history(ops, tmp_path / "history.jsonl")
    assert load_history(tmp_path / "history.jsonl") == ops


@pytest.mark.parametrize("balances, problem", [((10, 10), "accounts missing"), ((10, 10, 11), "a total of 31"),
                                               ((-1, 11, 20), "a negative balance")])
def test_a_read_that_sees_money_made_or_lost_is_a_violation(balances, problem):
    result = check_bank([read(balances if len(balances) == 3 else (*balances, None)), final((10, 10, 10), set())],
                        ACCOUNTS, OPENING)
    assert [v.check for v in result.violations] == ["bank-read"] and problem in result.violations[0].detail


def test_half_a_transfer_in_the_final_state_is_a_violation():
    assert checks(transfer(1, 0, 1, 3), final((7, 10, 13), {(1, 0, 1, 3)})) == ["bank-replay"]
    assert checks(transfer(1, 0, 1, 3), final((7, 10, 10), {(1, 0, 1, 3)})) == ["bank-total"]


def test_a_recorded_transfer_that_failed_or_was_refused_is_a_phantom():
    refused, failed = transfer(1, 0, 1, 3, applied=False), transfer(2, 0, 1, 1, "fail")
    assert checks(refused, failed, final((6, 14, 10), {(1, 0, 1, 3), (2, 0, 1, 1)})) == ["bank-phantom"]


def test_an_acknowledged_transfer_missing_is_lost_unless_a_power_cut_may_take_it():
    ops = (transfer(1, 0, 1, 3), final((10, 10, 10), set()))
    assert checks(*ops) == ["lost-transfer"]
    assert checks(*ops, may_lose=True) == []


def test_without_a_final_read_nothing_is_proven():
    assert checks(transfer(1, 0, 1, 3)) == ["no-final-read"]
