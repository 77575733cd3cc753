"""What an incremental backup uploads, whom it waits for, and what a prune deletes. Pure: listings and the time in.

The protocol these decisions serve is in docs/backup.md ("Prune, and backups
running at the same time"). In short: an export writes its pending marker,
then waits out every prune that may have listed the markers before it
(`prunes_in_the_way`), then uploads what is missing (`to_upload`); a prune
writes its lock, then lists markers, manifests and objects, and deletes what
`plan_prune` says, stopping PRUNE_WINDOW after it wrote its lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Iterable, Mapping, Sequence

from raftkv.backup.manifest import BackupInfo, time_of

PENDING_GRACE = timedelta(days=1)  # a partial backup this old is dead: its marker protects nothing, its folder goes
PRUNE_WINDOW = timedelta(minutes=10)  # a prune deletes nothing later than this after writing its lock
CLOCK_MARGIN = timedelta(minutes=5)  # how far apart the clocks of two writers to one URL may be, at most
MAX_EXPORT = PENDING_GRACE / 2  # an export that took longer writes no manifest: prunes may have given up on it


def to_upload(needed: Mapping[str, int], present: Mapping[str, int]) -> list[str]:
    """The objects (sha256 -> size) to upload: those absent, or present with another size (a copy a
    crash cut short on a store without atomic writes). In the order of `needed`."""
    return [name for name, size in needed.items() if present.get(name) != size]


def to_fetch(listed: Iterable[tuple[str, int, str]], present: Mapping[str, int]) -> list[str]:
    """Of a checkpoint's files (path, size, sha256; no sha256: a small file that changes, not hashed by its
    source), the ones a backup must fetch: every file whose object is not stored whole, and every unhashed
    one. In the order listed."""
    return [path for path, size, sha256 in listed if not sha256 or present.get(sha256) != size]


def prunes_in_the_way(locks: Mapping[str, datetime], now: datetime) -> list[str]:
    """The prune locks (name -> when that prune started, by its clock) an export must wait for after writing
    its marker: those whose PRUNE_WINDOW may not be over, even if our clock is up to CLOCK_MARGIN ahead."""
    return sorted(name for name, started in locks.items() if now < started + PRUNE_WINDOW + CLOCK_MARGIN)


def is_fresh(backup_id: str, now: datetime) -> bool:
    """Whether a partial backup may still be under way (then its marker protects what it names)."""
    started = time_of(backup_id)
    return started is not None and now - started < PENDING_GRACE


@dataclass(frozen=True)
class PrunePlan:
    backups: tuple[str, ...]  # complete backups beyond `keep`: manifest first, then folder
    partial: tuple[str, ...]  # folders without a manifest (a crashed or failed backup), old enough to be dead
    objects: tuple[str, ...]  # shared objects no kept backup and no backup under way references
    locks: tuple[str, ...]  # locks of prunes that stopped deleting long ago (finished, or crashed)


def plan_prune(backups: Sequence[BackupInfo], pending: Mapping[str, Iterable[str]], folders: Iterable[str],
               objects: Iterable[str], locks: Mapping[str, datetime], keep: int, now: datetime) -> PrunePlan:
    """What a prune deletes, given what it listed: the complete `backups` (oldest first), the `pending`
    markers of fresh partial backups (id -> objects), every folder named like a backup id, the objects
    under files/ and the prune locks (name -> start)."""
    kept, doomed = backups[-keep:], backups[:-keep]
    complete = {info.id for info in backups}
    partial = sorted(name for name in folders if name not in complete and not is_fresh(name, now))
    referenced = {name for info in kept for name in info.objects}
    under_way = {name for backup_id, names in pending.items() if is_fresh(backup_id, now) for name in names}
    garbage = sorted(set(objects) - referenced - under_way)
    finished = sorted(set(locks) - set(prunes_in_the_way(locks, now)))
    return PrunePlan(tuple(info.id for info in doomed), tuple(partial), tuple(garbage), tuple(finished))
