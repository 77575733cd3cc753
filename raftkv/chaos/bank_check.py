"""Did every bank keep its money, show no half transfer, and keep every acknowledged transfer? Pure.

Per bank (raftkv/chaos/bank.py), from its history and its final contents
(`bank_final`, read after healing):
- "bank-read": an acknowledged read that misses an account, sees a negative
  balance, or a total other than the opening one (half a transfer);
- "bank-total": the same of the final balances;
- "bank-replay": the final balances are not the opening ones moved by exactly
  the transfers recorded (a transfer's writes applied in part);
- "bank-phantom": a transfer recorded whose request failed, or was refused by
  its guards;
- "lost-transfer": an acknowledged transfer not recorded (unless `may_lose`:
  a power cut in lose-last-second mode may take the last second's writes).
"""

from __future__ import annotations

from typing import Iterable

from raftkv.chaos.history import BANK_FUNCTIONS, CheckResult, Op, Violation

_LISTED = 10


def check_bank(ops: Iterable[Op], accounts: int, opening_balance: int, may_lose: bool = False) -> CheckResult:
    by_bank: dict[str, list[Op]] = {}
    for op in ops:
        if op.f not in BANK_FUNCTIONS:
            raise ValueError(f"not a bank op: {op!r}")
        by_bank.setdefault(op.key, []).append(op)
    violations = [v for bank in sorted(by_bank)
                  for v in _check_one_bank(bank, by_bank[bank], accounts, opening_balance, may_lose)]
    return CheckResult(tuple(violations), (), len(by_bank), sum(map(len, by_bank.values())))


def _balance_problem(balances: tuple, accounts: int, total: int) -> str | None:
    if len(balances) != accounts or None in balances:
        return f"{sum(b is None for b in balances)} of {accounts} accounts missing"
    if min(balances) < 0:
        return f"a negative balance: {list(balances)}"
    if sum(balances) != total:
        return f"a total of {sum(balances)}, not {total}: {list(balances)}"
    return None


def _check_one_bank(bank: str, ops: list[Op], accounts: int, opening_balance: int,
                    may_lose: bool) -> list[Violation]:
    total = accounts * opening_balance
    violations = []
    bad_reads = [(op, problem) for op in ops if op.f == "bank_read" and op.status == "ok"
                 if (problem := _balance_problem(op.result, accounts, total))]
    if bad_reads:
        detail = f"{len(bad_reads)} reads saw money made or lost, e.g. {bad_reads[0][1]}"
        violations.append(Violation("bank-read", bank, detail, tuple(op for op, _ in bad_reads[:_LISTED])))
    finals = [op for op in ops if op.f == "bank_final" and op.status == "ok"]
    if not finals:
        attempts = tuple(op for op in ops if op.f == "bank_final")
        return violations + [Violation("no-final-read", bank, f"no final read of {bank}: its transfers were not "
                                                              "checked", attempts)]
    final = max(finals, key=lambda op: op.complete)
    balances, recorded = final.result
    if problem := _balance_problem(balances, accounts, total):
        violations.append(Violation("bank-total", bank, f"the final balances: {problem}", (final,)))
        return violations
    replayed = [opening_balance] * accounts
    for _, source, target, amount in recorded:
        replayed[source] -= amount
        replayed[target] += amount
    if tuple(replayed) != balances:
        violations.append(Violation("bank-replay", bank, f"the final balances {list(balances)} are not the opening "
                                                         f"ones moved by the {len(recorded)} transfers recorded, "
                                                         f"{replayed}", (final,)))
    transfers = {op.value[0]: op for op in ops if op.f == "transfer"}
    recorded_ids = {t[0] for t in recorded}
    phantoms = sorted(i for i in recorded_ids if i not in transfers or transfers[i].status == "fail"
                      or (transfers[i].status == "ok" and not transfers[i].result))
    if phantoms:
        detail = (f"transfers recorded that never applied (failed, refused by their guards, or never sent): "
                  f"{', '.join(map(str, phantoms[:_LISTED]))}{' and more' if len(phantoms) > _LISTED else ''}")
        violations.append(Violation("bank-phantom", bank, detail,
                                    (*[transfers[i] for i in phantoms if i in transfers], final)))
    lost = sorted((op for i, op in transfers.items()
                   if op.status == "ok" and op.result and op.complete < final.invoke and i not in recorded_ids),
                  key=lambda op: op.value[0])
    if lost and not may_lose:
        ids = ", ".join(str(op.value[0]) for op in lost[:_LISTED])
        violations.append(Violation("lost-transfer", bank, f"acknowledged transfers not in the final state: {ids}"
                                                           f"{' and more' if len(lost) > _LISTED else ''}",
                                    (*lost, final)))
    return violations
