"""Batch writes: rows grouped by partition, sent as atomic batches to the leaders, many in flight.

Each batch is a `put_many` (rows in Arrow's layout, no per-row message) or,
when some values are null (deletes), a `batch`. Either is an upsert of whole keys, so
re-sending one after a lost reply or a leader change is safe: the writer
retries `Undetermined` and `Unavailable` until its deadline. A failed or
aborted job leaves the batches that were acknowledged before it stopped;
there is no rollback (docs/spark.md).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from raftkv.client.async_client import AsyncClient
from raftkv.client.sync_client import run_on_client_loop
from raftkv.core.command_kinds import ALL_KEYS_END
from raftkv.core.commands import Delete, Put
from raftkv.core.errors import InvalidRequest, RaftKVError, Undetermined, Unavailable
from raftkv.core.partitioning import partition_for_key
from spark_connector.columns import from_arrow
from spark_connector.options import ConnectorOptions

BATCH_BYTES = 1 << 20
IN_FLIGHT = 16


@dataclass
class WriteCommit(WriterCommitMessage):
    rows: int


class KVWriter(DataSourceArrowWriter):
    def __init__(self, options: ConnectorOptions, overwrite: bool):
        self.options = options
        if overwrite:
            # Runs once, on the driver, before any task writes: overwrite replaces the option's key range.
            with_client(options, lambda client: client.delete_range(options.start, options.end or ALL_KEYS_END))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommit:
        return WriteCommit(with_client(self.options, lambda client: _write_all(client, iterator, self.options)))

    def commit(self, messages) -> None:
        pass

    def abort(self, messages) -> None:
        pass  # acknowledged batches stay: puts are idempotent upserts, so the job can simply be re-run


def with_client(options: ConnectorOptions, work):
    """`work(client)` on the process's client loop: a Python worker runs many tasks, and a loop of its own per
    task would be kept by grpc.aio for the life of the worker (raftkv.client.sync_client.client_loop)."""
    async def run():
        async with AsyncClient(list(options.endpoints), timeout=options.timeout, tls=options.tls,
                               token=options.token) as client:
            return await work(client)
    return run_on_client_loop(run())


async def _write_all(client: AsyncClient, batches: Iterator[pa.RecordBatch], options: ConnectorOptions) -> int:
    partitions = await client.partitions()
    slots = asyncio.Semaphore(IN_FLIGHT)
    sending: set[asyncio.Task] = set()
    errors: list[RaftKVError] = []
    rows = 0

    async def send(keys: list[bytes], values: list) -> None:
        try:
            await _send_with_retries(client, keys, values, options.timeout)
        except RaftKVError as exc:
            errors.append(exc)
        finally:
            slots.release()

    for keys, values in _groups(batches, partitions, options.write_batch_rows):
        rows += len(keys)  # every row is in exactly one group
        await slots.acquire()
        if errors:
            raise errors[0]  # stop early: the task fails and Spark reports why
        task = asyncio.create_task(send(keys, values))
        sending.add(task)
        task.add_done_callback(sending.discard)
    await asyncio.gather(*sending)
    if errors:
        raise errors[0]
    return rows


def _groups(batches: Iterator[pa.RecordBatch], partitions: int, max_rows: int) -> Iterator[tuple[list[bytes], list]]:
    """The rows as (keys, values) lists, each within one partition and under the size bounds. A
    partition's rows wait across Spark's Arrow batches (10,000 rows by default) until a group is full:
    at 8 partitions a group per batch was 1,250 rows, and every group costs a Raft entry."""
    pending: dict[int, tuple[list[bytes], list, int]] = {}
    for batch in batches:
        names = batch.schema.names
        if "key" not in names or "value" not in names:
            raise InvalidRequest(f"writing to raftkv needs columns key and value; the DataFrame has {', '.join(names)}")
        keys = from_arrow(batch.column("key"), "key")
        values = from_arrow(batch.column("value"), "value")
        for key, value in zip(keys, values):
            if key is None:
                raise InvalidRequest("a row has a null key; filter those rows out before writing")
            p = partition_for_key(key, partitions)
            group_keys, group_values, size = pending.get(p) or ([], [], 0)
            group_keys.append(key)
            group_values.append(value)
            size += len(key) + len(value or b"")
            if len(group_keys) >= max_rows or size >= BATCH_BYTES:
                yield group_keys, group_values
                group_keys, group_values, size = [], [], 0
            pending[p] = (group_keys, group_values, size)
    for group_keys, group_values, _ in pending.values():
        if group_keys:
            yield group_keys, group_values


async def _write_rows(client: AsyncClient, keys: list[bytes], values: list) -> None:
    """Puts as one put_many (the cheap bulk form); rows with a null value make it a batch with deletes."""
    if None in values:
        await client.batch(Put(k, v) if v is not None else Delete(k) for k, v in zip(keys, values))
    else:
        await client.put_many(keys, values)


async def _send_with_retries(client: AsyncClient, keys: list[bytes], values: list, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            return await _write_rows(client, keys, values)
        except (Undetermined, Unavailable):
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(0.2)
