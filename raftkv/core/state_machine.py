"""Applying a committed proposal: pure and deterministic.

`apply_proposal` turns decoded commands into the mutations to write (one
atomic engine write per Raft entry) and one result per command. It reads the
current state only through `read`, and sees the effects of earlier commands
in the same proposal, so a Cas after a Put of the same key in one entry sees
the Put.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from raftkv.core.commands import Batch, Cas, CasResult, Command, Delete, DeleteRange, Mutation, Put, PutMany
from raftkv.core.learner_registry import MetaUpdates, is_learner_command, updates_for

Result = CasResult | None


@dataclass
class _Overlay:
    """Writes of the current proposal, consulted before the engine.

    A PutMany's rows are spelled out only if a later command in the same
    proposal reads: most proposals holding one never do, and a bulk load
    would pay for a dict of every row on every replica.
    """

    read: Callable[[bytes], bytes | None]
    values: dict[bytes, bytes | None] = field(default_factory=dict)
    ranges: list[tuple[bytes, bytes]] = field(default_factory=list)
    unread: list[Mutation] = field(default_factory=list)  # recorded, not yet in `values`/`ranges`

    def get(self, key: bytes) -> bytes | None:
        for m in self.unread:
            self._spell_out(m)
        self.unread.clear()
        if key in self.values:
            return self.values[key]
        if any(start <= key < end for start, end in self.ranges):
            return None
        return self.read(key)

    def record(self, m: Mutation) -> None:
        self.unread.append(m)

    def _spell_out(self, m: Mutation) -> None:
        if isinstance(m, Put):
            self.values[m.key] = m.value
        elif isinstance(m, Delete):
            self.values[m.key] = None
        elif isinstance(m, PutMany):
            self.values.update(m.pairs())
        else:
            self.ranges.append((m.start, m.end))
            for key in self.values:
                if m.start <= key < m.end:
                    self.values[key] = None


@dataclass(frozen=True, slots=True)
class Applied:
    mutations: list[Mutation]
    results: list[Result]
    meta: MetaUpdates = field(default_factory=dict)  # writes to the state machine's metadata


def _no_meta(key: bytes) -> bytes | None:
    return None


def apply_proposal(
    read: Callable[[bytes], bytes | None],
    commands: Sequence[Command],
    read_meta: Callable[[bytes], bytes | None] = _no_meta,
) -> Applied:
    overlay = _Overlay(read)
    mutations: list[Mutation] = []
    results: list[Result] = []
    meta: MetaUpdates = {}

    def current_meta(key: bytes) -> bytes | None:
        return meta[key] if key in meta else read_meta(key)

    def write(m: Mutation) -> None:
        mutations.append(m)
        overlay.record(m)

    for command in commands:
        if isinstance(command, Cas):
            current = overlay.get(command.key)
            if current == command.expected:
                write(Put(command.key, command.new) if command.new is not None else Delete(command.key))
                results.append(CasResult(True, command.new))
            else:
                results.append(CasResult(False, current))
        elif isinstance(command, Batch):
            for op in command.ops:
                _write_unless_empty_range(write, op)
            results.append(None)
        elif is_learner_command(command):
            meta.update(updates_for(command, current_meta))
            results.append(None)
        else:
            _write_unless_empty_range(write, command)
            results.append(None)
    return Applied(mutations, results, meta)


def _write_unless_empty_range(write: Callable[[Mutation], None], m: Mutation) -> None:
    # The API rejects start >= end; the log may still hold one (an older client, a bug), and
    # every replica must treat it the same harmless way rather than fail on it.
    if not (isinstance(m, DeleteRange) and m.start >= m.end):
        write(m)
