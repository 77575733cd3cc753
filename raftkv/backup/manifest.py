"""The backup format: names under the URL, the manifest (versions 1 and 2) and the pending marker. Pure.

    <url>/files/<sha256[:2]>/<sha256>        version 2: each checkpoint file once, named by its content
    <url>/<backup id>/pending.json           a version-2 backup under way: the objects it will reference
    <url>/<backup id>/manifest.json          written last: a backup without it is partial, never listed
    <url>/<backup id>/p0000/<file>           version 1: the backup's own copy of each file
    <url>/locks/prune-<time>-<nonce>         a prune under way (docs/backup.md, "Prune")

A backup id is its creation time in UTC (`20260102T030405.123456Z`), so ids
sort in time order and retention needs no other state. Version 2 is written;
both are read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable

from raftkv.core.errors import CorruptData
from raftkv.storage.engine import Position

FORMAT = "raftkv-backup"
VERSION = 2
MANIFEST = "manifest.json"
PENDING = "pending.json"
FILES = "files"
LOCKS = "locks"
_PENDING_FORMAT = "raftkv-backup-pending"
_ID_FORMAT = "%Y%m%dT%H%M%S.%fZ"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_LOCK = re.compile(r"prune-(?P<id>[0-9T.]+Z)-[0-9a-f]+")


def partition_dir(partition: int) -> str:
    """The folder name of a partition, the same in a backup and in a node's data dir."""
    return f"p{partition:04d}"


def backup_id_for(created: datetime) -> str:
    return created.astimezone(timezone.utc).strftime(_ID_FORMAT)


def time_of(backup_id: str) -> datetime | None:
    """When the backup named `backup_id` started; None for a name that is not a backup id."""
    try:
        return datetime.strptime(backup_id, _ID_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def object_path(sha256: str) -> str:
    """Where a version-2 file lives, relative to the URL."""
    return f"{FILES}/{sha256[:2]}/{sha256}"


def is_object(name: str) -> bool:
    """Whether a name under files/ is one an export writes (a SHA-256 in lowercase hex)."""
    return _SHA256.fullmatch(name) is not None


def lock_name(started: datetime, nonce: str) -> str:
    return f"prune-{backup_id_for(started)}-{nonce}"


def lock_time(name: str) -> datetime | None:
    """When the prune that wrote lock `name` started; None for a name no prune writes."""
    found = _LOCK.fullmatch(name)
    return time_of(found["id"]) if found else None


# -- the manifest ------------------------------------------------------------


@dataclass(frozen=True)
class FileEntry:
    path: str  # where restore puts it, relative to the partition folders: p0000/000009.sst
    size: int
    sha256: str


@dataclass(frozen=True)
class PartitionCopy:
    """One partition's checkpoint: exactly the state after Raft entry `position`."""

    partition: int
    position: Position  # term 0: unknown (a backup from before terms were kept) or none (never written to)
    files: tuple[FileEntry, ...]


@dataclass(frozen=True)
class BackupInfo:
    """One complete backup, as its manifest describes it."""

    id: str
    cluster: str
    created: datetime
    copies: tuple[PartitionCopy, ...]
    cluster_id: str = ""  # the cluster's metadata id: a node seeds replicas only from its own cluster's backups
    version: int = VERSION

    @property
    def partitions(self) -> tuple[int, ...]:
        return tuple(c.partition for c in self.copies)

    @property
    def positions(self) -> dict[int, Position]:
        return {c.partition: c.position for c in self.copies}

    @property
    def total_bytes(self) -> int:
        return sum(f.size for c in self.copies for f in c.files)

    @property
    def objects(self) -> dict[str, int]:
        """sha256 -> size of every shared object the backup references (none for version 1)."""
        if self.version == 1:
            return {}
        return {f.sha256: f.size for c in self.copies for f in c.files}

    def location(self, entry: FileEntry) -> str:
        """Where a file of the backup is stored, relative to the URL."""
        return f"{self.id}/{entry.path}" if self.version == 1 else object_path(entry.sha256)

    def copy_of(self, partition: int) -> PartitionCopy:
        return next(c for c in self.copies if c.partition == partition)

    def to_manifest(self) -> bytes:
        doc = {
            "format": FORMAT,
            "version": self.version,
            "id": self.id,
            "cluster": self.cluster,
            "cluster_id": self.cluster_id,
            "created": self.created.isoformat(),
            "partitions": [
                {
                    "partition": c.partition,
                    "index": c.position.index,
                    "term": c.position.term,
                    "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in c.files],
                }
                for c in self.copies
            ],
        }
        return json.dumps(doc, indent=2).encode()

    @classmethod
    def from_manifest(cls, data: bytes, where: str) -> BackupInfo:
        """Parse and check a manifest; `where` names it in the error."""
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") not in (1, VERSION):
                raise ValueError(f"not a {FORMAT} manifest of version 1 or {VERSION}")
            copies = tuple(_partition_copy(p) for p in doc["partitions"])
            return cls(_typed_field(doc, "id", str), _typed_field(doc, "cluster", str),
                       datetime.fromisoformat(doc["created"]), copies, str(doc.get("cluster_id", "")),
                       doc["version"])
        except (ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: JSON nested too deep
            raise CorruptData(f"{where}: unreadable backup manifest ({exc})") from None

    def pending_marker(self) -> bytes:
        """What an export writes before it uploads: the objects the backup will reference."""
        return pending_marker(self.id, self.objects)


def _partition_copy(doc: dict) -> PartitionCopy:
    partition = _typed_field(doc, "partition", int)
    files = tuple(FileEntry(_typed_field(f, "path", str), _typed_field(f, "size", int), _sha256(f["sha256"]))
                  for f in doc["files"])
    for f in files:  # restore writes these paths locally: nothing may point elsewhere
        folder, _, name = f.path.partition("/")
        if folder != partition_dir(partition) or name in ("", ".", "..") or any(c in name for c in "/\\\0"):
            raise ValueError(f"file {f.path!r} is not a plain name in {partition_dir(partition)}/")
    return PartitionCopy(partition, Position(_typed_field(doc, "index", int), _typed_field(doc, "term", int)), files)


def _typed_field(doc: dict, key: str, kind: type) -> str | int:
    """doc[key], a text or a count (an integer, not negative, not a boolean)."""
    value = doc[key]
    if type(value) is not kind or (kind is int and value < 0):
        raise ValueError(f"{key}: expected {'a count' if kind is int else 'text'}, got {value!r}")
    return value


def _sha256(value: object) -> str:
    """A SHA-256 in lowercase hex: a version-2 file is fetched from the path it names."""
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise ValueError(f"sha256: expected 64 lowercase hex digits, got {value!r}")
    return value


def pending_marker(backup_id: str, objects: Iterable[str]) -> bytes:
    """A backup's pending marker: the objects it will (or, before it has hashed everything, may) reference."""
    return json.dumps({"format": _PENDING_FORMAT, "id": backup_id, "objects": sorted(objects)}).encode()


def pending_objects(data: bytes, where: str) -> frozenset[str]:
    """The objects a pending marker names; CorruptData if it is not one."""
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("format") != _PENDING_FORMAT or not isinstance(doc["objects"], list):
            raise ValueError(f"not a {_PENDING_FORMAT} marker")
        return frozenset(_sha256(name) for name in doc["objects"])
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise CorruptData(f"{where}: unreadable pending marker ({exc})") from None
