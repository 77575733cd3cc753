"""The Raft hub (raftkv/raft/hub.py): its frames, who it lets speak for whom, and what it refuses.

In one process, on loopback: real hubs, real pysyncobj groups, real TLS handshakes; the strangers
are raw sockets writing what an attacker would.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import resource
import ssl
import struct
import zlib

import pytest
import uvloop

from raftkv.core.spec import Tuning, build_spec
from raftkv.dev.local_cluster import free_port_block
from raftkv.core import metrics
from raftkv.raft import hub_frames
from raftkv.raft.engine.node_engine import NodeEngine
from raftkv.raft.group import Outcome, Role
from raftkv.raft.hub import Connection, Directory, RaftHub
from raftkv.raft.hub_frames import CONTROL, BadFrame
from raftkv.raft.syncobj_group import GroupConfig, SyncObjGroup
from raftkv.security.certs import init_certs
from raftkv.security.tls import Tls
from tests.loopback_hubs import LoopbackHubs
from tests.raft_scenarios import DictStateMachine
from tests.test_snapshot_writer import until


# -- frames ------------------------------------------------------------------------------------


def _body(frame: bytes) -> tuple:
    assert hub_frames.frame_length(frame[:hub_frames.HEADER_BYTES]) == len(frame) - hub_frames.HEADER_BYTES
    return hub_frames.decode(frame[hub_frames.HEADER_BYTES:])


@pytest.mark.parametrize("level", [0, 6])
def test_a_frame_carries_a_groups_message_or_a_control_verb(level):
    message = {"type": "append_entries", "entries": [(b"\x00cmd", 7, 2)], "term": 2, "commit_index": 6}
    assert _body(hub_frames.encode((3, message), level)) == (3, message)
    assert _body(hub_frames.encode((-1, message), level)) == (-1, message)
    assert _body(hub_frames.encode((CONTROL, "join", 5), level)) == (CONTROL, "join", 5)


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


@pytest.mark.parametrize("body, why", [
    (pickle.dumps((0, _Evil())), "only plain data"),
    (pickle.dumps(["not", "a", "tuple"]), "not a tuple"),
    (pickle.dumps((True, {})), "without a group number"),
    (pickle.dumps((CONTROL, "hello")), "malformed control"),
    (b"\x80\x05garbage", "undecodable"),
])
def test_a_frame_that_names_code_or_has_another_shape_is_refused(body, why):
    with pytest.raises(BadFrame, match=why):
        hub_frames.decode(b"\x00" + body)


def test_lengths_flags_and_inflation_are_bounded():
    with pytest.raises(BadFrame, match="a frame of 0 bytes"):
        hub_frames.frame_length(struct.pack(">I", 0))
    with pytest.raises(BadFrame):
        hub_frames.frame_length(struct.pack(">I", hub_frames.MAX_FRAME_BYTES + 1))
    with pytest.raises(BadFrame, match="unknown frame flag"):
        hub_frames.decode(b"\x07" + pickle.dumps((0, {})))
    bomb = zlib.compress(b"\x00" * (hub_frames.MAX_FRAME_BYTES + 1024), 9)
    with pytest.raises(BadFrame, match="inflates past"):
        hub_frames.decode(b"\x01" + bomb)


def test_an_empty_frame_and_a_short_header_are_bad_frames():
    with pytest.raises(BadFrame, match="an empty frame"):
        hub_frames.decode(b"")
    with pytest.raises(BadFrame, match="a frame header of 3 bytes"):
        hub_frames.frame_length(b"\x00\x00\x01")


def test_a_zlib_frame_inflates_sixteenfold_at_most():
    """Unpickling takes ~70 bytes a byte of EMPTY_LIST opcodes: 1 MiB of them in a 1 KiB frame
    would take 70 MiB, and 64 MiB of them in a 64 KiB frame gigabytes."""
    bomb = zlib.compress(b"\x80\x05" + b"]" * (1 << 20) + b".", 9)
    with pytest.raises(BadFrame, match=r"inflates past 65536 bytes \(16 times its size\)"):
        hub_frames.decode(b"\x01" + bomb)


def test_a_memo_index_in_a_frame_from_a_learner_allocates_nothing():
    """Found by scripts/fuzz.py: C's unpickler grows its memo array to the largest index a PUT names,
    so this 10-byte body made it allocate and zero 1 GiB (a 169-byte one took 21 s). A learner's and a
    hello's frames are read by the pure-Python unpickler, whose memo is a dict."""
    bomb = b"\x00\x80\x05N" + b"r" + struct.pack("<I", 1 << 26) + b"(t\x94."
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(BadFrame, match="a frame that is not a tuple|undecodable"):
        hub_frames.decode(bomb)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 100 * 1024  # KiB


