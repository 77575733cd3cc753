"""Is a register history linearizable? Porcupine's search, key by key.

Every key is its own register, and a history is linearizable exactly when
the history of each key is (P-compositionality), so keys are checked one
at a time: a violation names its key, and a key too costly to decide is
reported as unknown without holding up the others.

The search is Lowe's refinement of Wing & Gong, as in Porcupine. The calls
and returns of a key's ops sit in a doubly-linked list sorted by time.
Walking from the front, a call whose result the model allows may be
linearized next: it is lifted out of the list with its return, and the walk
starts again at the front. Reaching a return means that op was not
linearized before it returned: undo the last choice and try the calls after
it. A cache of (linearized ops, register value) prunes every configuration
already explored. One more cut, sound for any register history and what
keeps late info writes cheap: an op is not linearized if it would move the
register off a value that an unlinearized op still needs (a read of it, a
cas from it that swapped) when no unlinearized op can write that value again.

The model: the register starts absent (None); write(v) sets v; cas((e, n))
sets n and returns True if the register holds e, else returns False and
changes nothing; read returns the value.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

from raftkv.chaos.history import REGISTER_FUNCTIONS, CheckResult, Op, Violation

__all__ = ["CheckResult", "Violation", "check_register"]

_IMPOSSIBLE = object()
_HEAD = 0


def check_register(ops: Iterable[Op], *, budget: int = 2_000_000) -> CheckResult:
    """Check each key's reads, writes and cas; `budget` caps the search steps per key.

    `ops_checked` counts every op given, including those the search skips:
    failed ops (never applied) and info reads (they constrain nothing).
    """
    by_key: dict[str, list[Op]] = {}
    for op in ops:
        if op.f not in REGISTER_FUNCTIONS:
            raise ValueError(f"not a register op: {op!r}")
        by_key.setdefault(op.key, []).append(op)
    violations = []
    unknown = []
    for key in sorted(by_key):
        key_ops = sorted(by_key[key], key=lambda op: op.invoke)
        searched = [op for op in key_ops if op.status == "ok" or (op.status == "info" and op.f != "read")]
        try:
            stuck = _search(searched, budget)
        except _OverBudget:
            unknown.append(key)
            continue
        if stuck is not None:
            violations.append(Violation("linearizable", key, _explain(stuck, key_ops, len(searched)), tuple(key_ops)))
    return CheckResult(tuple(violations), tuple(unknown), len(by_key), sum(map(len, by_key.values())))


def _step(value: object, op: Op) -> object:
    """The register's value after `op`, or _IMPOSSIBLE if `op` could not have returned what it did."""
    if op.f == "read":
        return value if op.result == value else _IMPOSSIBLE
    if op.f == "write":
        return op.value
    expected, new = op.value
    swaps = value == expected
    if op.status == "info" or op.result == swaps:
        return new if swaps else value
    return _IMPOSSIBLE


def _needed(op: Op) -> tuple[object, ...]:
    """The value the register must hold where `op` is linearized, if any."""
    if op.status == "ok" and op.f == "read":
        return (op.result,)
    if op.status == "ok" and op.f == "cas" and op.result:
        return (op.value[0],)
    return ()


def _written(op: Op) -> tuple[object, ...]:
    """The value `op` may leave in the register, if any."""
    if op.f == "write":
        return (op.value,)
    if op.f == "cas" and op.result is not False:
        return (op.value[1],)
    return ()


class _OverBudget(Exception):
    pass


@dataclass(frozen=True)
class _Stuck:
    """The furthest the search got: after `placed` ops, with the register holding one of `values`, `op` could not be.

    `overwriter` is an op that was held back there because it would have
    stranded `stranded_op`: left a value that op needs, with nothing left to write it.
    """

    op: Op
    placed: int
    values: frozenset
    overwriter: Op | None
    stranded_op: Op | None


