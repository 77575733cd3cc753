"""Committed entries → ChangeEvents with before-images. Pure over an Engine.

The learner applies entries to its copy only after their events are durably
delivered (docs/learners.md), so a batch of entries is computed against a
pending view (`raftkv.core.overlay.Overlay`): the copy as of the last flush
plus the mutations of the entries already computed in this batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from learners.change_event import ChangeEvent
from raftkv.core.command_kinds import single_mutations
from raftkv.core.commands import Command, Delete, DeleteRange, Put, PutMany
from raftkv.core.overlay import Overlay
from raftkv.storage.engine import Engine, KeyRange
from raftkv.core.state_machine import apply_proposal

Emit = Callable[[str, bytes, bytes | None, bytes | None], None]  # (op, key, before, after) -> one event


def pending_view(engine: Engine) -> Overlay:
    """The copy plus the mutations of the entries computed since its last write (`.mutations`)."""
    return Overlay(engine.get, lambda start, end: engine.scan(KeyRange(start, end))[1])


@dataclass(frozen=True)
class EntryContext:
    cluster: str
    partition: int
    index: int
    term: int
    ts_ms: int


def capture_entry(view: Overlay, commands: Sequence[Command], ctx: EntryContext) -> list[ChangeEvent]:
    """The events of one committed entry; applies its mutations to `view`."""
    events: list[ChangeEvent] = []

    def event(op: str, key: bytes, before: bytes | None, after: bytes | None) -> None:
        events.append(ChangeEvent(op, key, before, after, ctx.cluster, ctx.partition, ctx.index, ctx.term,
                                  len(events), False, ctx.ts_ms))

    for m in apply_proposal(view.get, commands).mutations:
        if type(m) is PutMany and _capture_bulk(view, m, event):
            continue
        for single in single_mutations([m]):
            _capture_single(view, single, event)
    return events


def _capture_bulk(view: Overlay, m: PutMany, event: Emit) -> bool:
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
    view.record(m)
    return True


def _capture_single(view: Overlay, m: Put | Delete | DeleteRange, event: Emit) -> None:
    kind = type(m)
    if kind is Put:
        before = view.get(m.key)
        event("c" if before is None else "u", m.key, before, m.value)
    elif kind is Delete:
        before = view.get(m.key)
        if before is not None:  # deleting an absent key changes nothing
            event("d", m.key, before, None)
    else:
        for key, before in list(view.items_in(m.start, m.end)):
            event("d", key, before, None)
    view.record(m)


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
