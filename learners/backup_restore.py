"""Restoring a backup onto a stopped cluster, and backing up a running cluster without a learner.

Both go through `BackupStore` (raftkv/backup/store.py): the layout under the URL, the
manifest (raftkv/backup/manifest.py) and the checks are its.
"""

from __future__ import annotations

import shutil
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable, Mapping

from raftkv.client.sync_client import Client
from raftkv.storage.engine import ZERO
from raftkv.core.errors import ConfigError
from raftkv.core.partitioning import partitions_hosted_by
from raftkv.storage.rocks_engine import RocksEngine
from raftkv.core.spec import ClusterSpec
from raftkv.backup.manifest import BackupInfo, partition_dir
from raftkv.backup.store import BackupStore

# -- restore -------------------------------------------------------------------


def restore(url: str, backup_id: str, spec: ClusterSpec, storage_options: Mapping | None = None) -> BackupInfo:
    """Write a backup into the data dirs of a fresh cluster `spec`, with every Raft position reset to zero.

    Everything is downloaded and verified (`BackupStore.download`: every file's size and hash, each
    checkpoint opened read-only) before the first target is written, so a damaged backup leaves the
    targets untouched.
    """
    store = BackupStore(url, storage_options, source="--from")
    info = store.get(backup_id)
    _check_partitions(info, spec)
    targets = restore_targets(spec)
    _check_empty(targets)
    staging_parent = spec.nodes[0].data_dir
    staging_parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".restore-", dir=staging_parent) as tmp:
        staged = {p: Path(tmp) / partition_dir(p) for p in info.partitions}
        for p, folder in staged.items():
            store.download(info, p, folder / "db")
            _reset_position(folder)
        for p, folders in targets.items():
            for folder in folders:
                shutil.copytree(staged[p] / "db", folder / "db")
    return info


def restore_targets(spec: ClusterSpec) -> dict[int, list[Path]]:
    """partition -> the partition folders (`<data_dir>/p<NNNN>`) of every node hosting it."""
    targets: dict[int, list[Path]] = {p: [] for p in range(spec.partitions)}
    for node in spec.nodes:
        for p in partitions_hosted_by(node.id, spec.node_ids, spec.partitions, spec.replication):
            targets[p].append(node.data_dir / partition_dir(p))
    return targets


def _check_partitions(info: BackupInfo, spec: ClusterSpec) -> None:
    """A key's partition is crc32 mod P, so the data fits only a cluster with the same partitions."""
    if sorted(info.partitions) != list(range(spec.partitions)):
        raise ConfigError(
            f"backup {info.id} holds partitions {_ranges(info.partitions)} but the spec has {spec.partitions} "
            f"partitions (0-{spec.partitions - 1}); restore needs a spec with the backup's partition count",
            source=str(spec.path or "spec"),
        )


def _check_empty(targets: dict[int, list[Path]]) -> None:
    for folders in targets.values():
        for folder in folders:
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


# -- a backup of a running cluster, without a learner ---------------------------


def backup_cluster(client: Client, cluster: str, store: BackupStore, work: Path, created: datetime,
                   sent: Callable[[int], None] = lambda n: None) -> BackupInfo:
    """Copy each partition's checkpoint from its leader into `work`, then export them (`sent(n)`: n bytes
    uploaded).

    Each partition is exactly the state after its recorded entry; partitions are copied one after
    another, at different moments. The files are the leader's own table files, which RocksDB never
    changes, so from one backup to the next only what was written (or compacted) since is new, and
    only that is uploaded.
    """
    cluster_id = client.topology().meta.cluster_id
    checkpoints = {}
    for p in range(client.partitions):
        folder = work / partition_dir(p)
        checkpoints[p] = (folder, client.checkpoint(p, folder))
    return store.export(cluster, checkpoints, created, cluster_id, sent)
