"""Tests for raftkv.chaos.set_check: lost and phantom adds against the final read."""

from __future__ import annotations

import pytest

from raftkv.chaos.history import Op
from raftkv.chaos.set_check import check_set


def add(value, invoke, complete, *, status=None, key="s"):
    return Op(0, "add", key, value, None, invoke, complete, status or ("info" if complete is None else "ok"))


def read_all(values, invoke, complete, *, status=None, key="s"):
    result = frozenset(values) if values is not None else None
    return Op(99, "read_all", key, None, result, invoke, complete, status or ("info" if complete is None else "ok"))


def test_every_acknowledged_add_in_the_final_read_passes():
    result = check_set([add(1, 0, 10), add(2, 5, 15), read_all({1, 2}, 100, 110)])
    assert result.ok and result.unknown == ()
    assert (result.keys_checked, result.ops_checked) == (1, 3)


@pytest.mark.parametrize("final", [{1}, {1, 2}], ids=["absent", "present"])
def test_an_info_add_may_be_there_or_not(final):
    assert check_set([add(1, 0, 10), add(2, 5, None), read_all(final, 100, 110)]).ok


def test_a_failed_add_absent_from_the_read_passes():
    assert check_set([add(1, 0, 10), add(2, 5, 8, status="fail"), read_all({1}, 100, 110)]).ok


def test_an_acknowledged_add_missing_from_the_final_read_is_a_lost_write():
    lost = add(2, 5, 15)
    final = read_all({1, 3}, 100, 110)
    result = check_set([add(1, 0, 10), lost, add(3, 6, 16), add(4, 7, 17), final])
    (violation,) = result.violations
    assert (violation.check, violation.key) == ("lost-write", "s")
    assert violation.detail == "acknowledged adds missing from the final read_all: 2, 4 (2 of 4)"
    assert violation.ops[0] == lost and violation.ops[-1] == final


def test_a_value_never_added_is_a_phantom():
    (violation,) = check_set([add(1, 0, 10), read_all({1, 7}, 100, 110)]).violations
    assert violation.check == "phantom-read"
    assert violation.detail == "the final read_all holds values no add could have written: 7 (never added)"


def test_a_failed_add_present_in_the_read_is_a_phantom():
    failed = add(2, 5, 8, status="fail")
    (violation,) = check_set([add(1, 0, 10), failed, read_all({1, 2}, 100, 110)]).violations
    assert violation.check == "phantom-read" and "2 (its add failed)" in violation.detail
    assert failed in violation.ops


def test_the_last_acknowledged_read_all_is_the_final_one():
    ops = [add(1, 0, 10), read_all(set(), 5, 8), read_all(None, 120, 130, status="fail"), read_all({1}, 100, 110)]
    assert check_set(ops).ok
    stale_last = [add(1, 0, 10), read_all({1}, 20, 30), read_all(set(), 100, 110)]
    assert [v.check for v in check_set(stale_last).violations] == ["lost-write"]


def test_an_add_concurrent_with_the_final_read_is_not_judged():
    assert check_set([add(1, 0, 10), add(2, 95, 105), read_all({1}, 100, 110)]).ok


def test_without_an_acknowledged_read_all_the_set_is_unchecked_and_that_is_a_violation():
    timed_out = read_all(None, 100, None)
    (violation,) = check_set([add(1, 0, 10), timed_out]).violations
    assert (violation.check, violation.key, violation.ops) == ("no-final-read", "s", (timed_out,))
    assert "none of its 1 adds was checked" in violation.detail


def test_sets_are_checked_independently():
    ops = [add(1, 0, 10, key="a"), read_all({1}, 20, 30, key="a"),
           add(2, 0, 10, key="b"), read_all(set(), 20, 30, key="b")]
    result = check_set(ops)
    assert [(v.check, v.key) for v in result.violations] == [("lost-write", "b")]
    assert result.keys_checked == 2


def test_a_long_list_of_lost_values_is_cut_short():
    ops = [add(v, 0, 10) for v in range(25)] + [read_all(set(), 100, 110)]
    (violation,) = check_set(ops).violations
    assert violation.detail.endswith(": 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 15 more (25 of 25)")


def test_duplicate_adds_and_register_ops_are_refused():
    with pytest.raises(ValueError, match="added to 's' twice"):
        check_set([add(1, 0, 10), add(1, 20, 30), read_all({1}, 100, 110)])
    with pytest.raises(ValueError, match="not a set op"):
        check_set([Op(0, "write", "s", 1, None, 0, 1, "ok")])


def test_a_value_added_only_after_the_read_returned_is_a_phantom():
    (violation,) = check_set([add(1, 0, 10), add(5, 200, 210), read_all({1, 5}, 100, 110)]).violations
    assert violation.check == "phantom-read" and "5 (added after the read)" in violation.detail
