"""A small tmpfs mounted over one node's data dir, which a ballast file can fill up.

    disk = SmallDisk(node.data_dir, size_mb=256)   # mounts (needs root)
    disk.fill()     # the node's next writes fail with ENOSPC
    disk.free()     # space is back
    disk.close()    # unmounts; whatever the node wrote there is gone
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

from raftkv.core.errors import ConfigError

BALLAST_NAME = "chaos-ballast"
_CHUNK = 1 << 20


def unavailable_reason() -> str:
    """'' when this process can mount a tmpfs, else why not."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    if not any(Path(d, "mount").exists() for d in ("/bin", "/usr/bin", "/sbin", "/usr/sbin")):
        return "the mount command is missing"
    return ""


class SmallDisk:
    def __init__(self, folder: Path, size_mb: int):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        if any(self.folder.iterdir()):
            raise ConfigError(f"{self.folder} is not empty; a tmpfs mounted over it would hide its files",
                              source="diskfull")
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(self.folder)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise ConfigError(f"cannot mount a tmpfs on {self.folder}: {result.stderr.strip()}", source="diskfull")
        self.ballast = self.folder / BALLAST_NAME

    def free_bytes(self) -> int:
        stat = os.statvfs(self.folder)
        return stat.f_bavail * stat.f_frsize

    def fill(self) -> int:
        """Write the ballast until the disk is full; returns its size in bytes."""
        written = 0
        with open(self.ballast, "ab", buffering=0) as ballast:
            chunk = bytes(_CHUNK)
            while len(chunk) >= 512:
                try:
                    written += ballast.write(chunk)
                except OSError as error:
                    if error.errno != errno.ENOSPC:
                        raise
                    chunk = chunk[: len(chunk) // 2]
        return written

    def free(self) -> None:
        self.ballast.unlink(missing_ok=True)

    def close(self) -> None:
        """Unmount (lazily, should a process still hold a file there)."""
        self.free()
        subprocess.run(["umount", "-l", str(self.folder)], capture_output=True)
