"""What a chaos run records, and what a checker says about it.

A history is a list of `Op`, one per client request. It is kept as JSON lines
so that a run can be checked again, or read by a person, later.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterable

REGISTER_FUNCTIONS = frozenset({"read", "write", "cas"})
SET_FUNCTIONS = frozenset({"add", "read_all"})
BANK_FUNCTIONS = frozenset({"bank_read", "transfer", "bank_final"})  # raftkv/chaos/bank.py
STATUSES = frozenset({"ok", "fail", "info"})


@dataclass(frozen=True)
class Op:
    """One client request and what became of it.

    `status` is "ok" when acknowledged, "fail" when definitely not applied,
    and "info" when it may or may not have been applied (a timeout,
    `Undetermined`, a crash); an info op has no completion time.
    `value` is the write's int, the cas's `(expected, new)`, the add's int,
    the transfer's `(id, from, to, amount)`, None for reads. `result` is what a
    read saw (None: the key is absent), whether an acknowledged cas or transfer
    applied, the frozenset a read_all saw, the balances a bank_read saw, the
    balances and the recorded transfers a bank_final saw, else None.
    Times are `time.monotonic_ns()`.
    """

    client: int
    f: str
    key: str
    value: object
    result: object
    invoke: int
    complete: int | None
    status: str

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem:
            raise ValueError(f"malformed op ({problem}): {self!r}")


def _problem(op: Op) -> str | None:
    if op.f not in REGISTER_FUNCTIONS | SET_FUNCTIONS | BANK_FUNCTIONS:
        return f"unknown f {op.f!r}"
    if op.status not in STATUSES:
        return f"unknown status {op.status!r}"
    if op.status == "info" and op.complete is not None:
        return "an info op has no completion time"
    if op.status != "info" and op.complete is None:
        return f"status {op.status!r} needs a completion time"
    if op.complete is not None and op.complete < op.invoke:
        return "completed before it was invoked"
    if op.f == "cas" and not (isinstance(op.value, tuple) and len(op.value) == 2):
        return "a cas value is (expected, new)"
    if op.f == "cas" and op.status == "ok" and not isinstance(op.result, bool):
        return "an acknowledged cas result is a bool"
    if op.f == "read_all" and op.status == "ok" and not isinstance(op.result, frozenset):
        return "an acknowledged read_all result is a frozenset"
    if op.f == "transfer" and not (isinstance(op.value, tuple) and len(op.value) == 4):
        return "a transfer value is (id, from, to, amount)"
    if op.f == "transfer" and op.status == "ok" and not isinstance(op.result, bool):
        return "an acknowledged transfer result is a bool"
    if op.f == "bank_read" and op.status == "ok" and not isinstance(op.result, tuple):
        return "an acknowledged bank_read result is a tuple of balances"
    if op.f == "bank_final" and op.status == "ok" and not (isinstance(op.result, tuple) and len(op.result) == 2):
        return "an acknowledged bank_final result is (balances, transfers)"
    return None


@dataclass(frozen=True)
class Violation:
    """One thing a check found wrong; `key` says where (a register key, a set name)."""

    check: str  # which check: "linearizable", "lost-write", "phantom-read", "no-final-read", ...
    key: str
    detail: str  # one line for a person
    ops: tuple[Op, ...]  # the ops that show it


@dataclass(frozen=True)
class CheckResult:
    """What a checker found in a history."""

    violations: tuple[Violation, ...]
    unknown: tuple[str, ...]  # keys too costly to decide: neither proven nor refuted
    keys_checked: int
    ops_checked: int

    @property
    def ok(self) -> bool:
        return not self.violations


def dump_history(ops: Iterable[Op], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as out:
        for op in ops:
            out.write(op_line(op))


def op_line(op: Op) -> str:
    """The op as one JSON line of a history file."""
    return json.dumps({f.name: _to_json(getattr(op, f.name)) for f in fields(Op)}) + "\n"


def load_history(path: str | Path) -> list[Op]:
    with open(path, encoding="utf-8") as lines:
        return [Op(**{name: _from_json(v) for name, v in json.loads(line).items()}) for line in lines if line.strip()]


# JSON has no tuple or set, and a cas value or a read_all result must come back as one.
def _to_json(value: object) -> object:
    if isinstance(value, tuple):
        return {"tuple": [_to_json(item) for item in value]}
    if isinstance(value, frozenset):
        return {"frozenset": [_to_json(item) for item in sorted(value)]}
    return value


def _from_json(value: object) -> object:
    if isinstance(value, dict):
        ((tag, items),) = value.items()
        return {"tuple": tuple, "frozenset": frozenset}[tag](_from_json(item) for item in items)
    return value
