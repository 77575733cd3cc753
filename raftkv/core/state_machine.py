"""Applying a committed proposal: pure and deterministic.

`apply_proposal` turns decoded commands into the mutations to write (one
atomic engine write per Raft entry) and one result per command. It reads the
current state only through `read`, and sees the effects of earlier commands
in the same proposal, so a Cas after a Put of the same key in one entry sees
the Put. What each kind of command does is its `Kind.apply`
(raftkv/core/command_kinds.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from raftkv.core.command_kinds import kind_of
from raftkv.core.commands import Command, Mutation
from raftkv.core.learner_registry import MetaUpdates
from raftkv.core.overlay import Overlay

Result = Any  # what a command's caller gets back: a CasResult for a Cas, None for most


@dataclass(frozen=True, slots=True)
class Applied:
    mutations: list[Mutation]
    results: list[Result]
    meta: MetaUpdates = field(default_factory=dict)  # writes to the state machine's metadata


def _no_meta(key: bytes) -> bytes | None:
    return None


class _EntryState:
    """`command_kinds.State` while one entry is applied: the writes and metadata updates of its commands so far."""

    def __init__(self, read: Callable[[bytes], bytes | None], read_meta: Callable[[bytes], bytes | None]):
        self.overlay = Overlay(read)
        self.get = self.overlay.get
        self.record = self.overlay.record
        self.meta: MetaUpdates = {}
        self._read_meta = read_meta

    def meta_get(self, key: bytes) -> bytes | None:
        return self.meta[key] if key in self.meta else self._read_meta(key)

    def update_meta(self, updates: Mapping[bytes, bytes | None]) -> None:
        self.meta.update(updates)


def apply_proposal(
    read: Callable[[bytes], bytes | None],
    commands: Sequence[Command],
    read_meta: Callable[[bytes], bytes | None] = _no_meta,
) -> Applied:
    state = _EntryState(read, read_meta)
    results = [kind_of(command).apply(command, state) for command in commands]
    return Applied(state.overlay.mutations, results, state.meta)
