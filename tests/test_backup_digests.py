"""FileDigests: an export's hashes, each RocksDB table file read once while it lasts."""

from __future__ import annotations

import hashlib
import os

from raftkv.backup import digests
from raftkv.backup.digests import FileDigests


def test_a_hard_linked_table_file_is_hashed_once_and_other_files_every_time(tmp_path, monkeypatch):
    live, first, second = tmp_path / "live", tmp_path / "cp1", tmp_path / "cp2"
    for folder in (live, first, second):
        folder.mkdir()
    (live / "000009.sst").write_bytes(b"table")
    for checkpoint in (first, second):  # as RocksDB's checkpoints do: table files linked, the rest copied
        os.link(live / "000009.sst", checkpoint / "000009.sst")
        (checkpoint / "CURRENT").write_bytes(b"MANIFEST-000005\n")
    read = []
    real = digests._sha256
    monkeypatch.setattr(digests, "_sha256", lambda path: read.append(path.name) or real(path))

    hashes = FileDigests()
    found = hashes.of([first / "000009.sst", first / "CURRENT"])
    assert found[first / "000009.sst"] == (hashlib.sha256(b"table").hexdigest(), 5)
    assert hashes.of([second / "000009.sst", second / "CURRENT"])[second / "CURRENT"][1] == 16
    assert read == ["000009.sst", "CURRENT", "CURRENT"]

    hashes.of([second / "CURRENT"])  # an export without the table file: it is forgotten
    hashes.of([second / "000009.sst"])
    assert read[-1] == "000009.sst"
