"""The end of a loop turn for a node's Raft log: every group's records of the turn written with one
`os.write` and, in fsync mode, made durable with one fdatasync on an I/O thread while the loop runs on
(docs/raft-engine.md, "The node log, wired" and "The sync off the loop").

The node log defers every record (`NodeLog.defer_writes`); the first of a turn asks the hub for its
one flush of the turn, and the hub runs `before_send` before it sends any connection's frames. The
turn's records are written there. In fsync mode the frames then wait for the sync that covers that
write (the hub holds them: a follower's acknowledgement, a vote, any pysyncobj message), except the
engine's leader items (`steps`, `beat`), which leave at once: a leader may send its entries before its
own sync (Raft thesis §10.2.1) as long as it counts itself toward their quorum only once they are
synced, which the engine asks of this turn (`mark`, `synced`). N groups busy in one turn cost one
write and one fdatasync, not N, and one sync runs at a time: the turns meanwhile wait for the next.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from raftkv.core import metrics
from raftkv.core.errors import CorruptData, DiskFailed, StorageFull
from raftkv.raft.hub import RaftHub
from raftkv.raft.node_log import NodeLog
from raftkv.raft.syncobj_loop import warn_disk_full

log = logging.getLogger(__name__)


class LogTurn:
    def __init__(self, log: NodeLog, hub: RaftHub, fsync: bool, on_corrupt: Callable[[CorruptData], None]):
        self._log = log
        self._hub = hub
        self._fsync = fsync
        self._on_corrupt = on_corrupt
        self._clock = hub.clock
        self._failed = False
        self._syncing = False
        self._io = ThreadPoolExecutor(1, thread_name_prefix="raft-log-sync") if fsync else None
        hub.before_send = self.before_send
        if fsync and hub.engine is not None:
            hub.engine.durability = self
        log.defer_writes(hub.flush_soon)

    def before_send(self) -> int | None:
        """Write the turn's records; the write the frames must wait for a sync of (0: none), None if they
        must not leave."""
        if self._failed:
            return None
        try:
            written = self._log.write_pending()
        except StorageFull as exc:  # the batch waits for the next turn's write; Raft sends again
            warn_disk_full(exc, self._clock())
            return None
        except OSError as exc:  # a write the disk refused (EIO): as above
            log.warning("the node's Raft log could not be written (%s); the turn's messages are dropped", exc)
            return None
        if not self._fsync or self._log.synced >= written:
            return 0
        self._sync_soon()
        return written

    # -- what the node engine asks (fsync mode) --------------------------------------------

    def mark(self) -> int:
        """The write that covers every record made so far: once `synced` reaches it, they are durable."""
        return self._log.covering_write

    @property
    def synced(self) -> int:
        return self._log.synced

    def sync_now(self) -> None:
        """Everything written made durable before this returns (a group handed back to pysyncobj, which
        counts its own log toward every quorum; what is still batched was sent to no one)."""
        try:
            self._log.sync_written()
            self._hub.synced(self._log.synced)
        except CorruptData as exc:
            self._fail(exc)
            raise

    # -- the sync ---------------------------------------------------------------------------

    def _sync_soon(self) -> None:
        if self._syncing or self._failed:
            return
        self._syncing = True
        future = asyncio.get_running_loop().run_in_executor(self._io, self._log.sync_written)
        future.add_done_callback(self._synced)

    def _synced(self, future: asyncio.Future) -> None:
        self._syncing = False
        if self._log.closed:  # the node stops; closing synced what was written
            return
        try:
            synced = future.result()
        except CorruptData as exc:  # a failed fsync (DiskFailed): nothing may be said of what it covered
            self._fail(exc)
            return
        except OSError as exc:
            self._fail(DiskFailed(f"the node's Raft log in {self._log.folder} could not be synced: {exc}"))
            return
        metrics.NODE_LOG_FSYNCS.inc()
        engine = self._hub.engine
        if engine is not None:
            engine.on_synced()
        self._hub.synced(synced)
        if self._log.written > synced:
            self._sync_soon()

    def _fail(self, exc: CorruptData) -> None:
        if not self._failed:
            self._failed = True
            self._hub.sync_failed()
            self._on_corrupt(exc)
