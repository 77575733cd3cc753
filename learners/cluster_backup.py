"""A backup of a running cluster without a learner (`raftkv backup create`), fetching only what changed.

For each partition the leader checkpoints its database and lists the files with their sizes and the
SHA-256 of each table file (`Client.checkpoint_files`, docs/backup.md "What `backup create`
fetches"). Before choosing, the backup announces the objects it may reuse in its pending marker
and lists what the store holds (`BackupStore.reserve`), so no prune collects a file it chose to
skip; it then fetches the files the store lacks and every small file that changes, and exports
them with the skipped ones named from the listing (`BackupStore.export`).
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from pathlib import Path
from typing import Callable

from raftkv.api.checkpoint_stream import ListedFile
from raftkv.backup.manifest import BackupInfo, FileEntry, backup_id_for, partition_dir
from raftkv.backup.plan import to_fetch
from raftkv.backup.store import BackupStore
from raftkv.client.sync_client import Client
from raftkv.core.errors import RaftKVError


def _ignore(n: int) -> None:
    pass


def backup_cluster(client: Client, cluster: str, store: BackupStore, work: Path, created: datetime,
                   sent: Callable[[int], None] = _ignore, planned: Callable[[int], None] = _ignore,
                   copying: Callable[[int], None] = _ignore, fetched: Callable[[int], None] = _ignore) -> BackupInfo:
    """Back up every partition from a checkpoint of its leader into `store`, the files it fetches going
    through `work` (`copying(p)` hears of each partition as its copy starts, `fetched(n)` of the n bytes
    of files it fetches, `planned(n)` of the bytes to upload, `sent(n)` of each n uploaded).

    Each partition is exactly the state after its recorded entry; partitions are copied one after
    another, at different moments. A leader's table files never change, so from one backup to the next
    only what was written (or compacted) since is fetched and uploaded.
    """
    cluster_id = client.topology().meta.cluster_id
    announced: dict[str, int] = {}  # the table files of every listing so far: what the pending marker names
    checkpoints, stored = {}, {}
    try:
        for p in range(client.partitions):
            copying(p)
            folder = work / partition_dir(p)
            chosen: list[str] = []

            def choose(listed: list[ListedFile]) -> list[str]:
                announced.update((f.sha256, f.size) for f in listed if f.sha256)
                chosen[:] = to_fetch(listed, store.reserve(created, announced))
                return list(chosen)

            position, listed = client.checkpoint_files(p, folder, choose)
            fetched(sum(f.size for f in listed if f.path in chosen))
            checkpoints[p] = (folder, position)
            stored[p] = [FileEntry(f"{partition_dir(p)}/{f.path}", f.size, f.sha256)
                         for f in listed if f.path not in chosen]
        return store.export(cluster, checkpoints, created, cluster_id, sent, planned, stored)
    except Exception:
        if announced:  # its pending marker would keep the files it announced for a day
            with contextlib.suppress(RaftKVError):
                store.abandon(backup_id_for(created))
        raise
