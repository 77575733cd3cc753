"""Conversions between the gRPC messages and raftkv's commands and errors. Pure."""

from __future__ import annotations

from raftkv.api import kv_pb2 as pb
from raftkv.core.commands import (
    Batch,
    Cas,
    CasResult,
    Command,
    Delete,
    DeleteRange,
    LearnerProgress,
    Limits,
    Put,
    PutMany,
    RegisterLearner,
    RemoveLearner,
    check_command,
    routing_keys,
)
from raftkv.core.errors import (
    InvalidRequest,
    NotLeader,
    RaftKVError,
    StorageFull,
    Timeout,
    Unavailable,
    Undetermined,
)
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


def _mutation(m: pb.Mutation) -> Put | Delete | DeleteRange:
    kind = m.WhichOneof("op")
    if kind == "put":
        return Put(m.put.key, m.put.value)
    if kind == "delete":
        return Delete(m.delete.key)
    if kind == "delete_range":
        return DeleteRange(m.delete_range.start, m.delete_range.end)
    raise InvalidRequest("a batch operation has no put, delete or delete_range set")


def command_from_op(op: pb.Op, partitions: int, limits: Limits) -> Command:
    """The write command an Op carries, validated against limits and its partition."""
    kind = op.WhichOneof("op")
    if kind == "put":
        command: Command = Put(op.put.key, op.put.value)
    elif kind == "delete":
        command = Delete(op.delete.key)
    elif kind == "delete_range":
        command = DeleteRange(op.delete_range.start, op.delete_range.end)
    elif kind == "cas":
        c = op.cas
        command = Cas(c.key, c.expected if c.HasField("expected") else None, c.new if c.HasField("new") else None)
    elif kind == "batch":
        command = Batch(tuple(_mutation(m) for m in op.batch.ops))
    elif kind == "put_many":
        c = op.put_many
        command = PutMany(c.keys, c.key_offsets, c.values, c.value_offsets)
    elif kind == "register_learner":
        r = op.register_learner
        command = RegisterLearner(r.name, r.sink, tuple(sorted(r.options.items())))
    elif kind == "remove_learner":
        command = RemoveLearner(op.remove_learner.name)
    elif kind == "learner_progress":
        command = LearnerProgress(op.learner_progress.name, op.learner_progress.index)
    else:
        raise InvalidRequest(f"operation {kind or 'with nothing set'} is not a write")
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
    if isinstance(command, Put):
        return pb.Op(partition=partition, put=pb.Put(key=command.key, value=command.value))
    if isinstance(command, Delete):
        return pb.Op(partition=partition, delete=pb.Delete(key=command.key))
    if isinstance(command, DeleteRange):
        return pb.Op(partition=partition, delete_range=pb.DeleteRange(start=command.start, end=command.end))
    if isinstance(command, Cas):
        return pb.Op(partition=partition, cas=pb.Cas(key=command.key, expected=command.expected, new=command.new))
    if isinstance(command, Batch):
        return pb.Op(partition=partition, batch=pb.Batch(ops=[_mutation_message(m) for m in command.ops]))
    if isinstance(command, PutMany):
        columns = pb.Columns(keys=command.keys, key_offsets=command.key_offsets, values=command.values,
                             value_offsets=command.value_offsets)
        return pb.Op(partition=partition, put_many=columns)
    if isinstance(command, RegisterLearner):
        learner = pb.RegisterLearner(name=command.name, sink=command.sink, options=dict(command.options))
        return pb.Op(partition=partition, register_learner=learner)
    if isinstance(command, RemoveLearner):
        return pb.Op(partition=partition, remove_learner=pb.RemoveLearner(name=command.name))
    progress = pb.LearnerProgress(name=command.name, index=command.index)
    return pb.Op(partition=partition, learner_progress=progress)


def _mutation_message(m: Put | Delete | DeleteRange) -> pb.Mutation:
    if isinstance(m, Put):
        return pb.Mutation(put=pb.Put(key=m.key, value=m.value))
    if isinstance(m, Delete):
        return pb.Mutation(delete=pb.Delete(key=m.key))
    return pb.Mutation(delete_range=pb.DeleteRange(start=m.start, end=m.end))


_CODE_BY_ERROR = (
    (NotLeader, pb.NOT_LEADER),
    (InvalidRequest, pb.INVALID),
    (Unavailable, pb.UNAVAILABLE),
    (Undetermined, pb.UNDETERMINED),
    (Timeout, pb.TIMEOUT),
    (StorageFull, pb.STORAGE_FULL),
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
