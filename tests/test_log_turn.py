"""Tests for raftkv.raft.log_turn: a loop turn's records of every group written with one write and synced
with one fdatasync off the loop; the turn's frames leave once that sync is done, a leader's early ones at
once, and none if the write failed."""

from __future__ import annotations

import asyncio
import contextlib

from raftkv import failpoints
from raftkv.core import metrics
from raftkv.dev.local_cluster import free_port_block
from raftkv.raft.log_turn import LogTurn
from raftkv.raft.node_log import NodeLog
from tests.loopback_hubs import LoopbackHubs, unconnected_hub
from tests.conftest import until

GROUPS = 8


async def turn_ended() -> None:
    """Let the loop run the callbacks queued so far (the hub's one flush of the turn among them)."""
    for _ in range(3):
        await asyncio.sleep(0)


def test_a_turn_writes_every_groups_records_once_and_syncs_them_once(tmp_path):
    async def scenario():
        log = NodeLog(tmp_path, fsync=True)
        errors = []
        LogTurn(log, unconnected_hub(), fsync=True, on_corrupt=errors.append)
        writes, fsyncs = log.written, metrics.NODE_LOG_FSYNCS._value.get()
        views = [log.group(g) for g in range(GROUPS)]
        for view in views:  # one turn: every group created, and an entry for each
            view.add(b"entry", 1, 1)
        assert log.written == writes and all(view.waiting(1) and view.dirty for view in views)
        await until(lambda: log.synced == log.written == writes + 1)
        await until(lambda: metrics.NODE_LOG_FSYNCS._value.get() == fsyncs + 1)
        assert not any(view.waiting(1) or view.dirty for view in views) and errors == []
        log.close()
        assert [NodeLog(tmp_path, fsync=True).group(g)[:] for g in range(GROUPS)] == [[(b"entry", 1, 1)]] * GROUPS

    asyncio.run(scenario())


class Received:
    """Group 0's endpoint on the receiving hub."""

    def __init__(self) -> None:
        self.messages: list[object] = []

    def deliver(self, sender, connection, message) -> None:
        self.messages.append(message)

    def links_changed(self) -> None:
        pass

    def directory_changed(self) -> None:
        pass


@contextlib.asynccontextmanager
async def sender_and_receiver(folder):
    """A node log with its LogTurn on a hub connected to another hub; yields (the sending hub, the
    receiver's id, what group 0 received there, the log's view of group 0)."""
    hubs = LoopbackHubs()
    a, b = (f"127.0.0.1:{port}" for port in (free_port_block(1), free_port_block(1)))
    sender, receiver = hubs.hub(a), hubs.hub(b)
    received = Received()
    receiver.attach(0, received)
    log = NodeLog(folder, fsync=True)
    LogTurn(log, sender, fsync=True, on_corrupt=lambda error: None)
    try:
        await until(lambda: sender.is_up(b))
        yield sender, b, received, log.group(0)
    finally:
        failpoints.disarm_all()
        log.close()
        await hubs.close()


def test_no_frame_of_a_turn_leaves_when_its_records_could_not_be_written(tmp_path):
    async def scenario():
        async with sender_and_receiver(tmp_path) as (sender, b, received, view):
            failpoints.arm("journal-append-before", "1*error")
            view.add(b"not written", 1, 1)
            sender.send(b, 0, "speaks of entry 1")
            await turn_ended()
            failpoints.disarm_all()
            assert view.waiting(1)  # kept for the next turn's write
            sender.send(b, 0, "speaks of entry 1 again")
            await until(lambda: received.messages)
            assert received.messages == ["speaks of entry 1 again"] and not view.waiting(1) and not view.dirty

    asyncio.run(scenario())


def test_a_leaders_early_frame_leaves_before_the_turns_sync_and_the_others_wait_for_it(tmp_path):
    """Raft thesis §10.2.1: a leader may send its entries before its own sync (it counts itself once synced);
    an acknowledgement, a vote, any other frame waits for the sync of the records it speaks of. An early
    frame never overtakes a frame of an earlier turn still waiting."""
    async def scenario():
        async with sender_and_receiver(tmp_path) as (sender, b, received, view):
            failpoints.arm("journal-fsync-before", "1*delay(2500)")
            view.add(b"entry", 1, 1)
            sender.send(b, 0, "ack 1")
            sender.send(b, 0, "steps 1", early=True)
            await until(lambda: received.messages)
            log = view._node
            assert received.messages == ["steps 1"] and log.synced < log.written  # the sync is under way
            sender.send(b, 0, "steps 2", early=True)  # a later turn, the ack still waiting
            await until(lambda: len(received.messages) == 3)
            assert received.messages == ["steps 1", "ack 1", "steps 2"] and log.synced == log.written

    asyncio.run(scenario())
