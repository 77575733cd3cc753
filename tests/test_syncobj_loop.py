"""LoopPoller and Ticker: pysyncobj's poller contract on an asyncio loop."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.serializer import Serializer

from raftkv.chaos.small_disk import SmallDisk
from raftkv.core.clock import Throttle
from raftkv.core.errors import StorageFull
from raftkv.raft import syncobj_loop
from raftkv.raft.syncobj_loop import MAX_TIMER_SECONDS, STALL_SECONDS, LoopPoller, Ticker, timer_delay


def test_events_reach_the_current_owner_of_an_fd_and_closed_fds_unsubscribe_quietly():
    async def scenario():
        loop = asyncio.get_running_loop()
        poller = LoopPoller(loop)
        a, b = socket.socketpair()
        seen = []
        poller.subscribe(a.fileno(), lambda fd, ev: seen.append(("old", ev)), POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE)
        # re-subscribing replaces the owner; events dispatched later go to the new callback only
        poller.subscribe(a.fileno(), lambda fd, ev: seen.append(("new", ev)), POLL_EVENT_TYPE.READ)
        b.send(b"x")
        for _ in range(20):
            await asyncio.sleep(0.01)
            if seen:
                break
        assert seen and all(owner == "new" and ev == POLL_EVENT_TYPE.READ for owner, ev in seen)
        fd = a.fileno()
        poller.subscribe(fd, lambda fd, ev: None, POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE)
        a.close()  # pysyncobj closes first...
        poller.unsubscribe(fd)  # ...then unsubscribes: must not raise
        b.close()

    asyncio.run(scenario())


def test_ticker_coalesces_requests_and_ticks_periodically():
    class FakeSyncObj:
        ticks = 0

        def _onTick(self, timeToWait):
            self.ticks += 1

    async def scenario():
        loop = asyncio.get_running_loop()
        obj = FakeSyncObj()
        poller = LoopPoller(loop)
        ticker = Ticker(obj, poller, loop, period=0.02)
        for _ in range(10):
            ticker.soon()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert obj.ticks == 1
        ticker.start()
        await asyncio.sleep(0.2)
        assert obj.ticks >= 4
        ticker.stop()
        stopped_at = obj.ticks
        ticker.soon()
        await asyncio.sleep(0.06)
        assert obj.ticks == stopped_at

    asyncio.run(scenario())


def test_a_full_disk_while_handling_a_message_or_a_tick_is_a_warning_not_a_crash(caplog, monkeypatch):
    """A follower whose journal cannot take a message's entries drops the message (the leader sends it
    again); before, the StorageFull escaped into the event loop as 'Exception in callback'."""

    class FullSyncObj:
        def _onTick(self, timeout):
            raise StorageFull("disk full while writing raft.log")

    async def scenario():
        loop = asyncio.get_running_loop()
        poller = LoopPoller(loop)
        a, b = socket.socketpair()
        handled = []

        def on_message(fd, event):
            handled.append(event)
            a.recv(10)
            raise StorageFull("disk full while writing raft.log")

        poller.subscribe(a.fileno(), on_message, POLL_EVENT_TYPE.READ)
        ticker = Ticker(FullSyncObj(), poller, loop, period=0.01)
        ticker.start()
        b.send(b"x")
        for _ in range(50):
            await asyncio.sleep(0.01)
            if handled:
                break
        await asyncio.sleep(0.05)
        ticker.stop()
        poller.unsubscribe(a.fileno())
        a.close()
        b.close()
        return handled

    monkeypatch.setattr(syncobj_loop, "_disk_full", Throttle(syncobj_loop.DISK_FULL_LOG_SECONDS))
    with caplog.at_level(logging.WARNING):
        assert asyncio.run(scenario())
    assert "Exception in callback" not in caplog.text and "Traceback" not in caplog.text
    assert sum("disk full" in r.getMessage() for r in caplog.records) == 1  # rate-limited


def test_a_full_disk_while_receiving_a_snapshot_is_one_line_not_a_traceback_per_chunk(tmp_path, caplog, monkeypatch):
    disk = SmallDisk(tmp_path / "disk", size_mb=4)
    try:
        serializer = Serializer(str(disk.folder / "snapshot"), 1 << 16, False, None, None, None)
        disk.fill()
        monkeypatch.setattr(syncobj_loop, "_disk_full", Throttle(syncobj_loop.DISK_FULL_LOG_SECONDS))
        with caplog.at_level(logging.DEBUG):
            for _ in range(200):  # a leader resending the first chunks of a snapshot
                assert serializer.setTransmissionData((bytes(1 << 16), True, False)) is False
        assert [(r.name, r.levelno, r.exc_info) for r in caplog.records] == [
            ("raftkv.raft.syncobj_loop", logging.WARNING, None)]
        assert "disk full receiving a snapshot" in caplog.records[0].getMessage()
    finally:
        disk.close()


@pytest.mark.parametrize("next_timer, delay", [
    (None, 0.02),  # no timer known: every period
    (100.3, 0.3),  # a follower's election deadline, say
    (100.001, 0.02),  # due sooner than a period: a period
    (90.0, 0.02),  # overdue
    (160.0, MAX_TIMER_SECONDS),  # far: pysyncobj's once-a-second work still runs
])
def test_the_next_periodic_tick_comes_at_the_next_timer_but_within_a_period_and_a_second(next_timer, delay):
    assert timer_delay(next_timer, now=100.0, period=0.02) == pytest.approx(delay)


def test_on_a_fake_clock_a_closer_timer_rearms_the_ticker_and_a_late_periodic_tick_is_a_stall():
    """The ticker's decisions read only the clock it is given: the loop never runs here."""

    class Timed:
        timer = 100.3

        def _onTick(self, timeToWait):
            pass

    now, stalls, obj = [100.0], [], Timed()
    loop = asyncio.new_event_loop()
    try:
        ticker = Ticker(obj, LoopPoller(loop), loop, period=0.02, next_timer=lambda: obj.timer,
                        on_stall=stalls.append, clock=lambda: now[0])
        ticker.start()
        assert ticker.due == pytest.approx(100.3)
        obj.timer = 100.2  # a tick brings the timer closer (the follower became leader): due then
        ticker._tick()
        assert ticker.due == pytest.approx(100.2)
        obj.timer = 100.21  # not closer by a period: left as it is
        ticker._tick()
        assert ticker.due == pytest.approx(100.2)
        now[0] = 100.2 + STALL_SECONDS / 2  # on time, give or take
        ticker._periodic()
        assert stalls == [] and ticker.due == pytest.approx(now[0] + 0.02)
        obj.timer = 500.0
        now[0] = ticker.due + STALL_SECONDS * 1.5  # the loop was blocked
        ticker._periodic()
        assert stalls == [now[0]] and ticker.due == pytest.approx(now[0] + MAX_TIMER_SECONDS)
        ticker.stop()
    finally:
        loop.close()
