"""Restoring backups onto a stopped cluster, to a backup or to a point of the log with a change feed.

It goes through `BackupStore` (raftkv/backup/store.py): the layout under the URL, the
manifest (raftkv/backup/manifest.py) and the checks are its. Which backup and which feed events
bring a partition to a point of its log is `restore_plan.py`'s decision.

A restore builds every partition in `<first node's data_dir>/.restore-staging` before it writes a target:

    objects/<sha256>         each file of the backups, once it checked out (kept from one attempt to the next)
    p0000-<key>/db           a partition downloaded, replayed to its target and reset to position zero
    placed.json              target folder -> the key of the partition placed there

and writes each target `<data_dir>/p0000` as `.p0000.restoring`, renamed into place: a target holds a whole
partition or nothing. A restore interrupted anywhere (killed mid-download, a full disk) can be run again
with the same arguments: it fetches only the files it lacks, rebuilds only the partitions it had not
finished and skips the targets it placed. The staging folder goes once every target is placed.
"""

from __future__ import annotations

import json
import shutil
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable, Mapping

from learners.feed_history import FeedHistory
from learners.restore_plan import Coverage, Replay, Replayer, index_at_time, plan_restore
from raftkv.backup.manifest import BackupInfo, partition_dir
from raftkv.backup.store import BackupStore
from raftkv.core.errors import ConfigError, InvalidRequest
from raftkv.core.overlay import Overlay
from raftkv.core.partitioning import partitions_hosted_by
from raftkv.core.spec import ClusterSpec
from raftkv.storage.engine import ZERO
from raftkv.storage.rocks_engine import RocksEngine

STAGING = ".restore-staging"
_PLACED = "placed.json"
_REPLAY_BATCH = 10_000  # events written to a partition's copy at once


def _ignore(n: int) -> None:
    pass


# -- restore -------------------------------------------------------------------


def restore(url: str, backup_id: str, spec: ClusterSpec, storage_options: Mapping | None = None,
            received: Callable[[int], None] = _ignore, planned: Callable[[int], None] = _ignore) -> BackupInfo:
    """Write a backup into the data dirs of a fresh cluster `spec`, with every Raft position reset to zero.

    Everything is downloaded and verified (`BackupStore.download`: every file's size and hash, each
    checkpoint opened read-only) before the first target is written, so a damaged backup leaves the
    targets untouched. `planned(n)` hears once how many bytes will be downloaded, `received(n)` of each n.
    """
    store = BackupStore(url, storage_options, source="--from")
    info = store.get(backup_id)
    _check_partitions(f"backup {info.id}", info.partitions, spec)
    at = {p: info.positions[p].index for p in info.partitions}
    _build_and_place(store, {p: Replay(p, info, at[p], at[p]) for p in info.partitions}, spec, None,
                     received, planned)
    return info


def restore_to(url: str, spec: ClusterSpec, targets: Mapping[int, int] | int, feed: FeedHistory | None,
               storage_options: Mapping | None = None, received: Callable[[int], None] = _ignore,
               planned: Callable[[int], None] = _ignore) -> dict[int, tuple[Replay, int | None]]:
    """Write the state of each partition at a point of its log into the data dirs of a fresh cluster `spec`:
    the newest backup at or before it, then the feed's events up to it (docs/backup.md, "Point-in-time
    restore"). `targets` is partition -> index, or a time in milliseconds since the epoch (every change
    the feed captured by then). Returns partition -> (its plan, the events it replayed; None when it needed
    none, or an earlier attempt at this restore had built the partition).

    Which backups, which events and whether the feed holds all of them is decided before anything is
    downloaded; a gap is an InvalidRequest naming it, and nothing is written.
    """
    store = BackupStore(url, storage_options, source="--from")
    backups = store.backups()
    if feed is not None and feed.cluster:
        backups = [info for info in backups if info.cluster == feed.cluster]
    if not backups:
        of = f" of cluster {feed.cluster!r}, the feed's," if feed is not None and feed.cluster else ""
        raise ConfigError(f"no backups{of} in {store.url}", source="--from")
    partitions = backups[-1].partitions
    _check_partitions(f"backup {backups[-1].id}", partitions, spec)
    coverage = feed.coverage() if feed is not None else {}
    if isinstance(targets, int):
        targets = _indices_at_time(feed, coverage, partitions, targets)
    plans = plan_restore(backups, targets, coverage, partitions)
    replayed = _build_and_place(store, plans, spec, feed, received, planned)
    return {p: (plan, replayed.get(p)) for p, plan in plans.items()}


def _indices_at_time(feed: FeedHistory | None, coverage: Mapping[int, Coverage], partitions: Iterable[int],
                     at_ms: int) -> dict[int, int]:
    """Per partition, the end of the longest prefix of its log the feed had captured by `at_ms`."""
    if feed is None:
        raise ConfigError("a time needs the feed's timestamps: give --feed", source="--to-time")
    targets = {}
    for p in partitions:
        if p not in coverage:
            raise InvalidRequest(f"partition {p}: the feed holds nothing of the partition; nothing was restored")
        held = coverage[p]
        stamps = ((e.index, e.ts_ms) for e in feed.events(p, held.earliest, held.latest))
        targets[p] = index_at_time(p, held, stamps, at_ms)
    return targets


