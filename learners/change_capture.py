"""Committed entries → ChangeEvents with before-images. Pure over an Engine.

The learner applies entries to its copy only after their events are durably
delivered (docs/learners.md), so a batch of entries is computed against a
`PendingView`: the copy as of the last flush plus the mutations of the
entries already computed in this batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from learners.change_event import ChangeEvent
from raftkv.core.commands import Command, Delete, DeleteRange, Mutation, Put, PutMany, single_mutations
from raftkv.storage.engine import Engine, KeyRange
from raftkv.core.state_machine import apply_proposal

Emit = Callable[[str, bytes, bytes | None, bytes | None], None]  # (op, key, before, after) -> one event


@dataclass
class PendingView:
    """The copy plus mutations not yet written to it."""

    engine: Engine
    values: dict[bytes, bytes | None] = field(default_factory=dict)
    ranges: list[tuple[bytes, bytes]] = field(default_factory=list)
    mutations: list[Mutation] = field(default_factory=list)

    def get(self, key: bytes) -> bytes | None:
        if key in self.values:
            return self.values[key]
        if self.ranges and any(start <= key < end for start, end in self.ranges):
            return None
        return self.engine.get(key)

    def items_in(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Live keys in [start, end) in this view, in key order."""
        _, stored = self.engine.scan(KeyRange(start, end))
        keys = {k for k, _ in stored} | {k for k in self.values if start <= k < end}
        for key in sorted(keys):
            value = self.get(key)
            if value is not None:
                yield key, value

    def apply(self, m: Mutation) -> None:
        self.mutations.append(m)
        if isinstance(m, Put):
            self.values[m.key] = m.value
        elif isinstance(m, PutMany):
            self.values.update(m.pairs())
        elif isinstance(m, Delete):
            self.values[m.key] = None
        elif m.start < m.end:
            self.ranges.append((m.start, m.end))
            for key in self.values:
                if m.start <= key < m.end:
                    self.values[key] = None


@dataclass(frozen=True)
class EntryContext:
    cluster: str
    partition: int
    index: int
    term: int
    ts_ms: int


def capture_entry(view: PendingView, commands: Sequence[Command], ctx: EntryContext) -> list[ChangeEvent]:
    """The events of one committed entry; applies its mutations to `view`."""
    events: list[ChangeEvent] = []

    def event(op: str, key: bytes, before: bytes | None, after: bytes | None) -> None:
        events.append(ChangeEvent(op, key, before, after, ctx.cluster, ctx.partition, ctx.index, ctx.term,
                                  len(events), False, ctx.ts_ms))

    for m in apply_proposal(view.get, commands).mutations:
        if isinstance(m, PutMany) and _capture_bulk(view, m, event):
            continue
        for single in single_mutations([m]):
            _capture_single(view, single, event)
    return events


def _capture_bulk(view: PendingView, m: PutMany, event: Emit) -> bool:
    """A PutMany of distinct keys in one pass, kept whole for the copy; False if a key repeats.

    Every row's before-image then comes from before the PutMany, which is what
    makes one pass right; a repeated key needs the rows applied one by one.
    """
    keys, values = m.split()
    if len(set(keys)) < len(keys):
        return False
    get = view.get
    for key, value in zip(keys, values):
        before = get(key)
        event("c" if before is None else "u", key, before, value)
    view.apply(m)
    return True


def _capture_single(view: PendingView, m: Put | Delete | DeleteRange, event: Emit) -> None:
    if isinstance(m, Put):
        before = view.get(m.key)
        event("c" if before is None else "u", m.key, before, m.value)
    elif isinstance(m, Delete):
        before = view.get(m.key)
        if before is not None:  # deleting an absent key changes nothing
            event("d", m.key, before, None)
    else:
        for key, before in list(view.items_in(m.start, m.end)):
            event("d", key, before, None)
    view.apply(m)


def capture_snapshot(copy: Engine, snapshot: Engine, ctx: EntryContext) -> list[ChangeEvent]:
    """`r` events that turn `copy` into `snapshot`.

    Keys new or changed in the snapshot get an `r` with the snapshot's value
    (the copy's value as before-image); keys the snapshot lacks get a `d`. The
    caller installs the snapshot once these are delivered.
    """
    events: list[ChangeEvent] = []

    def event(op: str, key: bytes, before: bytes | None, after: bytes | None) -> None:
        events.append(ChangeEvent(op, key, before, after, ctx.cluster, ctx.partition, ctx.index, ctx.term,
                                  len(events), True, ctx.ts_ms))

    mine = dict(copy.scan(KeyRange())[1])
    for key, value in snapshot.scan(KeyRange())[1]:
        before = mine.pop(key, None)
        if before != value:
            event("r", key, before, value)
    for key, before in sorted(mine.items()):
        event("d", key, before, None)
    return events
