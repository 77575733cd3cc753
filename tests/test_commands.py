"""Tests for raftkv.core.commands and log_codec: the proposal encoding, routing keys and check_command."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings, strategies as st

from raftkv.core.commands import (
    Batch,
    Cas,
    Delete,
    DeleteRange,
    Guard,
    GuardedBatch,
    Limits,
    Put,
    PutMany,
)
from raftkv.core.command_kinds import DecodeError, check_command, encode_command, routing_keys
from raftkv.core.log_codec import VERSION, decode_proposal, encode_proposal
from raftkv.core.errors import InvalidRequest

# --- strategies -------------------------------------------------------------

keys = st.binary(max_size=12)
values = st.binary(max_size=24)
optional_values = st.none() | values

puts = st.builds(Put, keys, values)
deletes = st.builds(Delete, keys)
ranges = st.builds(DeleteRange, keys, keys)
cases = st.builds(Cas, keys, optional_values, optional_values)
mutations = st.one_of(puts, deletes, ranges)
batches = st.builds(Batch, st.lists(mutations, max_size=5).map(tuple))
put_manys = st.lists(st.tuples(keys, values), min_size=1, max_size=6).map(
    lambda rows: PutMany.of([k for k, _ in rows], [v for _, v in rows]))
guarded = st.builds(GuardedBatch, st.lists(st.builds(Guard, keys, optional_values), max_size=3).map(tuple),
                    st.lists(mutations, max_size=4).map(tuple))
commands = st.one_of(puts, deletes, ranges, cases, batches, put_manys, guarded)
command_lists = st.lists(commands, max_size=8)


def boundaries(cmds: list) -> list[int]:
    """Offsets in the encoding at which each command ends (1 = after the version byte)."""
    return list(itertools.accumulate((len(encode_command(c)) for c in cmds), initial=1))


# --- encode / decode --------------------------------------------------------


@given(command_lists)
def test_decode_inverts_encode_for_any_command_list(cmds):
    assert decode_proposal(encode_proposal(cmds)) == cmds


@given(command_lists)
def test_encoding_accepts_tuples_like_lists(cmds):
    assert encode_proposal(tuple(cmds)) == encode_proposal(cmds)


def test_empty_proposal_is_just_the_version_byte_and_decodes_to_nothing():
    assert encode_proposal([]) == bytes([VERSION])
    assert decode_proposal(bytes([VERSION])) == []


@pytest.mark.parametrize(
    "cas",
    [
        Cas(b"k", None, None),
        Cas(b"k", b"", None),
        Cas(b"k", None, b""),
        Cas(b"k", b"", b""),
        Cas(b"k", b"old", b"new"),
    ],
)
def test_cas_round_trip_distinguishes_absent_from_empty(cas):
    [decoded] = decode_proposal(encode_proposal([cas]))
    assert decoded == cas
    assert (decoded.expected is None) == (cas.expected is None)
    assert (decoded.new is None) == (cas.new is None)


def test_encoding_layout_matches_the_documented_format():
    encoded = encode_proposal([Put(b"k", b"vv"), Delete(b"d"), DeleteRange(b"a", b"bc"), Cas(b"c", None, b"n")])
    expected = (
        b"\x01"
        + b"\x01" + struct.pack("<II", 1, 2) + b"k" + b"vv"
        + b"\x02" + struct.pack("<I", 1) + b"d"
        + b"\x03" + struct.pack("<II", 1, 2) + b"a" + b"bc"
        + b"\x04" + struct.pack("<BIII", 0b10, 1, 0, 1) + b"c" + b"n"
    )
    assert encoded == expected


def test_batch_layout_is_tag_count_then_its_mutations():
    encoded = encode_proposal([Batch((Put(b"k", b"v"), Delete(b"d")))])
    assert encoded == (
        b"\x01\x05" + struct.pack("<I", 2)
        + b"\x01" + struct.pack("<II", 1, 1) + b"kv"
        + b"\x02" + struct.pack("<I", 1) + b"d"
    )


@given(command_lists)
def test_a_proposal_is_the_version_byte_then_each_command_as_encode_command_gives_it(cmds):
    assert encode_proposal(cmds) == bytes([VERSION]) + b"".join(encode_command(c) for c in cmds)


@pytest.mark.parametrize("bad", [Cas(b"k", None, b"v"), Batch((Put(b"k", b"v"),))])
def test_encode_refuses_a_cas_or_batch_inside_a_batch(bad):
    with pytest.raises(ValueError, match="only put, delete and delete_range"):
        encode_proposal([Batch((Put(b"a", b"b"), bad))])


def test_encode_refuses_something_that_is_not_a_command():
    with pytest.raises(TypeError, match="not a command"):
        encode_proposal([b"put k v"])


# --- decode rejects ---------------------------------------------------------


@pytest.mark.parametrize("buf", [b"", b"\x00", b"\x02", b"\xff" + encode_proposal([Put(b"k", b"v")])[1:]])
def test_decode_rejects_a_missing_or_wrong_version(buf):
    with pytest.raises(DecodeError, match="version"):
        decode_proposal(buf)


@given(st.lists(commands, min_size=1, max_size=4))
@settings(max_examples=60)
def test_a_prefix_of_an_encoding_is_an_error_unless_it_ends_on_a_command_boundary(cmds):
    encoded = encode_proposal(cmds)
    ends = boundaries(cmds)
    for cut in range(len(encoded)):
        prefix = encoded[:cut]
        if cut in ends:
            # The version byte alone is a read barrier; a cut between commands is a shorter proposal.
            assert decode_proposal(prefix) == cmds[: ends.index(cut)]
        else:
            with pytest.raises(DecodeError):
                decode_proposal(prefix)


@given(commands)
def test_every_proper_prefix_of_a_single_command_after_the_version_byte_is_rejected(command):
    encoded = encode_proposal([command])
    for cut in range(2, len(encoded)):
        with pytest.raises(DecodeError):
            decode_proposal(encoded[:cut])


def test_a_length_pointing_past_the_end_is_rejected():
    # klen=1, vlen=100 but only 3 bytes of payload follow.
    buf = b"\x01\x01" + struct.pack("<II", 1, 100) + b"kvv"
    with pytest.raises(DecodeError):
        decode_proposal(buf)


@pytest.mark.parametrize(
    "garbage",
    [b"\x00", b"\x02", b"\x01\x00\x00", b"\x04" + b"\x00" * 12, b"\x05\x01\x00\x00\x00", b"\x06hello"],
)
def test_decode_rejects_trailing_garbage_after_valid_commands(garbage):
    encoded = encode_proposal([Put(b"k", b"v"), Delete(b"d")])
    with pytest.raises(DecodeError):
        decode_proposal(encoded + garbage)


@pytest.mark.parametrize("tag", [0, 12, 13, 0x7F, 0xFF])
def test_decode_rejects_unknown_tags(tag):
    with pytest.raises(DecodeError, match=f"unknown command tag {tag}"):
        decode_proposal(bytes([VERSION, tag]) + b"\x00" * 16)


def test_decode_rejects_every_tag_outside_the_five_commands():
    for tag in range(256):
        if tag in (1, 2, 3, 4, 5):
            continue
        with pytest.raises(DecodeError):
            decode_proposal(bytes([VERSION, tag]) + b"\x00" * 16)


def _batch_holding(raw_op: bytes) -> bytes:
    return bytes([VERSION]) + b"\x05" + struct.pack("<I", 1) + raw_op


@pytest.mark.parametrize(
    "inner",
    [
        Cas(b"k", b"old", b"new"),
        Cas(b"k", None, None),
        Batch((Put(b"k", b"v"),)),
        Batch(()),
    ],
)
def test_decode_rejects_a_cas_or_batch_inside_a_batch(inner):
    raw_inner = encode_proposal([inner])[1:]
    with pytest.raises(DecodeError, match="not allowed inside a batch"):
        decode_proposal(_batch_holding(raw_inner))


def test_decode_rejects_a_batch_whose_count_exceeds_its_operations():
    buf = bytes([VERSION]) + b"\x05" + struct.pack("<I", 3) + encode_proposal([Put(b"k", b"v")])[1:]
    with pytest.raises(DecodeError):
        decode_proposal(buf)


def test_decode_error_is_a_value_error():
    assert issubclass(DecodeError, ValueError)


# --- routing_keys -----------------------------------------------------------


def test_routing_keys_ignore_ranges_which_apply_within_the_partition_they_are_sent_to():
    assert routing_keys(Put(b"p", b"v")) == [b"p"]
    assert routing_keys(Delete(b"d")) == [b"d"]
    assert routing_keys(Cas(b"c", None, None)) == [b"c"]
    assert routing_keys(DeleteRange(b"s", b"t")) == []
    assert routing_keys(Batch((Put(b"a", b""), DeleteRange(b"b", b"c"), Delete(b"d")))) == [b"a", b"d"]


# --- check_command ----------------------------------------------------------

LIMITS = Limits(max_key_bytes=8, max_value_bytes=16)


def test_limits_defaults_match_the_spec_defaults():
    from raftkv.core.spec import DEFAULT_MAX_KEY_BYTES, DEFAULT_MAX_VALUE_BYTES

    assert Limits() == Limits(max_key_bytes=DEFAULT_MAX_KEY_BYTES, max_value_bytes=DEFAULT_MAX_VALUE_BYTES)


@pytest.mark.parametrize(
    "command",
    [
        Put(b"k" * 8, b"v" * 16),
        Put(b"k", b""),
        Delete(b"k" * 8),
        DeleteRange(b"a" * 8, b"b" * 8),
        Cas(b"k" * 8, b"v" * 16, b"w" * 16),
        Cas(b"k", None, None),
        Batch((Put(b"k" * 8, b"v" * 16), Delete(b"d"), DeleteRange(b"a", b"b"))),
    ],
)
def test_check_command_accepts_commands_exactly_at_the_limits(command):
    check_command(command, LIMITS)


@pytest.mark.parametrize(
    "command, what",
    [
        (Put(b"", b"v"), "key must not be empty"),
        (Delete(b""), "key must not be empty"),
        (Cas(b"", None, b"v"), "key must not be empty"),
        (DeleteRange(b"", b"b"), "range start must not be empty"),
        (DeleteRange(b"a", b""), "range end must not be empty"),
        (Batch((Put(b"", b"v"),)), "key must not be empty"),
    ],
)
def test_check_command_rejects_empty_keys(command, what):
    with pytest.raises(InvalidRequest, match=what):
        check_command(command, LIMITS)


@pytest.mark.parametrize(
    "command, what",
    [
        (Put(b"k" * 9, b"v"), "key"),
        (Delete(b"k" * 9), "key"),
        (Cas(b"k" * 9, None, None), "key"),
        (DeleteRange(b"a" * 9, b"b"), "range start"),
        (DeleteRange(b"a", b"b" * 9), "range end"),
        (Batch((Delete(b"d"), Put(b"k" * 9, b"v"))), "key"),
    ],
)
def test_check_command_rejects_oversized_keys_naming_the_limit_and_config_field(command, what):
    with pytest.raises(InvalidRequest) as info:
        check_command(command, LIMITS)
    message = str(info.value)
    assert message.startswith(f"{what} is 9 bytes")
    assert "the limit is 8" in message
    assert "cluster.max_key_bytes" in message


@pytest.mark.parametrize(
    "command",
    [
        Put(b"k", b"v" * 17),
        Cas(b"k", b"v" * 17, None),
        Cas(b"k", None, b"v" * 17),
        Batch((Put(b"k", b"v" * 17),)),
    ],
)
def test_check_command_rejects_oversized_values_naming_the_limit_and_config_field(command):
    with pytest.raises(InvalidRequest) as info:
        check_command(command, LIMITS)
    message = str(info.value)
    assert "value is 17 bytes" in message
    assert "the limit is 16" in message
    assert "cluster.max_value_bytes" in message


@pytest.mark.parametrize("start, end", [(b"b", b"a"), (b"a", b"a"), (b"ab", b"a")])
def test_check_command_rejects_ranges_whose_start_is_not_below_end(start, end):
    with pytest.raises(InvalidRequest, match="range start must be below range end"):
        check_command(DeleteRange(start, end), LIMITS)
    with pytest.raises(InvalidRequest, match="range start must be below range end"):
        check_command(Batch((DeleteRange(start, end),)), LIMITS)


def test_check_command_rejects_an_empty_batch():
    with pytest.raises(InvalidRequest, match="at least one operation"):
        check_command(Batch(()), LIMITS)


@pytest.mark.parametrize("inner", [Cas(b"k", None, b"v"), Batch((Put(b"k", b"v"),))])
def test_check_command_rejects_a_cas_or_batch_nested_in_a_batch(inner):
    with pytest.raises(InvalidRequest, match="only put, delete and delete_range"):
        check_command(Batch((Put(b"a", b"b"), inner)), LIMITS)


@given(
    st.integers(1, 64).flatmap(lambda k: st.tuples(st.just(k), st.binary(min_size=1, max_size=70))),
    st.integers(0, 64).flatmap(lambda v: st.tuples(st.just(v), st.binary(max_size=70))),
)
def test_check_command_accepts_a_put_iff_key_and_value_are_within_the_limits(key_case, value_case):
    max_key, key = key_case
    max_value, value = value_case
    limits = Limits(max_key_bytes=max_key, max_value_bytes=max_value)
    ok = len(key) <= max_key and len(value) <= max_value
    if ok:
        check_command(Put(key, value), limits)
    else:
        with pytest.raises(InvalidRequest):
            check_command(Put(key, value), limits)


def test_decode_reports_a_cut_inside_a_field_as_truncation():
    with pytest.raises(DecodeError, match="truncated"):
        decode_proposal(encode_proposal([Put(b"abc", b"def")])[:10])


@pytest.mark.parametrize("flags, elen, nlen", [(0xFF, 0, 0), (0b10, 3, 1), (0b01, 0, 2)])
def test_decode_rejects_malformed_cas(flags, elen, nlen):
    import struct

    body = b"k" + b"x" * elen + b"n" * nlen
    with pytest.raises(DecodeError, match="malformed cas"):
        decode_proposal(b"\x01\x04" + struct.pack("<BIII", flags, 1, elen, nlen) + body)


def test_put_many_checks_its_columns_and_routes_by_every_key():
    command = PutMany.of([b"a", b"bb"], [b"1", b""])
    assert list(command.pairs()) == [(b"a", b"1"), (b"bb", b"")]
    assert routing_keys(command) == [b"a", b"bb"]
    assert encode_command(command) == encode_proposal([command])[1:]
    check_command(command, Limits())
    for bad, message in [
        (PutMany.of([b""], [b"v"]), "key must not be empty"),
        (PutMany.of([b"k" * 5000], [b"v"]), "key is 5000 bytes"),
        (PutMany.of([b"k"], [b"v" * 2_000_000]), "value is 2000000 bytes"),
        (PutMany(b"ab", struct.pack("<3i", 0, 1, 2), b"v", struct.pack("<2i", 0, 1)), "2 keys but 1 values"),
        (PutMany(b"ab", struct.pack("<2i", 0, 1), b"v", struct.pack("<2i", 0, 1)), "run from 0 to the data's length"),
        (PutMany(b"a", struct.pack("<3i", 0, 2, 1), b"vv", struct.pack("<3i", 0, 1, 2)), "must not decrease"),
        (PutMany(b"", b"", b"", b""), "with one row or more"),
    ]:
        with pytest.raises(InvalidRequest, match=message):
            check_command(bad, Limits())
    with pytest.raises(ValueError, match="only put, delete and delete_range"):
        encode_proposal([Batch((command,))])


def test_a_guarded_batch_is_tag_11_its_guards_then_a_batchs_fields():
    encoded = encode_proposal([GuardedBatch((Guard(b"a", b"1"), Guard(b"b", None)), (Put(b"a", b"0"),))])
    assert encoded == (
        b"\x01\x0b" + struct.pack("<I", 2)
        + struct.pack("<BII", 1, 1, 1) + b"a1" + struct.pack("<BII", 0, 1, 0) + b"b"
        + struct.pack("<I", 1) + b"\x01" + struct.pack("<II", 1, 1) + b"a0"
    )
    assert decode_proposal(encoded)[0].guards[1].expected is None  # absent, not empty


def test_check_command_wants_a_guarded_batch_to_have_a_guard_and_an_operation():
    with pytest.raises(InvalidRequest, match="at least one guard"):
        check_command(GuardedBatch((), (Put(b"k", b"v"),)), Limits())
    with pytest.raises(InvalidRequest, match="at least one operation"):
        check_command(GuardedBatch((Guard(b"k", None),), ()), Limits())
    with pytest.raises(InvalidRequest, match="key is 5 bytes; the limit is 4"):
        check_command(GuardedBatch((Guard(b"kkkkk", None),), (Put(b"k", b"v"),)), Limits(max_key_bytes=4))
    assert routing_keys(GuardedBatch((Guard(b"g", None),), (Put(b"k", b"v"),))) == [b"g", b"k"]