def restore_targets(spec: ClusterSpec) -> dict[int, list[Path]]:
    """partition -> the partition folders (`<data_dir>/p<NNNN>`) of every node hosting it."""
    targets: dict[int, list[Path]] = {p: [] for p in range(spec.partitions)}
    for node in spec.nodes:
        for p in partitions_hosted_by(node.id, spec.node_ids, spec.partitions, spec.replication):
            targets[p].append(node.data_dir / partition_dir(p))
    return targets


def _build_and_place(store: BackupStore, plans: Mapping[int, Replay], spec: ClusterSpec, feed: FeedHistory | None,
                     received: Callable[[int], None], planned: Callable[[int], None]) -> dict[int, int]:
    """Build every partition in the staging folder, then place it in every target; the events replayed."""
    targets = restore_targets(spec)
    staging = spec.nodes[0].data_dir / STAGING
    placed = _placed(staging)
    keys = {p: plan.key() for p, plan in plans.items()}
    _check_empty(targets, placed, keys)
    ready = {p: staging / f"{partition_dir(p)}-{keys[p]}" for p in plans}
    objects = staging / "objects"
    to_build = [p for p in plans if not (ready[p] / "db").exists()]
    store.stage([(plans[p].backup, p) for p in to_build], objects, received, planned)  # every partition at once
    replayed = {}
    for p in to_build:
        building = staging / f"{partition_dir(p)}.building"
        shutil.rmtree(building, ignore_errors=True)
        store.download(plans[p].backup, p, building / "db", received, staged=objects)
        if plans[p].needs_feed:
            replayed[p] = _replay(building, plans[p], feed)
        _reset_position(building)
        building.rename(ready[p])
    for p, folders in targets.items():
        for folder in folders:
            if placed.get(str(folder)) == keys[p] and (folder / "db").exists():
                continue  # placed by an earlier attempt at this same restore
            placed[str(folder)] = keys[p]  # before the rename: a crash after it leaves no unexplained target
            _write_placed(staging, placed)
            temp = folder.with_name(f".{folder.name}.restoring")
            shutil.rmtree(temp, ignore_errors=True)
            shutil.copytree(ready[p] / "db", temp / "db")
            temp.replace(folder)  # over an empty folder, or none
    shutil.rmtree(staging)
    return replayed


def _replay(folder: Path, plan: Replay, feed: FeedHistory) -> int:
    """Apply the feed's events of `plan` to the partition copy in `folder`; how many there were."""
    replayer = Replayer(plan)
    events = iter(feed.events(plan.partition, plan.after, plan.until))
    engine = RocksEngine(folder)
    try:
        while chunk := list(islice(events, _REPLAY_BATCH)):
            view = Overlay(engine.get)
            replayer.apply(chunk, view)
            engine.write(view.mutations, engine.position)
    finally:
        engine.close()
    return replayer.applied


def _placed(staging: Path) -> dict[str, str]:
    path = staging / _PLACED
    return json.loads(path.read_text()) if path.exists() else {}


def _write_placed(staging: Path, placed: dict[str, str]) -> None:
    staging.mkdir(parents=True, exist_ok=True)
    temp = staging / f".{_PLACED}.tmp"
    temp.write_text(json.dumps(placed, indent=1))
    temp.replace(staging / _PLACED)


def _check_partitions(what: str, partitions: Iterable[int], spec: ClusterSpec) -> None:
    """A key's partition is crc32 mod P, so the data fits only a cluster with the same partitions."""
    if sorted(partitions) != list(range(spec.partitions)):
        raise ConfigError(
            f"{what} holds partitions {_ranges(partitions)} but the spec has {spec.partitions} "
            f"partitions (0-{spec.partitions - 1}); restore needs a spec with the backup's partition count",
            source=str(spec.path or "spec"),
        )


def _check_empty(targets: dict[int, list[Path]], placed: Mapping[str, str], keys: Mapping[int, str]) -> None:
    """Every target folder is empty, or holds what an earlier attempt at this same restore placed there."""
    for p, folders in targets.items():
        for folder in folders:
            if placed.get(str(folder)) == keys[p]:
                continue
            if folder.exists() and any(folder.iterdir()):
                raise ConfigError(
                    f"{folder} already holds data; restore builds a fresh cluster, so give it a spec whose "
                    "data dirs are empty",
                    source="backup restore",
                )


def _reset_position(folder: Path) -> None:
    """Record position zero and no learners: the restored data is the new cluster's base state, not a log
    position, and the learners a voter's checkpoint names (with their progress) are the old cluster's."""
    engine = RocksEngine(folder)
    try:
        engine.write([], ZERO, meta={key: None for key, _ in engine.meta_items()})
        engine.flush()
    finally:
        engine.close()


def _ranges(partitions: Iterable[int]) -> str:
    numbers = sorted(partitions)
    if numbers and numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{numbers[0]}-{numbers[-1]}" if len(numbers) > 1 else str(numbers[0])
    return ",".join(map(str, numbers)) or "none"