def test_encode_sends_plain_a_body_that_would_inflate_past_the_limit():
    zeros = (0, {"entries": [b"\x00" * (1 << 20)]})
    frame = hub_frames.encode(zeros, 9)
    assert frame[hub_frames.HEADER_BYTES] == 0 and _body(frame) == zeros
    rows = (0, {"entries": [f"user:{i:08d} {{'age': {i % 97}, 'name': 'user {i}'}}".encode() for i in range(5000)]})
    frame = hub_frames.encode(rows, 9)
    assert frame[hub_frames.HEADER_BYTES] == 1 and _body(frame) == rows


# -- strangers and read-only members -------------------------------------------------------------


async def _single_voter(hubs: LoopbackHubs, folder) -> tuple[SyncObjGroup, str]:
    address = f"127.0.0.1:{free_port_block(1)}"
    group = SyncObjGroup(GroupConfig(partition=0, hub=hubs.hub(address), self_address=address, peers=(),
                                     folder=folder, fsync=False, tuning=Tuning()), DictStateMachine(),
                         asyncio.get_running_loop())
    await until(lambda: group.role == Role.LEADER and group.last_applied >= 1)
    return group, address


async def _closed_by_peer(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), 10) == b""
    except ConnectionError:
        return True


def test_a_learner_may_only_answer_appends_not_ask_for_votes_or_append(tmp_path):
    """A read-only member's vote request with a higher term would depose the leader, and its append would
    be obeyed: both are dropped, and the group goes on committing in its term."""

    async def scenario():
        hubs = LoopbackHubs()
        group, address = await _single_voter(hubs, tmp_path / "voter")
        try:
            term = group.term
            reader, writer = await asyncio.open_connection(*address.rsplit(":", 1))
            forged = [(CONTROL, "hello", None), (CONTROL, "join", 0),
                      (0, {"type": "request_vote", "term": term + 50, "last_log_index": 10**6, "last_log_term": 99}),
                      (0, {"type": "append_entries", "term": term + 50, "commit_index": 10**6, "entries": [],
                           "prevLogIdx": 10**6, "prevLogTerm": 99})]
            writer.write(b"".join(hub_frames.encode(body) for body in forged))
            await writer.drain()
            header = await asyncio.wait_for(reader.readexactly(hub_frames.HEADER_BYTES), 10)
            group_number, message = hub_frames.decode(await reader.readexactly(hub_frames.frame_length(header)))
            assert (group_number, message["type"]) == (0, "append_entries")  # it was taken as a learner...
            done = asyncio.get_running_loop().create_future()
            group.propose(b"k=v", lambda result, outcome: done.set_result(outcome))
            assert await asyncio.wait_for(done, 10) == Outcome.APPLIED
            assert (group.role, group.term) == (Role.LEADER, term)  # ...and no more than that
            writer.close()
        finally:
            group.close()
            await hubs.close()

    asyncio.run(scenario())


_ADMIN_STATUS = zlib.compress(pickle.dumps(["status"]))  # what pysyncobj's admin tool sends first


