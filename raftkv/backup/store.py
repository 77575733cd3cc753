"""Backups on any fsspec URL: export, listing, retention, download and verification.

The names under the URL and the manifest are `manifest.py`'s; what an export
uploads and what a prune deletes, `plan.py`'s. Every storage call goes through
fsspec; a storage failure becomes `Unavailable` with one line, a file that is
missing or does not match its manifest `CorruptData`. Files move TRANSFERS at a
time (fsspec calls from a bounded thread pool: an S3 request mostly waits).

Restore builds a fresh cluster's data: each partition's checkpoint is copied
to `<node data_dir>/p<NNNN>/db` of every node hosting it, with its Raft
position reset to zero. The new cluster's logs start at index 1 and replicas
skip entries at or below the stored position, so an old position would make
them drop the new cluster's first writes. The data is the base state, not a
log position.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Iterator, Mapping


from raftkv import failpoints
from raftkv.backup.digests import IMMUTABLE, FileDigests
from raftkv.backup.manifest import (FILES, LOCKS, MANIFEST, PENDING, BackupInfo, FileEntry, PartitionCopy,
                                    backup_id_for, is_object, lock_name, lock_time, object_path, partition_dir,
                                    pending_marker, pending_objects, time_of)
from raftkv.backup.plan import (CLOCK_MARGIN, MAX_EXPORT, PRUNE_WINDOW, is_fresh, plan_prune, prunes_in_the_way,
                                to_upload)
from raftkv.core.errors import ConfigError, CorruptData, RaftKVError, Unavailable
from raftkv.storage.engine import Position
from raftkv.storage.rocks_files import checkpoint_position

log = logging.getLogger(__name__)

LATEST = "latest"
TRANSFERS = 8  # files uploaded or downloaded at once
_CHUNK = 4 << 20
_DELETES_PER_CALL = 1000  # S3's DeleteObjects takes at most this many keys
_OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "abfs", "az"}  # a PUT stores an object whole, or not at all
_PRUNE_POLL_SECONDS = 1.0


@dataclass(frozen=True)
class Pruned:
    backups: tuple[str, ...]  # complete backups deleted
    partial: tuple[str, ...]  # partial ones deleted
    objects: int  # shared objects deleted
    bytes: int  # their size
    left: int  # garbage objects left for the next prune (its window closed)


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


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
    """The backups under one URL. `clock` is the wall clock backup ids, markers and locks are dated by."""

    def __init__(self, url: str, storage_options: Mapping | None = None, source: str = "url",
                 clock: Callable[[], datetime] = _utc_now):
        import fsspec  # here, not at the top: a node without a backup URL never pays for importing it

        self.url = url.rstrip("/")
        try:
            # A fresh instance each time, and its listings never cached (`_listing`): another writer
            # (a learner, `raftkv backup create`, a prune) changes what is there at any moment.
            self._fs, root = fsspec.core.url_to_fs(self.url, skip_instance_cache=True, **(storage_options or {}))
        except (ValueError, ImportError, TypeError) as exc:
            raise ConfigError(f"cannot use {url!r}: {exc}", source=source) from None
        self._root = root.rstrip("/")
        protocols = {self._fs.protocol} if isinstance(self._fs.protocol, str) else set(self._fs.protocol)
        self._atomic_puts = bool(protocols & _OBJECT_STORES)
        self._clock = clock
        self._digests = FileDigests()

    @contextlib.contextmanager
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

    def _listing(self) -> None:
        """Forget every listing fsspec cached: the next one asks the storage. Called before each."""
        self._fs.invalidate_cache()

    def _write(self, data: bytes | Path, remote: str) -> None:
        if not self._atomic_puts:
            self._fs.makedirs(str(PurePosixPath(remote).parent), exist_ok=True)
        if isinstance(data, Path):
            self._fs.put_file(str(data), remote)
        else:
            self._fs.pipe_file(remote, data)

    def _put_whole(self, data: bytes | Path, remote: str, backup_id: str) -> None:
        """Write `remote` so that a reader sees all of it or nothing: an object store stores a PUT whole;
        elsewhere the data goes to a file in the backup's folder first, then is renamed into place."""
        if self._atomic_puts:
            self._write(data, remote)
            return
        staged = self._path(backup_id, f".{PurePosixPath(remote).name}.tmp")
        self._write(data, staged)
        self._fs.makedirs(str(PurePosixPath(remote).parent), exist_ok=True)
        self._fs.mv(staged, remote)

    def _remove(self, paths: list[str], recursive: bool = False) -> None:
        """Delete those of `paths` still there: another prune may have been first, and on an object store
        a folder is gone with its last object."""
        if not paths:
            return
        try:
            self._fs.rm(paths, recursive=recursive)
        except FileNotFoundError:
            for path in paths:
                with contextlib.suppress(FileNotFoundError):
                    self._fs.rm(path, recursive=recursive)

    # export

    def export(self, cluster: str, checkpoints: Mapping[int, tuple[Path, Position]], created: datetime,
               cluster_id: str = "", sent: Callable[[int], None] = lambda n: None,
               planned: Callable[[int], None] = lambda n: None,
               stored: Mapping[int, Iterable[FileEntry]] | None = None) -> BackupInfo:
        """Make a backup of checkpoints (partition -> (folder, position)): upload the files no stored
        object holds yet, then the manifest that makes them a backup. `stored` names, per partition, the
        files of its checkpoint that are not in its folder but under files/ (`reserve`d under the same
        `created`). `planned(n)` hears once how many bytes will be uploaded, `sent(n)` of every n bytes
        uploaded (from the upload threads). The order of steps is what keeps a concurrent prune off the
        files (docs/backup.md)."""
        backup_id = backup_id_for(created)
        local = {p: sorted(f for f in folder.iterdir() if f.is_file()) for p, (folder, _) in checkpoints.items()}
        digests = self._digests.of([f for files in local.values() for f in files])
        copies = tuple(
            PartitionCopy(p, checkpoints[p][1], tuple(sorted(
                [FileEntry(f"{partition_dir(p)}/{f.name}", digests[f][1], digests[f][0]) for f in files]
                + list((stored or {}).get(p, ())), key=lambda entry: entry.path)))
            for p, files in sorted(local.items())
        )
        info = BackupInfo(backup_id, cluster, created.astimezone(timezone.utc), copies, cluster_id)
        sources = {sha256: path for path, (sha256, _) in digests.items()}
        with self._storage("upload to"):
            self._put_whole(info.pending_marker(), self._path(backup_id, PENDING), backup_id)
            self._wait_for_prunes()
            missing = to_upload(info.objects, self._objects())
            if gone := [sha256 for sha256 in missing if sha256 not in sources]:
                raise Unavailable(f"backup {backup_id}: {len(gone)} stored files it reuses were deleted while it "
                                  f"ran (a prune whose clock is off by more than {CLOCK_MARGIN}?); run it again")
            planned(sum(info.objects[sha256] for sha256 in missing))

            def upload(sha256: str) -> None:
                self._put_whole(sources[sha256], self._path(object_path(sha256)), backup_id)
                sent(info.objects[sha256])
                failpoints.hit("backup-upload-after")

            _each(upload, missing)
            if self._clock() - info.created > MAX_EXPORT:  # prunes judge the marker's age by the backup's id
                raise Unavailable(f"backup {backup_id} took longer than {MAX_EXPORT} to upload to {self.url}; "
                                  "a prune may have collected files it reused, so it was not completed")
            self._put_whole(info.to_manifest(), self._path(backup_id, MANIFEST), backup_id)
            self._fs.rm_file(self._path(backup_id, PENDING))
        return info

    def reserve(self, created: datetime, objects: Iterable[str]) -> dict[str, int]:
        """Before a backup (started at `created`) decides which files it need not fetch: announce the objects
        it may reuse in its pending marker, wait out every prune that may not have seen the marker, then
        list what is stored (sha256 -> size). What is announced and listed stays until its export ends."""
        backup_id = backup_id_for(created)
        with self._storage("prepare a backup in"):
            self._put_whole(pending_marker(backup_id, objects), self._path(backup_id, PENDING), backup_id)
            self._wait_for_prunes()
            return self._objects()

    def _wait_for_prunes(self) -> None:
        """Until no prune that may have listed the markers before ours can still delete anything."""
        waited = False
        while running := prunes_in_the_way(self._locks(), self._clock()):
            if not waited:
                log.info("backups: waiting for prune %s in %s to finish", running[0], self.url)
                waited = True
            time.sleep(_PRUNE_POLL_SECONDS)

    def abandon(self, backup_id: str) -> None:
        """Give up on an export whose process died: remove its marker and, unless its manifest was
        written, its folder. The next prune collects the objects only it referenced."""
        with self._storage("clean up in"):
            self._listing()
            if self._fs.exists(self._path(backup_id, MANIFEST)):
                self._remove([self._path(backup_id, PENDING)])
            else:
                self._remove([self._path(backup_id)], recursive=True)

    # listing

    def backups(self) -> list[BackupInfo]:
        """Complete backups, oldest first."""
        with self._storage("list backups in"):
            self._listing()
            infos = [self._read_manifest(path) for path in self._fs.glob(self._path("*", MANIFEST))]
        return sorted(infos, key=lambda info: info.id)

    def _read_manifest(self, path: str) -> BackupInfo:
        folder = PurePosixPath(path).parent.name
        where = f"{self.url}/{folder}/{MANIFEST}"
        info = BackupInfo.from_manifest(self._fs.cat_file(path), where)
        if info.id != folder:  # version-1 files are fetched from the folder named by the id
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

    def _objects(self) -> dict[str, int]:
        """sha256 -> size of every object under files/ (anything else there is not ours)."""
        self._listing()
        return {name: entry["size"] for path, entry in self._fs.find(self._path(FILES), detail=True).items()
                if is_object(name := PurePosixPath(path).name) and path == self._path(object_path(name))}

    def _pending(self) -> dict[str, frozenset[str]]:
        """backup id -> objects, from the pending markers of backups that may still be under way."""
        now, markers = self._clock(), {}
        self._listing()
        for path in self._fs.glob(self._path("*", PENDING)):
            backup_id = PurePosixPath(path).parent.name
            if is_fresh(backup_id, now):
                markers[backup_id] = pending_objects(self._fs.cat_file(path), f"{self.url}/{backup_id}/{PENDING}")
        return markers

    def _folders(self) -> list[str]:
        """Every folder named like a backup id; anything else under the URL is not a backup."""
        self._listing()
        return [name for path in self._fs.ls(self._root, detail=False)
                if time_of(name := PurePosixPath(path).name) is not None]

    def _locks(self) -> dict[str, datetime]:
        """Prune lock -> when its prune started."""
        self._listing()
        names = {PurePosixPath(path).name for path in self._fs.find(self._path(LOCKS), maxdepth=1)}
        return {name: started for name in names if (started := lock_time(name)) is not None}

    # retention

    def prune(self, keep: int) -> Pruned:
        """Delete the oldest complete backups beyond `keep`, partial ones a day old (an export that failed
        or crashed: one started a day ago is not still running), and the objects under files/ that
        neither a kept backup nor a backup under way references."""
        lock = self._path(LOCKS, lock_name(self._clock(), uuid.uuid4().hex[:12]))
        started = time.monotonic()
        with self._storage("apply retention in"):
            self._write(b"", lock)  # empty: whole as soon as it is visible
            try:
                pending = self._pending()  # before the manifests: a backup finishing meanwhile is in either
                backups = self.backups()
                objects = self._objects()
                plan = plan_prune(backups, pending, self._folders(), objects, self._locks(), keep, self._clock())
                for backup_id in plan.backups:
                    self._remove([self._path(backup_id, MANIFEST)])  # unlisted first, then removed
                    self._remove([self._path(backup_id)], recursive=True)
                self._remove([self._path(backup_id) for backup_id in plan.partial], recursive=True)
                self._remove([self._path(LOCKS, name) for name in plan.locks])
                deleted = self._delete_objects(plan.objects, started)
            finally:
                self._remove([lock])
        return Pruned(plan.backups, plan.partial, len(deleted), sum(objects[name] for name in deleted),
                      len(plan.objects) - len(deleted))

    def _delete_objects(self, names: tuple[str, ...], started: float) -> list[str]:
        """Delete objects in batches while the prune's window is open; the ones deleted."""
        deleted: list[str] = []
        for first in range(0, len(names), _DELETES_PER_CALL):
            if time.monotonic() - started >= PRUNE_WINDOW.total_seconds():
                log.warning("backups: prune of %s stopped after %s; the next prune deletes the %d files left",
                            self.url, PRUNE_WINDOW, len(names) - len(deleted))
                break
            batch = list(names[first:first + _DELETES_PER_CALL])
            self._remove([self._path(object_path(name)) for name in batch])
            deleted += batch
        return deleted

    # download and verification

    def download(self, info: BackupInfo, partition: int, dest: Path,
                 received: Callable[[int], None] = lambda n: None, staged: Path | None = None) -> None:
        """Fetch a partition's checkpoint into `dest` (which must not exist), checking every file's size and
        SHA-256 against the manifest, then that RocksDB opens it, read-only, at the manifest's position.
        `received(n)` hears of every n bytes (from the download threads).

        With `staged`, a folder kept from one attempt to the next, each file is first fetched there, named
        by its SHA-256 once it checked out, and then linked (a table file) or copied into `dest`: a restore
        run again after an interruption fetches only what it does not hold yet."""
        dest.mkdir(parents=True)
        copy = info.copy_of(partition)
        if staged is None:
            _each(lambda entry: self._fetch_checked(info, entry, dest / PurePosixPath(entry.path).name, received),
                  copy.files)
        else:
            self.stage([(info, partition)], staged, received)
            for entry in copy.files:
                kept, local = staged / entry.sha256, dest / PurePosixPath(entry.path).name
                if local.suffix in IMMUTABLE:  # never changed: linked, not copied
                    local.hardlink_to(kept)
                else:
                    shutil.copyfile(kept, local)
        where = f"backup {info.id}: partition {partition}"
        try:
            position = checkpoint_position(dest)
        except CorruptData as exc:
            raise CorruptData(f"{where}: {exc}; the backup is damaged, restore another one") from None
        if position != copy.position:
            raise CorruptData(f"{where}: the checkpoint is the state after entry {position.index} (term "
                              f"{position.term}), the manifest says {copy.position.index} (term {copy.position.term})")

    def stage(self, copies: Iterable[tuple[BackupInfo, int]], staged: Path,
              received: Callable[[int], None] = lambda n: None, planned: Callable[[int], None] = lambda n: None) -> None:
        """Fetch the files of several partition copies ((backup, partition) pairs) into `staged` at once, each
        checked and then named by its SHA-256, but for those an earlier attempt left there. `planned(n)` hears
        once how many bytes that leaves to fetch."""
        staged.mkdir(parents=True, exist_ok=True)
        unique = {entry.sha256: (info, entry) for info, p in copies for entry in info.copy_of(p).files}
        missing = [(info, entry) for info, entry in unique.values()
                   if not ((kept := staged / entry.sha256).exists() and kept.stat().st_size == entry.size)]
        planned(sum(entry.size for _, entry in missing))

        def fetch(info: BackupInfo, entry: FileEntry) -> None:
            part = staged / f"{entry.sha256}.part"
            self._fetch_checked(info, entry, part, received)
            part.rename(staged / entry.sha256)

        _each(lambda pair: fetch(*pair), missing)

    def _fetch_checked(self, info: BackupInfo, entry: FileEntry, local: Path, received: Callable[[int], None]) -> None:
        where = f"backup {info.id}: {entry.path} ({self.url}/{info.location(entry)})"
        with self._storage("download from"):
            try:
                digest, size = self._fetch(self._path(info.location(entry)), local, received)
            except FileNotFoundError:
                raise CorruptData(f"{where} is missing; the backup is damaged, restore another one") from None
        if (digest, size) != (entry.sha256, entry.size):
            raise CorruptData(
                f"{where}: {size} bytes with sha256 {digest[:12]}…, the manifest says {entry.size} bytes "
                f"with sha256 {entry.sha256[:12]}…; the backup is damaged, restore another one"
            )
        failpoints.hit("backup-download-after")

    def _fetch(self, remote: str, local: Path, received: Callable[[int], None]) -> tuple[str, int]:
        digest, size = hashlib.sha256(), 0
        with self._fs.open(remote, "rb") as src, local.open("wb") as dst:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                dst.write(chunk)
                size += len(chunk)
                received(len(chunk))
        return digest.hexdigest(), size


def _each(task: Callable, items: list) -> None:
    """`task(item)` for every item, TRANSFERS at a time. The first failure is raised once the tasks under way
    have ended; the ones not started yet never start."""
    if len(items) <= 1:
        for item in items:
            task(item)
        return
    with ThreadPoolExecutor(min(TRANSFERS, len(items)), thread_name_prefix="backup-transfer") as pool:
        futures = [pool.submit(task, item) for item in items]
        try:
            for future in futures:
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def list_backups(url: str, storage_options: Mapping | None = None) -> list[BackupInfo]:
    """Complete backups under `url`, oldest first."""
    return BackupStore(url, storage_options, source="--from").backups()
