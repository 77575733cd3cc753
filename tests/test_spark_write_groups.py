"""How the Spark writer groups rows into put_many requests (spark_connector/batch_write.py). Pure: no Spark."""

from __future__ import annotations

import pyarrow as pa
import pytest

from raftkv.core.errors import InvalidRequest
from raftkv.core.partitioning import partition_for_key
from spark_connector.batch_write import _groups


def _batch(keys: list[bytes]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(keys, pa.binary()), pa.array([b"v"] * len(keys), pa.binary())],
                                      names=["key", "value"])


def test_a_partitions_rows_fill_a_group_across_sparks_arrow_batches():
    """Spark hands the writer 10,000 rows at a time: grouping each batch on its own made a Raft entry of
    every partition's share of it (1,250 rows at 8 partitions)."""
    keys = [b"k%04d" % i for i in range(40)]
    groups = list(_groups(iter([_batch(keys[:15]), _batch(keys[15:30]), _batch(keys[30:])]), 2, max_rows=8))
    assert sorted(k for group_keys, _ in groups for k in group_keys) == keys
    assert all(len({partition_for_key(k, 2) for k in group_keys}) == 1 for group_keys, _ in groups)
    assert sum(len(group_keys) == 8 for group_keys, _ in groups) == 4  # 40 rows in 2 partitions: 4 full groups
    assert len(groups) == 6  # and one part-filled group per partition, at the end


def test_a_batch_without_a_key_column_is_refused():
    with pytest.raises(InvalidRequest, match="needs columns key and value"):
        list(_groups(iter([pa.RecordBatch.from_arrays([pa.array([b"x"])], names=["value"])]), 2, max_rows=8))
