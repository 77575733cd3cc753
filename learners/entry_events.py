"""The ChangeEvents of one Raft entry as columns, and rows read back from them. Pure.

Change capture builds these: a bulk load's entry holds thousands of rows, and
a ChangeEvent per row costs more than computing the row. A sink that writes
straight from the columns (the changelog sink) builds no object per row;
`EventRows` hands the same events to every other sink as ChangeEvents.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate, chain, groupby
from typing import Iterable, Iterator, Sequence

from learners.change_event import ChangeEvent


@dataclass(frozen=True, slots=True)
class EntryEvents:
    """One entry's events (or a snapshot diff's): row i is the event with seq `first_seq + i`.

    Iterating gives the rows as ChangeEvents.
    """

    cluster: str
    partition: int
    index: int
    term: int
    snapshot: bool
    ts_ms: int
    ops: Sequence[str]
    keys: Sequence[bytes]
    befores: Sequence[bytes | None]
    afters: Sequence[bytes | None]
    first_seq: int = 0

    def __len__(self) -> int:
        return len(self.ops)

    def event(self, row: int) -> ChangeEvent:
        return ChangeEvent(self.ops[row], self.keys[row], self.befores[row], self.afters[row], self.cluster,
                           self.partition, self.index, self.term, self.first_seq + row, self.snapshot, self.ts_ms)

    def __iter__(self) -> Iterator[ChangeEvent]:
        return map(self.event, range(len(self)))


def entries_of(events: Iterable[ChangeEvent]) -> list[EntryEvents]:
    """ChangeEvents as columns: each run of one entry's events with consecutive seqs makes one EntryEvents."""

    def run(numbered: tuple[int, ChangeEvent]) -> tuple:
        n, e = numbered
        return e.cluster, e.partition, e.index, e.term, e.snapshot, e.ts_ms, e.seq - n

    entries = []
    for _, numbered in groupby(enumerate(events), run):
        rows = [e for _, e in numbered]
        first = rows[0]
        entries.append(EntryEvents(first.cluster, first.partition, first.index, first.term, first.snapshot,
                                   first.ts_ms, [e.op for e in rows], [e.key for e in rows],
                                   [e.before for e in rows], [e.after for e in rows], first.seq))
    return entries


class EventRows(Sequence[ChangeEvent]):
    """The events of `entries`, in order, as ChangeEvents built as they are read."""

    def __init__(self, entries: Sequence[EntryEvents]):
        self.entries = entries
        self._ends = list(accumulate(map(len, entries)))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __iter__(self) -> Iterator[ChangeEvent]:
        return chain.from_iterable(self.entries)

    def __getitem__(self, i: int | slice) -> ChangeEvent | list[ChangeEvent]:
        if isinstance(i, slice):
            return [self[n] for n in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("event index out of range")
        entry = bisect_right(self._ends, i)
        return self.entries[entry].event(i - (self._ends[entry - 1] if entry else 0))
