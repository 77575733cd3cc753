"""Did a set keep every acknowledged add, and nothing else?

The set workload adds unique ints to a set (the key) while faults happen;
after healing, the harness reads the whole set once more. That final read,
the acknowledged read_all that completed last, must hold every acknowledged
add that completed before it was invoked ("lost-write" otherwise), and only
values that an add which may have applied had sent before the read
completed ("phantom-read" otherwise). An info add may be there or not.
"""

from __future__ import annotations

from typing import Iterable

from raftkv.chaos.history import SET_FUNCTIONS, CheckResult, Op, Violation

_LISTED = 10  # values named in a detail line; the rest are counted


def check_set(ops: Iterable[Op]) -> CheckResult:
    by_key: dict[str, list[Op]] = {}
    for op in ops:
        if op.f not in SET_FUNCTIONS:
            raise ValueError(f"not a set op: {op!r}")
        by_key.setdefault(op.key, []).append(op)
    violations = [v for key in sorted(by_key) for v in _check_one_set(key, by_key[key])]
    return CheckResult(tuple(violations), (), len(by_key), sum(map(len, by_key.values())))


def _check_one_set(key: str, ops: list[Op]) -> list[Violation]:
    adds: dict[object, Op] = {}
    for op in ops:
        if op.f == "add":
            if op.value in adds:
                raise ValueError(f"{op.value!r} is added to {key!r} twice; the set check needs unique values")
            adds[op.value] = op
    reads = [op for op in ops if op.f == "read_all" and op.status == "ok"]
    if not reads:
        attempts = tuple(op for op in ops if op.f == "read_all")
        detail = f"no acknowledged read_all of {key!r}, so none of its {len(adds)} adds was checked"
        return [Violation("no-final-read", key, detail, attempts)]
    final = max(reads, key=lambda op: op.complete)
    violations = []

    lost = sorted(
        (op for op in adds.values()
         if op.status == "ok" and op.complete < final.invoke and op.value not in final.result),
        key=lambda op: op.value,
    )
    if lost:
        acknowledged = sum(op.status == "ok" for op in adds.values())
        listing = _listing(op.value for op in lost)
        detail = f"acknowledged adds missing from the final read_all: {listing} ({len(lost)} of {acknowledged})"
        violations.append(Violation("lost-write", key, detail, (*lost, final)))

    never_added = sorted(value for value in final.result if value not in adds)
    impossible = sorted(
        (op for value, op in adds.items()
         if value in final.result and (op.status == "fail" or op.invoke > final.complete)),
        key=lambda op: op.value,
    )
    if never_added or impossible:
        reasons = [f"{value!r} (never added)" for value in never_added] + [
            f"{op.value!r} ({'its add failed' if op.status == 'fail' else 'added after the read'})" for op in impossible
        ]
        detail = f"the final read_all holds values no add could have written: {_listing(reasons)}"
        violations.append(Violation("phantom-read", key, detail, (*impossible, final)))
    return violations


def _listing(items: Iterable[object]) -> str:
    items = list(items)
    shown = ", ".join(map(str, items[:_LISTED]))
    return shown if len(items) <= _LISTED else f"{shown} and {len(items) - _LISTED} more"
