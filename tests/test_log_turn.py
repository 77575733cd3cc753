"""Tests for raftkv.raft.log_turn: a loop turn's records of every group written with one write and synced
with one fdatasync, before any frame of the turn leaves; none leaves if the write failed."""

from __future__ import annotations

import asyncio

from raftkv import failpoints
from raftkv.core import metrics
from raftkv.dev.local_cluster import free_port_block
from raftkv.raft.log_turn import LogTurn
from raftkv.raft.node_log import NodeLog
from tests.loopback_hubs import LoopbackHubs, unconnected_hub
from tests.test_snapshot_writer import until

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
        views = [log.group(g) for g in range(GROUPS)]
        await turn_ended()
        writes, fsyncs = log.written, metrics.NODE_LOG_FSYNCS._value.get()
        for view in views:  # one turn: an entry for every group
            view.add(b"entry", 1, 1)
        assert log.written == writes and all(view.waiting(1) and view.dirty for view in views)
        await turn_ended()
        assert log.written == writes + 1 and log.synced == log.written
        assert metrics.NODE_LOG_FSYNCS._value.get() == fsyncs + 1
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


def test_no_frame_of_a_turn_leaves_when_its_records_could_not_be_written(tmp_path):
    async def scenario():
        hubs = LoopbackHubs()
        a, b = (f"127.0.0.1:{port}" for port in (free_port_block(1), free_port_block(1)))
        sender, receiver = hubs.hub(a), hubs.hub(b)
        received = Received()
        receiver.attach(0, received)
        log = NodeLog(tmp_path, fsync=True)
        LogTurn(log, sender, fsync=True, on_corrupt=lambda error: None)
        view = log.group(0)
        try:
            await until(lambda: sender.is_up(b))
            failpoints.arm("journal-append-before", "1*error")
            try:
                view.add(b"not written", 1, 1)
                sender.send(b, 0, "speaks of entry 1")
                await turn_ended()
            finally:
                failpoints.disarm_all()
            assert view.waiting(1)  # kept for the next turn's write
            sender.send(b, 0, "speaks of entry 1 again")
            await until(lambda: received.messages)
            assert received.messages == ["speaks of entry 1 again"] and not view.waiting(1) and not view.dirty
        finally:
            log.close()
            await hubs.close()

    asyncio.run(scenario())
