"""learners.sinks.change_messages: the bytes protobuf itself would write for each event's Change."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from learners.change_event import OPS
from learners.entry_events import EntryEvents
from learners.sinks.change_messages import change_messages
from raftkv.api import kv_pb2 as pb

# lengths of one, two and three varint bytes
payloads = st.one_of(st.binary(max_size=8), st.integers(0, 20_000).map(lambda n: b"\xab" * n))
rows = st.lists(st.tuples(st.sampled_from(OPS), payloads, st.none() | payloads, st.none() | payloads), max_size=6)
u64 = st.integers(0, 2**64 - 1)
entries = st.builds(
    lambda source, columns, first_seq: EntryEvents(*source, *columns, first_seq=first_seq),
    st.tuples(st.text(max_size=3), st.integers(0, 2**32 - 1), u64, u64, st.booleans(), st.integers(-2**63, 2**63 - 1)),
    rows.map(lambda r: tuple(map(list, zip(*r))) if r else ([], [], [], [])),
    st.integers(0, 2**32 - 7),
)


@settings(max_examples=300, deadline=None)
@given(entries)
def test_each_message_is_what_protobuf_serializes(entry):
    expected = [pb.Change(index=e.index, seq=e.seq, op=e.op, key=e.key, before=e.before, after=e.after, term=e.term,
                          snapshot=e.snapshot, ts_ms=e.ts_ms).SerializeToString() for e in entry]
    assert change_messages(entry) == expected


def test_absent_and_empty_images_stay_apart():
    entry = EntryEvents("c", 0, 5, 1, False, 0, ["c", "d"], [b"k", b"k"], [None, b""], [b"", None])
    created, deleted = map(pb.Change.FromString, change_messages(entry))
    assert (created.HasField("before"), created.HasField("after"), created.after) == (False, True, b"")
    assert (deleted.HasField("before"), deleted.HasField("after"), deleted.seq) == (True, False, 1)