@pytest.mark.parametrize("opening", [
    b"GET / HTTP/1.1\r\n\r\n",
    struct.pack(">I", len(_ADMIN_STATUS)) + _ADMIN_STATUS,
    hub_frames.encode((0, {"type": "request_vote", "term": 99})),
    hub_frames.encode((CONTROL, "hello", "n9")) + hub_frames.encode((CONTROL, "transfer", 0)),
], ids=["http", "pysyncobj-admin", "message-before-hello", "unknown-verb"])
def test_a_connection_that_does_not_speak_the_protocol_is_closed_and_changes_nothing(tmp_path, opening):
    async def scenario():
        hubs = LoopbackHubs()
        group, address = await _single_voter(hubs, tmp_path / "voter")
        try:
            term, applied = group.term, group.last_applied
            reader, writer = await asyncio.open_connection(*address.rsplit(":", 1))
            writer.write(opening)
            await writer.drain()
            assert await _closed_by_peer(reader)
            writer.close()
            assert (group.role, group.term, group.last_applied, group.voters) == (
                Role.LEADER, term, applied, frozenset({address}))
        finally:
            group.close()
            await hubs.close()

    asyncio.run(scenario())


def test_engine_frames_go_only_to_nodes_that_announced_the_engine_and_a_node_without_it_stays_connected():
    """Mixed releases: hubs a and b run the node engine, c does not (as a node of the previous release).
    a and b hear each other's engine frames; c, which never announced it, is never an engine peer, and
    the announcement it gets (a ping's argument) leaves its connections up."""

    async def scenario():
        hubs = LoopbackHubs()
        a, b, c = (f"127.0.0.1:{free_port_block(1)}" for _ in range(3))
        hubs.know(a, b, c)
        loop = asyncio.get_running_loop()
        engines = {}
        for address in (a, b):
            hub = hubs.hub(address)
            hub.engine = engines[address] = NodeEngine(loop, hub, Tuning(), hub.flush_soon)
        hubs.hub(c)
        try:
            pairs = [(x, y) for x in (a, b, c) for y in (a, b, c) if x != y]
            await until(lambda: all(hubs.hub(x).is_up(y) for x, y in pairs))
            await until(lambda: hubs.hub(a).engine_peer(b) and hubs.hub(b).engine_peer(a))
            assert not hubs.hub(a).engine_peer(c) and not hubs.hub(b).engine_peer(c)
            stale, link = metrics.ENGINE_STALE._value.get(), hubs.hub(a)._links[b]
            assert hubs.hub(a).send(b, hub_frames.ENGINE, [("beat", 7, 1, 1, 0), "not an item"])
            await until(lambda: engines[b].heard_from(a) > 0)
            assert metrics.ENGINE_STALE._value.get() == stale + 2  # a group b does not host, and garbage
            # a later frame arrives on the same connection: dropped items do not close it
            assert hubs.hub(a).send(b, hub_frames.ENGINE, ["garbage again"])
            await until(lambda: metrics.ENGINE_STALE._value.get() == stale + 3)
            assert hubs.hub(a)._links[b] is link and all(hubs.hub(x).is_up(y) for x, y in pairs)
        finally:
            await hubs.close()

    asyncio.run(scenario())


# -- mutual TLS --------------------------------------------------------------------------------------


@pytest.fixture
def certs(tmp_path):
    spec = build_spec(nodes=2, partitions=1, replication=2, base_port=7000, data_dir=tmp_path / "data")
    init_certs(tmp_path / "certs", spec, ["alice"], days=30)
    return tmp_path / "certs"


def _tls(certs, stem: str) -> Tls:
    return Tls(certs / "ca.pem", certs / f"{stem}.pem", certs / f"{stem}.key")


@pytest.mark.parametrize("stem, claimed, accepted", [
    ("node-n2", "n2", True),
    ("node-n2", "n1", False),  # a node speaking for another
    ("learner", None, True),
    ("learner", "n2", False),  # a learner claiming to be a voter
    ("user-alice", None, False),  # a client certificate is no Raft peer at all
])
def test_over_tls_a_peer_speaks_only_for_what_its_certificate_names(certs, stem, claimed, accepted):
    async def scenario():
        port = free_port_block(1)
        hub = RaftHub(asyncio.get_running_loop(), "n1", Directory, _tls(certs, "node-n1"), retry_seconds=0.5,
                      dead_after=3.5)
        hub.listen("127.0.0.1", port)
        hub.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=_tls(certs, stem).client_context(),
                                                           server_hostname="127.0.0.1")
            writer.write(hub_frames.encode((CONTROL, "hello", claimed)) + hub_frames.encode((CONTROL, "ping", None)))
            await writer.drain()
            if accepted:
                header = await asyncio.wait_for(reader.readexactly(hub_frames.HEADER_BYTES), 10)
                assert hub_frames.decode(await reader.readexactly(hub_frames.frame_length(header))) == (
                    CONTROL, "pong", None)
            else:
                assert await _closed_by_peer(reader)
            writer.close()
        finally:
            await hub.close()

    asyncio.run(scenario())


