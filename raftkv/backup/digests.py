"""SHA-256 of the local files an export uploads, each table file hashed once while it lasts.

An export names every file by its SHA-256 before it can tell what is already
stored, so without help it would read the whole database once per export.
RocksDB never changes a table file (`*.sst`, `*.blob`) once written, and a
checkpoint hard-links it, so the same inode comes back export after export:
its hash is remembered by (name, device, inode, size, mtime) until an export
no longer has it. Other files (CURRENT, MANIFEST, OPTIONS, the WAL) are small
or change, and are hashed every time.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

IMMUTABLE = (".sst", ".blob")  # RocksDB never changes these once written
_CHUNK = 4 << 20


class FileDigests:
    def __init__(self) -> None:
        self._known: dict[tuple, str] = {}

    def of(self, files: list[Path]) -> dict[Path, tuple[str, int]]:
        """path -> (sha256, size) of each file; what is remembered afterwards is only these files'."""
        known, self._known = self._known, {}
        found = {}
        for path in files:
            st = path.stat()
            key = _key(path, st)
            digest = known.get(key) or _sha256(path)
            if path.suffix in IMMUTABLE:
                self._known[key] = digest
            found[path] = (digest, st.st_size)
        return found

    def all_known(self, files: list[Path]) -> bool:
        """Whether every one of `files` was hashed before (an unchanged table file)."""
        return all(_key(path, path.stat()) in self._known for path in files)


def _key(path: Path, st: os.stat_result) -> tuple:
    return path.name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
