"""What the power-loss filesystem tests share: a fresh mounted disk per test, and file helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raftkv.powerloss import PowerLossDisk
from raftkv.powerloss.disk import is_mounted
from raftkv.powerloss.fs import TRASH


@pytest.fixture
def new_disk(tmp_path):
    """Mounts a fresh disk over an existing empty directory, as over a node's data dir; every disk
    made is closed (unmounted) at the end, whatever the test did to it."""
    made: list[PowerLossDisk] = []

    def make() -> PowerLossDisk:
        n = len(made)
        (tmp_path / f"data{n}").mkdir()
        disk = PowerLossDisk(tmp_path / f"data{n}", tmp_path / f"backing{n}")
        made.append(disk)
        disk.mount()
        return disk

    yield make
    for disk in made:
        disk.close()
        assert not is_mounted(disk.mount_point)


@pytest.fixture
def disk(new_disk) -> PowerLossDisk:
    return new_disk()


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def put(path: Path, data: bytes, sync: bool = False) -> None:
    with open(path, "wb") as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())


def durable(disk: PowerLossDisk, files: dict[str, bytes], dirs: tuple[str, ...] = ()) -> Path:
    """Files (and directories) that are on the disk for good before a test starts."""
    root = disk.mount_point
    for name in dirs:
        (root / name).mkdir()
    for name, data in files.items():
        put(root / name, data, sync=True)
    for name in ("", *dirs):
        fsync(root / name)
    return root


def tree(root: Path) -> dict[str, bytes | str]:
    """A directory's names and file contents, the trash left out."""
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if relative.split("/")[0] == TRASH:
            continue
        found[relative] = "dir" if path.is_dir() else path.read_bytes()
    return found
