"""Mounting the power-loss filesystem: libfuse 3 through mfusepy, fixed where mfusepy's wrappers
drop what `PowerLossFS` needs, and serving it until it is unmounted."""

from __future__ import annotations

import errno
import threading
import time
from typing import Any

import mfusepy

from raftkv.powerloss.fs import PowerLossFS


class _FUSE(mfusepy.FUSE):
    """mfusepy's FUSE, fixed where its libfuse 3 wrappers drop what this filesystem needs, and
    keeping `running` up to date (what a crash that waits on an operation reports)."""

    def _wrapper(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        thread = threading.get_ident()
        self.operations.running[thread] = (func.__name__, time.monotonic())
        try:
            return super()._wrapper(func, *args, **kwargs)
        finally:
            del self.operations.running[thread]

    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        # ftruncate on a file unlinked since comes without a path: the handle is all there is.
        fh = fip.contents.fh if fip else None
        return self.operations.truncate(None if path is None else path.decode(self.encoding, self.errors),
                                        length, fh)

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        if flags:  # RENAME_NOREPLACE or RENAME_EXCHANGE, which a plain rename would get wrong
            return -errno.EINVAL
        return self.rename_fuse_2(old, new)

    def utimens_fuse_3(self, path: bytes | None, buf: Any, fip: Any) -> int:
        # UTIME_NOW and UTIME_OMIT only survive as (seconds, nanoseconds) pairs.
        times = None
        if buf:
            times = tuple((spec.tv_sec, spec.tv_nsec) for spec in (buf.contents.actime, buf.contents.modtime))
        return self.operations.utimens(None if path is None else path.decode(self.encoding, self.errors), times)


def serve(fs: PowerLossFS, mount: str) -> None:
    """Mount `fs` on `mount` and serve it (multi-threaded) until it is unmounted."""
    if mfusepy.fuse_version_major != 3:
        raise RuntimeError(f"mfusepy loaded libfuse {mfusepy.fuse_version_major}; this filesystem needs libfuse 3")
    # hard_remove: libfuse passes the unlink of an open file straight through instead of renaming
    # it to a .fuse_hidden file (which this log would take for a rename).
    # max_idle_threads: libfuse 3.14.0 warns about its own default unless given one.
    _FUSE(fs, mount, foreground=True, hard_remove=True, fsname="powerloss", max_idle_threads=10)
