"""The asynchronous snapshot writer against pysyncobj's own rename of its placeholder."""

from __future__ import annotations

import asyncio
import os

from pysyncobj import SERIALIZER_STATE

from raftkv import snapshot_file
from raftkv.local_cluster import free_port_block
from raftkv.spec import Tuning
from raftkv.syncobj_replica import PartitionReplica


def test_a_worker_that_finishes_before_pysyncobj_renames_still_leaves_the_new_snapshot(tmp_path):
    async def scenario():
        replica = PartitionReplica(partition=0, self_address=f"127.0.0.1:{free_port_block(1)}", peer_addresses=[],
                                   folder=tmp_path / "p0", fsync=False, tuning=Tuning(),
                                   loop=asyncio.get_running_loop())
        try:
            snapshot = replica.conf.fullDumpFile
            for last in (5, 9):
                tmp = snapshot + ".tmp"
                replica._write_snapshot(tmp, ((b"x", last, 1), (b"y", last - 1, 1), set()))
                await asyncio.wrap_future(replica._snapshot_job)  # the worker is done first...
                os.replace(tmp, snapshot)  # ...then pysyncobj renames its placeholder (Serializer.serialize)
                assert replica._snapshot_state() == SERIALIZER_STATE.SUCCESS
                assert snapshot_file.read_meta(snapshot).last_entry[1] == last
        finally:
            replica.close()

    asyncio.run(scenario())
