"""A client of a learner's ChangeLog service (the `changelog` sink, on the learner's --api-port).

    with ChangeLogClient("127.0.0.1:7100") as log:
        for chunk in log.follow():          # what is delivered from now on, as it is synced
            for change in chunk.changes:
                ...

gRPC failures become raftkv errors: trimmed history is InvalidRequest (the
message says how far back the log goes), anything else Unavailable.
"""

from __future__ import annotations

from typing import Iterator

import grpc

from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.client_core import CHANNEL_OPTIONS
from raftkv.errors import InvalidRequest, Unavailable


class ChangeLogClient:
    def __init__(self, address: str, timeout: float = 10.0):
        self.address = address
        self.timeout = timeout
        self._channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._stub = kv_pb2_grpc.ChangeLogStub(self._channel)

    def offsets(self, after: dict[int, int] | None = None, max_rows: int = 0) -> list[pb.PartitionOffsets]:
        request = pb.OffsetsRequest(after=after or {}, max_rows=max_rows)
        try:
            return list(self._stub.Offsets(request, timeout=self.timeout).partitions)
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def read(self, partition: int, after: int, until: int) -> Iterator[pb.ChangesChunk]:
        """The partition's changes with after < index <= until."""
        try:
            yield from self._stub.Read(pb.ChangesRequest(partition=partition, after=after, until=until))
        except grpc.RpcError as exc:
            raise self._error(exc) from None

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

    def _error(self, exc: grpc.RpcError) -> InvalidRequest | Unavailable:
        if exc.code() == grpc.StatusCode.OUT_OF_RANGE:
            return InvalidRequest(exc.details())
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
