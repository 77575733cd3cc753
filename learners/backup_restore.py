"""Restoring a backup onto a stopped cluster, and backing up a running cluster without a learner.

Both go through `BackupStore` (raftkv/backup/store.py): the layout under the URL, the
manifest and the checksums are its.
"""

from __future__ import annotations

import shutil
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Iterable, Mapping


from raftkv.client.sync_client import Client
from raftkv.core.commands import Put
from raftkv.storage.engine import ZERO, Position
from raftkv.core.errors import ConfigError
from raftkv.core.partitioning import partitions_hosted_by
from raftkv.storage.rocks_engine import RocksEngine
from raftkv.core.spec import ClusterSpec
from raftkv.backup.store import BackupInfo, BackupStore, partition_dir

_SCAN_WRITE_KEYS = 1000


# -- restore -------------------------------------------------------------------


def restore(url: str, backup_id: str, spec: ClusterSpec, storage_options: Mapping | None = None) -> BackupInfo:
    """Write a backup into the data dirs of a fresh cluster `spec`, with every Raft position reset to zero.

    Everything is downloaded and verified before the first target is
    written, so a damaged backup leaves the target untouched.
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
    """Record position zero: the restored data is the new cluster's base state, not a log position."""
    engine = RocksEngine(folder)
    try:
        engine.write([], ZERO)
        engine.flush()
    finally:
        engine.close()


def _ranges(partitions: Iterable[int]) -> str:
    numbers = sorted(partitions)
    if numbers and numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{numbers[0]}-{numbers[-1]}" if len(numbers) > 1 else str(numbers[0])
    return ",".join(map(str, numbers)) or "none"


# -- a backup of a running cluster, without a learner ---------------------------


def backup_cluster(client: Client, cluster: str, store: BackupStore, work: Path, created: datetime) -> BackupInfo:
    """Scan every partition (linearizable) into a local RocksDB, checkpoint it, export.

    Each partition is consistent on its own, at the applied index its scan was
    served at; partitions are scanned one after another, at different moments.
    """
    cluster_id = client.topology().meta.cluster_id
    checkpoints = {p: _scan_into(client, p, work) for p in range(client.partitions)}
    return store.export(cluster, checkpoints, created, cluster_id)


def _scan_into(client: Client, partition: int, work: Path) -> tuple[Path, Position]:
    """Copy one partition, from one linearizable view, into a RocksDB under `work`; its checkpoint and position
    (the applied entry and its term, which a node seeding a new replica from the backup checks)."""
    engine = RocksEngine(work / "copy" / partition_dir(partition))
    try:
        position = ZERO
        for chunk in client.scan_chunks(partition, consistency="linearizable"):
            if position == ZERO:  # every chunk comes from the first one's view
                position = Position(chunk.applied_index, chunk.applied_term)
            puts = [Put(kv.key, kv.value) for kv in chunk.items]
            for start in range(0, len(puts), _SCAN_WRITE_KEYS):
                engine.write(puts[start:start + _SCAN_WRITE_KEYS], position)
        engine.write([], position)
        checkpoint = work / "export" / partition_dir(partition)
        checkpoint.parent.mkdir(exist_ok=True)
        return checkpoint, engine.checkpoint(checkpoint)
    finally:
        engine.close()
