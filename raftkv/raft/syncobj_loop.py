"""Drive pysyncobj replicas from an asyncio loop instead of a thread each.

pysyncobj's autoTick runs one thread per SyncObj, each blocking in its own
poll(). With eight replicas per node plus the API, the threads spent most of
their time handing the GIL to each other (strace: ~18,000 futex calls/s and
half the CPU in the kernel at ~2,500 puts/s). Here every replica of a node
runs on the node's event loop:

- `LoopPoller` implements pysyncobj's Poller interface on top of the loop's
  add_reader/add_writer. It is handed to pysyncobj as `conf.pollerType`, which
  our `createPoller` hook returns as-is;
- `Ticker` calls a replica's `_onTick(0)` soon after any of its sockets had
  an event or a command was queued, and when its next Raft timer runs out (an
  election deadline, a heartbeat due), at least every second for pysyncobj's
  once-a-second work, except while the group rests (`quiescence`). Ticks are
  coalesced: at most one pending. pysyncobj's own tick loop polls every few
  milliseconds instead; ticking every 50 ms, as here before, cost an awake
  group 20 ticks a second whether or not a timer was due. When the next
  periodic tick is due (`timer_delay`) and whether the loop stalled are
  decided on the `Clock` it is given, pysyncobj's (`core/clock.py`).

All pysyncobj code then runs on the loop thread, and so do the proposal
callbacks: no locks, no thread hops.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from typing import Callable

import pysyncobj.syncobj
from pysyncobj.poller import POLL_EVENT_TYPE, Poller

from raftkv.core import metrics
from raftkv.core.clock import Clock, Throttle
from raftkv.core.errors import CorruptData, StorageFull

log = logging.getLogger(__name__)

_upstream_create_poller = pysyncobj.syncobj.createPoller


def _create_poller(poller_type):
    if isinstance(poller_type, LoopPoller):
        return poller_type
    return _upstream_create_poller(poller_type)


pysyncobj.syncobj.createPoller = _create_poller
# pysyncobj wakes its tick thread through a pipe on every queued command: two fds per group, and a
# write, a read and a loop callback per proposal. Every command we queue is followed by `Ticker.soon`.
pysyncobj.syncobj.PIPE_NOTIFIER_ENABLED = False


class LoopPoller(Poller):
    """pysyncobj's socket subscriptions, served by an asyncio loop.

    Like pysyncobj's own PollPoller, the callback is looked up when an event
    is dispatched, not when it was registered: pysyncobj closes sockets before
    unsubscribing them and the kernel reuses fd numbers at once, so an event
    already queued for a closed socket must reach whoever owns that fd now
    (pysyncobj's handlers expect exactly that), never a stale handler.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Clock = time.monotonic):
        self._loop = loop
        self.clock = clock  # when a full disk is logged
        self._subscriptions: dict[int, tuple[object, int]] = {}  # fd -> (callback, POLL_EVENT_TYPE mask)
        self.on_event = lambda: None  # the Ticker sets these two
        self.on_corrupt: Callable[[CorruptData], None] = lambda exc: None

    def subscribe(self, descr: int, callback, eventMask: int) -> None:
        self.unsubscribe(descr)
        self._subscriptions[descr] = (callback, eventMask)
        try:
            # A socket error makes the fd readable, and pysyncobj's read path handles it.
            if eventMask & (POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR):
                self._loop.add_reader(descr, self._dispatch, descr, POLL_EVENT_TYPE.READ)
            if eventMask & POLL_EVENT_TYPE.WRITE:
                self._loop.add_writer(descr, self._dispatch, descr, POLL_EVENT_TYPE.WRITE)
        except OSError:  # closed already: pysyncobj learns that from its own socket calls
            self.unsubscribe(descr)

    def unsubscribe(self, descr: int) -> None:
        if self._subscriptions.pop(descr, None) is None:
            return
        for remove in (self._loop.remove_reader, self._loop.remove_writer):
            try:
                remove(descr)
            except OSError:
                # pysyncobj closes a socket before unsubscribing it; epoll then refuses to modify
                # the closed fd, and the selector drops its registration itself.
                pass

    def poll(self, timeout: float) -> None:
        """Events arrive through the loop; nothing to wait for here."""

    def _dispatch(self, descr: int, event: int) -> None:
        callback, mask = self._subscriptions.get(descr, (None, 0))
        if callback is not None and (mask & event or event == POLL_EVENT_TYPE.READ and mask & POLL_EVENT_TYPE.ERROR):
            self.run(callback, descr, event)
        else:
            self.on_event()

    def run(self, callback: Callable[..., object], *args) -> None:
        """`callback(*args)` (pysyncobj handling a message), then a tick soon."""
        try:
            callback(*args)
        except (StorageFull, CorruptData) as exc:
            self.failed(exc)
            return
        self.on_event()

    def failed(self, exc: StorageFull | CorruptData) -> None:
        """Its entries could not be stored (the leader resends them; a tick soon), or its files cannot be
        trusted (e.g. the journal's fsync failed before an acknowledgement: the group stops)."""
        if isinstance(exc, CorruptData):
            self.on_corrupt(exc)
            return
        warn_disk_full(exc, self.clock())
        self.on_event()


DISK_FULL_LOG_SECONDS = 10.0
STALL_SECONDS = 0.2  # a periodic tick this late means the loop was blocked
MAX_TIMER_SECONDS = 1.0  # pysyncobj's once-a-second work (the journal's sync in default mode) runs about on time
_disk_full = Throttle(DISK_FULL_LOG_SECONDS)  # a full disk fails every tick and every message of every group


def warn_disk_full(exc: StorageFull, now: float) -> None:
    if _disk_full.due(now):
        log.warning("%s (logged at most every %.0fs)", exc, DISK_FULL_LOG_SECONDS)


def timer_delay(next_timer: float | None, now: float, period: float) -> float:
    """Seconds from `now` to the next periodic tick: when the next Raft timer runs out (`next_timer`, None:
    unknown), but no sooner than `period` and no later than pysyncobj's once-a-second work."""
    if next_timer is None:
        return period
    return min(max(next_timer - now, period), MAX_TIMER_SECONDS)


def _snapshot_chunk_disk_full(record: logging.LogRecord) -> bool:
    """pysyncobj's serializer logs a traceback for every snapshot chunk it cannot write, and a
    snapshot is sent in thousands of them: a full disk becomes the one rate-limited line instead."""
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        warn_disk_full(StorageFull("disk full receiving a snapshot from the leader; it is sent again once space "
                                    "is freed"), time.monotonic())  # a log record is this one's edge
        return False
    return True


logging.getLogger("pysyncobj.serializer").addFilter(_snapshot_chunk_disk_full)


class Ticker:
    """Ticks one SyncObj (autoTick=False) on the loop: on events, and when its next timer runs out."""

    def __init__(self, syncobj, poller: LoopPoller, loop: asyncio.AbstractEventLoop, period: float,
                 on_corrupt: Callable[[CorruptData], None] | None = None,
                 on_stall: Callable[[float], None] = lambda now: None, next_timer: Callable[[], float] | None = None,
                 clock: Clock = time.monotonic):
        """`next_timer()`: when (on `clock`, pysyncobj's) the replica's next Raft timer runs out; periodic
        ticks come then, but no more often than every `period` seconds (every `period` without it).
        `on_stall(now)` runs before the first periodic tick after the loop was blocked for a while."""
        self._syncobj = syncobj
        self.clock = clock
        self._next_timer = next_timer
        self._on_stall = on_stall
        self.due = 0.0  # when (on the clock) the next periodic tick is
        self._on_corrupt = on_corrupt
        self._loop = loop
        self._period = period
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._stopped = False
        self._resting = False
        poller.on_event = self.soon
        poller.on_corrupt = self._corrupt

    def start(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        now = self.clock()
        delay = timer_delay(self._next_timer() if self._next_timer is not None else None, now, self._period)
        self.due = now + delay
        self._timer = self._loop.call_later(delay, self._periodic)

    @property
    def resting(self) -> bool:
        return self._resting

    def rest(self) -> None:
        """No periodic ticks until `wake`; events still tick."""
        if self._resting or self._stopped:
            return
        self._resting = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def wake(self) -> None:
        """Periodic ticks again, the first one soon."""
        if not self._resting or self._stopped:
            return
        self._resting = False
        self.start()
        self.soon()

    def soon(self) -> None:
        """Tick once more as soon as the loop is free (coalesced)."""
        if not self._scheduled and not self._stopped:
            self._scheduled = True
            self._loop.call_soon(self._tick)

    def soon_from_thread(self) -> None:
        """`soon`, asked from another thread (nothing once the loop is closed)."""
        self.from_thread(self.soon)

    def from_thread(self, call: Callable[[], None]) -> None:
        """`call()` on the loop, asked from another thread; nothing once the ticker is stopped or the loop closed."""
        try:
            self._loop.call_soon_threadsafe(lambda: None if self._stopped else call())
        except RuntimeError:  # the loop closed: the group is gone
            pass

    def _tick(self) -> None:
        self._scheduled = False
        if self._stopped:
            return
        metrics.RAFT_TICKS.inc()
        try:
            self._syncobj._onTick(0.0)
        except StorageFull as exc:  # retried on every tick until there is room again
            warn_disk_full(exc, self.clock())
        except CorruptData as exc:
            self._corrupt(exc)
        except Exception:
            # pysyncobj's own tick thread logs and carries on the same way (e.g. a full disk
            # during apply is retried on the next tick).
            log.exception("replica tick failed")
        # A tick may bring the next timer closer (a follower became leader and heartbeats from now on).
        if (self._timer is not None and self._next_timer is not None and not self._stopped
                and self._next_timer() < self.due - self._period):
            self.start()

    def _corrupt(self, exc: CorruptData) -> None:
        """Ticking on would act on state it cannot trust."""
        if self._stopped:
            return
        self.stop()
        if self._on_corrupt is None:
            log.error("%s", exc)
        else:  # the owner says what it does about it: a node stops, a learner re-syncs the partition
            self._on_corrupt(exc)

    def _periodic(self) -> None:
        # A loop blocked for a while (a RocksDB reopen on a freed disk, a long fsync) runs this timer
        # before the messages that arrived meanwhile: a follower would campaign against the leader it
        # has not heard only because it was not listening.
        now = self.clock()
        if now - self.due > STALL_SECONDS:
            self._on_stall(now)
        self._timer = None
        self._tick()
        if not self._stopped and not self._resting:
            self.start()

    def stop(self) -> None:
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