def test_over_tls_a_stranger_does_not_get_past_the_handshake(certs, tmp_path):
    other = tmp_path / "other"
    init_certs(other, None, [], days=30)

    async def scenario():
        port = free_port_block(1)
        hub = RaftHub(asyncio.get_running_loop(), "n1", Directory, _tls(certs, "node-n1"), retry_seconds=0.5,
                      dead_after=3.5)
        hub.listen("127.0.0.1", port)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)  # plaintext
            writer.write(hub_frames.encode((CONTROL, "hello", "n2")))
            assert await _closed_by_peer(reader)
            writer.close()
            foreign = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            foreign.check_hostname, foreign.verify_mode = False, ssl.CERT_NONE
            foreign.load_cert_chain(other / "learner.pem", other / "learner.key")  # another cluster's CA
            with pytest.raises((ssl.SSLError, ConnectionError)):
                reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=foreign)
                writer.write(hub_frames.encode((CONTROL, "hello", None)))
                await writer.drain()
                if await _closed_by_peer(reader):
                    raise ConnectionError("closed")
        finally:
            await hub.close()

    asyncio.run(scenario())


# -- what the hub tells its groups -------------------------------------------------------------


class _Watcher:
    def __init__(self):
        self.changes = 0

    def deliver(self, sender, connection, message) -> None:
        pass

    def links_changed(self) -> None:
        pass

    def directory_changed(self) -> None:
        self.changes += 1


def test_a_new_directory_tells_every_group_to_look_at_its_links_again():
    """Groups look at their members' links only when told (`GroupTransport._follow_links`): a node that
    joins the cluster is in a new directory, and a group must look again to reach it. The same directory
    tells nothing: it would wake every resting group."""

    async def scenario():
        directories = [Directory()]
        hub = RaftHub(asyncio.get_running_loop(), "n1", lambda: directories[-1], None, retry_seconds=0.5,
                      dead_after=60)  # no ping of its own during the test: it pings when told below
        watcher = _Watcher()
        hub.attach(0, watcher)
        hub.start()
        try:
            hub._ping()
            hub._ping()
            assert watcher.changes == 0
            directories.append(Directory({"n2": ("127.0.0.1", free_port_block(1))}, {"n2:0": ("n2", 0)}))
            hub._ping()
            hub._ping()
            assert watcher.changes == 1
        finally:
            await hub.close()

    asyncio.run(scenario())


def test_a_frame_sent_after_the_peer_closed_the_connection_is_dropped_not_raised():
    """A frame queued for a connection the peer has just closed, before `read_frames` hears of it: uvloop
    (the nodes' loop) raises on a write to a closed transport, inside the flush callback. Found by the
    chaos suite's disk faults: a traceback in a node's log."""

    async def scenario():
        loop = asyncio.get_running_loop()
        raised: list[dict] = []
        loop.set_exception_handler(lambda _, context: raised.append(context))
        server = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        hub = RaftHub(loop, "n1", Directory, None, retry_seconds=0.5, dead_after=3.5)
        connection = Connection(hub, reader, writer, peer="n2", dialed=True)
        try:
            writer.transport.abort()
            assert connection.send(hub_frames.encode((CONTROL, "ping", None)))
            for _ in range(3):
                await asyncio.sleep(0)  # the flush runs at the next turn of the loop
            assert not raised, raised
            assert connection.closed
        finally:
            server.close()
            await hub.close()

    uvloop.run(scenario())


# -- time, on a fake clock ------------------------------------------------------------------------------


