"""The Python client.

    with raftkv.Client("127.0.0.1:7000") as kv:
        kv.put(b"k", b"v")
        kv.get(b"k")                      # linearizable by default
        kv.read(b"k", consistency="follower").applied_index

Thread-safe: it runs an `AsyncClient` on the process's one client loop thread
(`client_loop`), and calls from many threads are coalesced there (operations
bound for the same node travel in one Execute request). Routing: each key's partition is
computed here and sent to the leader from a cached routing table, refreshed
on NotLeader or a connection failure, retried until the deadline.

Errors: InvalidRequest (nothing written), Unavailable (nothing written, no
leader reachable before the deadline), Undetermined (a write whose outcome is
unknown), Timeout (a read that did not finish), StorageFull, ChangeRefused (a topology
change a rule forbids; nothing changed).
"""

from __future__ import annotations

import asyncio
import atexit
import heapq
import os
import threading
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence, Unpack

import uvloop

from raftkv.api import kv_pb2 as pb
from raftkv.api.checkpoint_stream import ListedFile
from raftkv.client.async_client import AsyncClient, Bytes, ClientOptions, LearnerView, Read, scan_bounds
from raftkv.client.core import NodeStatus
from raftkv.core.commands import CasResult, Mutation
from raftkv.meta.wire import Topology
from raftkv.storage.engine import Position

__all__ = ["Client", "LearnerView", "NodeStatus", "Read", "Topology"]


_loop_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_thread: threading.Thread | None = None
_loop_pid: int | None = None


def client_loop() -> asyncio.AbstractEventLoop:
    """The event loop every Client of this process runs on, on a daemon thread started by the first Client (and
    again in a forked child, which has no copy of the thread). One, not one per Client: grpc.aio binds its
    poller to every loop that ever made a channel and never unbinds it, so a loop per Client kept about
    250 KiB per Client ever opened (a process that opened one per request grew without bound)."""
    global _loop, _loop_thread, _loop_pid
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid():
            _loop, _loop_pid = uvloop.new_event_loop(), os.getpid()
            _loop_thread = threading.Thread(target=_loop.run_forever, name="raftkv-client", daemon=True)
            _loop_thread.start()
        return _loop


@atexit.register
def _stop_client_loop() -> None:
    """Stop the client loop before the interpreter finalizes: a loop still polling grpc.aio's sockets while
    the interpreter tears down its objects crashed the process (SIGSEGV) after it had done its work."""
    global _loop
    with _loop_lock:
        loop, thread = _loop, _loop_thread
        if loop is None or thread is None or _loop_pid != os.getpid():
            return
        _loop = None
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    if not thread.is_alive():
        loop.close()


def run_on_client_loop(coro, timeout: float | None = None):
    """`coro`'s result, run on the client loop; cancelled there if the caller stops waiting (a timeout, Ctrl-C)."""
    future = asyncio.run_coroutine_threadsafe(coro, client_loop())
    try:
        return future.result(timeout)
    except BaseException:
        future.cancel()
        raise


