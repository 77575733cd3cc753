"""`raftkv backup verify`: backups checked as a restore would check them, each stored file read once.

Backups under one URL share their files (version 2: by SHA-256, under files/), so checking
every backup one after the other would fetch a shared file once per backup that names it.
Instead each partition is checked in every backup holding it, from one staging folder:
a file is fetched once, linked into each backup's copy of the partition, and deleted when
no partition left to check needs it, so the local space is about one partition's files
over all the backups. A version-1 backup's files are its own: they stage apart.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, Sequence

from raftkv.backup.manifest import BackupInfo, partition_dir
from raftkv.backup.store import BackupStore


def verify_backups(store: BackupStore, infos: Sequence[BackupInfo], work: Path,
           received: Callable[[int], None] = lambda n: None) -> None:
    """Check every partition of `infos` as `BackupStore.download` does (each file's size and SHA-256, then
    RocksDB opens the checkpoint at the manifest's position), one partition at a time in scratch folders
    under `work`. CorruptData names the first backup and file that does not check out."""
    partitions = sorted({p for info in infos for p in info.partitions})
    for i, p in enumerate(partitions):
        for info in infos:
            if p not in info.partitions:
                continue
            scratch = work / f"{info.id}-{partition_dir(p)}"
            try:
                store.download(info, p, scratch, received, staged=_staging(work, info))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        later = {_staging(work, info) / entry.sha256 for info in infos for q in partitions[i + 1:]
                 if q in info.partitions for entry in info.copy_of(q).files}
        for folder in {_staging(work, info) for info in infos}:
            for kept in folder.iterdir() if folder.exists() else ():
                if kept not in later:
                    kept.unlink()


def bytes_to_read(infos: Sequence[BackupInfo]) -> int:
    """What `verify_backups` fetches: each stored file once."""
    return sum({(_staging(Path(), info), entry.sha256): entry.size
                for info in infos for copy in info.copies for entry in copy.files}.values())


def _staging(work: Path, info: BackupInfo) -> Path:
    return work / ("objects" if info.version > 1 else f"files-{info.id}")
