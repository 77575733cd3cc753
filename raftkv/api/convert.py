"""Conversions between the gRPC messages and raftkv's commands and errors. Pure."""

from __future__ import annotations

import functools
import operator
from dataclasses import fields
from typing import Any, Callable

from raftkv.api import kv_pb2 as pb
from raftkv.core.commands import (Batch, CasResult, Command, Delete, DeleteRange, Guard, GuardedBatch, Limits, Put,
                                  RegisterLearner)
from raftkv.core.command_kinds import Kind, by_proto_field, check_command, kind_of, routing_keys
from raftkv.core.errors import (InvalidRequest, NotLeader, PermissionDenied, RaftKVError, ResourceExhausted,
                                StorageFull, Timeout, Unauthenticated, Unavailable, Undetermined)
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


# Each kind's message is the Op field its Kind names (raftkv/core/command_kinds.py), with the command's fields
# under the same names, an unset optional field standing for None. The messages of two kinds are shaped
# otherwise, and their conversions are here: a batch holds Mutation messages, a learner's options are a map.
_SHAPED: dict[type, tuple[Callable[[Any], Any], Callable[[Any], Command]]] = {
    Batch: (lambda c: pb.Batch(ops=[_mutation_message(op) for op in c.ops]),
            lambda m: Batch(tuple(_mutation(op) for op in m.ops))),
    GuardedBatch: (lambda c: pb.GuardedBatch(guards=[pb.Guard(key=g.key, expected=g.expected) for g in c.guards],
                                             ops=[_mutation_message(op) for op in c.ops]),
                   lambda m: GuardedBatch(tuple(Guard(g.key, g.expected if g.HasField("expected") else None)
                                                for g in m.guards), tuple(_mutation(op) for op in m.ops))),
    RegisterLearner: (lambda c: pb.RegisterLearner(name=c.name, sink=c.sink, options=dict(c.options)),
                      lambda m: RegisterLearner(m.name, m.sink, tuple(sorted(m.options.items())))),
}


@functools.cache
def _reader(kind: Kind) -> Callable[[Any], Command]:
    """How a command of `kind` is read from its message (one attrgetter when no field may be unset: the fast way)."""
    if kind.type in _SHAPED:
        return _SHAPED[kind.type][1]
    names = _field_names(kind.type)
    message = pb.Op.DESCRIPTOR.fields_by_name[kind.proto_field].message_type
    optional = {name for name in names if message.fields_by_name[name].has_presence}
    if optional:
        return lambda m: kind.type(*[getattr(m, name) if name not in optional or m.HasField(name) else None
                                     for name in names])
    values = operator.attrgetter(*names)
    return (lambda m: kind.type(values(m))) if len(names) == 1 else (lambda m: kind.type(*values(m)))


def _fill(parent: Any, command: Command) -> None:
    """Set the field of `parent` (an Op or a Mutation) that carries `command`."""
    kind = kind_of(command)
    if not kind.proto_field:
        raise TypeError(f"{kind.type.__name__} has no message in the API")
    if kind.type in _SHAPED:
        getattr(parent, kind.proto_field).CopyFrom(_SHAPED[kind.type][0](command))
        return
    message = getattr(parent, kind.proto_field)
    message.SetInParent()
    for name in _field_names(kind.type):
        value = getattr(command, name)
        if value is not None:
            setattr(message, name, value)


@functools.cache
def _field_names(command_type: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(command_type))


def _mutation(m: pb.Mutation) -> Put | Delete | DeleteRange:
    name = m.WhichOneof("op")
    kind = by_proto_field(name) if name else None
    if kind is None or not kind.in_batch:
        raise InvalidRequest("a batch operation has no put, delete or delete_range set")
    return _reader(kind)(getattr(m, name))


def _mutation_message(m: Put | Delete | DeleteRange) -> pb.Mutation:
    message = pb.Mutation()
    _fill(message, m)
    return message


def command_from_op(op: pb.Op, partitions: int, limits: Limits) -> Command:
    """The write command an Op carries, validated against limits and its partition."""
    name = op.WhichOneof("op")
    kind = by_proto_field(name) if name else None
    if kind is None:
        raise InvalidRequest(f"operation {name or 'with nothing set'} is not a write")
    if (size := op.ByteSize()) > limits.max_write_bytes:
        raise InvalidRequest(f"the {name} is {size:,} bytes; one write may carry at most {limits.max_write_bytes:,} "
                             "(2 × tuning.max_batch_bytes, one Raft entry): split it into smaller ones")
    command = _reader(kind)(getattr(op, name))
    check_command(command, limits)
    check_partition(command, op.partition, partitions)
    return command


def check_partition(command: Command, partition: int, partitions: int) -> None:
    if partition >= partitions:
        raise InvalidRequest(f"partition {partition} does not exist; the cluster has {partitions}")
    keys = routing_keys(command)
    for key in keys:
        if partition_for_key(key, partitions) != partition:
            raise InvalidRequest(
                f"key {key[:40]!r} belongs to partition {partition_for_key(key, partitions)}, not {partition}"
                + ("; a batch must stay within one partition" if len(keys) > 1 else "")
            )


def op_from_command(command: Command, partition: int) -> pb.Op:
    op = pb.Op(partition=partition)
    _fill(op, command)
    return op


_CODE_BY_ERROR = (
    (NotLeader, pb.NOT_LEADER),
    (InvalidRequest, pb.INVALID),
    (Unavailable, pb.UNAVAILABLE),
    (Undetermined, pb.UNDETERMINED),
    (Timeout, pb.TIMEOUT),
    (StorageFull, pb.STORAGE_FULL),
    (PermissionDenied, pb.PERMISSION_DENIED),
    (ResourceExhausted, pb.RESOURCE_EXHAUSTED),
    (Unauthenticated, pb.UNAUTHENTICATED),
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


def result_from_write(value: CasResult | bool | None) -> pb.Result:
    if isinstance(value, CasResult):
        return pb.Result(cas_succeeded=value.succeeded, found=value.current is not None, value=value.current or b"")
    if isinstance(value, bool):  # a guarded batch's
        return pb.Result(cas_succeeded=value)
    return pb.Result()
