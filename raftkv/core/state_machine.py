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

from raftkv.core.commands import Batch, Cas, CasResult, Command, Delete, DeleteRange, Mutation, Put
from raftkv.core.learner_registry import MetaUpdates, is_learner_command, updates_for
from raftkv.core.overlay import Overlay

Result = CasResult | None


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
    overlay = Overlay(read)
    results: list[Result] = []
    meta: MetaUpdates = {}

    def current_meta(key: bytes) -> bytes | None:
        return meta[key] if key in meta else read_meta(key)

    for command in commands:
        kind = type(command)
        if kind is Cas:
            current = overlay.get(command.key)
            if current == command.expected:
                overlay.record(Put(command.key, command.new) if command.new is not None else Delete(command.key))
                results.append(CasResult(True, command.new))
            else:
                results.append(CasResult(False, current))
            continue
        if kind is Batch:
            for op in command.ops:
                _record_unless_empty_range(overlay, op)
        elif is_learner_command(command):
            meta.update(updates_for(command, current_meta))
        else:
            _record_unless_empty_range(overlay, command)
        results.append(None)
    return Applied(overlay.mutations, results, meta)


def _record_unless_empty_range(overlay: Overlay, m: Mutation) -> None:
    # The API rejects start >= end; the log may still hold one (an older client, a bug), and
    # every replica must treat it the same harmless way rather than fail on it.
    if not (type(m) is DeleteRange and m.start >= m.end):
        overlay.record(m)
