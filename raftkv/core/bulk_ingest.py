"""Which `put_many` a leader logs as one table file instead of rows (docs/bulk-ingest.md). Pure.

Below `INGEST_MIN_BYTES` an ingest costs the three replicas more CPU than the puts it saves
(measured in docs/bulk-ingest.md: RocksDB's ingest takes about 1.4 ms of CPU per file whatever its
size, and the leader's build 1.0-1.5 us a row, against about 1 us a row a replica for the puts); above
`2 * max_batch_bytes` the file would pass the largest entry the Raft layer sends whole
(`appendEntriesBatchSizeBytes`, 4 * max_batch_bytes), so those rows are logged as they are.
"""

from __future__ import annotations

from raftkv.core.commands import PutMany

INGEST_MIN_BYTES = 1 << 20
# The release line that brought the IngestSst entry: older nodes cannot decode it, so a leader logs one
# only once the cluster version (raftkv/meta/cluster_version.py) says every member runs this or newer.
SST_INGEST_SINCE = "0.2.0"


def ingest_wanted(c: PutMany, max_batch_bytes: int) -> bool:
    """Whether the leader should log `c` as a table file."""
    size = len(c.keys) + len(c.values)
    return INGEST_MIN_BYTES <= size <= 2 * max_batch_bytes
