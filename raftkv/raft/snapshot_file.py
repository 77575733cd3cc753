"""The snapshot file pysyncobj stores and streams to lagging replicas.

An uncompressed tar (RocksDB's SST files are compressed already):

    meta.json      format, partition, engine position, cluster addresses
    prev.entry     the two journal entries pysyncobj keeps as the log's base:
    last.entry     u64 index, u64 term, command bytes
    db/...         a RocksDB checkpoint of the partition
    digests.json   the SHA-256 of each file under db/ (absent from files of 0.1)

pysyncobj hands the file to other replicas byte by byte, so it must be one
self-contained file. Two kinds never leave their node, both the head and the
entries only, `"in_place": true` in meta.json, no db/ (`write_head`):

- a compaction's (docs/durability.md): `"checkpoint": "snapshot-XXXX"` names the
  folder beside the file that holds the checkpoint; `extract_db` copies it by
  hard links, and the tar is built from it only when a member needs it;
- a seed's (`syncobj_seed`): the replica's database is the copy it was sent, and
  `"checkpoint": "snapshot-seed"` a checkpoint of it. A seed of 0.2 named none:
  the file is then only the record of where the seed left the database, until
  the replica's first compaction (`Meta.seeded`).

Neither is sent (`syncobj_snapshots.SnapshotHooks`). A node of 0.2 reads both as
a seed's.

A tar checks its headers only: a damaged byte in a table
file used to travel to the replica that installed the snapshot (a chaos run:
the leader's damaged snapshot, sent to a wiped follower, stopped it on a
corrupt database at every start). The digests stop it at unpacking. They come
last and leave the format number alone, so a node of 0.1 reads the file as
before (it reads up to db/ and unpacks only db/).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import struct
import tarfile
from dataclasses import dataclass
from pathlib import Path

from raftkv.storage.engine import Position
from raftkv.storage.rocks_files import link_checkpoint
from raftkv.core.errors import CorruptData, StorageFull
from raftkv.core.durable import fsync_path

FORMAT = 1
_ENTRY_HEAD = struct.Struct("<QQ")

Entry = tuple  # pysyncobj's (command: bytes, index: int, term: int)


@dataclass(frozen=True)
class Meta:
    partition: int
    position: Position
    last_entry: Entry
    prev_entry: Entry
    cluster: list[str]
    in_place: bool = False  # the database is not in the file (`write_head`)
    checkpoint: str | None = None  # ... but in this folder beside it, a compaction's (`write_head`)

    @property
    def seeded(self) -> bool:
        """A seed's head of 0.2: the database is the replica's own live one, and nothing here can rebuild it."""
        return self.in_place and self.checkpoint is None


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _encode_entry(entry: Entry) -> bytes:
    command, index, term = entry
    return _ENTRY_HEAD.pack(index, term) + bytes(command)


def _decode_entry(data: bytes) -> Entry:
    index, term = _ENTRY_HEAD.unpack_from(data)
    return (data[_ENTRY_HEAD.size :], index, term)


DIGESTS = "digests.json"
_HASH_CHUNK = 1 << 20


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(db: Path) -> dict[str, Path]:
    """Every file under a checkpoint, by the name the tar gives it (db/...)."""
    return {f"db/{p.relative_to(db).as_posix()}": p for p in sorted(db.rglob("*")) if p.is_file()}


def write(filename: str | Path, checkpoint_dir: Path, meta: Meta, fsync: bool = False) -> None:
    with tarfile.open(filename, "w") as tar:
        _add_head(tar, meta)
        tar.add(checkpoint_dir, arcname="db")
        digests = {name: _sha256(path) for name, path in _files(checkpoint_dir).items()}
        _add_bytes(tar, DIGESTS, json.dumps(digests, sort_keys=True).encode())
    if fsync:  # pysyncobj renames it over the previous snapshot once we return
        fsync_path(Path(filename))


def write_head(filename: str | Path, meta: Meta) -> None:
    """A snapshot file of the head and the entries, no database (`meta.in_place`): a seed's, whose database
    is where the replica opens it, or a compaction's, whose checkpoint is the folder `meta.checkpoint`
    beside the file. Never sent."""
    with tarfile.open(filename, "w") as tar:
        _add_head(tar, meta)
    fsync_path(Path(filename))


def _add_head(tar: tarfile.TarFile, meta: Meta) -> None:
    head = {
        "format": FORMAT,
        "partition": meta.partition,
        "index": meta.position.index,
        "term": meta.position.term,
        "cluster": meta.cluster,
    }
    if meta.in_place:  # only then: the head of every other file is as a node of 0.1 reads it
        head["in_place"] = True
    if meta.checkpoint is not None:
        head["checkpoint"] = meta.checkpoint
    _add_bytes(tar, "meta.json", json.dumps(head).encode())
    _add_bytes(tar, "prev.entry", _encode_entry(meta.prev_entry))
    _add_bytes(tar, "last.entry", _encode_entry(meta.last_entry))


def read_meta(filename: str | Path) -> Meta:
    try:
        with tarfile.open(filename, "r") as tar:
            members = {}
            for member in tar:
                if member.name == "db":
                    break
                members[member.name] = tar.extractfile(member).read()
        head = json.loads(members["meta.json"])
        if head.get("format") != FORMAT:
            raise CorruptData(f"snapshot {filename} has format {head.get('format')}, expected {FORMAT}")
        return Meta(
            partition=head["partition"],
            position=Position(head["index"], head["term"]),
            last_entry=_decode_entry(members["last.entry"]),
            prev_entry=_decode_entry(members["prev.entry"]),
            cluster=head["cluster"],
            in_place=head.get("in_place") is True,
            checkpoint=_checkpoint_name(head.get("checkpoint")),
        )
    except (tarfile.TarError, KeyError, ValueError, struct.error, OSError) as exc:
        raise CorruptData(f"snapshot {filename} is corrupt or unreadable ({exc})") from None


def _checkpoint_name(name) -> str | None:
    if name is None:
        return None
    if not isinstance(name, str) or not name.startswith(KEPT_PREFIX) or "/" in name:
        raise ValueError(f"checkpoint {name!r} is not a folder beside the file")
    return name


KEPT_PREFIX = "snapshot-"  # a compaction's checkpoint folder, beside its snapshot file


def kept_checkpoint(filename: str | Path, meta: Meta) -> Path | None:
    """The folder holding the database of the file's snapshot, if the file names one (a compaction's)."""
    return Path(filename).parent / meta.checkpoint if meta.checkpoint is not None else None


def extract_db(filename: str | Path, dest: Path) -> Path:
    """Unpack the checkpoint into dest/db and return that path; CorruptData if a file of it does not match
    its digest. A compaction's file (`write_head`) names its checkpoint: that is copied by hard links."""
    kept = kept_checkpoint(filename, read_meta(filename))
    try:
        if kept is not None:
            link_checkpoint(kept / "db", dest / "db")
            return dest / "db"
        with tarfile.open(filename, "r") as tar:
            members = [m for m in tar.getmembers() if m.name == "db" or m.name.startswith("db/")]
            if not members:
                raise CorruptData(f"snapshot {filename} holds no database (its replica was seeded in place and "
                                  f"has not compacted since); stop the node, move {Path(filename).parent} away and "
                                  "restart it so the partition re-syncs from its peers")
            digests = tar.extractfile(DIGESTS).read() if DIGESTS in tar.getnames() else None
            tar.extractall(dest, members=members, filter="data")
        if digests is not None:
            _verify(filename, dest / "db", json.loads(digests))
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise StorageFull(f"disk full unpacking snapshot {filename} into {dest}") from None
        raise CorruptData(f"snapshot {filename} is corrupt or unreadable ({exc})") from None
    except (tarfile.TarError, ValueError) as exc:
        raise CorruptData(f"snapshot {filename} is corrupt or unreadable ({exc})") from None
    return dest / "db"


def _verify(filename: str | Path, db: Path, digests: dict[str, str]) -> None:
    unpacked = _files(db)
    if set(unpacked) != set(digests):
        raise CorruptData(f"snapshot {filename} is damaged: its files {sorted(set(unpacked) ^ set(digests))[:3]} "
                          "do not match its list")
    for name, path in unpacked.items():
        if _sha256(path) != digests[name]:
            raise CorruptData(f"snapshot {filename} is damaged: {name} does not match its digest")


def check(path: Path) -> None:
    """Refuse to start on a damaged snapshot file.

    pysyncobj loads it on the first tick and only logs a failure: the replica would then run with
    a compacted journal and no base to apply it on, and never apply another entry. An empty file
    is the placeholder of a snapshot a crash interrupted (the journal was not compacted yet).
    """
    if not path.exists() or path.stat().st_size == 0:
        return
    try:
        kept = kept_checkpoint(path, read_meta(path))
        if kept is not None and not (kept / "db").is_dir():
            raise CorruptData(f"snapshot {path} names the checkpoint {kept.name}, which is missing")
    except CorruptData as exc:
        raise CorruptData(f"{exc}; stop the node, move {path.parent} away and restart it so the partition "
                          "re-syncs from its peers") from None
