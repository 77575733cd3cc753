"""One connection of the Raft hub (`hub.RaftHub`) to or from a peer: its stream, and the frames waiting to
leave on it, in order. In fsync mode a turn's frames wait for the node log's sync of the write they
may speak of (held); a leader's early frames leave at once unless a held frame is still waiting."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Protocol

from raftkv.core import metrics
from raftkv.core.clock import Clock
from raftkv.raft import hub_frames
from raftkv.raft.hub_frames import BadFrame

log = logging.getLogger(__name__)

HIGH_WATER_BYTES = 128 * 1024 * 1024  # a peer this far behind in reading is as good as gone


class Hub(Protocol):
    """What a connection calls on its hub (`hub.RaftHub`)."""

    clock: Clock
    _holding: set[Connection]

    def _queued(self, connection: Connection) -> None: ...
    def _received(self, connection: Connection, body: tuple) -> None: ...
    def _refused(self, writer: asyncio.StreamWriter, why: str) -> None: ...
    def _closed(self, connection: Connection) -> None: ...


class Connection:
    """One TCP (or TLS) stream to or from a peer, and the frames waiting to leave on it."""

    def __init__(self, hub: Hub, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 peer: str | None, dialed: bool):
        self._hub = hub
        self._reader = reader
        self._writer = writer
        self.peer = peer  # the node id; None for a learner, or an accepted connection before its hello
        self.dialed = dialed
        self.greeted = dialed  # an accepted connection is of use once its hello was checked
        self.joined: set[int] = set()  # groups this (accepted) connection subscribed to read-only
        self.last_received = hub.clock()
        self.closed = False
        self._pending: list[bytes] = []  # in order: the held frames first, then this turn's
        self._early: list[bytes] = []  # this turn's frames that need not wait for the node log's sync
        self._holds: deque[list[int]] = deque()  # [sync point, frames]: the held frames, oldest first

    def __repr__(self) -> str:
        return f"<{'to' if self.dialed else 'from'} {self.peer or 'learner'}>"

    def send(self, frame: bytes, early: bool = False) -> bool:
        """Queue `frame` for the end of the turn; an `early` one leaves before the turn's sync of the node
        log, unless frames of an earlier turn still wait for theirs (it never overtakes them)."""
        if self.closed:
            return False
        self._hub._queued(self)
        (self._early if early else self._pending).append(frame)
        return True

    def send_now(self, frame: bytes) -> None:
        """A ping or its answer: it acknowledges nothing, so it leaves at once, ahead of frames that wait for
        the node log's sync. Held behind a 5 s fsync, it left the peer hearing nothing for longer than
        `dead_after`: it closed the connection and dialed again, and frames of the two connections crossed
        (test_chaos's bad-disk run)."""
        if not self.closed:
            self._write_frames([frame])

    def _end_turn(self, point: int | None) -> None:
        """The hub's flush: `point` None drops this turn's frames (the records they speak of were not
        written); else they leave once the node log's sync covers write `point` (0: at once)."""
        early, self._early = self._early, []
        held = sum(count for _, count in self._holds)
        if point is None:
            del self._pending[held:]
            return
        if not self._holds and not point:
            self._pending += early
            self._write(len(self._pending))
            return
        if early and not self._holds:
            self._write_frames(early)
        else:
            self._pending += early
        fresh = len(self._pending) - held
        if fresh:
            point = max(point, self._holds[-1][0]) if self._holds else point
            if self._holds and self._holds[-1][0] == point:
                self._holds[-1][1] += fresh
            else:
                self._holds.append([point, fresh])
            self._hub._holding.add(self)

    def _release(self, synced: int) -> bool:
        """The frames held for syncs up to write `synced` leave; whether any still wait."""
        count = 0
        while self._holds and self._holds[0][0] <= synced:
            count += self._holds.popleft()[1]
        if count:
            self._write(count)
        return bool(self._holds)

    def _drop_held(self) -> None:
        held = sum(count for _, count in self._holds)
        del self._pending[:held]
        self._holds.clear()

    def _write(self, count: int) -> None:
        frames, self._pending[:count] = self._pending[:count], []
        self._write_frames(frames)

    def _write_frames(self, frames: list[bytes]) -> None:
        if self.closed or not frames:
            return
        if self._writer.transport.is_closing():  # the peer went away; `read_frames` has not heard yet
            self.close()  # uvloop raises on a write to a closed transport (asyncio only counts them)
            return
        self._writer.write(b"".join(frames))
        metrics.RAFT_SOCKET_WRITES.inc()
        if self._writer.transport.get_write_buffer_size() > HIGH_WATER_BYTES:
            log.warning("%r is not reading its Raft messages; closing it", self)
            self.close()

    async def read_frames(self) -> None:
        """Hand each frame to the hub until the stream ends or sends something that is not a frame."""
        try:
            while True:
                header = await self._reader.readexactly(hub_frames.HEADER_BYTES)
                frame = await self._reader.readexactly(hub_frames.frame_length(header))
                self.last_received = self._hub.clock()
                self._hub._received(self, hub_frames.decode(frame, from_node=self.peer is not None))
        except BadFrame as exc:
            self._hub._refused(self._writer, f"{exc}")
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except Exception:
            log.exception("the Raft connection %r failed", self)
        finally:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._pending.clear()
        self._early.clear()
        self._holds.clear()
        self._writer.close()
        self._hub._closed(self)
