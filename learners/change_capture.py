"""Committed entries → ChangeEvents with before-images, as columns. Pure over an Engine.

The learner applies entries to its copy only after their events are durably
delivered (docs/learners.md), so a batch of entries is computed against a
pending view (`raftkv.core.overlay.Overlay`): the copy as of the last flush
plus the mutations of the entries already computed in this batch.

An entry's puts and deletes between two delete-ranges are captured together:
one read of the view for all their before-images, with a key that repeats
among them seeing its own earlier row. A bulk-load file (`IngestSst`) is
captured, and written to the copy, as the rows it holds (docs/bulk-ingest.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress
from typing import Sequence

from learners.entry_events import EntryEvents
from raftkv.core.command_kinds import kind_of
from raftkv.core.commands import Command, DeleteRange, IngestSst, Mutation
from raftkv.core.overlay import Overlay
from raftkv.storage import rocks_sst
from raftkv.storage.engine import Engine, KeyRange
from raftkv.core.state_machine import apply_proposal

Columns = tuple[list[str], list[bytes], list[bytes | None], list[bytes | None]]  # ops, keys, befores, afters


def pending_view(engine: Engine) -> Overlay:
    """The copy plus the mutations of the entries computed since its last write (`.mutations`)."""
    return Overlay(engine.get, lambda start, end: engine.scan(KeyRange(start, end))[1], engine.get_many)


@dataclass(frozen=True)
class EntryContext:
    cluster: str
    partition: int
    index: int
    term: int
    ts_ms: int


def capture_entry(view: Overlay, commands: Sequence[Command], ctx: EntryContext) -> EntryEvents:
    """The events of one committed entry; applies its mutations to `view`."""
    columns: Columns = ([], [], [], [])
    writes: list[Mutation] = []
    commands = [_file_rows(c, ctx) if type(c) is IngestSst else c for c in commands]
    for m in apply_proposal(view.get, commands).mutations:
        if type(m) is DeleteRange:  # the one mutation whose rows are not in it: they are the view's keys in its range
            _extend(columns, _capture_writes(view, writes))
            writes = []
            _extend(columns, _capture_range(view, m))
        else:
            writes.append(m)
    _extend(columns, _capture_writes(view, writes))
    return EntryEvents(ctx.cluster, ctx.partition, ctx.index, ctx.term, False, ctx.ts_ms, *columns)


def _file_rows(c: IngestSst, ctx: EntryContext) -> Command:
    rocks_sst.check(c, f"the learner's copy of partition {ctx.partition}")
    return rocks_sst.rows(c)


def _extend(columns: Columns, more: Columns) -> None:
    for column, rows in zip(columns, more):
        column += rows


def _capture_writes(view: Overlay, writes: Sequence[Mutation]) -> Columns:
    if not writes:
        return [], [], [], []
    keys, afters = _rows(writes)
    befores = view.get_many(keys)
    if len(set(keys)) < len(keys):
        befores = _after_earlier_rows(keys, afters, befores)
    for m in writes:
        view.record(m)
    ops = [("c" if before is None else "u") if after is not None else ("d" if before is not None else None)
           for before, after in zip(befores, afters)]
    if None in ops:  # a delete of an absent key changes nothing: no event
        kept = [op is not None for op in ops]
        return tuple(list(compress(column, kept)) for column in (ops, keys, befores, afters))
    return ops, keys, befores, afters


def _rows(writes: Sequence[Mutation]) -> tuple[list[bytes], list[bytes | None]]:
    """(keys, afters) of every row the writes hold, in order (`Kind.rows`); a delete's after is None."""
    keys: list[bytes] = []
    afters: list[bytes | None] = []
    for m in writes:
        more_keys, more_afters = kind_of(m).rows(m)
        keys += more_keys
        afters += more_afters
    return keys, afters


def _after_earlier_rows(keys: list[bytes], afters: list[bytes | None],
                        stored: list[bytes | None]) -> list[bytes | None]:
    """Before-images when a key repeats: a row after the first of its key sees the one before it."""
    latest: dict[bytes, bytes | None] = {}
    befores = []
    for key, after, before in zip(keys, afters, stored):
        befores.append(latest.get(key, before))
        latest[key] = after
    return befores


def _capture_range(view: Overlay, m: DeleteRange) -> Columns:
    rows = [("d", key, before, None) for key, before in view.items_in(m.start, m.end)]
    view.record(m)
    return _columns(rows)


def _columns(rows: list[tuple[str, bytes, bytes | None, bytes | None]]) -> Columns:
    """(op, key, before, after) rows as columns."""
    return tuple(map(list, zip(*rows))) if rows else ([], [], [], [])


def capture_snapshot(copy: Engine, snapshot: Engine, ctx: EntryContext) -> EntryEvents:
    """`r` events that turn `copy` into `snapshot`.

    Keys new or changed in the snapshot get an `r` with the snapshot's value
    (the copy's value as before-image); keys the snapshot lacks get a `d`. The
    caller installs the snapshot once these are delivered.

    Both scans come in key order and are walked side by side: only the difference
    is held. Holding the copy whole cost a learner as much memory as its largest
    partition at every re-sync. Neither scan fills the block cache: each re-sync
    reads a database that is then deleted, and the learner's RSS grew by the
    cache's 64 MiB over the lose-last-second hour with blocks no read wanted again.
    """
    mine = iter(copy.scan(KeyRange(), cache=False)[1])
    held = next(mine, None)
    changed: list[tuple[str, bytes, bytes | None, bytes | None]] = []
    gone: list[tuple[str, bytes, bytes | None, bytes | None]] = []
    for key, value in snapshot.scan(KeyRange(), cache=False)[1]:
        while held is not None and held[0] < key:
            gone.append(("d", held[0], held[1], None))
            held = next(mine, None)
        before = None
        if held is not None and held[0] == key:
            before, held = held[1], next(mine, None)
        if before != value:
            changed.append(("r", key, before, value))
    while held is not None:
        gone.append(("d", held[0], held[1], None))
        held = next(mine, None)
    return EntryEvents(ctx.cluster, ctx.partition, ctx.index, ctx.term, True, ctx.ts_ms, *_columns(changed + gone))
