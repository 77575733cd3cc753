"""Point-in-time restore, decided: where each partition starts, which feed events take it to the target, and
whether the feed can show it holds all of them. Pure: backups, what the feed covers and its events in.

Per partition: the newest backup at or before the target index, then the feed's events with
backup index < index <= target, applied in (index, seq) order. The feed must prove it holds every
entry of that range (docs/backup.md, "Point-in-time restore"):

- its retained range covers it: `earliest <= backup index` and `target <= latest` (what the feed has
  delivered: entries without changes, no-ops and membership entries, move it too, so the indices
  between events need no events of their own);
- no re-sync cuts it: a learner that installed a snapshot delivered entries base+1..index as one diff
  at `index`. Such a range is replayed as that diff when it lies wholly inside the restore's
  (the backup at or before `base`, the target at or after `index`); one that straddles either end
  is a gap;
- while replaying, each event's before-image must be the key's value at that point, and the events of
  each entry must be numbered 0, 1, ...: a missing event on a key that changes again, or a feed of
  another cluster's log, shows here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Iterable, Mapping, Sequence

from learners.change_event import ChangeEvent
from raftkv.backup.manifest import BackupInfo
from raftkv.core.commands import Delete, Put
from raftkv.core.errors import ConfigError, CorruptData, InvalidRequest
from raftkv.core.overlay import Overlay


@dataclass(frozen=True)
class Resync:
    """The learner installed a snapshot: entries base+1..index came as one diff, at `index`."""

    base: int
    index: int


@dataclass(frozen=True)
class Coverage:
    """What a feed holds of one partition: the changes of every entry with earliest < index <= latest, entry by
    entry, except inside its re-syncs."""

    earliest: int
    latest: int
    resyncs: tuple[Resync, ...] = ()


@dataclass(frozen=True)
class Replay:
    """One partition's restore: `backup`'s copy (exactly the state after entry `after`), then the feed's events
    with after < index <= until, but for those inside a re-sync in `diffs` (its diff replaces them)."""

    partition: int
    backup: BackupInfo
    after: int
    until: int
    diffs: tuple[Resync, ...] = ()

    @property
    def needs_feed(self) -> bool:
        return self.until > self.after

    def key(self) -> str:
        """What a staged copy of this partition was built as: a restore run again reuses it only for the same."""
        return f"{self.backup.id}-{self.after}-{self.until}"


# -- targets -------------------------------------------------------------------


def parse_index_targets(text: str) -> dict[int, int]:
    """`0:120,1:340` -> {0: 120, 1: 340}."""
    targets: dict[int, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        partition, sep, index = part.partition(":")
        if not sep or not partition.strip().isdigit() or not index.strip().isdigit():
            raise ConfigError(f"expected PARTITION:INDEX, got {part!r}", source="--to-index")
        if int(partition) in targets:
            raise ConfigError(f"partition {int(partition)} is named twice", source="--to-index")
        targets[int(partition)] = int(index)
    if not targets:
        raise ConfigError("expected PARTITION:INDEX,... for every partition", source="--to-index")
    return targets


def parse_time(text: str) -> int:
    """An ISO 8601 time with its zone (`2026-01-02T03:04:05.250Z`, `...+01:00`) -> milliseconds since the epoch."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(f"{text!r} is not an ISO 8601 time (2026-01-02T03:04:05Z)", source="--to-time") from None
    if when.tzinfo is None:
        raise ConfigError(f"{text!r} has no time zone: add Z (UTC) or an offset such as +01:00", source="--to-time")
    return round(when.timestamp() * 1000)


def index_at_time(partition: int, coverage: Coverage, stamps: Iterable[tuple[int, int]], at_ms: int) -> int:
    """The end of the longest prefix of the partition's log whose changes the feed captured at or before `at_ms`:
    one before the first entry captured later, or the feed's latest when there is none.

    `stamps` are the (index, ts_ms) of the feed's events after `coverage.earliest`, in index order; ts_ms
    is when the learner captured the entry, after its commit, and is taken not to go backwards.
    """
    first = True
    for index, ts_ms in stamps:
        if ts_ms > at_ms:
            if first and coverage.earliest > 0:
                raise InvalidRequest(
                    f"partition {partition}: the feed's oldest retained change (index {index}) is after the time, "
                    f"and the feed no longer holds what came before index {coverage.earliest + 1}, so it cannot "
                    "tell which entries were committed by then")
            return index - 1
        first = False
    return coverage.latest


# -- the plan --------------------------------------------------------------------


