"""Backups on any fsspec URL: layout, manifest, export, listing, retention, restore.

    <url>/<backup id>/manifest.json      written last: a backup without it is partial, never listed
    <url>/<backup id>/p0000/<file>        a RocksDB checkpoint of partition 0, one file per object
    <url>/<backup id>/p0001/<file>        ...

A backup id is its creation time in UTC (`20260102T030405.123456Z`), so ids
sort in time order and retention needs no other state. Every storage call
goes through fsspec; a storage failure becomes `Unavailable` with one line,
a file that does not match its manifest becomes `CorruptData`.

Restore builds a fresh cluster's data: each partition's checkpoint is copied
to `<node data_dir>/p<NNNN>/db` of every node hosting it, with its Raft
position reset to zero. The new cluster's logs start at index 1 and replicas
skip entries at or below the stored position, so an old position would make
them drop the new cluster's first writes. The data is the base state, not a
log position.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Iterator, Mapping

import fsspec

from raftkv.storage.engine import Position
from raftkv.core.errors import ConfigError, CorruptData, RaftKVError, Unavailable

FORMAT = "raftkv-backup"
VERSION = 1
MANIFEST = "manifest.json"
LATEST = "latest"
PARTIAL_UPLOAD_GRACE = timedelta(days=1)
_ID_FORMAT = "%Y%m%dT%H%M%S.%fZ"
_CHUNK = 4 << 20


def partition_dir(partition: int) -> str:
    """The folder name of a partition, the same in a backup and in a node's data dir."""
    return f"p{partition:04d}"


def backup_id_for(created: datetime) -> str:
    return created.astimezone(timezone.utc).strftime(_ID_FORMAT)


# -- the manifest ------------------------------------------------------------


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the backup's folder: p0000/000009.sst
    size: int
    sha256: str


@dataclass(frozen=True)
class PartitionCopy:
    """One partition's checkpoint: exactly the state after Raft entry `position`."""

    partition: int
    position: Position  # term 0: unknown (a scan reports only its applied index)
    files: tuple[FileEntry, ...]


