"""A voter's checkpoint for a backup (raftkv/node/backup_checkpoint.py), against a real RocksDB: each table
file hashed once while it lasts, and only the files asked for sent."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest

from raftkv.backup import digests
from raftkv.backup.digests import FileDigests
from raftkv.core.commands import Put
from raftkv.core.errors import CorruptData
from raftkv.node.backup_checkpoint import backup_checkpoint
from raftkv.storage.engine import Position
from raftkv.storage.rocks_engine import RocksEngine
from tests.test_corrupt_data import damage_table_files


class _Voter:
    """What backup_checkpoint reads of a replica: its engine, and its log's base."""

    def __init__(self, folder, on_corrupt=None):
        self.engine = RocksEngine(folder, on_corrupt=on_corrupt)
        self.group = self

    last_applied = 0

    def log_base_at(self, index: int):
        return ((b"\x00", index - 1, 1), (b"\x00", index, 1))


def _backup(voter: _Voter, hashes: FileDigests, wanted: list[str]):
    """The listing, and path -> the bytes sent."""
    async def ask() -> list[str]:
        return wanted

    async def run():
        return [chunk async for chunk in backup_checkpoint(voter, hashes, ask)]

    listing, *chunks = asyncio.run(run())
    sent: dict[str, bytes] = {}
    for chunk in chunks:
        sent[chunk.path] = sent.get(chunk.path, b"") + chunk.data
    return listing, sent


def test_a_backups_checkpoint_lists_every_file_hashes_each_table_file_once_and_sends_only_those_asked_for(
        tmp_path, monkeypatch):
    voter = _Voter(tmp_path / "p0000")
    read = []
    real = digests._sha256
    monkeypatch.setattr(digests, "_sha256", lambda path: read.append(path.name) or real(path))
    hashes = FileDigests()
    try:
        voter.engine.write([Put(b"k%04d" % i, b"v" * 100) for i in range(1000)], Position(7, 2))
        listing, sent = _backup(voter, hashes, ["CURRENT"])
        files = {f.path: f for f in listing.files}
        tables = sorted(name for name in files if name.endswith(".sst"))
        assert (listing.index, listing.term, [e.index for e in listing.base]) == (7, 2, [6, 7])
        assert tables and {"CURRENT", "OPTIONS-000007"} <= set(files) and not listing.path and not listing.data
        for name in tables:  # the checkpoint linked the database's own table files
            assert files[name].sha256 == hashlib.sha256((voter.engine.folder / "db" / name).read_bytes()).hexdigest()
        assert all(not f.sha256 for name, f in files.items() if name not in tables)
        assert list(sent) == ["CURRENT"] and len(sent["CURRENT"]) == files["CURRENT"].size
        assert sorted(read) == tables

        voter.engine.write([Put(b"new", b"n")], Position(8, 2))
        listing, sent = _backup(voter, hashes, tables)
        again = {f.path: f for f in listing.files}
        added = sorted(name for name in again if name.endswith(".sst") and name not in files)
        assert added and sorted(read) == sorted(tables + added)  # the unchanged ones were not read again
        assert all(again[name].sha256 == files[name].sha256 for name in tables)
        assert sent == {name: (voter.engine.folder / "db" / name).read_bytes() for name in tables}
        assert not [p for p in voter.engine.folder.iterdir() if p.name.startswith("copy-")]  # the checkpoints went
    finally:
        voter.engine.close()


def test_a_table_file_damaged_before_its_first_backup_stops_the_voter_and_one_read_before_is_kept(tmp_path):
    """A table file the backup has not hashed before has every block read first: damaged, the voter stops
    (its database is damaged) and nothing is listed. One hashed by an earlier backup is not read again:
    the store holds it as it was then."""
    reported = []
    voter = _Voter(tmp_path / "p0000", on_corrupt=reported.append)
    hashes = FileDigests()
    try:
        voter.engine.write([Put(b"k%04d" % i, b"v" * 100) for i in range(1000)], Position(7, 2))
        listing, _ = _backup(voter, hashes, [])
        first = {f.path: f.sha256 for f in listing.files if f.path.endswith(".sst")}
        times = {sst: sst.stat().st_mtime_ns for sst in (voter.engine.folder / "db").glob("*.sst")}
        for sst in damage_table_files(voter.engine.folder / "db", lambda key: key.startswith(b"k")):
            os.utime(sst, ns=(times[sst], times[sst]))  # as a disk's decay would: the file's times unchanged
        listing, _ = _backup(voter, hashes, [])
        assert {f.path: f.sha256 for f in listing.files if f.path.endswith(".sst")} == first and not reported

        voter.engine.write([Put(b"new", b"n")], Position(8, 2))  # a new table file: the checkpoint is read whole
        with pytest.raises(CorruptData, match="is corrupt .*checksum mismatch"):
            _backup(voter, hashes, [])
        assert len(reported) == 1
    finally:
        voter.engine.close()
