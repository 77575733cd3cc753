"""A power-loss filesystem, like Jepsen's LazyFS: a FUSE mount that passes everything through to a
backing directory and, on a simulated power cut, drops whatever was not yet durable.

`disk.PowerLossDisk` drives it from tests and chaos runs; `pending` decides what a power cut
keeps; `fs` is the filesystem and `fuse_mount` mounts it through libfuse; `python -m
raftkv.powerloss` is the process that serves it.
"""

from raftkv.powerloss.disk import PowerLossDisk, unavailable_reason
from raftkv.powerloss.pending import CrashReport, TornWrite

__all__ = ["CrashReport", "PowerLossDisk", "TornWrite", "unavailable_reason"]
