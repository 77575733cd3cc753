"""The Sink protocol (a contract: docs/learners.md) and how sinks are found.

A sink makes delivered events durable together with the Raft index each
partition reached, and reports that position back on `recover`, so a learner
resumes at index + 1 after any crash. Progress moves only after `flush`.

A sink reads its options (text, from `--sink-option KEY=VALUE`) into a frozen
dataclass of its own with `learners.sinks.options.OptionReader`, which names
every bad option in one ConfigError. Every sink also receives `learner`, its
learner's name, and the cluster's size limits (`options.limits`). `memory_sink.MemorySink` is the in-memory twin for tests.

Sinks register under the entry-point group `raftkv.sinks`:

    [options.entry_points]
    raftkv.sinks =
        jsonl = my_package.jsonl_sink:JsonlSink
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence, runtime_checkable

from learners.change_event import ChangeEvent
from learners.entry_events import EntryEvents, EventRows, entries_of
from raftkv.core.errors import ConfigError

ENTRY_POINT_GROUP = "raftkv.sinks"


@dataclass(frozen=True)
class DeliveryBatch:
    """Events in Raft order per partition, and the index each partition reaches with them.

    `positions` may advance a partition with no events (entries without writes); `terms` holds
    the term of each position's entry (a backup records it: a replica seeded from the backup
    must match its leader's log there). The feed pump's `events` are `EventRows`, which build
    each ChangeEvent as it is read; a sink that can write from columns reads `entries()` instead.
    `resyncs` names the partitions re-synced from a snapshot, with the index of the copy their
    `r`/`d` events are the differences from (the batch's position is the snapshot's): the entries
    between are not in the feed one by one. A sink that keeps a readable history records it, so a
    reader can tell (docs/backup.md, "Point-in-time restore").
    """

    events: Sequence[ChangeEvent]
    positions: Mapping[int, int] = field(default_factory=dict)
    terms: Mapping[int, int] = field(default_factory=dict)
    resyncs: Mapping[int, int] = field(default_factory=dict)

    def entries(self) -> Sequence[EntryEvents]:
        """The same events as columns, an entry at a time."""
        return self.events.entries if isinstance(self.events, EventRows) else entries_of(self.events)


class Sink(Protocol):
    def open(self, config: Mapping[str, str]) -> None:
        """Validate `config` (raise ConfigError naming the option) and connect."""

    def recover(self) -> dict[int, int]:
        """partition -> last index durably delivered (absent: nothing yet)."""

    def deliver(self, batch: DeliveryBatch) -> None:
        """Hand events over; they need not be durable until flush()."""

    def flush(self) -> None:
        """Make everything delivered durable, with its positions, atomically."""

    def close(self) -> None: ...


@runtime_checkable
class CheckedSink(Protocol):
    """A sink that can check its options against its backend before any learner runs (`learner add`)."""

    def check(self, config: Mapping[str, str]) -> None:
        """Raise ConfigError naming what cannot work, Unavailable if the backend does not answer."""


def _entry_points():
    from importlib.metadata import entry_points  # a big import: only when a sink is looked up

    return entry_points(group=ENTRY_POINT_GROUP)


def available_sinks() -> list[str]:
    return sorted(ep.name for ep in _entry_points())


def load_sink(name: str) -> Sink:
    """A new, unopened sink instance registered under `name` (only its module is imported)."""
    matches = [ep for ep in _entry_points() if ep.name == name]
    if not matches:
        raise ConfigError(
            f"no sink named {name!r}; installed sinks: {', '.join(available_sinks()) or 'none'}",
            source="--sink",
        )
    return matches[0].load()()