class Client:
    def __init__(self, endpoints: str | Sequence[str], **options: Unpack[ClientOptions]):
        """The same options as `AsyncClient`."""
        self._async = AsyncClient(endpoints, **options)
        self._closed = False

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._run(self._async.close(), timeout=5)

    def _run(self, coro, timeout: float | None = None):
        return run_on_client_loop(coro, timeout)

    @property
    def partitions(self) -> int:
        return self._run(self._async.partitions())

    def partition_of(self, key: Bytes) -> int:
        return self._run(self._async.partition_of(key))

    def put(self, key: Bytes, value: Bytes) -> None:
        self._run(self._async.put(key, value))

    def delete(self, key: Bytes) -> None:
        self._run(self._async.delete(key))

    def cas(self, key: Bytes, expected: Bytes | None, new: Bytes | None) -> CasResult:
        """Set key to `new` (delete if None) when its value is `expected` (absent if None)."""
        return self._run(self._async.cas(key, expected, new))

    def batch(self, ops: Iterable[Mutation]) -> None:
        """Apply puts, deletes and delete_ranges atomically; all keys must be in one partition."""
        self._run(self._async.batch(ops))

    def guarded_batch(self, guards: Mapping[Bytes, Bytes | None], ops: Iterable[Mutation]) -> bool:
        """Apply puts, deletes and delete_ranges atomically if every key of `guards` holds its value (None:
        is absent) when they are applied, else none; whether they were. All keys must be in one partition."""
        return self._run(self._async.guarded_batch(guards, ops))

    def put_many(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """Put every key to its value atomically; all keys must be in one partition (the bulk-load batch)."""
        self._run(self._async.put_many(keys, values))

    def delete_range(self, start: Bytes, end: Bytes) -> None:
        """Delete [start, end) in every partition (atomic per partition, not across partitions)."""
        self._run(self._async.delete_range(start, end))

    def read(self, key: Bytes, consistency: str | None = None) -> Read:
        return self._run(self._async.read(key, consistency))

    def get(self, key: Bytes, consistency: str | None = None) -> bytes | None:
        return self.read(key, consistency).value

    def scan(self, start: Bytes = b"", end: Bytes | None = None, *, prefix: Bytes | None = None, limit: int = 0,
             consistency: str | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Keys in [start, end) (or with `prefix`) in key order, merged across partitions.

        Each partition is read from one consistent view; different partitions
        may be read at different moments.
        """
        start_b, end_b = scan_bounds(start, end, prefix)
        streams = [self.scan_partition(p, start_b, end_b, limit=limit, consistency=consistency)
                   for p in range(self.partitions)]
        for count, item in enumerate(heapq.merge(*streams, key=lambda kv: kv[0]), 1):
            yield item
            if limit and count >= limit:
                return

    def scan_chunks(self, partition: int, start: bytes = b"", end: bytes | None = None, *, limit: int = 0,
                    consistency: str | None = None, columnar: bool = False) -> Iterator[pb.ScanChunk]:
        """One partition's scan as chunks from one view; each chunk carries that view's applied index."""
        chunks = self._async.scan_partition(partition, start, end, limit=limit, consistency=consistency,
                                            columnar=columnar)
        while True:
            try:
                yield self._run(anext(chunks))
            except StopAsyncIteration:
                return

    def checkpoint(self, partition: int, dest: Path) -> Position:
        """A partition's state as its leader's RocksDB checkpoint, written to `dest` (a folder that does not
        exist yet): the files and the Raft position they are exactly the state after. An admin verb."""
        return self._run(self._async.checkpoint(partition, dest))

    def checkpoint_files(self, partition: int, dest: Path,
                         choose: Callable[[list[ListedFile]], list[str]]) -> tuple[Position, list[ListedFile]]:
        """`checkpoint`, only the files `choose` names of the leader's listing (called with every file of
        the checkpoint: its path, size and, for a table file, SHA-256): the position, and the listing."""
        return self._run(self._async.checkpoint_files(partition, dest, choose))

    def split_keys(self, partition: int, start: bytes = b"", end: bytes | None = None, *, every: int) -> list[bytes]:
        """Every `every`-th key of a partition's range, from one replica: boundaries for parallel scans."""
        return self._run(self._async.split_keys(partition, start, end, every=every))

    def scan_partition(self, partition: int, start: bytes = b"", end: bytes | None = None, *, limit: int = 0,
                       consistency: str | None = None) -> Iterator[tuple[bytes, bytes]]:
        """One partition's keys in order from one view (`scan_chunks` tells the view's applied index)."""
        for chunk in self.scan_chunks(partition, start, end, limit=limit, consistency=consistency):
            for kv in chunk.items:
                yield kv.key, kv.value

    def register_learner(self, name: str, sink: str, options: dict[str, str] | None = None,
                         partitions: Iterable[int] | None = None) -> None:
        """Register a learner through the log of each partition (all when None)."""
        self._run(self._async.register_learner(name, sink, options, partitions))

    def remove_learner(self, name: str, partitions: Iterable[int] | None = None) -> None:
        self._run(self._async.remove_learner(name, partitions))

    def report_progress(self, name: str, delivered: dict[int, int]) -> None:
        """A learner's durably delivered index per partition, replicated in each partition's log."""
        self._run(self._async.report_progress(name, delivered))

    def topology(self) -> Topology:
        return self._run(self._async.topology())

    def move_replica(self, partition: int, source: str, target: str) -> Topology:
        return self._run(self._async.move_replica(partition, source, target))

    def decommission(self, node_id: str, force: bool = False) -> Topology:
        return self._run(self._async.decommission(node_id, force))

    def transfer_leadership(self, partition: int, node_id: str) -> None:
        self._run(self._async.transfer_leadership(partition, node_id))

    def change_topology(self, command, everywhere: bool = False) -> Topology:
        return self._run(self._async.change_topology(command, everywhere))

    def status(self) -> list[NodeStatus]:
        return self._run(self._async.status())

    def learners(self) -> dict[str, LearnerView]:
        """Registered learners as the partitions' leaders see them."""
        return self._run(self._async.learners())
