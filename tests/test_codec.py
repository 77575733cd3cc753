"""Tests for raftkv.api.convert: gRPC messages <-> commands, and errors <-> results."""

from __future__ import annotations

import zlib
from dataclasses import replace

import pytest
from hypothesis import given, strategies as st

from raftkv.api import kv_pb2 as pb
from raftkv.api.convert import (
    check_partition,
    command_from_op,
    consistency_from_name,
    error_from_result,
    op_from_command,
    result_from_error,
    result_from_write,
)
from raftkv.core.commands import Batch, Cas, CasResult, Delete, DeleteRange, Limits, Put, PutMany
from raftkv.core.errors import (
    ConfigError,
    CorruptData,
    InvalidRequest,
    NotLeader,
    StorageFull,
    Timeout,
    Unavailable,
    Undetermined,
)

P = 4
LIMITS = Limits(max_key_bytes=16, max_value_bytes=32)


def part(key: bytes, partitions: int = P) -> int:
    return zlib.crc32(key) % partitions


def key_in(partition: int, avoid: tuple[bytes, ...] = ()) -> bytes:
    """Some key of `partition` (independent of raftkv.core.partitioning)."""
    for i in range(1000):
        key = b"k%d" % i
        if zlib.crc32(key) % P == partition and key not in avoid:
            return key
    raise AssertionError("no key found")


K0, K1 = key_in(0), key_in(1)
K0b = key_in(0, avoid=(K0,))


# --- command_from_op ----------------------------------------------------------


def test_put_op():
    op = pb.Op(partition=part(K0), put=pb.Put(key=K0, value=b"v"))
    assert command_from_op(op, P, LIMITS) == Put(K0, b"v")


def test_put_op_with_an_empty_value():
    op = pb.Op(partition=part(K0), put=pb.Put(key=K0))
    assert command_from_op(op, P, LIMITS) == Put(K0, b"")


def test_delete_op():
    op = pb.Op(partition=part(K1), delete=pb.Delete(key=K1))
    assert command_from_op(op, P, LIMITS) == Delete(K1)


def test_delete_range_op_is_accepted_on_any_partition():
    for partition in range(P):
        op = pb.Op(partition=partition, delete_range=pb.DeleteRange(start=b"a", end=b"b"))
        assert command_from_op(op, P, LIMITS) == DeleteRange(b"a", b"b")


@pytest.mark.parametrize(
    "fields, cas",
    [
        (dict(expected=b"old", new=b"new"), Cas(K0, b"old", b"new")),
        (dict(new=b"new"), Cas(K0, None, b"new")),
        (dict(expected=b"old"), Cas(K0, b"old", None)),
        (dict(), Cas(K0, None, None)),
        (dict(expected=b"", new=b""), Cas(K0, b"", b"")),
    ],
)
def test_cas_op_maps_unset_optional_fields_to_none_and_set_empty_to_empty(fields, cas):
    op = pb.Op(partition=part(K0), cas=pb.Cas(key=K0, **fields))
    assert command_from_op(op, P, LIMITS) == cas


def test_batch_op():
    op = pb.Op(partition=0, batch=pb.Batch(ops=[
        pb.Mutation(put=pb.Put(key=K0, value=b"1")),
        pb.Mutation(delete=pb.Delete(key=K0b)),
        pb.Mutation(delete_range=pb.DeleteRange(start=K0, end=K0 + b"\x00")),
    ]))
    assert command_from_op(op, P, LIMITS) == Batch((Put(K0, b"1"), Delete(K0b), DeleteRange(K0, K0 + b"\x00")))


def test_batch_with_an_empty_mutation_is_rejected():
    op = pb.Op(partition=0, batch=pb.Batch(ops=[pb.Mutation(put=pb.Put(key=K0)), pb.Mutation()]))
    with pytest.raises(InvalidRequest, match="no put, delete or delete_range set"):
        command_from_op(op, P, LIMITS)


def test_empty_batch_is_rejected():
    with pytest.raises(InvalidRequest, match="at least one operation"):
        command_from_op(pb.Op(partition=0, batch=pb.Batch()), P, LIMITS)


@pytest.mark.parametrize(
    "op, what",
    [
        (pb.Op(partition=0, get=pb.Get(key=b"k")), "operation get is not a write"),
        (pb.Op(partition=0), "operation with nothing set is not a write"),
    ],
)
def test_non_write_ops_are_rejected(op, what):
    with pytest.raises(InvalidRequest, match=what):
        command_from_op(op, P, LIMITS)


