"""raftkv.core.command_kinds: a kind registered here, in the test, works end to end on the twin.

The kinds below exist only in this file. Nothing else in raftkv knows them: the
log codec, the state machine, the engine, the gatekeeper, the partition check
and change capture all find what they need in the registry. (The API has no
message for them: a real kind adds one to kv.proto, under its `proto_field`.)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pytest

from learners.change_capture import EntryContext, capture_entry, pending_view
from raftkv.api.convert import check_partition
from raftkv.core.command_kinds import DecodeError, Kind, State, check_command, point, register, routing_keys, unregister
from raftkv.core.commands import Batch, Limits, Put
from raftkv.core.errors import InvalidRequest
from raftkv.core.log_codec import decode_proposal, encode_proposal
from raftkv.core.partitioning import partition_for_key
from raftkv.node.gatekeeper import command_requests
from raftkv.node.replica import KVStateMachine
from raftkv.raft.group import Outcome, Role
from raftkv.raft.memory_group import Disk, MemoryGroup
from raftkv.raft.memory_network import MemoryNetwork
from raftkv.security.permissions import Access, Request
from raftkv.storage.engine import MemoryEngine, Position


@dataclass(frozen=True, slots=True)
class Append:
    """Append `suffix` to the value of `key` (absent: empty); its caller gets the new length. Applied by reading."""

    key: bytes
    suffix: bytes


@dataclass(frozen=True, slots=True)
class PutPair:
    """`value` under both keys: a mutation, written as it is."""

    first: bytes
    second: bytes
    value: bytes


def encode_fields(*fields: bytes) -> tuple[bytes, ...]:
    return (struct.pack(f"<{len(fields)}I", *map(len, fields)), *fields)


def decode_fields(buf: bytes, pos: int, count: int) -> tuple[list[bytes], int]:
    lengths = struct.unpack_from(f"<{count}I", buf, pos)
    pos += 4 * count
    fields = []
    for length in lengths:
        fields.append(buf[pos:pos + length])
        pos += length
    return fields, pos


def check_keys(keys: list[bytes], limits: Limits) -> None:
    if not all(0 < len(key) <= limits.max_key_bytes for key in keys):
        raise InvalidRequest("keys must not be empty or over the limit")


def apply_append(c: Append, state: State) -> int:
    value = (state.get(c.key) or b"") + c.suffix
    state.record(Put(c.key, value))
    return len(value)


def decode_append(buf: bytes, pos: int) -> tuple[Append, int]:
    fields, pos = decode_fields(buf, pos, 2)
    return Append(*fields), pos


def decode_pair(buf: bytes, pos: int) -> tuple[PutPair, int]:
    fields, pos = decode_fields(buf, pos, 3)
    return PutPair(*fields), pos


APPEND = Kind(0xF0, Append, lambda c: encode_fields(c.key, c.suffix), decode_append,
              lambda c, limits: check_keys([c.key], limits), lambda c: [c.key],
              ranges_written=lambda c: [point(c.key)], apply=apply_append)
PUT_PAIR = Kind(0xF1, PutPair, lambda c: encode_fields(c.first, c.second, c.value), decode_pair,
                lambda c, limits: check_keys([c.first, c.second], limits), lambda c: [c.first, c.second],
                ranges_written=lambda c: [point(c.first), point(c.second)],
                write=lambda c, w: (w.put(c.first, c.value), w.put(c.second, c.value)),
                rows=lambda c: ([c.first, c.second], [c.value, c.value]))


@pytest.fixture
def kinds():
    registered = [register(APPEND), register(PUT_PAIR)]
    yield
    for kind in registered:
        unregister(kind)


def key_in(partition: int, partitions: int) -> bytes:
    return next(key for key in (b"k%d" % i for i in range(1000)) if partition_for_key(key, partitions) == partition)


def test_the_new_kinds_are_checked_routed_encoded_and_permitted_by_the_registry_alone(kinds):
    limits = Limits()
    append, pair = Append(b"k", b"xy"), PutPair(b"a", b"b", b"v")
    check_command(append, limits)
    check_command(pair, limits)
    with pytest.raises(InvalidRequest, match="keys must not be empty"):
        check_command(PutPair(b"a", b"", b"v"), limits)
    with pytest.raises(InvalidRequest, match="a batch holds only put, delete and delete_range"):
        check_command(Batch((append,)), limits)

    assert routing_keys(pair) == [b"a", b"b"]
    here, there = key_in(1, 4), key_in(2, 4)
    check_partition(PutPair(here, here, b"v"), 1, 4)
    with pytest.raises(InvalidRequest, match="belongs to partition 2, not 1$"):
        check_partition(Append(there, b"x"), 1, 4)
    with pytest.raises(InvalidRequest, match="belongs to partition 2, not 1; a batch must stay within one partition"):
        check_partition(PutPair(here, there, b"v"), 1, 4)

    commands = [Put(b"k", b"a"), append, pair]
    assert decode_proposal(encode_proposal(commands)) == commands

    assert command_requests(append) == [Request.key(Access.WRITE, b"k")]
    assert command_requests(pair) == [Request.key(Access.WRITE, b"a"), Request.key(Access.WRITE, b"b")]


def test_the_new_kinds_are_applied_alike_on_every_replica_of_the_twin(tmp_path, kinds):
    names = ["n1", "n2", "n3"]
    net = MemoryNetwork(seed=0)
    engines = {name: MemoryEngine() for name in names}
    groups = {}
    for name in names:
        (tmp_path / name).mkdir()
        disk = Disk(tmp_path / name, voters=frozenset(names))
        groups[name] = MemoryGroup(name, disk, KVStateMachine(0, engines[name]), net)
    groups["n1"].campaign()
    net.stabilize()
    assert groups["n1"].role == Role.LEADER

    answers = []
    entry = [Append(b"k", b"ab"), PutPair(b"p", b"q", b"1"), Append(b"k", b"cd"), Append(b"p", b"2")]
    groups["n1"].propose(encode_proposal(entry), lambda result, outcome: answers.append((outcome, result)))
    net.stabilize()
    net.tick()  # the followers learn of the commit with the next heartbeat

    assert answers == [(Outcome.APPLIED, [2, None, 4, 2])]
    for name, engine in engines.items():
        assert [engine.get(k) for k in (b"k", b"p", b"q")] == [b"abcd", b"12", b"1"], name
        assert engine.position.index == groups[name].last_applied


def test_change_capture_reports_the_new_kinds_rows_with_before_images(kinds):
    copy = MemoryEngine()
    copy.write([Put(b"k", b"old")], Position(1, 1))
    events = capture_entry(pending_view(copy), [Append(b"k", b"+"), PutPair(b"k", b"n", b"v")],
                           EntryContext("c", 0, 2, 1, 0))
    assert [(e.op, e.key, e.before, e.after) for e in events] == [
        ("u", b"k", b"old", b"old+"), ("u", b"k", b"old+", b"v"), ("c", b"n", None, b"v")]


def test_a_kind_is_registered_once_and_unknown_again_once_unregistered():
    kind = register(APPEND)
    try:
        with pytest.raises(ValueError, match="registered already"):
            register(APPEND)
        encoded = encode_proposal([Append(b"k", b"x")])
    finally:
        unregister(kind)
    with pytest.raises(DecodeError, match="unknown command tag 240"):
        decode_proposal(encoded)
    with pytest.raises(TypeError, match="not a command"):
        check_command(Append(b"k", b"x"), Limits())
