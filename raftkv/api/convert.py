"""Conversions between the gRPC messages and raftkv's commands and errors. Pure."""

from __future__ import annotations

from typing import Any, Callable

from raftkv.api import kv_pb2 as pb
from raftkv.core.commands import (
    Batch, Cas, CasResult, Command, Delete, DeleteRange, LearnerProgress, Limits, Put, PutMany,
    RegisterLearner, RemoveLearner,
)
from raftkv.core.command_kinds import check_command, kind_of, routing_keys, tag_of
from raftkv.core.errors import (InvalidRequest, NotLeader, PermissionDenied, RaftKVError, ResourceExhausted,
                                StorageFull, Timeout, Unavailable, Undetermined)
from raftkv.core.partitioning import partition_for_key

CONSISTENCY_BY_NAME = {
    "linearizable": pb.LINEARIZABLE,
    "leader": pb.LEADER,
    "follower": pb.FOLLOWER,
    "stale": pb.FOLLOWER,
}


def consistency_from_name(name: str) -> int:
    try:
        return CONSISTENCY_BY_NAME[name.lower()]
    except KeyError:
        raise InvalidRequest(
            f"unknown consistency {name!r}; use one of {', '.join(CONSISTENCY_BY_NAME)}"
        ) from None


# Each command kind's protobuf form, keyed by its log tag (raftkv.core.commands.KINDS): the Op field
# that carries it, and the conversions both ways.
_PROTO: dict[int, tuple[str, Callable[[Any], Any], Callable[[Any], Command]]] = {
    tag_of(Put): ("put", lambda c: pb.Put(key=c.key, value=c.value), lambda m: Put(m.key, m.value)),
    tag_of(Delete): ("delete", lambda c: pb.Delete(key=c.key), lambda m: Delete(m.key)),
    tag_of(DeleteRange): ("delete_range", lambda c: pb.DeleteRange(start=c.start, end=c.end),
                                         lambda m: DeleteRange(m.start, m.end)),
    tag_of(Cas): (
        "cas", lambda c: pb.Cas(key=c.key, expected=c.expected, new=c.new),
        lambda m: Cas(m.key, m.expected if m.HasField("expected") else None, m.new if m.HasField("new") else None)),
    tag_of(Batch): ("batch", lambda c: pb.Batch(ops=[_mutation_message(op) for op in c.ops]),
                             lambda m: Batch(tuple(_mutation(op) for op in m.ops))),
    tag_of(PutMany): (
        "put_many", lambda c: pb.Columns(keys=c.keys, key_offsets=c.key_offsets, values=c.values,
                                         value_offsets=c.value_offsets),
        lambda m: PutMany(m.keys, m.key_offsets, m.values, m.value_offsets)),
    tag_of(RegisterLearner): (
        "register_learner", lambda c: pb.RegisterLearner(name=c.name, sink=c.sink, options=dict(c.options)),
        lambda m: RegisterLearner(m.name, m.sink, tuple(sorted(m.options.items())))),
    tag_of(RemoveLearner): ("remove_learner", lambda c: pb.RemoveLearner(name=c.name),
                                     lambda m: RemoveLearner(m.name)),
    tag_of(LearnerProgress): ("learner_progress", lambda c: pb.LearnerProgress(name=c.name, index=c.index),
                                          lambda m: LearnerProgress(m.name, m.index)),
}
_FROM_FIELD = {name: from_message for name, _, from_message in _PROTO.values()}
_MUTATION_FIELDS = ("put", "delete", "delete_range")


def _mutation(m: pb.Mutation) -> Put | Delete | DeleteRange:
    kind = m.WhichOneof("op")
    if kind not in _MUTATION_FIELDS:
        raise InvalidRequest("a batch operation has no put, delete or delete_range set")
    return _FROM_FIELD[kind](getattr(m, kind))


def _mutation_message(m: Put | Delete | DeleteRange) -> pb.Mutation:
    name, to_message, _ = _PROTO[kind_of(m).tag]
    return pb.Mutation(**{name: to_message(m)})


def command_from_op(op: pb.Op, partitions: int, limits: Limits) -> Command:
    """The write command an Op carries, validated against limits and its partition."""
    kind = op.WhichOneof("op")
    if kind not in _FROM_FIELD:
        raise InvalidRequest(f"operation {kind or 'with nothing set'} is not a write")
    command = _FROM_FIELD[kind](getattr(op, kind))
    check_command(command, limits)
    check_partition(command, op.partition, partitions)
    return command


def check_partition(command: Command, partition: int, partitions: int) -> None:
    if partition >= partitions:
        raise InvalidRequest(f"partition {partition} does not exist; the cluster has {partitions}")
    for key in routing_keys(command):
        if partition_for_key(key, partitions) != partition:
            raise InvalidRequest(
                f"key {key[:40]!r} belongs to partition {partition_for_key(key, partitions)}, not {partition}"
                + ("; a batch must stay within one partition" if isinstance(command, (Batch, PutMany)) else "")
            )


def op_from_command(command: Command, partition: int) -> pb.Op:
    name, to_message, _ = _PROTO[kind_of(command).tag]
    return pb.Op(partition=partition, **{name: to_message(command)})


_CODE_BY_ERROR = (
    (NotLeader, pb.NOT_LEADER),
    (InvalidRequest, pb.INVALID),
    (Unavailable, pb.UNAVAILABLE),
    (Undetermined, pb.UNDETERMINED),
    (Timeout, pb.TIMEOUT),
    (StorageFull, pb.STORAGE_FULL),
    (PermissionDenied, pb.PERMISSION_DENIED),
    (ResourceExhausted, pb.RESOURCE_EXHAUSTED),
)


def result_from_error(error: RaftKVError) -> pb.Result:
    for cls, code in _CODE_BY_ERROR:
        if isinstance(error, cls):
            hint = error.leader_hint or "" if isinstance(error, NotLeader) else ""
            return pb.Result(code=code, message=str(error), leader_hint=hint)
    return pb.Result(code=pb.UNAVAILABLE, message=str(error))


def error_from_result(result: pb.Result, partition: int) -> RaftKVError | None:
    """The error a non-OK result stands for (None when OK)."""
    code = result.code
    if code == pb.OK:
        return None
    if code == pb.NOT_LEADER:
        return NotLeader(partition, result.leader_hint or None)
    for cls, c in _CODE_BY_ERROR:
        if c == code:
            return cls(result.message)
    return Unavailable(result.message or f"unknown result code {code}")


def result_from_write(value: CasResult | None) -> pb.Result:
    if isinstance(value, CasResult):
        return pb.Result(cas_succeeded=value.succeeded, found=value.current is not None, value=value.current or b"")
    return pb.Result()