@pytest.mark.parametrize(
    "make_op",
    [
        lambda k, p: pb.Op(partition=p, put=pb.Put(key=k, value=b"v")),
        lambda k, p: pb.Op(partition=p, delete=pb.Delete(key=k)),
        lambda k, p: pb.Op(partition=p, cas=pb.Cas(key=k, new=b"v")),
        lambda k, p: pb.Op(partition=p, batch=pb.Batch(ops=[pb.Mutation(put=pb.Put(key=k))])),
    ],
)
def test_a_key_sent_to_the_wrong_partition_is_rejected_naming_its_partition(make_op):
    wrong = (part(K1) + 1) % P
    with pytest.raises(InvalidRequest) as info:
        command_from_op(make_op(K1, wrong), P, LIMITS)
    assert f"belongs to partition {part(K1)}, not {wrong}" in str(info.value)


@given(st.binary(min_size=1, max_size=16), st.integers(1, 64))
def test_a_key_is_accepted_exactly_on_its_own_partition(key, partitions):
    for partition in range(partitions):
        op = pb.Op(partition=partition, put=pb.Put(key=key, value=b"v"))
        if partition == zlib.crc32(key) % partitions:
            assert command_from_op(op, partitions, LIMITS) == Put(key, b"v")
        else:
            with pytest.raises(InvalidRequest, match=f"belongs to partition {zlib.crc32(key) % partitions}"):
                command_from_op(op, partitions, LIMITS)


def test_a_batch_across_partitions_is_rejected():
    op = pb.Op(partition=0, batch=pb.Batch(ops=[
        pb.Mutation(put=pb.Put(key=K0, value=b"1")),
        pb.Mutation(put=pb.Put(key=K1, value=b"2")),
    ]))
    with pytest.raises(InvalidRequest) as info:
        command_from_op(op, P, LIMITS)
    message = str(info.value)
    assert f"belongs to partition {part(K1)}, not 0" in message
    assert "a batch must stay within one partition" in message


@pytest.mark.parametrize("partition", [P, P + 1, 2**32 - 1])
def test_a_partition_that_does_not_exist_is_rejected(partition):
    for op in (
        pb.Op(partition=partition, put=pb.Put(key=K0, value=b"v")),
        pb.Op(partition=partition, delete_range=pb.DeleteRange(start=b"a", end=b"b")),
    ):
        with pytest.raises(InvalidRequest, match=f"partition {partition} does not exist; the cluster has {P}"):
            command_from_op(op, P, LIMITS)


@pytest.mark.parametrize(
    "op, what",
    [
        (pb.Op(partition=0, put=pb.Put(key=b"", value=b"v")), "key must not be empty"),
        (pb.Op(partition=part(K0), put=pb.Put(key=K0, value=b"v" * 33)), "cluster.max_value_bytes"),
        (pb.Op(partition=0, delete=pb.Delete(key=b"k" * 17)), "cluster.max_key_bytes"),
        (pb.Op(partition=0, delete_range=pb.DeleteRange(start=b"b", end=b"a")), "range start must be below"),
        (pb.Op(partition=0, cas=pb.Cas(key=K0, expected=b"v" * 33)), "cluster.max_value_bytes"),
    ],
)
def test_command_from_op_checks_limits(op, what):
    with pytest.raises(InvalidRequest, match=what):
        command_from_op(op, P, LIMITS)


def test_a_write_past_one_raft_entry_is_refused_naming_the_bound():
    op = pb.Op(partition=part(K0), put_many=op_from_command(PutMany.of([K0], [b"v" * 30]), 0).put_many)
    command_from_op(op, P, LIMITS)
    with pytest.raises(InvalidRequest, match=r"the put_many is \d+ bytes; one write may carry at most 40 \(2 × tuning.max_batch_bytes"):
        command_from_op(op, P, replace(LIMITS, max_write_bytes=40))


def test_check_partition_directly():
    check_partition(Put(K1, b""), part(K1), P)
    check_partition(DeleteRange(b"x", b"y"), 0, P)
    with pytest.raises(InvalidRequest):
        check_partition(Delete(K1), (part(K1) + 1) % P, P)


# --- op_from_command round trip -------------------------------------------------

keys = st.binary(min_size=1, max_size=16)
vals = st.binary(max_size=32)
mutations = st.one_of(
    st.builds(Put, keys, vals),
    st.builds(Delete, keys),
    st.tuples(keys, keys).filter(lambda r: r[0] < r[1]).map(lambda r: DeleteRange(*r)),
)
write_commands = st.one_of(
    mutations,
    st.builds(Cas, keys, st.none() | vals, st.none() | vals),
)


@given(write_commands)
def test_op_from_command_round_trips_through_command_from_op(command):
    partition = zlib.crc32(command.start if isinstance(command, DeleteRange) else command.key) % P
    op = op_from_command(command, partition)
    assert op.partition == partition
    assert command_from_op(op, P, LIMITS) == command
    # and through the wire format
    assert command_from_op(pb.Op.FromString(op.SerializeToString()), P, LIMITS) == command