@dataclass(frozen=True)
class BackupInfo:
    """One complete backup, as its manifest describes it."""

    id: str
    cluster: str
    created: datetime
    copies: tuple[PartitionCopy, ...]
    cluster_id: str = ""  # the cluster's metadata id: a node seeds replicas only from its own cluster's backups

    @property
    def partitions(self) -> tuple[int, ...]:
        return tuple(c.partition for c in self.copies)

    @property
    def positions(self) -> dict[int, Position]:
        return {c.partition: c.position for c in self.copies}

    @property
    def total_bytes(self) -> int:
        return sum(f.size for c in self.copies for f in c.files)

    def copy_of(self, partition: int) -> PartitionCopy:
        return next(c for c in self.copies if c.partition == partition)

    def to_manifest(self) -> bytes:
        doc = {
            "format": FORMAT,
            "version": VERSION,
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
            if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
                raise ValueError(f"not a {FORMAT} manifest of version {VERSION}")
            copies = tuple(_partition_copy(p) for p in doc["partitions"])
            return cls(_typed_field(doc, "id", str), _typed_field(doc, "cluster", str),
                       datetime.fromisoformat(doc["created"]), copies, str(doc.get("cluster_id", "")))
        except (ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: JSON nested too deep
            raise CorruptData(f"{where}: unreadable backup manifest ({exc})") from None


def _partition_copy(doc: dict) -> PartitionCopy:
    partition = _typed_field(doc, "partition", int)
    files = tuple(FileEntry(_typed_field(f, "path", str), _typed_field(f, "size", int), _typed_field(f, "sha256", str))
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


# -- storage options ---------------------------------------------------------


def parse_storage_options(pairs: Iterable[tuple[str, str]]) -> dict:
    """fsspec keyword arguments from text pairs.

    Dotted keys nest (`client_kwargs.region_name`); `true`/`false` become
    booleans and decimal digits integers, because options arrive as text from
    flags and sink configs while fsspec backends expect typed values.
    """
    options: dict = {}
    for key, value in pairs:
        *parents, leaf = key.split(".")
        table = options
        for part in parents:
            table = table.setdefault(part, {})
        table[leaf] = _typed(value)
    return options


def _typed(value: str) -> bool | int | str:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    return int(value) if value.isdigit() else value


# -- the store -----------------------------------------------------------------


class BackupStore:
    """The backups under one URL."""

    def __init__(self, url: str, storage_options: Mapping | None = None, source: str = "url"):
        self.url = url.rstrip("/")
        try:
            # A fresh instance each time: fsspec's cached ones keep directory listings
            # that other writers (another learner, `raftkv backup create`) make stale.
            self._fs, root = fsspec.core.url_to_fs(self.url, skip_instance_cache=True, **(storage_options or {}))
        except (ValueError, ImportError, TypeError) as exc:
            raise ConfigError(f"cannot use {url!r}: {exc}", source=source) from None
        self._root = root.rstrip("/")

    @contextmanager
    def _storage(self, action: str) -> Iterator[None]:
        """Turn any storage failure into one line; raftkv's own errors pass through.

        fsspec backends raise their own types for an unreachable endpoint
        (botocore's EndpointConnectionError for s3://), so no narrower
        catch covers every URL scheme.
        """
        try:
            yield
        except RaftKVError:
            raise
        except Exception as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise Unavailable(f"cannot {action} {self.url}: {reason}") from exc

    def _path(self, *parts: str) -> str:
        return "/".join((self._root, *parts))

    # export

    def export(self, cluster: str, checkpoints: Mapping[int, tuple[Path, Position]], created: datetime,
               cluster_id: str = "") -> BackupInfo:
        """Upload checkpoints (partition -> (folder, position)), then the manifest that makes them a backup."""
        backup_id = backup_id_for(created)
        copies = tuple(
            self._upload_partition(backup_id, p, folder, position)
            for p, (folder, position) in sorted(checkpoints.items())
        )
        info = BackupInfo(backup_id, cluster, created.astimezone(timezone.utc), copies, cluster_id)
        manifest, staged = self._path(backup_id, MANIFEST), self._path(backup_id, MANIFEST + ".tmp")
        with self._storage("write the manifest to"):
            self._fs.pipe_file(staged, info.to_manifest())
            self._fs.mv(staged, manifest)  # appears whole: listing never sees half a manifest
        return info

    def _upload_partition(self, backup_id: str, partition: int, folder: Path, position: Position) -> PartitionCopy:
        name = partition_dir(partition)
        with self._storage("upload to"):
            self._fs.makedirs(self._path(backup_id, name), exist_ok=True)
            files = tuple(
                self._upload_file(local, f"{name}/{local.name}", backup_id)
                for local in sorted(folder.iterdir())
                if local.is_file()
            )
        return PartitionCopy(partition, position, files)

    def _upload_file(self, local: Path, relative: str, backup_id: str) -> FileEntry:
        digest, size = hashlib.sha256(), 0
        with local.open("rb") as src, self._fs.open(self._path(backup_id, relative), "wb") as dst:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                dst.write(chunk)
                size += len(chunk)
        return FileEntry(relative, size, digest.hexdigest())

    # listing

    def backups(self) -> list[BackupInfo]:
        """Complete backups, oldest first."""
        with self._storage("list backups in"):
            infos = [self._read_manifest(path) for path in self._fs.glob(self._path("*", MANIFEST))]
        return sorted(infos, key=lambda info: info.id)

    def _read_manifest(self, path: str) -> BackupInfo:
        folder = PurePosixPath(path).parent.name
        where = f"{self.url}/{folder}/{MANIFEST}"
        info = BackupInfo.from_manifest(self._fs.cat_file(path), where)
        if info.id != folder:  # files are fetched from the folder named by the id
            raise CorruptData(f"{where}: the manifest is of backup {info.id!r}, not {folder}")
        return info

    def get(self, backup_id: str) -> BackupInfo:
        """A backup by id, or the newest for `latest`."""
        backups = self.backups()
        if not backups:
            raise ConfigError(f"no backups in {self.url}", source="--backup")
        if backup_id == LATEST:
            return backups[-1]
        for info in backups:
            if info.id == backup_id:
                return info
        raise ConfigError(
            f"no backup {backup_id!r} in {self.url}; newest: {backups[-1].id} (see `raftkv backup list`)",
            source="--backup",
        )

    # retention

    def prune(self, keep: int, now: datetime) -> list[str]:
        """Delete the oldest complete backups beyond `keep`, and partial uploads older than a day.

        A partial upload (no manifest) is what an export that failed or crashed
        leaves; one started a day ago cannot still be in progress.
        """
        backups = self.backups()
        doomed = [info.id for info in backups[:-keep]]
        complete = {info.id for info in backups}
        with self._storage("apply retention in"):
            for backup_id in doomed:
                self._fs.rm_file(self._path(backup_id, MANIFEST))  # unlisted first, then removed
                self._fs.rm(self._path(backup_id), recursive=True)
            for name, started in self._ids_present():
                if name not in complete and started < now - PARTIAL_UPLOAD_GRACE:
                    self._fs.rm(self._path(name), recursive=True)
                    doomed.append(name)
        return doomed

    def _ids_present(self) -> list[tuple[str, datetime]]:
        """(name, start time) of every folder named like a backup id; anything else there is not ours."""
        found = []
        for path in self._fs.ls(self._root, detail=False):
            name = PurePosixPath(path).name
            try:
                found.append((name, datetime.strptime(name, _ID_FORMAT).replace(tzinfo=timezone.utc)))
            except ValueError:
                continue
        return found

    # download

    def download(self, info: BackupInfo, partition: int, dest: Path,
                 received: Callable[[int], None] = lambda n: None) -> None:
        """Fetch a partition's checkpoint into `dest`, checking every file against the manifest;
        `received(n)` hears of every n bytes."""
        dest.mkdir(parents=True)
        for entry in info.copy_of(partition).files:
            where = f"{self.url}/{info.id}/{entry.path}"
            with self._storage("download from"):
                digest, size = self._fetch(self._path(info.id, entry.path), dest / PurePosixPath(entry.path).name,
                                           received)
            if (digest, size) != (entry.sha256, entry.size):
                raise CorruptData(
                    f"{where}: {size} bytes with sha256 {digest[:12]}…, the manifest says {entry.size} bytes "
                    f"with sha256 {entry.sha256[:12]}…; the backup is damaged, restore another one"
                )

    def _fetch(self, remote: str, local: Path, received: Callable[[int], None]) -> tuple[str, int]:
        digest, size = hashlib.sha256(), 0
        with self._fs.open(remote, "rb") as src, local.open("wb") as dst:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                dst.write(chunk)
                size += len(chunk)
                received(len(chunk))
        return digest.hexdigest(), size


def list_backups(url: str, storage_options: Mapping | None = None) -> list[BackupInfo]:
    """Complete backups under `url`, oldest first."""
    return BackupStore(url, storage_options, source="--from").backups()
