"""Making files and directories survive a power cut: fsync, a mkdir -p whose new directories last,
and a whole-file replace that leaves the old file or the new one, never a torn or empty one.

A new file or directory is durable only once the directory holding its name is fsynced too; a
failed fsync is a `DiskFailed` (the kernel may have dropped what it could not write, and would
report the next fsync as a success); a slow one is logged.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path

from raftkv.core.errors import DiskFailed
from raftkv.core.metrics import NODE_FSYNCS

SLOW_FSYNC_SECONDS = 0.25  # an fsync slower than this is logged (at most every SLOW_FSYNC_LOG_SECONDS)
SLOW_FSYNC_LOG_SECONDS = 10.0

_logger = logging.getLogger(__name__)


def make_dirs(path: Path) -> None:
    """`path` and any missing parents, each made durable (its parent fsynced) as it is created."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        folder.mkdir(exist_ok=True)
        fsync_directory(folder.parent)


def replace_file(path: Path, data: bytes, mode: int = 0o644) -> None:
    """`path` now holds `data`, durably: written beside it under a unique name (created 0600, so a
    key is never readable by others), synced, renamed over it, and its directory synced."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            fsync_file(f.fileno(), Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def fsync_tree(root: Path) -> None:
    """Every file and directory under `root`, and `root` itself."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            fsync_path(Path(folder, name))
        fsync_directory(Path(folder))


def fsync_directory(directory: Path) -> None:
    fsync_path(directory, os.O_DIRECTORY)


def fsync_path(path: Path, flags: int = 0) -> None:
    """fsync the file (or, with O_DIRECTORY, the directory) at `path`."""
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        fsync_file(fd, path)
    finally:
        os.close(fd)


def fsync_file(fd: int, path: Path, data_only: bool = False) -> None:
    """fsync (or fdatasync) `fd`; DiskFailed if it fails, a warning if it is slow."""
    started = time.monotonic()
    try:
        (os.fdatasync if data_only else os.fsync)(fd)
    except OSError as error:
        raise fsync_failed(path, error) from error
    NODE_FSYNCS.inc()
    took = time.monotonic() - started
    if took > SLOW_FSYNC_SECONDS and started - _slow_fsync_logged[0] >= SLOW_FSYNC_LOG_SECONDS:
        _slow_fsync_logged[0] = started
        _logger.warning("fsync of %s took %.2fs: the disk is slow, and so is every write of this node "
                        "(logged at most every %.0fs)", path, took, SLOW_FSYNC_LOG_SECONDS)


_slow_fsync_logged = [-SLOW_FSYNC_LOG_SECONDS]


def fsync_failed(path: Path, error: OSError) -> DiskFailed:
    return DiskFailed(f"fsync of {path} failed ({error.strerror}): the disk may have dropped writes this node "
                      f"acknowledged, so it stops; check the disk (dmesg), then move {path.parent} away and "
                      "restart the node so the partition re-syncs from its peers")
