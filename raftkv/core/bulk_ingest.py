"""Which `put_many` a leader logs as one table file instead of rows (docs/bulk-ingest.md). Pure.

Below `INGEST_MIN_BYTES` an ingest's fixed costs (a file written and synced, RocksDB's manifest
written and synced, one more table file in level 0) cost more than the puts it saves; above
`2 * max_batch_bytes` the file would pass the largest entry the Raft layer sends whole
(`appendEntriesBatchSizeBytes`, 4 * max_batch_bytes), so those rows are logged as they are.
"""

from __future__ import annotations

from raftkv.core.commands import PutMany

INGEST_MIN_BYTES = 128 * 1024
# The release line that brought the IngestSst entry: older nodes cannot decode it, so a leader logs one
# only once the cluster version (raftkv/meta/cluster_version.py) says every member runs this or newer.
SST_INGEST_SINCE = "0.2.0.dev0"


def ingest_wanted(c: PutMany, max_batch_bytes: int) -> bool:
    """Whether the leader should log `c` as a table file."""
    size = len(c.keys) + len(c.values)
    return INGEST_MIN_BYTES <= size <= 2 * max_batch_bytes