@given(st.lists(mutations, min_size=1, max_size=5))
def test_batches_round_trip_when_sent_to_one_partition(ops):
    op = op_from_command(Batch(tuple(ops)), 0)
    assert op.WhichOneof("op") == "batch"
    assert len(op.batch.ops) == len(ops)
    # Checked against a single partition, so give it one.
    assert command_from_op(op, 1, LIMITS) == Batch(tuple(ops))


@pytest.mark.parametrize("cas", [Cas(b"k", None, None), Cas(b"k", b"", None), Cas(b"k", None, b""), Cas(b"k", b"", b"")])
def test_op_from_command_sets_cas_optional_fields_only_when_present(cas):
    op = op_from_command(cas, 0)
    assert op.cas.HasField("expected") == (cas.expected is not None)
    assert op.cas.HasField("new") == (cas.new is not None)


# --- results and errors ---------------------------------------------------------


@pytest.mark.parametrize(
    "error, code",
    [
        (InvalidRequest("bad key"), pb.INVALID),
        (Unavailable("no leader"), pb.UNAVAILABLE),
        (Undetermined("maybe applied"), pb.UNDETERMINED),
        (Timeout("too slow"), pb.TIMEOUT),
        (StorageFull("disk full"), pb.STORAGE_FULL),
    ],
)
def test_each_error_class_round_trips_through_a_result(error, code):
    result = result_from_error(error)
    assert result.code == code
    assert result.message == str(error)
    assert result.leader_hint == ""
    back = error_from_result(pb.Result.FromString(result.SerializeToString()), partition=3)
    assert type(back) is type(error)
    assert str(back) == str(error)


@pytest.mark.parametrize("hint", ["n2", None])
def test_not_leader_round_trips_with_its_leader_hint(hint):
    result = result_from_error(NotLeader(5, hint))
    assert result.code == pb.NOT_LEADER
    assert result.leader_hint == (hint or "")
    back = error_from_result(result, partition=5)
    assert isinstance(back, NotLeader)
    assert back.partition == 5
    assert back.leader_hint == hint
    assert str(back) == str(NotLeader(5, hint))


@pytest.mark.parametrize("error", [CorruptData("bad sst"), ConfigError("oops")])
def test_errors_without_a_code_become_unavailable(error):
    result = result_from_error(error)
    assert result.code == pb.UNAVAILABLE
    assert result.message == str(error)
    assert isinstance(error_from_result(result, 0), Unavailable)


def test_ok_result_is_no_error():
    assert error_from_result(pb.Result(), 0) is None
    assert error_from_result(pb.Result(code=pb.OK, message="ignored"), 0) is None


def test_an_unknown_result_code_is_unavailable_naming_the_code():
    result = pb.Result()
    result.ParseFromString(b"\x08\x63")  # code = 99, unknown to this version
    error = error_from_result(result, 0)
    assert isinstance(error, Unavailable)
    assert "unknown result code 99" in str(error)


@pytest.mark.parametrize(
    "value, fields",
    [
        (None, dict(code=pb.OK, found=False, value=b"", cas_succeeded=False)),
        (CasResult(True, b"new"), dict(code=pb.OK, found=True, value=b"new", cas_succeeded=True)),
        (CasResult(True, None), dict(code=pb.OK, found=False, value=b"", cas_succeeded=True)),
        (CasResult(False, b""), dict(code=pb.OK, found=True, value=b"", cas_succeeded=False)),
        (CasResult(False, None), dict(code=pb.OK, found=False, value=b"", cas_succeeded=False)),
    ],
)
def test_result_from_write(value, fields):
    result = result_from_write(value)
    assert {k: getattr(result, k) for k in fields} == fields


# --- consistency ------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, level",
    [
        ("linearizable", pb.LINEARIZABLE),
        ("leader", pb.LEADER),
        ("follower", pb.FOLLOWER),
        ("stale", pb.FOLLOWER),
        ("LINEARIZABLE", pb.LINEARIZABLE),
        ("Stale", pb.FOLLOWER),
    ],
)
def test_consistency_from_name(name, level):
    assert consistency_from_name(name) == level


@pytest.mark.parametrize("name", ["strong", "", "eventual"])
def test_unknown_consistency_is_rejected_listing_the_choices(name):
    with pytest.raises(InvalidRequest) as info:
        consistency_from_name(name)
    assert repr(name) in str(info.value)
    assert "linearizable, leader, follower, stale" in str(info.value)


def test_a_range_inside_a_batch_applies_within_the_batch_partition():
    partition = zlib.crc32(b"d") % P
    other_start = next(k for k in (b"a%d" % i for i in range(100)) if zlib.crc32(k) % P != partition)
    op = op_from_command(Batch((Put(b"d", b"1"), DeleteRange(other_start, other_start + b"\x00"))), partition)
    assert command_from_op(op, P, LIMITS).ops[1] == DeleteRange(other_start, other_start + b"\x00")
