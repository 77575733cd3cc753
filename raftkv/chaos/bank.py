"""The bank workload: transfers between accounts of one partition, as Jepsen's bank test makes them.

Each bank is ACCOUNTS accounts in one partition (a bank per partition, in the
first BANKS partitions), each opened with OPENING_BALANCE. A transfer reads
the bank's accounts (`bank_read`: one scan of the partition, one view), then
moves a few units from one account to another in one guarded batch: both
balances written only if neither changed since the read, with a record of
the transfer (`from, to, amount` under its id) written in the same batch. So
the money a bank holds never changes, a read never sees half a transfer, and
the final contents say exactly which transfers were applied
(raftkv/chaos/bank_check.py checks all three).

Keys are found by their partition: `k/<bank>/a/<account>/<salt>` and
`k/<bank>/t/<transfer id>/<salt>`, the salt the first that puts the key in
the bank's partition.
"""

from __future__ import annotations

import random
from contextlib import aclosing
from typing import Sequence

from raftkv.client.async_client import AsyncClient
from raftkv.core.commands import Put
from raftkv.core.partitioning import partition_for_key

BANKS = 2
ACCOUNTS = 8
OPENING_BALANCE = 100
MAX_AMOUNT = 5


def banks(partitions: int) -> list[Bank]:
    """The run's banks: one in each of the first BANKS partitions."""
    return [Bank(b, partitions) for b in range(min(BANKS, partitions))]


def bank_name(bank: int) -> str:
    return f"bank{bank}"


def _in_partition(prefix: bytes, partition: int, partitions: int) -> bytes:
    return next(key for key in (prefix + b"%d" % salt for salt in range(10_000))
                if partition_for_key(key, partitions) == partition)


class Bank:
    """One bank's keys; it lives in partition `bank`."""

    def __init__(self, bank: int, partitions: int):
        self.bank, self.partition, self.partitions = bank, bank % partitions, partitions
        self.name = bank_name(bank)
        self.prefix = b"k/%d/" % bank
        self.accounts = [_in_partition(self.prefix + b"a/%d/" % i, self.partition, partitions) for i in range(ACCOUNTS)]

    def transfer_key(self, transfer_id: int) -> bytes:
        return _in_partition(self.prefix + b"t/%d/" % transfer_id, self.partition, self.partitions)

    def opening(self) -> tuple[dict[bytes, None], list[Put]]:
        """The guarded batch that opens the accounts: only where none exists yet (a retry changes nothing)."""
        return dict.fromkeys(self.accounts), [Put(a, b"%d" % OPENING_BALANCE) for a in self.accounts]

    async def balances(self, kv: AsyncClient) -> tuple[int | None, ...]:
        """Every account's balance (None: missing), from one view of the partition."""
        found = {}
        end = self.prefix + b"a0"  # past every account key ("a/" < "a0")
        async with aclosing(kv.scan_partition(self.partition, self.prefix + b"a/", end)) as chunks:
            async for chunk in chunks:
                found.update((item.key, int(item.value)) for item in chunk.items)
        return tuple(found.get(a) for a in self.accounts)

    async def contents(self, kv: AsyncClient) -> tuple[tuple[int | None, ...], frozenset]:
        """The balances and the transfers recorded, `(id, from, to, amount)`, from one view of the partition."""
        found, transfers = {}, set()
        async with aclosing(kv.scan_partition(self.partition, self.prefix, self.prefix + b"\xff")) as chunks:
            async for chunk in chunks:
                for item in chunk.items:
                    if item.key.startswith(self.prefix + b"t/"):
                        transfer_id = int(item.key[len(self.prefix) + 2:].split(b"/")[0])
                        transfers.add((transfer_id, *map(int, item.value.split(b","))))
                    else:
                        found[item.key] = int(item.value)
        return tuple(found.get(a) for a in self.accounts), frozenset(transfers)

    def transfer(self, balances: Sequence[int], transfer_id: int,
                 rng: random.Random) -> tuple[tuple[int, int, int, int], dict[bytes, bytes], list[Put]] | None:
        """A transfer the balances allow, as (id, from, to, amount) and its guards and writes; None when no
        account has money to move."""
        funded = [i for i, b in enumerate(balances) if b > 0]
        if not funded:
            return None
        source = rng.choice(funded)
        target = rng.choice([i for i in range(ACCOUNTS) if i != source])
        amount = rng.randint(1, min(MAX_AMOUNT, balances[source]))
        a, b = self.accounts[source], self.accounts[target]
        guards = {a: b"%d" % balances[source], b: b"%d" % balances[target]}
        writes = [Put(a, b"%d" % (balances[source] - amount)), Put(b, b"%d" % (balances[target] + amount)),
                  Put(self.transfer_key(transfer_id), b"%d,%d,%d" % (source, target, amount))]
        return (transfer_id, source, target, amount), guards, writes