def plan_restore(backups: Sequence[BackupInfo], targets: Mapping[int, int], coverage: Mapping[int, Coverage],
                 partitions: Iterable[int]) -> dict[int, Replay]:
    """Each partition's Replay; every partition the backups hold must have a target. One InvalidRequest naming
    every partition the backups and the feed cannot bring exactly to its target."""
    wanted = sorted(partitions)
    missing, extra = sorted(set(wanted) - set(targets)), sorted(set(targets) - set(wanted))
    if missing or extra:
        raise ConfigError(f"name every partition of the backups ({', '.join(map(str, wanted))}) once"
                          + (f"; missing: {', '.join(map(str, missing))}" if missing else "")
                          + (f"; not in the backups: {', '.join(map(str, extra))}" if extra else ""),
                          source="--to-index")
    plans, gaps = {}, []
    for p in wanted:
        try:
            plans[p] = plan_partition(p, backups, targets[p], coverage.get(p))
        except InvalidRequest as exc:
            gaps.append(str(exc))
    if gaps:
        raise InvalidRequest("; ".join(gaps) + "; nothing was restored")
    return plans


def plan_partition(partition: int, backups: Sequence[BackupInfo], target: int, coverage: Coverage | None) -> Replay:
    holding = [info for info in backups if partition in info.partitions]
    usable = [info for info in holding if info.positions[partition].index <= target]
    if not usable:
        oldest = min((info.positions[partition].index for info in holding), default=None)
        raise InvalidRequest(f"partition {partition}: no backup at or before index {target}"
                             + (f" (the oldest is at index {oldest})" if oldest is not None else ""))
    backup = max(usable, key=lambda info: (info.positions[partition].index, info.id))
    after = backup.positions[partition].index
    if after == target:
        return Replay(partition, backup, after, target)
    where = f"partition {partition}: from the backup at index {after} to index {target}"
    if coverage is None:
        raise InvalidRequest(f"{where}, but no feed holds the partition's changes (give --feed, one that follows it)")
    if coverage.latest < target:
        raise InvalidRequest(f"{where}, but the feed has delivered only up to index {coverage.latest}")
    if coverage.earliest > after:
        raise InvalidRequest(f"{where}, but the feed holds only the changes after index {coverage.earliest} "
                             f"(entries {after + 1}..{coverage.earliest} are no longer retained)")
    diffs = []
    for resync in coverage.resyncs:
        if resync.index <= after or resync.base >= target:
            continue  # wholly before the backup, or after the target
        if resync.base < after or resync.index > target:
            raise InvalidRequest(f"{where}, but the feed re-synced from a snapshot at index {resync.index}: entries "
                                 f"{resync.base + 1}..{resync.index} are in it only as one diff at index "
                                 f"{resync.index}, so it cannot bring the partition to a state inside that range")
        diffs.append(resync)
    return Replay(partition, backup, after, target, tuple(diffs))


# -- replaying --------------------------------------------------------------------


class Replayer:
    """Applies one partition's events to a view of its copy (`Overlay`), checking that they continue it."""

    def __init__(self, replay: Replay):
        self.replay = replay
        self.applied = 0
        self._last: tuple[int, int] | None = None  # (index, seq) of the last event taken
        self._diff_at = {r.index for r in replay.diffs}

    def apply(self, events: Iterable[ChangeEvent], view: Overlay) -> None:
        """Record each event's after-image (a put, or a delete for `d`) in `view`. CorruptData when the feed
        does not continue the copy: events out of order or missing within an entry, a before-image that
        differs from the key's value, a snapshot diff no re-sync accounts for."""
        r = self.replay
        for event in events:
            if event.partition != r.partition or not r.after < event.index <= r.until:
                raise CorruptData(f"partition {r.partition}: the feed sent event {event.event_id} for the range "
                                  f"{r.after + 1}..{r.until}")
            if any(d.base < event.index < d.index for d in r.diffs):
                continue  # the re-sync's diff at its index replaces these entries
            self._check_follows(event)
            if event.snapshot and event.index not in self._diff_at:
                raise CorruptData(f"partition {r.partition}: the feed holds a snapshot diff at index {event.index} "
                                  "that no recorded re-sync accounts for (a learner from before re-syncs were "
                                  "recorded?); it cannot show which entries it replaced")
            held = view.get(event.key)
            if held != event.before:
                raise CorruptData(
                    f"partition {r.partition}: the feed's event {event.event_id} on key {event.key!r} expects the "
                    f"value {_short(event.before)} but the backup and the events before it give {_short(held)}: "
                    f"the feed does not continue backup {r.backup.id} (an event is missing, or the feed is of "
                    "another cluster)")
            view.record(Delete(event.key) if event.op == "d" else Put(event.key, event.after))
            self.applied += 1

    def _check_follows(self, event: ChangeEvent) -> None:
        index, seq = event.index, event.seq
        last = self._last
        expected = 0 if last is None or index > last[0] else last[1] + 1
        if (last is not None and index < last[0]) or seq != expected:
            raise CorruptData(f"partition {self.replay.partition}: the feed's event {event.event_id} follows "
                              f"{(self.replay.partition, *last) if last else 'the backup'}: an event is missing "
                              "or out of order")
        self._last = (index, seq)


def _short(value: bytes | None) -> str:
    if value is None:
        return "absent"
    return repr(value[:24]) + ("…" if len(value) > 24 else "")
