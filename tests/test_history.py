"""Tests for raftkv.chaos.history: what an Op may be, and histories as JSON lines."""

from __future__ import annotations

import json

import pytest

from raftkv.chaos.history import CheckResult, Op, Violation, dump_history, load_history


def test_a_history_survives_dump_and_load_exactly(tmp_path):
    ops = [
        Op(0, "write", "k", 7, None, 10, 20, "ok"),
        Op(1, "read", "k", None, None, 11, 19, "ok"),
        Op(2, "cas", "k", (None, 3), True, 12, 30, "ok"),
        Op(3, "cas", "k", (7, 8), None, 13, None, "info"),
        Op(4, "cas", "k", (7, 9), None, 14, 15, "fail"),
        Op(5, "read", "k", None, 7, 16, 40, "ok"),
        Op(6, "add", "s", 42, None, 17, None, "info"),
        Op(7, "read_all", "s", None, frozenset({1, 42, -3}), 18, 50, "ok"),
        Op(8, "read_all", "s", None, frozenset(), 19, 50, "ok"),
    ]
    path = tmp_path / "history.jsonl"
    dump_history(ops, path)
    loaded = load_history(path)
    assert loaded == ops
    assert [type(op.value) for op in loaded] == [type(op.value) for op in ops]
    assert [type(op.result) for op in loaded] == [type(op.result) for op in ops]
    assert loaded[2].result is True


def test_each_op_is_one_json_line(tmp_path):
    path = tmp_path / "history.jsonl"
    dump_history([Op(0, "write", "k", 1, None, 1, 2, "ok"), Op(1, "read", "k", None, 1, 3, 4, "ok")], path)
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[0])["f"] == "write"


def test_loading_rejects_a_malformed_op(tmp_path):
    path = tmp_path / "history.jsonl"
    dump_history([Op(0, "write", "k", 1, None, 1, 2, "ok")], path)
    path.write_text(path.read_text().replace('"ok"', '"done"'))
    with pytest.raises(ValueError, match="unknown status"):
        load_history(path)


@pytest.mark.parametrize(
    "fields, problem",
    [
        (dict(f="delete"), "unknown f"),
        (dict(status="timeout"), "unknown status"),
        (dict(status="info"), "an info op has no completion time"),
        (dict(complete=None), "status .ok. needs a completion time"),
        (dict(status="fail", complete=None), "status .fail. needs a completion time"),
        (dict(invoke=30), "completed before it was invoked"),
        (dict(f="cas", value=1, result=True), r"a cas value is \(expected, new\)"),
        (dict(f="cas", value=(1, 2), result=None), "an acknowledged cas result is a bool"),
        (dict(f="read_all", value=None, result={1, 2}), "an acknowledged read_all result is a frozenset"),
    ],
)
def test_a_malformed_op_is_refused(fields, problem):
    good = dict(client=0, f="write", key="k", value=1, result=None, invoke=10, complete=20, status="ok")
    Op(**good)
    with pytest.raises(ValueError, match=problem):
        Op(**{**good, **fields})


def test_an_op_may_return_at_the_instant_it_was_invoked():
    Op(0, "read", "k", None, None, 10, 10, "ok")


def test_a_result_is_ok_exactly_when_nothing_was_violated():
    violation = Violation("lost-write", "s", "1 missing", ())
    assert CheckResult((), ("k",), 1, 10).ok
    assert not CheckResult((violation,), (), 1, 10).ok
