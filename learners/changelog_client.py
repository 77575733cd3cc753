"""A client of a learner's ChangeLog service (the `changelog` sink, on the learner's --api-port).

    with ChangeLogClient("127.0.0.1:7100") as log:
        for chunk in log.follow():          # what is delivered from now on, as it is synced
            for change in chunk.changes:
                ...

gRPC failures become raftkv errors: trimmed history is InvalidRequest (the
message says how far back the log goes), anything else Unavailable.
`tail` prints the followed log as v1 ChangeEvent JSON lines (`raftkv feed tail --changelog`);
`read_changelog` reads what it retains (the chaos harness's feed check).
"""

from __future__ import annotations

import json
import queue
import sys
import threading
from typing import Iterator, TextIO

import grpc

from learners.change_event import ChangeEvent
from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.client.channels import CHANNEL_OPTIONS
from raftkv.core.errors import InvalidRequest, Unauthenticated, Unavailable
from raftkv.security.tls import Tls, open_blocking_channel, refusal


class ChangeLogClient:
    def __init__(self, address: str, timeout: float = 10.0, tls: Tls | None = None, token: str | None = None):
        self.address = address
        self.timeout = timeout
        self._tls = tls
        self._channel = open_blocking_channel(address, tls, CHANNEL_OPTIONS, token)
        self._stub = kv_pb2_grpc.ChangeLogStub(self._channel)

    def offsets(self, after: dict[int, int] | None = None, max_rows: int = 0) -> list[pb.PartitionOffsets]:
        request = pb.OffsetsRequest(after=after or {}, max_rows=max_rows)
        try:
            return list(self._stub.Offsets(request, timeout=self.timeout).partitions)
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def read(self, partition: int, after: int, until: int, timeout: float | None = None) -> Iterator[pb.ChangesChunk]:
        """The partition's changes with after < index <= until, all within `timeout` seconds (None: no limit);
        a reader that stops early ends the call."""
        calls = self._stub.Read(pb.ChangesRequest(partition=partition, after=after, until=until), timeout=timeout)
        try:
            yield from calls
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        finally:
            calls.cancel()

    def follow(self, after: dict[int, int] | None = None) -> Iterator[pb.ChangesChunk]:
        """Changes after `after` (partitions not named: from now on), then each delivery as it is synced.

        Endless; close the client (or stop iterating and close the generator) to end it.
        Each chunk names its partition and the index it is complete `through`.
        """
        calls = self._stub.Follow(pb.FollowRequest(after=after or {}))
        try:
            yield from calls
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise self._error(exc) from None
        finally:
            calls.cancel()

    def cluster(self) -> str:
        """The cluster's name, from the learner's node API on the same port."""
        try:
            return kv_pb2_grpc.KVStub(self._channel).Status(pb.StatusRequest(), timeout=self.timeout).cluster
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def _error(self, exc: grpc.RpcError) -> InvalidRequest | Unauthenticated | Unavailable:
        if exc.code() == grpc.StatusCode.OUT_OF_RANGE:
            return InvalidRequest(exc.details())
        if why := refusal(exc.details() or "", self._tls):
            return Unauthenticated(f"the changelog at {self.address}: {why}")
        return Unavailable(
            f"the changelog at {self.address} did not answer ({exc.code().name}: {exc.details()}); it must be "
            "a learner's --api-port, running with --sink changelog"
        )

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ChangeLogClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def optional_bytes(change: pb.Change, field: str) -> bytes | None:
    """`before` or `after`, None when the change has none (proto3 would give b"")."""
    return getattr(change, field) if change.HasField(field) else None


def event_of(change: pb.Change, partition: int, cluster: str) -> ChangeEvent:
    return ChangeEvent(change.op, change.key, optional_bytes(change, "before"), optional_bytes(change, "after"),
                       cluster, partition, change.index, change.term, change.seq, change.snapshot, change.ts_ms)


def tail(address: str, *, from_beginning: bool = False, out: TextIO | None = None, timeout: float | None = None,
         max_events: int | None = None, tls: Tls | None = None, token: str | None = None) -> int:
    """Print followed events as JSON lines until `timeout` idle seconds or `max_events`; return the count."""
    out = out or sys.stdout
    count = 0
    with ChangeLogClient(address, tls=tls, token=token) as log:
        cluster = log.cluster()
        after = {o.partition: o.earliest for o in log.offsets()} if from_beginning else None
        chunks: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(log.follow(after), chunks), daemon=True).start()
        while max_events is None or count < max_events:
            try:
                chunk = chunks.get(timeout=timeout)
            except queue.Empty:
                break
            if isinstance(chunk, Exception):
                raise chunk
            for change in chunk.changes[:None if max_events is None else max_events - count]:
                out.write(json.dumps(event_of(change, chunk.partition, cluster).to_dict(), separators=(",", ":")))
                out.write("\n")
                count += 1
            out.flush()
    return count


def read_changelog(address: str, tls: Tls | None = None, token: str | None = None,
                   timeout: float = 60.0) -> list[ChangeEvent]:
    """Every retained event, partition by partition in index order (each key's events in order), each
    partition's within `timeout` seconds."""
    with ChangeLogClient(address, tls=tls, token=token) as log:
        cluster = log.cluster()
        return [event_of(change, o.partition, cluster)
                for o in log.offsets() for chunk in log.read(o.partition, o.earliest, o.latest, timeout)
                for change in chunk.changes]


def _pump(chunks: Iterator[pb.ChangesChunk], into: queue.Queue) -> None:
    try:
        for chunk in chunks:
            into.put(chunk)
    except Exception as exc:  # handed to the reading thread, which raises it
        into.put(exc)
