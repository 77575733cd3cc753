"""Key → partition and partition → replicas. Pure and deterministic.

A key's partition is `crc32(key) mod P` (zlib's CRC-32, the same function as
Spark SQL's `crc32` and Java's `java.util.zip.CRC32`), so clients, Spark
writers and nodes agree without talking. P is fixed when the cluster is made.

Partition p's replicas are `replication` consecutive nodes of the spec's node
list starting at node `p mod N`, so leaders and load spread evenly.
"""

from __future__ import annotations

import zlib
from typing import Sequence


def partition_for_key(key: bytes, partitions: int) -> int:
    return zlib.crc32(key) % partitions


def replicas_for(partition: int, node_ids: Sequence[str], replication: int) -> tuple[str, ...]:
    n = len(node_ids)
    return tuple(node_ids[(partition + i) % n] for i in range(min(replication, n)))


def partitions_hosted_by(node_id: str, node_ids: Sequence[str], partitions: int, replication: int) -> list[int]:
    return [p for p in range(partitions) if node_id in replicas_for(p, node_ids, replication)]