def test_on_a_fake_clock_a_connection_that_hears_nothing_for_dead_after_is_closed_and_one_that_hears_stays():
    async def scenario():
        loop = asyncio.get_running_loop()
        now = [1000.0]
        accepted: list[asyncio.StreamWriter] = []
        server = await asyncio.start_server(lambda reader, writer: accepted.append(writer), "127.0.0.1", 0)
        hub = RaftHub(loop, "n1", Directory, None, retry_seconds=0.5, dead_after=3.0, clock=lambda: now[0])
        try:
            where = server.sockets[0].getsockname()[:2]
            silent, heard = [Connection(hub, *await asyncio.open_connection(*where), peer=peer, dialed=True)
                             for peer in ("n2", "n3")]
            hub._links.update(n2=silent, n3=heard)
            reading = loop.create_task(heard.read_frames())
            await until(lambda: len(accepted) == 2)
            now[0] += 2.9
            hub._ping()
            assert not silent.closed and not heard.closed
            accepted[1].write(hub_frames.encode((CONTROL, "pong", None)))  # the one `heard` dialed answers
            await until(lambda: heard.last_received == now[0])
            now[0] += 0.2  # 3.1 s of silence from n2, 0.2 s from n3
            hub._ping()
            assert silent.closed and not heard.closed and hub._links["n2"] is None
            reading.cancel()
        finally:
            server.close()
            await hub.close()

    asyncio.run(scenario())


def test_pings_and_their_answers_leave_at_once_while_raft_frames_wait_for_a_slow_sync():
    """test_chaos's bad-disk run: a node whose fsync took 5 s held its pongs behind the sync; its peers
    heard nothing for longer than dead_after, closed their connections and dialed again, and a heartbeat
    sent on the old one was handled after a snapshot sent on the new one."""
    async def frame(reader: asyncio.StreamReader) -> tuple:
        header = await asyncio.wait_for(reader.readexactly(hub_frames.HEADER_BYTES), 5)
        return _body(header + await reader.readexactly(hub_frames.frame_length(header)))

    async def scenario():
        streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        server = await asyncio.start_server(lambda *stream: streams.append(stream), "127.0.0.1", 0)
        hub = RaftHub(asyncio.get_running_loop(), "n1", Directory, None, retry_seconds=0.5, dead_after=30.0)
        hub.before_send = lambda: 7  # the node log's sync of write 7 has not come yet
        try:
            where = server.sockets[0].getsockname()[:2]
            pinging, answering = [Connection(hub, *await asyncio.open_connection(*where), peer="n2", dialed=dialed)
                                  for dialed in (True, False)]
            hub._links["n2"] = pinging
            await until(lambda: len(streams) == 2)
            accepted = [reader for reader, _ in streams]
            for connection in (pinging, answering):
                hub.reply(connection, 3, {"type": "next_node_idx"})  # an answer: it waits for the sync
            await asyncio.sleep(0)  # the turn's flush holds them
            assert hub._holding == {pinging, answering}
            hub._ping()
            hub._on_control(answering, "ping", None)
            assert [await frame(accepted[0]), await frame(accepted[1])] == [(CONTROL, "ping", None),
                                                                           (CONTROL, "pong", None)]
            hub.synced(7)
            assert [(await frame(reader))[0] for reader in accepted] == [3, 3]
        finally:
            for connection in (pinging, answering):  # `answering` is no accepted connection of the hub's
                connection.close()
            for _, writer in streams:
                writer.close()
            server.close()
            await hub.close()

    asyncio.run(scenario())


def test_on_a_fake_clock_refusals_are_logged_at_most_every_ten_seconds(caplog):
    async def scenario():
        now = [0.0]
        hub = RaftHub(asyncio.get_running_loop(), "n1", Directory, None, retry_seconds=0.5, dead_after=3.5,
                      clock=lambda: now[0])
        for now[0] in (0.0, 1.0, 9.9, 10.0, 19.9, 20.0):
            hub._log_refusal(f"refused at {now[0]}")
        await hub.close()

    with caplog.at_level(logging.WARNING, logger="raftkv.raft.hub"):
        asyncio.run(scenario())
    assert [r.getMessage() for r in caplog.records if r.name == "raftkv.raft.hub"] == [
        "refused at 0.0", "refused at 10.0", "refused at 20.0"]