def _search(ops: list[Op], budget: int) -> _Stuck | None:
    """None if `ops` linearize, else where the search got furthest. Raises _OverBudget after `budget` steps.

    An info op has no return: it may take effect any time after its call,
    or never, which is the same as at the very end. So the search succeeds
    once only calls are left ahead of the walk.

    Times come from one monotonic clock; an op that returned at t and one
    called at t may have overlapped, so at equal times calls sort first and
    only a strictly earlier return orders two ops.
    """
    events = sorted(
        [(op.invoke, 0, i) for i, op in enumerate(ops)]
        + [(op.complete, 1, i) for i, op in enumerate(ops) if op.complete is not None]
    )
    tail = len(events) + 1
    entry_op = [-1] + [i for _, _, i in events] + [-1]
    is_call = [False] + [kind == 0 for _, kind, _ in events] + [False]
    nxt = list(range(1, tail + 1))
    prv = [-1] + list(range(tail))
    call_entry = [_HEAD] * len(ops)
    returns = [_HEAD] * tail  # a call entry's return entry; _HEAD for an info op, which has none
    for entry in range(1, tail):
        if is_call[entry]:
            call_entry[entry_op[entry]] = entry
        else:
            returns[call_entry[entry_op[entry]]] = entry
    needed_by: dict[object, int] = {}  # value -> bits of the ops that need it
    written_by: dict[object, int] = {}  # value -> bits of the ops that may write it
    for i, op in enumerate(ops):
        for needed in _needed(op):
            needed_by[needed] = needed_by.get(needed, 0) | 1 << i
        for written in _written(op):
            written_by[written] = written_by.get(written, 0) | 1 << i

    def stranded(value: object, after: object, linearized: int) -> int:
        """Bits of the ops that would never be linearized if the register went from `value` to `after`."""
        if after == value or written_by.get(value, 0) & ~linearized:
            return 0
        return needed_by.get(value, 0) & ~linearized

    def lift(entry: int) -> None:
        nxt[prv[entry]] = nxt[entry]
        prv[nxt[entry]] = prv[entry]
        ret = returns[entry]
        if ret != _HEAD:
            nxt[prv[ret]] = nxt[ret]
            prv[nxt[ret]] = prv[ret]

    def unlift(entry: int) -> None:
        ret = returns[entry]
        if ret != _HEAD:
            nxt[prv[ret]] = ret
            prv[nxt[ret]] = ret
        nxt[prv[entry]] = entry
        prv[nxt[entry]] = entry

    def stuck_at(return_entry: int, value: object, linearized: int, placed: int) -> _Stuck:
        """Stuck at `return_entry`; says which call ahead of it, if any, was held back for stranding an op."""
        entry = nxt[_HEAD]
        while entry != return_entry:
            after = _step(value, ops[entry_op[entry]])
            if after is not _IMPOSSIBLE:
                bits = stranded(value, after, linearized | 1 << entry_op[entry])
                if bits:
                    overwriter, needer = ops[entry_op[entry]], ops[(bits & -bits).bit_length() - 1]
                    return _Stuck(ops[entry_op[return_entry]], placed, frozenset({value}), overwriter, needer)
            entry = nxt[entry]
        return _Stuck(ops[entry_op[return_entry]], placed, frozenset({value}), None, None)

    value: object = None
    linearized = 0  # bit i: ops[i] is linearized
    explored: set[tuple[int, object]] = set()
    chosen: list[tuple[int, object]] = []  # (call entry, value before it), to undo
    furthest: _Stuck | None = None
    steps = 0
    entry = nxt[_HEAD]
    while entry != tail:
        steps += 1
        if steps > budget:
            raise _OverBudget
        if is_call[entry]:
            op = entry_op[entry]
            after = _step(value, ops[op])
            if after is not _IMPOSSIBLE:
                configuration = (linearized | 1 << op, after)
                # Stranding an op is a dead end, however far the search would go before finding out.
                if configuration not in explored and not stranded(value, after, configuration[0]):
                    explored.add(configuration)
                    chosen.append((entry, value))
                    linearized, value = configuration
                    lift(entry)
                    entry = nxt[_HEAD]
                    continue
            entry = nxt[entry]
        else:
            if furthest is None or len(chosen) > furthest.placed:
                furthest = stuck_at(entry, value, linearized, len(chosen))
            elif len(chosen) == furthest.placed and ops[entry_op[entry]] is furthest.op:
                furthest = replace(furthest, values=furthest.values | {value})
            if not chosen:
                return furthest
            entry, value = chosen.pop()
            linearized &= ~(1 << entry_op[entry])
            unlift(entry)
            entry = nxt[entry]
    return None


def _explain(stuck: _Stuck, key_ops: list[Op], searched: int) -> str:
    origin = key_ops[0].invoke
    op = stuck.op
    values = " or ".join(sorted(map(repr, stuck.values)))
    line = (
        f"{_describe(op, origin)} cannot be linearized: "
        f"after {stuck.placed} of {searched} ops the register holds {values}"
    )
    if stuck.overwriter is not None:
        who = "it" if stuck.overwriter is op else _describe(stuck.overwriter, origin)
        (needed,) = _needed(stuck.stranded_op)
        needer = _describe(stuck.stranded_op, origin)
        line += f"; {who} would overwrite {needed!r}, which {needer} needs and no op still to be placed writes"
    for needed in _needed(op):
        if needed is not None:
            line += _provenance(needed, key_ops)
    return line


def _provenance(value: object, key_ops: list[Op]) -> str:
    """Why `value` was never current, if the history alone shows it."""
    writers = [op for op in key_ops if value in _written(op)]
    if not writers:
        return f"; no op ever wrote {value!r}"
    if all(op.status == "fail" for op in writers):
        return f"; only failed ops (never applied) wrote {value!r}"
    return ""


def _describe(op: Op, origin: int) -> str:
    if op.f == "read":
        what = f"read -> {op.result!r}"
    elif op.f == "write":
        what = f"write {op.value!r}"
    else:
        what = f"cas {op.value[0]!r} -> {op.value[1]!r}" + (f" = {op.result}" if op.status == "ok" else "")
    ended = f"+{(op.complete - origin) / 1e6:.3f} ms" if op.complete is not None else "no answer"
    return f"client {op.client} {what} ({op.status}, +{(op.invoke - origin) / 1e6:.3f} ms .. {ended})"
